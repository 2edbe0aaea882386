"""What a resume checkpoint costs: its size, the time to save it (the state serialized, written,
flushed to the disk, checksummed, renamed) and to check and restore it, for the offline default
and for the ImageNet ResNet-50 state with its 65,536-row bank; and so the share of training
time that ``train.checkpoint_every_minutes`` costs, and how long a signal's save takes.

    python benchmarks/checkpoint_cost.py                  # -> BENCHMARKS.md
    python benchmarks/checkpoint_cost.py --output /tmp/c.md --repeats 3

The run folder is a temporary folder on the disk that holds ``--dir`` (default: this checkout).
"""

import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

TITLE = "## Resume checkpoints: size and cost (`benchmarks/checkpoint_cost.py`)"
CONFIGS = (("offline default", "mnist.yaml"),
           ("ResNet-50, K = 65,536", "imagenet_resnet50_b256.yaml"))


def measure(config_name, repeats, folder, settings=()):
    import keras

    from caco_tf import build_model, load_config
    from caco_tf.training.run_folder import RunFolder

    config = load_config(os.path.join(_harness.ROOT, "configs", config_name), settings)
    keras.utils.set_random_seed(0)
    model = build_model(config, steps_per_epoch=100)
    saves, restores = [], []
    with tempfile.TemporaryDirectory(dir=folder) as scratch:  # removed afterwards
        run = RunFolder(scratch)
        for index in range(repeats + 1):  # the first of each is a warm-up
            model.optimizer.iterations.assign(index)
            start = time.perf_counter()
            run.write_backup(model, 1, 10, 100, {"loss": [1.0, 10.0]})
            saves.append(time.perf_counter() - start)
            start = time.perf_counter()
            point = run.read_backup()
            model.load_weights(point.weights)
            restores.append(time.perf_counter() - start)
        size = os.path.getsize(point.weights)
    parameters = sum(int(v.numpy().size) for v in model.weights)
    return {"bytes": size, "values": parameters, "save": statistics.median(saves[1:]),
            "restore": statistics.median(restores[1:])}


def section(rows, args):
    every = 10.0
    lines = [f"The run folder on the disk of `{args.dir}`; median of {args.repeats} saves and "
             "restores after one "
             "of each. A save serializes the state in memory (weights, key encoder, bank, bank "
             "momentum, FIFO pointer, optimizer slots and step), writes and flushes it "
             "(`fsync`), computes its CRC-32, renames it into place and rewrites "
             "`training_metadata.json`; a restore checks the size and CRC-32 and loads it.", "",
             "| state | values | file | save (s) | restore (s) | share of training at "
             f"`train.checkpoint_every_minutes: {every:g}` |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, row in rows.items():
        lines.append(f"| {name} | {row['values']:,} | {row['bytes'] / 2 ** 20:,.1f} MiB | "
                     f"{row['save']:.2f} | {row['restore']:.2f} | "
                     f"{100 * row['save'] / (60 * every):.2f} % |")
    return lines + ["", "A signal (SIGTERM, SIGINT) costs one save after the step in progress: "
                    "within a preemption's 30 seconds when the step plus the save above fit in "
                    "it."]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = _harness.parser(__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=tempfile.gettempdir(),
                        help="a folder on the disk to measure (a scratch run folder is made and "
                             "removed in it)")
    parser.add_argument("--only", default="", help="comma-separated config file names")
    args = parser.parse_args(argv)
    settings = []
    if args.tiny:
        args.repeats, args.only = 1, "mnist.yaml"
        settings = ["model.widths=[8, 16, 32, 64]", "method.caco.bank_size=64"]
    rows = {}
    for name, config in CONFIGS:
        if args.only and config not in args.only.split(","):
            continue
        rows[name] = measure(config, args.repeats, args.dir, settings)
        print(name, rows[name], flush=True)
    _harness.publish(args, "checkpoint_cost", TITLE,
                     _harness.header(__file__, argv) + section(rows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
