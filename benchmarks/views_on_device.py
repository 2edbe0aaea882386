"""Input-pipeline throughput per CPU core with and without ``data.views_on_device``, and the
cores of input an accelerator needs.

    python benchmarks/views_on_device.py [--images 200] [--size 224] [--batch 32]
                                         [--batches 8] [--repeats 5] [--note ...]

From ``--images`` generated JPEGs of ImageNet-like size (500×375 and 375×500, quality 90;
``input_pipeline.generate_jpegs``), the images a CPU core turns into views each second with
``data.pretrain_dataset``

- with every view finished on the CPU (the default): decode, crops, flips, colour jitter,
  grayscale, blur, solarization, normalization;
- with ``data.views_on_device`` (``augment.ColourOnDevice``): decode, crops and flips only;
  the colour work is left to the train step, on the accelerator, and is not timed here;

for the asymmetric two views and multi-crop (2 × size + 6 × 96, or 6 × size below 96).  Each
figure is the median over ``--repeats`` rounds; in every round the pipelines run one after the
other (interleaved), each from a fresh iterator, over ``--batches`` batches after the first.
Per core, two ways: the images over the CPU time this process spent meanwhile (all its
threads: what a core of work makes, whatever else the machine runs), and images/second over
the cores this process may use (``nproc``; lower when other jobs share them).  Cores an
accelerator needs: its step rate over the first.
"""

import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402
from input_pipeline import generate_jpegs  # noqa: E402

TITLE = "## Per-view work on the accelerator (`data.views_on_device`)"
# images/s of the authors' own PyTorch CaCo step on one H100 (issue 43: update_sym_network and
# update_multicrop_network, ResNet-50 224 px, batch 256, K = 65,536): (float32, bf16).
ACCELERATOR_RATES = {"asymmetric": (668, 1276), "multicrop": (432, 823)}
VIEWS = {"asymmetric": "two views (`asymmetric`)", "multicrop": "multi-crop (`multicrop`)"}


def per_core(make, args, wall_rates):
    """Images per CPU-second of this process over ``args.batches`` batches after the first of
    a fresh iterator; appends the images/second per core of the machine to ``wall_rates``."""
    iterator = iter(make())
    next(iterator)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(args.batches):
        next(iterator)
    images = args.batches * args.batch
    wall_rates.append(images / (time.perf_counter() - wall) / _harness.cpu_count())
    return images / (time.process_time() - cpu)


def pipelines(paths, args, wall_rates):
    """{(views, where the colour work runs): a call returning images per CPU-second}."""
    import numpy as np

    from caco_tf import data
    from caco_tf.data import augment

    source = data.FileSource(np.asarray(paths))
    recipes = {"asymmetric": lambda: augment.AsymmetricViews(args.size),
               "multicrop": lambda: augment.MultiCropViews(args.size, min(96, args.size),
                                                           args.local_crops)}
    made = {}
    for name, views in recipes.items():
        for where, wrap in (("CPU", lambda v: v), ("device", augment.ColourOnDevice)):
            def make(views=views, wrap=wrap):
                return data.pretrain_dataset(source, args.batch, wrap(views()), seed=0,
                                             skipped=data.SkippedFiles())
            wall_rates[name, where] = []
            made[name, where] = lambda make=make, key=(name, where): per_core(
                make, args, wall_rates[key])
    return made


def section(rates, wall_rates, args, jpeg_kb, load):
    local = f"{args.local_crops} × {min(96, args.size)}"
    lines = [
        f"{args.images} generated JPEGs (500×375 and 375×500, quality 90, {jpeg_kb:.0f} kB on "
        f"average); views of {args.size} px (multi-crop: 2 × {args.size} + {local}), batches "
        f"of {args.batch}; one image = all its views; over {args.batches} batches after the "
        f"first, from a fresh iterator; median of {args.repeats} rounds, the pipelines "
        f"interleaved within each round. Load average {load[0]:.1f} before, {load[1]:.1f} "
        f"after. \"device\": the input pipeline with `data.views_on_device` (decode, crops, "
        f"flips); the colour work it leaves to the train step is not in these figures.", ""]
    if args.note:
        lines += [args.note, ""]
    lines += ["| views | colour work on | images per CPU-second (median) | rounds | "
              "images/s per core of the machine | device / CPU (median of the rounds' ratios) |",
              "|---|---|---:|---|---:|---:|"]
    for (name, where), each in rates.items():
        ratio = statistics.median(d / c for d, c in zip(each, rates[name, "CPU"]))
        lines.append(f"| {VIEWS[name]} | {where} | {statistics.median(each):.1f} | "
                     f"{', '.join(f'{r:.1f}' for r in each)} | "
                     f"{statistics.median(wall_rates[name, where]):.1f} | {ratio:.2f}x |")
    lines += ["", "Cores of input one accelerator needs at the authors' PyTorch step rates on "
              "one H100 (ResNet-50, batch 256, K = 65,536: two views 668 images/s in float32, "
              "1,276 with bf16; multi-crop 432 and 823): the rate over the images per "
              "CPU-second above. An 8-GPU box needs 8 times as many, and the colour work the "
              "device path leaves to the step costs accelerator time not counted here:", "",
              "| views | colour work on | cores at float32 (668 / 432 images/s) | cores at bf16 "
              "(1,276 / 823 images/s) | 8 GPUs at bf16 |", "|---|---|---:|---:|---:|"]
    for (name, where), each in rates.items():
        fp32, bf16 = ACCELERATOR_RATES[name]
        core = statistics.median(each)
        lines.append(f"| {VIEWS[name]} | {where} | {fp32 / core:.1f} | {bf16 / core:.1f} | "
                     f"{8 * bf16 / core:.0f} |")
    return lines


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = _harness.parser(__doc__)
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--size", type=int, default=224, help="the (global) views' side")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--local-crops", type=int, default=6, help="multi-crop's local crops")
    parser.add_argument("--note", default="", help="a line to add, e.g. about machine load")
    args = parser.parse_args(argv)
    if args.tiny:
        args.images, args.size, args.batch, args.batches, args.repeats = 8, 32, 4, 1, 1
        args.local_crops = 1

    import numpy as np

    with tempfile.TemporaryDirectory() as folder:
        paths = generate_jpegs(folder, args.images)
        jpeg_kb = np.mean([os.path.getsize(p) for p in paths]) / 1e3
        before, wall_rates = os.getloadavg()[0], {}
        rates = _harness.interleave(pipelines(paths, args, wall_rates), args.repeats,
                                    warmup=0 if args.tiny else 1, show="{:.1f}")
        after = os.getloadavg()[0]
    for key, each in wall_rates.items():  # the warm-up round's
        del each[:len(each) - args.repeats]
    lines = _harness.header(__file__, argv) + section(rates, wall_rates, args, jpeg_kb,
                                                      (before, after))
    _harness.publish(args, "views_on_device", TITLE, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
