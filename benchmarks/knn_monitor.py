"""The kNN monitor at scale: its time and peak memory as the training set grows.

    python benchmarks/knn_monitor.py  # 10 k, 100 k, 1 M images -> BENCHMARKS.md
    python benchmarks/knn_monitor.py --sizes 10000 --output /tmp/k.md     # a quick look

Generated labelled images (16×16 RGB PNGs of 100 classes, in a random class order, as TFRecord
shards like ImageNet's; a separate held-out set of 20,000) are written once under ``--data``.
For each training-set size, one process builds the monitor as a run does
(``evaluation.monitor.knn_monitor``: class-balanced samples of ``evaluation.knn_train_images``
training and ``knn_test_images`` held-out images, kNN by blocks) and times one measurement, then
reports its peak resident memory.  For comparison, the same process size with the monitor as it
was before (every training image's features, one process) up to ``--unbounded-limit`` images.
The monitor's share of an epoch: its time over the epoch's (steps × the median step time of the
same model, measured here on the generated images' batch size).
"""

import argparse
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

TITLE = "## The kNN monitor at scale (`benchmarks/knn_monitor.py`)"
CLASSES, SIZE, PER_SHARD = 100, 16, 50_000


def write_images(folder, count, seed):
    """``count`` labelled PNGs in TFRecord shards under ``folder`` (once; kept)."""
    import numpy as np
    import tensorflow as tf
    from PIL import Image

    done = os.path.join(folder, "done")
    if os.path.exists(done):
        return os.path.join(folder, "part-*")
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    colours = np.random.default_rng(1).integers(0, 256, (CLASSES, 3))
    for shard, start in enumerate(range(0, count, PER_SHARD)):
        with tf.io.TFRecordWriter(os.path.join(folder, f"part-{shard:05d}")) as writer:
            for _ in range(min(PER_SHARD, count - start)):
                label = int(rng.integers(CLASSES))
                pixels = np.clip(colours[label] + rng.normal(0, 40, (SIZE, SIZE, 3)), 0, 255)
                buffer = io.BytesIO()
                Image.fromarray(pixels.astype(np.uint8)).save(buffer, "PNG")
                feature = {"image/encoded": tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=[buffer.getvalue()])),
                    "image/class/label": tf.train.Feature(
                        int64_list=tf.train.Int64List(value=[label]))}
                writer.write(tf.train.Example(features=tf.train.Features(
                    feature=feature)).SerializeToString())
    open(done, "w").close()
    return os.path.join(folder, "part-*")


def measure(train_glob, held_out_glob, unbounded, batch, warmup=3, steps=10):
    """In this process: one monitor measurement (bounded, or every image's features), its
    time and this process's peak RSS; and the median of ``steps`` train steps of the same
    model, after ``warmup``."""
    import numpy as np

    from caco_tf import build, data
    from caco_tf.evaluation.monitor import knn_monitor
    from caco_tf.evaluation import knn
    from caco_tf import RunSettings, load_config

    config = load_config(None, [
        f"data.source=tfrecord:{train_glob}", f"data.held_out=tfrecord:{held_out_glob}",
        f"data.image_size={SIZE}", "data.channels=3", "data.views=asymmetric",
        "model.projector_hidden=256", "model.embedding_dim=64", "method.caco.bank_size=4096",
        f"train.batch_size={batch}", "evaluation.batch_size=500"])
    train, held_out = build.load_data(RunSettings.of(config).data)
    views = build.run_views(config)
    model = build.build_model(config, steps_per_epoch=len(train) // batch)
    start = time.perf_counter()
    if unbounded:  # as before: every training image, one process, all features in memory
        train_features, train_labels = knn.extract_features(
            model.backbone, build.eval_dataset(RunSettings.of(config), views, train))
        test_features, test_labels = knn.extract_features(
            model.backbone, build.eval_dataset(RunSettings.of(config), views, held_out))
        knn.knn_accuracy(train_features, train_labels, test_features, test_labels, 200)
    else:
        monitor = knn_monitor(RunSettings.of(config), views, train, held_out)
        monitor.set_model(model)
        monitor.measure()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # GB
    # The same model's training step on the same images, for the monitor's share of an epoch.
    iterator = iter(data.pretrain_dataset(train, batch, views, seed=0, image_size=SIZE,
                                          channels=3))
    function = model.make_train_function()
    for _ in range(warmup):  # tracing, the pipeline's start
        function(iterator)
    times = []
    for _ in range(steps):
        begin = time.perf_counter()
        function(iterator)
        times.append(time.perf_counter() - begin)
    return {"seconds": seconds, "peak_gb": peak, "images": len(train),
            "step_seconds": float(np.median(times))}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = _harness.parser(__doc__)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--held-out", type=int, default=20_000, help="held-out images")
    parser.add_argument("--unbounded-limit", type=int, default=100000,
                        help="measure the unbounded monitor up to this many images")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--data", default=os.path.join(_harness.ROOT, "runs", "knn_monitor_data"))
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        train_glob, held_out_glob, unbounded, batch = args.child
        print(json.dumps(measure(train_glob, held_out_glob, unbounded == "1", int(batch))))
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        if args.tiny:
            args.sizes, args.held_out, args.batch, args.data = "200", 100, 16, scratch
            args.unbounded_limit = 0
        rows = measure_sizes(args)
    lines = _harness.header(__file__, argv) + section(rows, args)
    _harness.publish(args, "knn_monitor", TITLE, lines)
    return 0


def measure_sizes(args):
    """A row for each training-set size and monitor, each measured in its own process (in this
    one with ``--tiny``)."""
    held_out = write_images(os.path.join(args.data, f"held_out_{args.held_out}"), args.held_out,
                            seed=99)
    rows = []
    for size in [int(size) for size in args.sizes.split(",")]:
        images = write_images(os.path.join(args.data, f"train_{size}"), size, seed=size)
        for unbounded in ([False, True] if size <= args.unbounded_limit else [False]):
            if args.tiny:
                row = measure(images, held_out, unbounded, args.batch, warmup=1, steps=2)
            else:
                output = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), "--child", images, held_out,
                     str(int(unbounded)), str(args.batch)], capture_output=True, text=True,
                    check=True).stdout
                row = json.loads(output.strip().splitlines()[-1])
            row["unbounded"] = unbounded
            rows.append(row)
            print(row, flush=True)
    return rows


def section(rows, args):
    from caco_tf import DEFAULTS

    settings = DEFAULTS["evaluation"]
    lines = [f"Generated 16×16 RGB images of {CLASSES} classes in TFRecord shards (held-out: "
             f"{args.held_out:,}); small ConvNet backbone; defaults `knn_train_images` "
             f"{settings['knn_train_images']:,}, `knn_test_images` "
             f"{settings['knn_test_images']:,}, `knn_monitor_k` 200, monitor every "
             f"{settings['knn_monitor_every']} epochs. One measurement per row, in its own "
             f"process (peak RSS includes TensorFlow's runtime and the model); the epoch is "
             f"the images / batch {args.batch} steps at the median step time measured in the "
             f"same process.",
             "",
             "| training images | monitor | one measurement (s) | peak RSS (GB) | epoch (s) "
             "| share of an epoch | amortized (every 5 epochs) |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        epoch = row["images"] // args.batch * row["step_seconds"]
        share = row["seconds"] / epoch
        lines.append(
            f"| {row['images']:,} | {'every image (before)' if row['unbounded'] else 'bounded'} "
            f"| {row['seconds']:.1f} | {row['peak_gb']:.2f} | {epoch:.0f} | {100 * share:.1f} % "
            f"| {100 * share / settings['knn_monitor_every']:.2f} % |")
    return lines + ["", *imagenet_computation(settings)]


def imagenet_computation(settings):
    """The same costs written out for ImageNet-1k with ResNet-50 at 224 px (no GPU here)."""
    forward = 4.1e9 * 2  # FLOPs of one ResNet-50 forward at 224 px (4.1 G multiply-adds)
    images, width = 1_281_167, 2048
    monitor_images = settings["knn_train_images"] + settings["knn_test_images"]
    # An epoch: two views, each a query forward + backward (about 3 forwards) and a key forward.
    epoch = images * 2 * 4 * forward
    monitor = monitor_images * forward
    every = settings["knn_monitor_every"]
    return [
        f"ImageNet-1k on 8 GPUs, ResNet-50 at 224 px (computed, not measured): an epoch is "
        f"{images:,} images × 2 views × (a query forward and backward ≈ 3 forwards, and a key "
        f"forward) × {forward / 1e9:.1f} GFLOP ≈ {epoch / 1e15:.0f} PFLOP. One bounded "
        f"measurement is {monitor_images:,} forwards ≈ {monitor / 1e15:.2f} PFLOP, split over "
        f"the 8 replicas like the training step: **{100 * monitor / epoch:.2f} % of an epoch**, "
        f"{100 * monitor / epoch / every:.2f} % amortized at every {every} epochs (the kNN "
        f"itself, {settings['knn_test_images']:,} × {settings['knn_train_images']:,} × {width} "
        f"multiply-adds ≈ "
        f"{2 * settings['knn_test_images'] * settings['knn_train_images'] * width / 1e12:.0f} "
        f"TFLOP, is negligible). Features held: {monitor_images:,} × {width} × 4 B = "
        f"{monitor_images * width * 4 / 1e6:.0f} MB, against {images * width * 4 / 1e9:.1f} GB "
        f"for every training image (the monitor before), which the chief alone computed "
        f"({images * forward / 1e15:.1f} PFLOP on one GPU ≈ "
        f"{100 * images * forward / epoch * 8:.0f} % "
        f"of an 8-GPU epoch's wall time)."]


if __name__ == "__main__":
    sys.exit(main())
