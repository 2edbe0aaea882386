"""The offline default's wall time (``python train.py``): one step per call against N per call,
or this tree against an earlier revision.

    python benchmarks/offline_wall_time.py                    # 2 rounds -> BENCHMARKS.md
    python benchmarks/offline_wall_time.py --against cf75f45  # before/after -> its own section
    python benchmarks/offline_wall_time.py --rounds 1 --per-call 10 --output /tmp/w.md

Each round runs the whole command twice, in turn (the order reversed every other round, so
that the shared machine's drifts hit both alike), each in a fresh run folder, from start to
exit (data, training, kNN, export): with ``--set train.steps_per_execution=1`` and ``=N``; or,
with ``--against REV``, the default of a checkout of REV (``git worktree``, its own train.py,
package and configs/mnist.yaml) and of this tree.  The two must train alike: the final weights
files are compared array by array, the histories but their wall-clock columns (and, against a
revision, the health monitor's ranks, which may differ in their last digits), and the kNN
results.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

ROOT = _harness.ROOT

SECTIONS = {
    "per_call": ("offline_wall_time",
                 "## The offline default's wall time (`benchmarks/offline_wall_time.py`)"),
    "against": ("offline_wall_time_against",
                "## The offline default's wall time against an earlier revision "
                "(`benchmarks/offline_wall_time.py --against REV`)"),
}
TIMING = ("step_ms", "images_per_s", "data_wait", "train_seconds")
RANKS = ("rank_embedding", "rank_features")


def one_run(checkout, settings, run_dir):
    """Seconds of ``python train.py`` of ``checkout`` with ``settings``, start to exit."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=checkout)
    command = [sys.executable, os.path.join(checkout, "train.py"), "--quiet", "--run-dir", run_dir]
    for setting in settings:
        command += ["--set", setting]
    start = time.perf_counter()
    subprocess.run(command, cwd=os.path.dirname(run_dir), env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def same_training(first, second, ignored=()):
    """Whether two run folders hold the same final weights, history and kNN result."""
    import numpy as np

    from caco_tf.training.run_folder import weight_arrays

    a, b = (weight_arrays(os.path.join(d, "checkpoints", "last.weights.h5"))
            for d in (first, second))
    if a.keys() == b.keys():
        weights = all(np.array_equal(a[k], b[k]) for k in a)
    else:  # another revision's file layout (0.3.0 renamed the bank's variables): by value
        weights = sorted(v.tobytes() for v in a.values()) == sorted(v.tobytes() for v in b.values())

    def history(folder):
        with open(os.path.join(folder, "history.json")) as handle:
            return [{k: v for k, v in row.items() if k not in TIMING + tuple(ignored)}
                    for row in json.load(handle)]

    def knn(folder):
        with open(os.path.join(folder, "results.json")) as handle:
            return json.load(handle)["knn_top1"]

    return weights, history(first) == history(second), (knn(first), knn(second))


def worktree(revision, folder):
    """A checkout of ``revision`` in ``folder`` (a detached git worktree of this repository)."""
    path = os.path.join(folder, "checkout")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "--force", path, revision],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return path


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = _harness.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--per-call", type=int, default=10)
    parser.add_argument("--against", metavar="REV", help="compare this tree's default with "
                        "REV's (a commit, tag or branch) instead of one against N steps a call")
    parser.add_argument("--set", action="append", default=[], help="passed to every train.py")
    args = parser.parse_args(argv)
    name, title = SECTIONS["against" if args.against else "per_call"]
    times, checks = {}, []
    with tempfile.TemporaryDirectory() as folder:
        if args.tiny:
            args.rounds, args.per_call = 1, 2
            args.set = _harness.tiny_training(folder) + args.set
        if args.against:
            revision = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", args.against],
                                      capture_output=True, text=True, check=True).stdout.strip()
            head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                  capture_output=True, text=True, check=True).stdout.strip()
            variants = {f"{revision} (before)": (worktree(args.against, folder), args.set),
                        f"{head} (this tree)": (ROOT, args.set)}
            ignored = RANKS
        else:
            variants = {f"{n} per call": (ROOT, args.set + [f"train.steps_per_execution={n}"])
                        for n in (1, args.per_call)}
            ignored = ()
        labels = list(variants)
        try:
            for index in range(args.rounds):
                folders = {}
                for label in (labels if index % 2 == 0 else labels[::-1]):
                    folders[label] = os.path.join(folder, f"run{labels.index(label)}-{index}")
                    times.setdefault(label, []).append(one_run(*variants[label], folders[label]))
                    print(f"round {index + 1}, {label}: {times[label][-1]:.0f} s", flush=True)
                checks.append(same_training(*(folders[label] for label in labels), ignored))
        finally:
            if args.against:
                subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force",
                                os.path.join(folder, "checkout")], check=False)
    first, second = (statistics.median(times[label]) for label in labels)
    weights, histories = all(c[0] for c in checks), all(c[1] for c in checks)
    rows = ["| variant | wall time (s), median | runs (s) |", "|---|---:|---|"]
    rows += [f"| {label} | {statistics.median(times[label]):.0f} | "
             f"{', '.join(f'{t:.0f}' for t in times[label])} |" for label in labels]
    compared = "but wall-clock columns" + (" and ranks" if ignored else "")
    lines = _harness.header(__file__, argv) + [
        "`python train.py` (the offline default, start to exit"
        + "".join(f", `--set {s}`" for s in args.set) + f"), {args.rounds} rounds, the two "
        "in turn.", "",
        *rows, "",
        f"Ratio of the medians: {second / first:.2f} ({first / second:.2f}x faster: "
        f"{labels[1]} against {labels[0]}). Same training: final weights "
        f"{'identical' if weights else 'DIFFERENT'}, histories {compared} "
        f"{'identical' if histories else 'DIFFERENT'}, kNN top-1 "
        f"{', '.join(f'{a:.1f} / {b:.1f} %' for _, _, (a, b) in checks)} ({labels[0]} / "
        f"{labels[1]}, each round)."]
    _harness.publish(args, name, title, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
