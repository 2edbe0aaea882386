"""How long a run takes to stop on SIGTERM (a preemption gives about 30 seconds): the offline
default is started, sent SIGTERM once it trains, and timed until it has exited (the step in
progress, the save with the stream's position, the line, the exit).

    python benchmarks/stop_time.py                         # -> BENCHMARKS.md
    python benchmarks/stop_time.py --repeats 3 --after 20 --output /tmp/s.md
"""

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

TITLE = "## Time to stop on SIGTERM (`benchmarks/stop_time.py`)"


def one_stop(after, folder, settings):
    """Seconds from SIGTERM to the exit of ``python train.py``, signalled ``after`` seconds
    into its first epoch; its exit status and the line it printed last."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    process = subprocess.Popen(
        [sys.executable, os.path.join(_harness.ROOT, "train.py"), "--run-dir",
         os.path.join(folder, "run"), "--quiet"] + [w for s in settings for w in ("--set", s)],
        cwd=folder, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # "images: ..." is printed when the data is ready, just before the model and fit.
    line = process.stdout.readline()
    if not line.startswith("images:"):
        process.kill()
        raise RuntimeError(f"train.py did not start: {line!r}, {process.stderr.read()[-500:]}")
    time.sleep(after)
    start = time.perf_counter()
    process.send_signal(signal.SIGTERM)
    _, error = process.communicate(timeout=300)
    elapsed = time.perf_counter() - start
    return elapsed, process.returncode, (error.strip().splitlines() or [""])[-1]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = _harness.parser(__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--after", type=float, default=20.0,
                        help="seconds of training before the signal")
    parser.add_argument("--set", action="append", default=[], help="passed to train.py")
    args = parser.parse_args(argv)
    times = []
    with tempfile.TemporaryDirectory() as data:
        if args.tiny:
            args.repeats, args.after = 1, 0.0
            args.set = _harness.tiny_training(data) + args.set
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as folder:
                elapsed, status, last = one_stop(args.after, folder, args.set)
            print(f"{elapsed:.2f} s, exit {status}: {last}", flush=True)
            times.append(elapsed)
    command = " ".join(["python train.py"] + [f"--set {s}" for s in args.set])
    lines = _harness.header(__file__, argv) + [
        f"`{command}`, SIGTERM {args.after:g} s after its data was ready; time until the "
        f"process exited, {args.repeats} runs.", "",
        "| | median | min | max |", "|---|---:|---:|---:|",
        f"| seconds from SIGTERM to exit | {statistics.median(times):.2f} | "
        f"{min(times):.2f} | {max(times):.2f} |", "",
        f"Exit status {status}; its last line: `{last}`.", "",
        "For ResNet-50 with its 65,536-row bank the stop is one step plus one save: 2.7 s for "
        "the save (section above) plus the step (on these 2 CPU cores about 12 s in float32, "
        "`step_time.py`; on a GPU machine well under a second)."]
    _harness.publish(args, "stop_time", TITLE, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
