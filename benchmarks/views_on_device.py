"""Input-pipeline throughput per CPU core with and without ``data.views_on_device``.

    python benchmarks/views_on_device.py [--images 200] [--size 224] [--batch 32]
                                         [--batches 8] [--repeats 5] [--note ...]

From ``--images`` generated JPEGs of ImageNet-like size (500×375 and 375×500, quality 90;
``input_pipeline.generate_jpegs``), images/second per CPU core of ``data.pretrain_dataset``

- with every view finished on the CPU (the default): decode, crops, flips, colour jitter,
  grayscale, blur, solarization, normalization;
- with ``data.views_on_device`` (``augment.ColourOnDevice``): decode, crops and flips only;
  the colour work is left to the train step, on the accelerator, and is not timed here;

for the asymmetric two views and multi-crop (2 × size + 6 × 96, or 6 × size below 96).  Each
figure is the median over ``--repeats`` rounds; in every round the pipelines run one after the
other (interleaved), each from a fresh iterator, timing ``--batches`` batches after the first,
so that a machine shared with other jobs loads them alike.  Per core: images/second divided by
the cores this process may use (``nproc``), over which the pipeline's parallel map spreads.
Writes (or replaces) its section of BENCHMARKS.md (``--output``).
"""

import argparse
import datetime
import os
import statistics
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _report  # noqa: E402
from input_pipeline import generate_jpegs, images_per_second  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from caco_tf import data  # noqa: E402
from caco_tf.data import augment  # noqa: E402

TITLE = "## Per-view work on the accelerator (`data.views_on_device`)"
BEGIN, END = "<!-- views_on_device: begin -->", "<!-- views_on_device: end -->"


def pipelines(paths, size, batch):
    """{(views, where): a function making a fresh dataset}."""
    source = data.FileSource(np.asarray(paths))
    recipes = {"asymmetric": lambda: augment.AsymmetricViews(size),
               "multicrop": lambda: augment.MultiCropViews(size, local_size=min(96, size))}
    made = {}
    for name, views in recipes.items():
        for where, wrap in (("CPU", lambda v: v), ("device", augment.ColourOnDevice)):
            made[name, where] = lambda views=views, wrap=wrap: data.pretrain_dataset(
                source, batch, wrap(views()), seed=0, skipped=data.SkippedFiles())
    return made


# images/s of the authors' own PyTorch CaCo step on one H100 (issue 43: update_sym_network and
# update_multicrop_network, ResNet-50 224 px, batch 256, K = 65,536): (float32, bf16).
ACCELERATOR_RATES = {"two views": (668, 1276), "multi-crop": (432, 823)}


def measure(paths, args):
    """{pipeline: [images/s per core, one per round]}."""
    made = pipelines(paths, args.size, args.batch)
    for make in made.values():  # warm-up: tracing, XLA compilation, thread pools, page cache
        images_per_second(make, 1, args.batch)
    rates = {key: [] for key in made}
    cores = _report.cpu_count()
    for round_ in range(args.repeats):
        for key, make in made.items():
            rates[key].append(images_per_second(make, args.batches, args.batch) / cores)
        print(f"round {round_ + 1}: " + ", ".join(
            f"{v} on {w} {r[-1]:.1f}" for (v, w), r in rates.items()), flush=True)
    return rates


def section(rates, args, argv, jpeg_kb, load):
    lines = [
        BEGIN,
        _report.command_line("views_on_device.py", argv) + f" — {datetime.date.today()}, "
        f"{_report.cpu_model()}, TensorFlow {tf.__version__}, Keras {keras.__version__}.",
        "",
        f"{args.images} generated JPEGs (500×375 and 375×500, quality 90, {jpeg_kb:.0f} kB on "
        f"average); batches of {args.batch}; images/second per CPU core (one image = all its "
        f"views) over {args.batches} batches after the first, from a fresh iterator; median of "
        f"{args.repeats} rounds, the pipelines interleaved within each round. Load average "
        f"{load[0]:.1f} before, {load[1]:.1f} after. \"device\": the input pipeline with "
        f"`data.views_on_device` (decode, crops, flips); the colour work it leaves to the train "
        f"step is not in these figures.",
    ]
    if args.note:
        lines += ["", args.note]
    lines += ["", "| views | colour work on | images/s per core (median) | rounds | "
                  "device / CPU (median of the rounds' ratios) |", "|---|---|---:|---|---:|"]
    for (name, where), each in rates.items():
        ratio = statistics.median(d / c for d, c in zip(each, rates[name, "CPU"]))
        lines.append(f"| {name} | {where} | {statistics.median(each):.1f} | "
                     f"{', '.join(f'{r:.1f}' for r in each)} | {ratio:.2f}x |")
    lines += ["", "Cores of input an accelerator needs at the authors' PyTorch step rates on one "
              "H100 (ResNet-50, batch 256: two views 668 images/s in float32, 1,276 with bf16; "
              "multi-crop 432 and 823), from the medians above; an 8-GPU box needs 8 times as "
              "many (and the colour work the device path leaves to the step costs the "
              "accelerator time not counted here):", "",
              "| views | colour work on | float32 rate | cores | bf16 rate | cores | "
              "8 GPUs at bf16 |", "|---|---|---:|---:|---:|---:|---:|"]
    for (name, where), each in rates.items():
        fp32, bf16 = ACCELERATOR_RATES["multi-crop" if "multi" in name else "two views"]
        per_core = statistics.median(each)
        lines.append(f"| {name} | {where} | {fp32:,} | {fp32 / per_core:.1f} | {bf16:,} | "
                     f"{bf16 / per_core:.1f} | {8 * bf16 / per_core:.0f} |")
    lines.append(END)
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--size", type=int, default=224, help="the (global) views' side")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--note", default="", help="a line to add, e.g. about machine load")
    parser.add_argument("--output", default=os.path.join(ROOT, "BENCHMARKS.md"))
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as folder:
        paths = generate_jpegs(folder, args.images)
        jpeg_kb = np.mean([os.path.getsize(p) for p in paths]) / 1e3
        before = os.getloadavg()[0]
        rates = measure(paths, args)
        after = os.getloadavg()[0]
    _report.publish(section(rates, args, argv, jpeg_kb, (before, after)), args.output, BEGIN,
                    END, TITLE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
