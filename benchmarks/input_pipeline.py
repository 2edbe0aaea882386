"""Input-pipeline throughput: the paper's two colour views against the decode-and-crop ceiling.

    python benchmarks/input_pipeline.py [--images 300] [--repeats 5] [--batches 8] [--ops]
                                        [--note ...]

From ``--images`` generated JPEGs of ImageNet-like size (500×375 and 375×500, quality 90,
written to a temporary folder), images/second of

1. the ceiling: read + decode + two plain random crops (RandomResizedCrop's window, antialiased
   bilinear resize to 224), batched — what any two-view pipeline must at least do;
2. the full asymmetric two-view pipeline, ``data.pretrain_dataset`` with
   ``augment.AsymmetricViews`` (file check, decode, crops, flips, colour, blur, solarize,
   normalization, bad-file accounting);
3. the multi-crop pipeline, ``augment.MultiCropViews`` (2×224 + 6×96).

Each figure is the median over ``--repeats`` rounds; in every round the pipelines run one
after the other (interleaved), each from a fresh iterator, timing ``--batches`` batches of 32
after the first.  ``--ops`` adds a table of single ops (ms per 224² view): ours, with and
without XLA, against the Keras layers they replace (and keras-cv's crop, with the ``bench``
extra installed).
"""

import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

TITLE = "## Input pipeline throughput"


def generate_jpegs(folder, count, seed=0):
    """Photo-like JPEGs: smooth colour fields, sensor noise and a few discs; ~100 kB each."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    paths = []
    for index in range(count):
        width, height = (500, 375) if index % 3 else (375, 500)
        field = rng.uniform(0, 255, (height // 25 + 2, width // 25 + 2, 3)).astype(np.uint8)
        image = np.asarray(Image.fromarray(field).resize((width, height), Image.BICUBIC),
                           np.float32)
        image += rng.normal(0, 18, image.shape)
        rows, columns = np.mgrid[:height, :width]
        for _ in range(6):
            y, x, radius = rng.uniform(0, height), rng.uniform(0, width), rng.uniform(10, 80)
            image[(rows - y) ** 2 + (columns - x) ** 2 < radius ** 2] = rng.uniform(0, 255, 3)
        path = os.path.join(folder, f"{index:04d}.jpg")
        Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(path, quality=90)
        paths.append(path)
    return paths


def images_per_second(make_dataset, batches, batch):
    """A fresh iterator; images a second over ``batches`` batches after the first."""
    iterator = iter(make_dataset())
    next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    seconds = time.perf_counter() - start
    del iterator
    return batches * batch / seconds


def ceiling_dataset(paths, batch, size=224):
    """Read, decode, two plain random crops resized to ``size``, batches: the ceiling."""
    import tensorflow as tf

    from caco_tf.data import augment

    dataset = tf.data.Dataset.from_tensor_slices(paths).shuffle(len(paths), seed=0).repeat()

    def two_crops(number, path):
        image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
        return tuple(augment.resized_crop(image, tf.stack([number, tf.constant(view, tf.int64)]),
                                          size, (0.2, 1.0), (3 / 4, 4 / 3))
                     for view in range(2))

    dataset = dataset.enumerate().map(two_crops, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def measure_pipelines(paths, args):
    """{pipeline: [images/s of each round]}."""
    import numpy as np

    from caco_tf import data
    from caco_tf.data import augment

    source = data.FileSource(np.asarray(paths))

    def pretrain(views):
        return lambda: images_per_second(lambda: data.pretrain_dataset(
            source, args.batch, views, seed=0, skipped=data.SkippedFiles()),
            args.batches, args.batch)

    return _harness.interleave({
        "ceiling": lambda: images_per_second(lambda: ceiling_dataset(paths, args.batch, args.size),
                                             args.batches, args.batch),
        "asymmetric": pretrain(augment.AsymmetricViews(args.size)),
        "multicrop": pretrain(augment.MultiCropViews(args.size, min(96, args.size),
                                                     args.local_crops))},
        args.repeats, warmup=0 if args.tiny else 1, show="{:.0f}")


# ------------------------------------------------------------------------------- single ops
def measure_ops(path, repeats, count, size=224):
    """(op, ours, ms, ms without XLA or None, theirs, ms or None) rows: each per view of
    ``size``², on a batch of ``count``."""
    import keras
    import tensorflow as tf

    from caco_tf.data import augment

    decoded = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
    sources = tf.stack([decoded] * count)
    views = tf.random.stateless_uniform([count, size, size, 3], seed=[0, 1])
    seeds = tf.random.experimental.stateless_split(tf.constant([0, 2], tf.int64), count)

    def per_image(function, images):
        return lambda: tf.map_fn(lambda args: function(*args), (images, seeds),
                                 fn_output_signature=tf.TensorSpec([size, size, 3], tf.float32))

    def our_crop(image, seed):
        return augment.resized_crop(image, seed, size, (0.2, 1.0), (3 / 4, 4 / 3))

    def our_flip(view, seed):
        flip = tf.random.stateless_uniform([], seed=seed) < 0.5
        return tf.cond(flip, lambda: tf.reverse(view, [1]), lambda: view)

    mean, std = augment.IMAGENET_MEAN, augment.IMAGENET_STD
    # What augment_view runs after the crop, as it compiles it: jitter (always, to time it)
    # + grayscale + clip + normalization; and view 1's, with its blur (p = 1).
    colour_recipe = augment.ViewRecipe(size, jitter_probability=1.0, blur_probability=0.0)
    view1_recipe = augment.AsymmetricViews(size).recipes[0]

    def our_view(recipe, xla):
        finish = augment._colour_view_function(recipe, 3, mean, std, 1.0, xla)
        return lambda view, seed: finish(view, tf.random.stateless_uniform([augment._DRAWS],
                                                                           seed=seed))

    def tf_hue(view, seed):
        return tf.image.adjust_hue(view, tf.random.stateless_uniform([], seed, -0.1, 0.1))

    def our_blur(xla):
        blur = tf.function(lambda view, sigma: augment.gaussian_blur(view, sigma, max_radius=6),
                           jit_compile=xla, autograph=False)
        return lambda view, seed: blur(
            view, tf.random.stateless_uniform([], seed=seed, minval=0.1, maxval=2.0))

    def layer(made, images):
        return lambda: made(images, training=True)

    try:  # the bench extra
        import keras_cv

        their_crop = ("keras-cv RandomCropAndResize", layer(
            keras_cv.layers.RandomCropAndResize((size, size), crop_area_factor=(0.2, 1.0),
                                                aspect_ratio_factor=(3 / 4, 4 / 3)),
            tf.cast(sources, tf.float32)))
    except ImportError:
        their_crop = ("keras-cv RandomCropAndResize (keras-cv not installed)", None)
    jitter = keras.Sequential([
        keras.layers.RandomColorJitter(value_range=(0, 1), brightness_factor=0.4,
                                       contrast_factor=0.4, saturation_factor=(0.4, 0.6),
                                       hue_factor=0.1),
        keras.layers.RandomGrayscale(0.2)])
    cases = [  # op, ours, our fn, ours without XLA (or None), theirs, their fn (or None)
        (f"crop 500×375 → {size}", "crop_window + resize(antialias)", per_image(our_crop, sources),
         None, *their_crop),
        ("flip", "cond + reverse", per_image(our_flip, views), None, "keras RandomFlip",
         layer(keras.layers.RandomFlip("horizontal"), views)),
        ("colour jitter + grayscale (+ normalize)",
         "colour_view: normalization folded into the colour map, per-channel clip",
         per_image(our_view(colour_recipe, True), views),
         per_image(our_view(colour_recipe, False), views),
         "keras RandomColorJitter + RandomGrayscale (no normalization)", layer(jitter, views)),
        ("hue alone, HSV (not used: our hue is in the colour matrix)",
         "tf.image.adjust_hue", per_image(tf_hue, views), None, "keras RandomHue",
         layer(keras.layers.RandomHue(0.1, value_range=(0, 1)), views)),
        ("Gaussian blur σ∈[0.1, 2]", "gaussian_blur (separable, radius ⌈3σ⌉)",
         per_image(our_blur(True), views), per_image(our_blur(False), views),
         "keras RandomGaussianBlur (13×13)",
         layer(keras.layers.RandomGaussianBlur(factor=1.0, kernel_size=13, sigma=(0.1, 2.0),
                                               value_range=(0, 1)), views)),
        ("view 1 after its crop: colour (p = 0.8), grayscale, blur (p = 1), normalization",
         "colour_view", per_image(our_view(view1_recipe, True), views),
         per_image(our_view(view1_recipe, False), views), "—", None),
    ]

    def ms(function):
        if function is None:
            return None
        compiled = tf.function(function)
        times = _harness.interleave({"op": lambda: compiled().numpy()}, repeats)["op"]
        return statistics.median(times) / count * 1e3

    rows = []
    for op, ours, our_fn, plain_fn, theirs, their_fn in cases:
        rows.append((op, ours, ms(our_fn), ms(plain_fn), theirs, ms(their_fn)))
        print(rows[-1], flush=True)
    return rows


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = _harness.parser(__doc__)
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--size", type=int, default=224, help="the (global) views' side")
    parser.add_argument("--local-crops", type=int, default=6, help="multi-crop's local crops")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--ops", action="store_true", help="also time single ops")
    parser.add_argument("--note", default="", help="a line to add, e.g. about machine load")
    args = parser.parse_args(argv)
    count = 16
    if args.tiny:
        args.images, args.batch, args.repeats, args.batches = 8, 4, 1, 1
        args.size, args.local_crops, count = 32, 1, 1

    import numpy as np

    with tempfile.TemporaryDirectory() as folder:
        paths = generate_jpegs(folder, args.images)
        jpeg_kb = np.mean([os.path.getsize(p) for p in paths]) / 1e3
        before = os.getloadavg()[0]
        rates = measure_pipelines(paths, args)
        ops = measure_ops(paths[1], args.repeats, count, args.size) if args.ops else None
        after = os.getloadavg()[0]
    lines = _harness.header(__file__, argv, (
        f"{args.images} generated JPEGs (500×375 and 375×500, quality 90, {jpeg_kb:.0f} kB on "
        f"average) in a temporary folder; views of {args.size} px (multi-crop: 2 global and "
        f"{args.local_crops} local); batches of {args.batch}; images/second (one image = "
        f"all its views) over {args.batches} batches after the first, from a fresh iterator; "
        f"median of {args.repeats} rounds, the pipelines interleaved within each round. Load "
        f"average {before:.1f} before, {after:.1f} after."))
    if args.note:
        lines += [args.note, ""]
    lines += ["| pipeline | views | images/s (median) | rounds | of the ceiling "
              "(median of the rounds' ratios) |", "|---|---|---:|---|---:|"]
    two, local = f"2 × {args.size}", f"{args.local_crops} × {min(96, args.size)}"
    names = {"ceiling": ("(1) ceiling: decode + two plain random crops", two),
             "asymmetric": ("(2) asymmetric two views (`AsymmetricViews`)", two),
             "multicrop": ("(3) multi-crop (`MultiCropViews`)", f"{two} + {local}")}
    ratios = [a / c for a, c in zip(rates["asymmetric"], rates["ceiling"])]
    for name, (label, shape) in names.items():
        share = statistics.median(r / c for r, c in zip(rates[name], rates["ceiling"]))
        lines.append(f"| {label} | {shape} | {statistics.median(rates[name]):,.0f} | "
                     f"{', '.join(f'{r:.0f}' for r in rates[name])} | {100 * share:.0f} % |")
    lines += ["", f"(2) / (1) per round: {', '.join(f'{100 * r:.0f} %' for r in ratios)} "
                  f"(median {100 * statistics.median(ratios):.0f} %; goal ≥ 60 %)."]
    if ops:
        lines += ["", f"Single ops, ms per {args.size}² view (batch of {count}, median of "
                      f"{args.repeats}), ours against the layer it replaces "
                      "(see `caco_tf/data/augment.py`). The pipeline compiles everything a view "
                      "gets after its crop with XLA (`augment.colour_view`); \"without XLA\" "
                      "runs the same function as plain TF kernels (`augment.JIT_COMPILE = "
                      "False`):", "",
                  "| op | ours (or TF's) | ms | without XLA, ms | Keras / keras-cv | ms |",
                  "|---|---|---:|---:|---|---:|"]

        def shown(value):
            return "—" if value is None else f"{value:.2f}"
        lines += [f"| {op} | {ours} | {shown(mine)} | {shown(plain)} | {theirs} | "
                  f"{shown(other)} |" for op, ours, mine, plain, theirs, other in ops]
    _harness.publish(args, "input_pipeline", TITLE, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
