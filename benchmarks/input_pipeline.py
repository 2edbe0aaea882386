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
after the first, so that a machine shared with other jobs loads them alike.  ``--ops`` adds a
table of single ops (ms per 224² view): ours, with and without XLA, against the Keras /
keras-cv layers they replace.
Writes (or replaces) its section of BENCHMARKS.md: the text between the markers below, under
the section's heading.
"""

import argparse
import datetime
import os
import shlex
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _report import cpu_count  # noqa: E402
import _report  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from PIL import Image  # noqa: E402

from caco_tf import data  # noqa: E402
from caco_tf.data import augment  # noqa: E402

TITLE = "## Input pipeline throughput"
BEGIN, END = "<!-- input_pipeline: begin -->", "<!-- input_pipeline: end -->"
BATCH = 32


def generate_jpegs(folder, count, seed=0):
    """Photo-like JPEGs: smooth colour fields, sensor noise and a few discs; ~100 kB each."""
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


def ceiling_dataset(paths, size=224):
    """Read, decode, two plain random crops resized to ``size``, batches: the ceiling."""
    dataset = tf.data.Dataset.from_tensor_slices(paths).shuffle(len(paths), seed=0).repeat()

    def two_crops(number, path):
        image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
        return tuple(augment.resized_crop(image, tf.stack([number, tf.constant(view, tf.int64)]),
                                          size, (0.2, 1.0), (3 / 4, 4 / 3))
                     for view in range(2))

    dataset = dataset.enumerate().map(two_crops, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.batch(BATCH, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def images_per_second(make_dataset, batches, batch=BATCH):
    """A fresh iterator; the time of ``batches`` batches after the first."""
    iterator = iter(make_dataset())
    next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    seconds = time.perf_counter() - start
    del iterator
    return batches * batch / seconds


def measure_pipelines(paths, repeats, batches):
    source = data.FileSource(np.asarray(paths))
    pipelines = {
        "ceiling": lambda: ceiling_dataset(paths),
        "asymmetric": lambda: data.pretrain_dataset(source, BATCH, augment.AsymmetricViews(),
                                                    seed=0, skipped=data.SkippedFiles()),
        "multicrop": lambda: data.pretrain_dataset(source, BATCH, augment.MultiCropViews(),
                                                   seed=0, skipped=data.SkippedFiles()),
    }
    for make in pipelines.values():  # warm-up: tracing, thread pools, page cache
        images_per_second(make, 1)
    rates = {name: [] for name in pipelines}
    for round_ in range(repeats):
        for name, make in pipelines.items():
            rates[name].append(images_per_second(make, batches))
        print(f"round {round_ + 1}: " + ", ".join(f"{n} {r[-1]:.0f}" for n, r in rates.items()),
              flush=True)
    ratios = [a / c for a, c in zip(rates["asymmetric"], rates["ceiling"])]
    return {name: statistics.median(r) for name, r in rates.items()}, rates, ratios


# ------------------------------------------------------------------------------- single ops
def _per_view_ms(function, argument, repeats, count):
    compiled = tf.function(function)
    compiled(argument)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        compiled(argument)
        times.append(time.perf_counter() - start)
    return statistics.median(times) / count * 1e3


def measure_ops(path, repeats, count=16):
    """(op, ours, ms, ms without XLA or None, theirs, ms or None) rows: each per 224² view, on a
    batch of ``count``."""
    decoded = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
    sources = tf.stack([decoded] * count)
    views = tf.random.stateless_uniform([count, 224, 224, 3], seed=[0, 1])
    seeds = tf.random.experimental.stateless_split(tf.constant([0, 2], tf.int64), count)

    def per_image(function, images):
        return tf.map_fn(lambda args: function(*args), (images, seeds),
                         fn_output_signature=tf.TensorSpec([224, 224, 3], tf.float32))

    def our_crop(image, seed):
        return augment.resized_crop(image, seed, 224, (0.2, 1.0), (3 / 4, 4 / 3))

    def our_flip(view, seed):
        flip = tf.random.stateless_uniform([], seed=seed) < 0.5
        return tf.cond(flip, lambda: tf.reverse(view, [1]), lambda: view)

    mean, std = augment.IMAGENET_MEAN, augment.IMAGENET_STD
    # What augment_view runs after the crop, as it compiles it: jitter (always, to time it)
    # + grayscale + clip + normalization; and view 1's, with its blur (p = 1).
    colour_recipe = augment.ViewRecipe(jitter_probability=1.0, blur_probability=0.0)
    view1_recipe = augment.AsymmetricViews().recipes[0]

    def our_view(recipe, xla):
        finish = augment._colour_view_function(recipe, 3, mean, std, 1.0, xla)
        return lambda view, seed: finish(view, tf.random.stateless_uniform([augment._DRAWS],
                                                                           seed=seed))

    def tf_hue(view, seed):
        return tf.image.adjust_hue(view, tf.random.stateless_uniform([], seed, -0.1, 0.1))

    def our_blur(xla):
        blur = tf.function(lambda view, sigma: augment.gaussian_blur(view, sigma, max_radius=6),
                           jit_compile=xla, autograph=False)

        def run(view, seed):
            return blur(view, tf.random.stateless_uniform([], seed=seed, minval=0.1, maxval=2.0))
        return run

    import keras_cv

    keras_crop = keras_cv.layers.RandomCropAndResize(
        (224, 224), crop_area_factor=(0.2, 1.0), aspect_ratio_factor=(3 / 4, 4 / 3))
    keras_jitter = keras.Sequential([
        keras.layers.RandomColorJitter(value_range=(0, 1), brightness_factor=0.4,
                                       contrast_factor=0.4, saturation_factor=(0.4, 0.6),
                                       hue_factor=0.1),
        keras.layers.RandomGrayscale(0.2)])
    keras_hue = keras.layers.RandomHue(0.1, value_range=(0, 1))
    keras_blur = keras.layers.RandomGaussianBlur(factor=1.0, kernel_size=13, sigma=(0.1, 2.0),
                                                 value_range=(0, 1))
    keras_flip = keras.layers.RandomFlip("horizontal")
    cases = [  # op, ours, our fn, ours without XLA (or None), theirs, their fn (or None)
        ("crop 500×375 → 224", "crop_window + resize(antialias)",
         lambda: per_image(our_crop, sources), None, "keras-cv RandomCropAndResize",
         lambda: keras_crop(tf.cast(sources, tf.float32), training=True)),
        ("flip", "cond + reverse", lambda: per_image(our_flip, views), None,
         "keras RandomFlip", lambda: keras_flip(views, training=True)),
        ("colour jitter + grayscale (+ normalize)",
         "colour_view: normalization folded into the colour map, per-channel clip",
         lambda: per_image(our_view(colour_recipe, True), views),
         lambda: per_image(our_view(colour_recipe, False), views),
         "keras RandomColorJitter + RandomGrayscale (no normalization)",
         lambda: keras_jitter(views, training=True)),
        ("hue alone, HSV (not used: our hue is in the colour matrix)",
         "tf.image.adjust_hue", lambda: per_image(tf_hue, views), None,
         "keras RandomHue", lambda: keras_hue(views, training=True)),
        ("Gaussian blur σ∈[0.1, 2]", "gaussian_blur (separable, radius ⌈3σ⌉)",
         lambda: per_image(our_blur(True), views),
         lambda: per_image(our_blur(False), views),
         "keras RandomGaussianBlur (13×13)", lambda: keras_blur(views, training=True)),
        ("view 1 after its crop: colour (p = 0.8), grayscale, blur (p = 1), normalization",
         "colour_view", lambda: per_image(our_view(view1_recipe, True), views),
         lambda: per_image(our_view(view1_recipe, False), views), "—", None),
    ]
    rows = []
    for op, ours, our_fn, plain_fn, theirs, their_fn in cases:
        mine = _per_view_ms(lambda _: our_fn(), 0, repeats, count)
        plain = _per_view_ms(lambda _: plain_fn(), 0, repeats, count) if plain_fn else None
        other = _per_view_ms(lambda _: their_fn(), 0, repeats, count) if their_fn else None
        rows.append((op, ours, mine, plain, theirs, other))
        print(f"{op}: ours {mine:.2f} ms" + (f" (without XLA {plain:.2f} ms)" if plain else "")
              + (f", {theirs} {other:.2f} ms" if other else ""), flush=True)
    return rows


# ---------------------------------------------------------------------------------- report

def command_line(argv):
    shown, skip = [], False
    for arg in argv:
        if skip or arg == "--note" or arg.startswith("--note="):
            skip = arg == "--note"
            continue
        shown.append(shlex.quote(arg))
    return " ".join(["python benchmarks/input_pipeline.py", *shown])


def section(medians, rates, ratios, ops, args, argv, jpeg_kb, load):
    lines = [
        BEGIN,
        f"`{command_line(argv)}` — {datetime.date.today()}, {cpu_count()} CPU cores "
        f"(`nproc`), TensorFlow {tf.__version__}, Keras {keras.__version__}. "
        f"{args.images} generated JPEGs (500×375 and 375×500, quality 90, {jpeg_kb:.0f} kB on "
        f"average) in a temporary folder; batches of {BATCH}; images/second (one image = all "
        f"its views) over {args.batches} batches after the first, from a fresh iterator; "
        f"median of {args.repeats} rounds, the pipelines interleaved within each round.",
        "",
        f"The machine was shared with other jobs (load average {load[0]:.1f} before, "
        f"{load[1]:.1f} after, on {cpu_count()} cores): absolute figures are low and noisy; "
        "the interleaving keeps the ratios fair.",
    ]
    if args.note:
        lines += ["", args.note]
    lines += ["", "| pipeline | views | images/s (median) | rounds | of the ceiling "
                  "(median of the rounds' ratios) |",
              "|---|---|---:|---|---:|"]
    names = {"ceiling": ("(1) ceiling: decode + two plain random crops", "2 × 224"),
             "asymmetric": ("(2) asymmetric two views (`AsymmetricViews`)", "2 × 224"),
             "multicrop": ("(3) multi-crop (`MultiCropViews`)", "2 × 224 + 6 × 96")}
    for name, (label, shape) in names.items():
        each = ", ".join(f"{r:.0f}" for r in rates[name])
        share = statistics.median(r / c for r, c in zip(rates[name], rates["ceiling"]))
        lines.append(f"| {label} | {shape} | {medians[name]:,.0f} | {each} | "
                     f"{100 * share:.0f} % |")
    lines += ["", f"(2) / (1) per round: {', '.join(f'{100 * r:.0f} %' for r in ratios)} "
                  f"(median {100 * statistics.median(ratios):.0f} %; goal ≥ 60 %)."]
    if ops:
        lines += ["", "Single ops, ms per 224² view (batch of 16, median of "
                      f"{args.repeats}), ours against the layer it replaces "
                      "(see `caco_tf/data/augment.py`). The pipeline compiles everything a view "
                      "gets after its crop with XLA (`augment.colour_view`); \"without XLA\" "
                      "runs the same function as plain TF kernels (`augment.JIT_COMPILE = "
                      "False`):", "",
                  "| op | ours (or TF's) | ms | without XLA, ms | Keras / keras-cv | ms |",
                  "|---|---|---:|---:|---|---:|"]

        def ms(value):
            return "—" if value is None else f"{value:.2f}"
        lines += [f"| {op} | {ours} | {ms(mine)} | {ms(plain)} | {theirs} | {ms(other)} |"
                  for op, ours, mine, plain, theirs, other in ops]
    lines.append(END)
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--ops", action="store_true", help="also time single ops")
    parser.add_argument("--note", default="", help="a line to add, e.g. about machine load")
    parser.add_argument("--out", default=os.path.join(ROOT, "BENCHMARKS.md"))
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as folder:
        paths = generate_jpegs(folder, args.images)
        jpeg_kb = np.mean([os.path.getsize(p) for p in paths]) / 1e3
        before = os.getloadavg()[0]
        medians, rates, ratios = measure_pipelines(paths, args.repeats, args.batches)
        ops = measure_ops(paths[1], args.repeats) if args.ops else None
        after = os.getloadavg()[0]
    print(", ".join(f"{n}: {r:,.0f} images/s" for n, r in medians.items())
          + f"; (2)/(1) = {100 * statistics.median(ratios):.0f} %")
    _report.write_section(
        section(medians, rates, ratios, ops, args, argv, jpeg_kb, (before, after)), args.out,
        BEGIN, END, TITLE)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
