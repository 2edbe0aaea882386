"""The pre-training pipeline through tf.data service against the trainer's own cores.

    python benchmarks/data_service.py [--images 200] [--size 224] [--batch 32]
                                      [--batches 8] [--repeats 5] [--note ...]

From ``--images`` generated JPEGs of ImageNet-like size (``input_pipeline.generate_jpegs``),
the asymmetric two views (colour work on the CPU) made three ways, interleaved round by round:
by this process's own pipeline (``data.pretrain_dataset``), and through a local service
(``caco-data-service``: a dispatcher and 1 or 2 worker processes on this machine,
``service.served_pretrain_dataset``: batches made by the workers, sent over gRPC, put back in
order here).  On one machine the workers share its cores with the trainer, so the service
cannot be faster here: what it measures is the service's own cost per batch (serialization,
transfer, reordering), the time a trainer saves only when the workers run elsewhere.  Each
figure: batches after the first of a fresh iterator (a fresh job), median over the rounds.
Writes (or replaces) its section of BENCHMARKS.md (``--output``).
"""

import argparse
import datetime
import os
import signal
import statistics
import subprocess
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
from caco_tf.cli.data_service import free_port  # noqa: E402
from caco_tf.data import augment, service  # noqa: E402

TITLE = "## The input pipeline through tf.data service (`data.service`)"
BEGIN, END = "<!-- data_service: begin -->", "<!-- data_service: end -->"


def start_service(workers, logs):
    """A dispatcher and ``workers`` worker processes: (its address, the processes)."""
    port, processes = free_port(), []

    def start(*args):
        log = open(os.path.join(logs, f"{port}-{len(processes)}.log"), "w")
        process = subprocess.Popen(
            [sys.executable, "-m", "caco_tf.cli.data_service", *args], stdout=subprocess.PIPE,
            stderr=log, text=True, env=dict(os.environ, PYTHONPATH=ROOT), cwd=ROOT)
        processes.append(process)
        print(process.stdout.readline().strip(), flush=True)

    start("dispatcher", "--port", str(port))
    for _ in range(workers):
        start("worker", "--dispatcher", f"127.0.0.1:{port}", "--port", "0", "--host",
              "127.0.0.1")
    return f"127.0.0.1:{port}", processes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--size", type=int, default=224, help="the views' side")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--note", default="", help="a line to add, e.g. about machine load")
    parser.add_argument("--output", default=os.path.join(ROOT, "BENCHMARKS.md"))
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as folder:
        paths = generate_jpegs(folder, args.images)
        source = data.FileSource(np.asarray(paths))
        clusters = {workers: start_service(workers, folder) for workers in (1, 2)}
        try:
            def make(address=None):
                views = augment.AsymmetricViews(args.size)
                if address is None:
                    return data.pretrain_dataset(source, args.batch, views, seed=0,
                                                 skipped=data.SkippedFiles())
                return service.served_pretrain_dataset(source, args.batch, views, address,
                                                       seed=0, skipped=data.SkippedFiles())

            ways = {"this process": make}
            for workers, (address, _) in clusters.items():
                ways[f"service, {workers} worker{'s' if workers > 1 else ''}"] = (
                    lambda address=address: make(address))
            before = os.getloadavg()[0]
            for way in ways.values():  # warm-up: tracing, thread pools, page cache
                images_per_second(way, 1, args.batch)
            rates = {name: [] for name in ways}
            for round_ in range(args.repeats):
                for name, way in ways.items():
                    rates[name].append(images_per_second(way, args.batches, args.batch))
                print(f"round {round_ + 1}: " + ", ".join(
                    f"{name} {r[-1]:.1f}" for name, r in rates.items()), flush=True)
            after = os.getloadavg()[0]
        finally:
            for _, processes in clusters.values():
                for process in processes:
                    process.send_signal(signal.SIGTERM)
                    process.wait(30)
    local = rates["this process"]
    lines = [
        BEGIN,
        _report.command_line("data_service.py", argv) + f" — {datetime.date.today()}, "
        f"{_report.cpu_model()}, TensorFlow {tf.__version__}, Keras {keras.__version__}.",
        "",
        f"{args.images} generated JPEGs (500×375 and 375×500), asymmetric views of "
        f"{args.size} px, batches of {args.batch}; images/second of the whole machine over "
        f"{args.batches} batches after the first of a fresh iterator (a fresh service job), "
        f"median of {args.repeats} rounds, the three ways interleaved within each round. The "
        f"service's workers run on this machine's cores too: the difference per batch is the "
        f"service's own cost. Load average {before:.1f} before, {after:.1f} after.",
    ]
    if args.note:
        lines += ["", args.note]
    lines += ["", "| way | images/s (median) | rounds | ms per batch | the service's cost per "
                  "batch (ms, median of the rounds' differences) |", "|---|---:|---|---:|---:|"]
    for name, each in rates.items():
        cost = statistics.median(1e3 * args.batch * (1 / s - 1 / m)
                                 for s, m in zip(each, local))
        lines.append(f"| {name} | {statistics.median(each):.1f} | "
                     f"{', '.join(f'{r:.1f}' for r in each)} | "
                     f"{1e3 * args.batch / statistics.median(each):.0f} | "
                     f"{'' if name == 'this process' else f'{cost:.0f}'} |")
    lines.append(END)
    _report.publish("\n".join(lines) + "\n", args.output, BEGIN, END, TITLE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
