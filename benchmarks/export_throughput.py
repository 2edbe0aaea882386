"""Feature-extraction throughput: the exported SavedModel against keras ``predict``.

    python benchmarks/export_throughput.py [--batches 20] [--repeats 5] [--budget 120] [--note ...]

For each backbone (random weights: throughput does not depend on them), images/second of
``serving_default`` on uint8 batches at the model's size (preprocessing in the graph) through
the SavedModel loaded with ``tf.saved_model.load``, and of ``backbone.predict`` on the same
batches already normalized to float.  Each figure is the median of ``--repeats`` passes over
``--batches`` batches of 256 after one warm-up pass; a backbone gets fewer batches when its
estimated time would exceed ``--budget`` seconds (``cifar_resnet18`` on a small CPU).
Writes (or replaces) the "SavedModel export throughput" section of BENCHMARKS.md at the
repository root.
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

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from caco_tf.data import augment  # noqa: E402
from caco_tf.data.images import normalize_pixels  # noqa: E402
from caco_tf.nets import backbones  # noqa: E402
from caco_tf.serving import export  # noqa: E402

TITLE = "## SavedModel export throughput"
BATCH = 256
# name, image size, channels, mean, std (CIFAR-10 statistics for the colour model)
MODELS = [
    ("small_convnet", 28, 1, augment.MNIST_MEAN, augment.MNIST_STD),
    ("cifar_resnet18", 32, 3, [0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]),
]


def median_seconds(run, repeats):
    run()  # warm-up: tracing, thread pools
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(name, size, channels, mean, std, batches, repeats, budget, directory):
    """(SavedModel images/s, predict images/s, batches used), or None if even 1 batch is over
    the time budget; fewer batches are used when all of them would be."""
    keras.utils.set_random_seed(0)
    backbone = backbones.build_backbone(name, (size, size, channels))
    path = export.export_backbone(backbone, directory, size, channels, mean, std, model_name=name)
    serve = tf.saved_model.load(path).signatures["serving_default"]
    rng = np.random.default_rng(0)
    first = rng.integers(0, 256, (BATCH, size, size, channels), dtype=np.uint8)
    start = time.perf_counter()
    for _ in range(2):
        serve(images=first)["features"].numpy()
    per_batch = (time.perf_counter() - start) / 2  # an over-estimate: includes start-up
    # Warm-up plus repeats, for both methods, assuming predict is about as fast.
    batches = min(batches, int(budget / (per_batch * (repeats + 1) * 2)))
    if batches < 1:
        return None
    images = [first] + [rng.integers(0, 256, (BATCH, size, size, channels), dtype=np.uint8)
                        for _ in range(batches - 1)]
    floats = normalize_pixels(np.concatenate(images) / 255.0, mean,
                              np.asarray(std)).astype(np.float32)

    def saved_model_pass():
        for batch in images:
            serve(images=batch)["features"].numpy()

    def predict_pass():
        backbone.predict(floats, batch_size=BATCH, verbose=0)

    count = batches * BATCH
    return (count / median_seconds(saved_model_pass, repeats),
            count / median_seconds(predict_pass, repeats), batches)


def cpu_count():
    try:
        return len(os.sched_getaffinity(0))  # what `nproc` reports
    except AttributeError:
        return os.cpu_count()


def command_line(argv):
    """The command as run, less ``--note`` (printed as its own paragraph)."""
    shown, skip = [], False
    for arg in argv:
        if skip or arg == "--note" or arg.startswith("--note="):
            skip = arg == "--note"
            continue
        shown.append(shlex.quote(arg))
    return " ".join(["python benchmarks/export_throughput.py", *shown])


def section(rows, args, argv):
    gpus = len(tf.config.list_physical_devices("GPU"))
    lines = [
        TITLE, "",
        f"`{command_line(argv)}` — {datetime.date.today()}, {cpu_count()} CPU cores (`nproc`), "
        f"{gpus or 'no'} GPU{'s' if gpus != 1 else ''}, "
        f"TensorFlow {tf.__version__}, Keras {keras.__version__}. Images/second of feature "
        f"extraction, batch {BATCH}, up to {args.batches} batches (fewer where the "
        f"{args.budget:.0f} s budget requires), median of {args.repeats} passes after a "
        "warm-up. SavedModel: `serving_default` of the loaded SavedModel on uint8 images "
        "(cast, normalization and the size check in the graph). Keras: "
        "`backbone.predict` on the same images already normalized to float32.",
    ]
    if args.note:
        lines += ["", args.note]
    lines += ["", "| backbone | input | batches | SavedModel (images/s) "
                  "| keras predict (images/s) | SavedModel / predict |",
              "|---|---|---:|---:|---:|---:|"]
    for name, shape, result in rows:
        if result is None:
            lines.append(f"| {name} | {shape} | skipped: one batch exceeds the "
                         f"{args.budget:.0f} s budget | | | |")
        else:
            saved, predict, batches = result
            lines.append(f"| {name} | {shape} | {batches} | {saved:,.0f} | {predict:,.0f} "
                         f"| {saved / predict:.2f} |")
    return "\n".join(lines) + "\n"


def write_section(text, path):
    """Replace the section in ``path`` (up to the next "## " heading), or append it."""
    old = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    if TITLE in old:
        start = old.index(TITLE)
        end = old.find("\n## ", start + len(TITLE))
        new = old[:start] + text + (old[end:] if end >= 0 else "")
    else:
        new = old.rstrip("\n") + "\n\n" + text
    with open(path, "w") as handle:
        handle.write(new)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget", type=float, default=120.0,
                        help="skip a backbone whose estimated time exceeds this (seconds)")
    parser.add_argument("--note", default="", help="a line to add, e.g. about machine load")
    parser.add_argument("--out", default=os.path.join(ROOT, "BENCHMARKS.md"))
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)

    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for name, size, channels, mean, std in MODELS:
            result = measure(name, size, channels, mean, std, args.batches, args.repeats,
                             args.budget, directory)
            shape = f"{size}×{size}×{channels}"
            rows.append((name, shape, result))
            print(f"{name} {shape}: " + (
                f"SavedModel {result[0]:,.0f} images/s, predict {result[1]:,.0f} images/s, "
                f"ratio {result[0] / result[1]:.2f} ({result[2]} batches)" if result
                else "skipped (over the time budget)"))
    write_section(section(rows, args, argv), args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
