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

import os
import signal
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402
from input_pipeline import generate_jpegs, images_per_second  # noqa: E402

TITLE = "## The input pipeline through tf.data service (`data.service`)"


def start_service(workers, logs):
    """A dispatcher and ``workers`` worker processes: (its address, the processes)."""
    from caco_tf.cli.data_service import free_port

    port, processes = free_port(), []

    def start(*args):
        log = open(os.path.join(logs, f"{port}-{len(processes)}.log"), "w")
        process = subprocess.Popen(
            [sys.executable, "-m", "caco_tf.cli.data_service", *args], stdout=subprocess.PIPE,
            stderr=log, text=True, env=dict(os.environ, PYTHONPATH=_harness.ROOT),
            cwd=_harness.ROOT)
        processes.append(process)
        print(process.stdout.readline().strip(), flush=True)

    start("dispatcher", "--port", str(port))
    for _ in range(workers):
        start("worker", "--dispatcher", f"127.0.0.1:{port}", "--port", "0", "--host",
              "127.0.0.1")
    return f"127.0.0.1:{port}", processes


def measure(paths, args, folder):
    """{way: [images/s of each round]}: this process's pipeline and the services'."""
    import numpy as np

    from caco_tf import data
    from caco_tf.data import augment, service

    source = data.FileSource(np.asarray(paths))
    clusters = {workers: start_service(workers, folder) for workers in args.workers}
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
        return _harness.interleave(
            {name: lambda way=way: images_per_second(way, args.batches, args.batch)
             for name, way in ways.items()}, args.repeats, warmup=0 if args.tiny else 1,
            show="{:.1f}")
    finally:
        for _, processes in clusters.values():
            for process in processes:
                process.send_signal(signal.SIGTERM)
                process.wait(30)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = _harness.parser(__doc__)
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--size", type=int, default=224, help="the views' side")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--note", default="", help="a line to add, e.g. about machine load")
    args = parser.parse_args(argv)
    args.workers = (1, 2)
    if args.tiny:
        args.images, args.size, args.batch, args.batches, args.repeats = 8, 32, 4, 1, 1
        args.workers = (1,)

    with tempfile.TemporaryDirectory() as folder:
        paths = generate_jpegs(folder, args.images)
        before = os.getloadavg()[0]
        rates = measure(paths, args, folder)
        after = os.getloadavg()[0]
    local = rates["this process"]
    lines = _harness.header(__file__, argv) + [
        f"{args.images} generated JPEGs (500×375 and 375×500), asymmetric views of "
        f"{args.size} px, batches of {args.batch}; images/second of the whole machine over "
        f"{args.batches} batches after the first of a fresh iterator (a fresh service job), "
        f"median of {args.repeats} rounds, the ways interleaved within each round. The "
        f"service's workers run on this machine's cores too: the difference per batch is the "
        f"service's own cost. Load average {before:.1f} before, {after:.1f} after.", ""]
    if args.note:
        lines += [args.note, ""]
    lines += ["| way | images/s (median) | rounds | ms per batch | the service's cost per "
              "batch (ms, median of the rounds' differences) |", "|---|---:|---|---:|---:|"]
    for name, each in rates.items():
        cost = statistics.median(1e3 * args.batch * (1 / s - 1 / m)
                                 for s, m in zip(each, local))
        lines.append(f"| {name} | {statistics.median(each):.1f} | "
                     f"{', '.join(f'{r:.1f}' for r in each)} | "
                     f"{1e3 * args.batch / statistics.median(each):.0f} | "
                     f"{'' if name == 'this process' else f'{cost:.0f}'} |")
    _harness.publish(args, "data_service", TITLE, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
