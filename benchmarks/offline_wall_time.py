"""The offline default's wall time (``python train.py``), one step per call against N per call.

    python benchmarks/offline_wall_time.py                    # 2 rounds -> BENCHMARKS.md
    python benchmarks/offline_wall_time.py --rounds 1 --per-call 10 --output /tmp/w.md

Each round runs the whole command twice, ``--set train.steps_per_execution=1`` and ``=N``, in
turn (the order reversed every other round, so that the shared machine's drifts hit both
alike), each in a fresh run folder, from start to exit (data, training, kNN, export).  The two
must train alike: the final weights files are compared array by array, the histories but their
wall-clock columns, and the kNN results.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import _report  # noqa: E402

BEGIN, END = "<!-- offline_wall_time:begin -->", "<!-- offline_wall_time:end -->"
TITLE = "## The offline default's wall time (`benchmarks/offline_wall_time.py`)"
TIMING = ("step_ms", "images_per_s", "data_wait")


def one_run(per_call, run_dir):
    """Seconds of ``python train.py`` with ``per_call`` steps per call, start to exit."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    start = time.perf_counter()
    subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--quiet", "--run-dir",
                    run_dir, "--set", f"train.steps_per_execution={per_call}"],
                   cwd=os.path.dirname(run_dir), env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def same_training(first, second):
    """Whether two run folders hold the same final weights, history and kNN result."""
    from caco_tf.training.run_folder import weight_arrays

    a, b = (weight_arrays(os.path.join(d, "checkpoints", "last.weights.h5"))
            for d in (first, second))
    weights = a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)

    def history(folder):
        with open(os.path.join(folder, "history.json")) as handle:
            return [{k: v for k, v in row.items() if k not in TIMING}
                    for row in json.load(handle)]

    def knn(folder):
        with open(os.path.join(folder, "results.json")) as handle:
            return json.load(handle)["knn_top1"]

    return weights, history(first) == history(second), (knn(first), knn(second))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--per-call", type=int, default=10)
    parser.add_argument("--output", default=os.path.join(ROOT, "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    variants = (1, args.per_call)
    times = {n: [] for n in variants}
    checks = []
    with tempfile.TemporaryDirectory() as folder:
        for index in range(args.rounds):
            order = variants if index % 2 == 0 else variants[::-1]
            folders = {}
            for per_call in order:
                folders[per_call] = os.path.join(folder, f"n{per_call}-{index}")
                times[per_call].append(one_run(per_call, folders[per_call]))
                print(f"round {index + 1}, {per_call} per call: {times[per_call][-1]:.0f} s",
                      flush=True)
            checks.append(same_training(*(folders[n] for n in variants)))
    one, many = (statistics.median(times[n]) for n in variants)
    weights, histories = all(c[0] for c in checks), all(c[1] for c in checks)
    rows = ["| steps per call | wall time (s), median | runs (s) |", "|---:|---:|---|"]
    rows += [f"| {n} | {statistics.median(times[n]):.0f} | "
             f"{', '.join(f'{t:.0f}' for t in times[n])} |" for n in variants]
    text = "\n".join([
        BEGIN, _report.command_line("offline_wall_time.py", argv), "",
        f"{_report.cpu_model()}; {time.strftime('%Y-%m-%d')}; `python train.py` (the offline "
        f"default, start to exit), {args.rounds} rounds, the two settings in turn.", "",
        *rows, "",
        f"Ratio of the medians: {many / one:.2f} ({one / many:.2f}x faster with "
        f"{args.per_call} steps per call). Same training: final weights "
        f"{'identical' if weights else 'DIFFERENT'}, histories but wall-clock columns "
        f"{'identical' if histories else 'DIFFERENT'}, kNN top-1 "
        f"{', '.join(f'{a:.1f} / {b:.1f} %' for _, _, (a, b) in checks)} (one / "
        f"{args.per_call} per call, each round).", END]) + "\n"
    _report.publish(text, args.output, BEGIN, END, TITLE)


if __name__ == "__main__":
    main()
