"""The bank part of the CaCo step alone, against K: how its cost grows with the bank size.

    python benchmarks/bank_part.py                 # K = 4,096, 65,536, 262,144 -> BENCHMARKS.md
    python benchmarks/bank_part.py --sizes 1024,4096 --output /tmp/b.md

The same functions ``step_time.py`` times inside its ResNet-50 processes (``CaCo.objective``,
the step's own code for the MPPs, the loss and its gradient with respect to the queries and the
bank's update, then the step's diagnostics), at batch B (2B stacked query and key rows) and
D=256, without the encoders: a few minutes instead of an hour, so the growth in K can be checked
after every change.  The encoder is irrelevant here (only its embedding size D is used); every K
runs in this one process, one after the other, medians of ``--steps`` calls after ``--warmup``.
Goal (the performance issue): growth no worse than linear in K, i.e. from one K to the next the
time ratio over the K ratio is at most 1.
"""

import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402
import step_time  # noqa: E402

TITLE = "## Bank part against K (`benchmarks/bank_part.py`)"


def measure(args):
    import keras
    import tensorflow as tf

    from caco_tf import build_model, load_config

    rows = {}
    for size in args.sizes:
        config = load_config(os.path.join(_harness.ROOT, "configs", "mnist.yaml"), [
            f"method.caco.bank_size={size}", f"model.embedding_dim={args.dim}",
            "method.caco.warmup_epochs=0", f"train.batch_size={args.batch}"]
            + (["model.projector_hidden=32", "model.widths=[8, 16, 32, 64]"] if args.tiny
               else []))
        keras.utils.set_random_seed(0)
        model = build_model(config, step_time.STEPS_PER_EPOCH)
        embeddings = [tf.math.l2_normalize(tf.random.stateless_normal(
            [args.batch, args.dim], seed=[seed, 3]), -1) for seed in range(4)]
        rows[size] = {
            part: statistics.median(step_time.timed(lambda f=function: float(f(*embeddings)),
                                                    args.warmup, args.steps))
            for part, function in step_time.bank_functions(tf, model, False).items()}
        rows[size]["tile_rows"] = model.memory_bank.tile_rows
        print(f"K={size:,}: " + ", ".join(f"{p} {1e3 * t:.1f} ms" for p, t in rows[size].items()
                                          if p != "tile_rows"), flush=True)
    return rows


def section(rows, args):
    lines = [f"Batch {args.batch} (so {2 * args.batch} query and {2 * args.batch} key rows), "
             f"D={args.dim}, median of {args.steps} calls after {args.warmup}; "
             "`CaCo.objective` ('algorithm') and the same plus `CaCo.track_diagnostics` ('with "
             "diagnostics'), as timed inside `step_time.py`.", "",
             "| K | rows per tile | algorithm (ms) | with diagnostics (ms) | growth / K growth |",
             "|---:|---:|---:|---:|---:|"]
    linear, previous = True, None
    for size, row in rows.items():
        growth = "—"
        if previous:
            ratio = (row["with_diagnostics"] / rows[previous]["with_diagnostics"]
                     / (size / previous))
            linear &= ratio <= 1
            growth = f"{ratio:.2f}"
        lines.append(f"| {size:,} | {row['tile_rows']:,} | {1e3 * row['algorithm']:.1f} "
                     f"| {1e3 * row['with_diagnostics']:.1f} | {growth} |")
        previous = size
    return lines + ["", f"Growth no worse than linear in K: {'met' if linear else '**missed**'}."]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = _harness.parser(__doc__)
    parser.add_argument("--sizes", default="4096,65536,262144", help="bank sizes K")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args(argv)
    if args.tiny:
        args.sizes, args.batch, args.dim, args.steps, args.warmup = "64,128", 4, 16, 1, 1
    args.sizes = sorted(int(s) for s in args.sizes.split(",") if s)
    lines = _harness.header(__file__, argv) + section(measure(args), args)
    _harness.publish(args, "bank_part", TITLE, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
