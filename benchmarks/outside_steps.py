"""Where a run's wall time goes outside its steps: ``python train.py`` (the offline default,
or ``--set`` changes such as fewer epochs) run once, its wall time split into the start
(imports, data, model, up to ``fit``), the steps (history.json's ``step_ms`` × steps; the first
epoch's excess over the others' median is the compilation), each epoch's end (by callback:
the kNN monitor, the health ranks, the resume backup, the weights checkpoint, history and
TensorBoard) and the run's end (the end-of-run kNN, ``model.keras``, the SavedModel).  The
callbacks and end-of-run calls are timed from inside the process (their functions wrapped);
the rest is what is left.

    python benchmarks/outside_steps.py                          # -> BENCHMARKS.md
    python benchmarks/outside_steps.py --set train.epochs=4 --output /tmp/o.md
"""

import atexit
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

TITLE = "## A run's time outside its steps (`benchmarks/outside_steps.py`)"


def child(record, argv):
    """``train.py argv`` with its epoch-end callbacks and end-of-run calls timed into the JSON
    file ``record`` at exit."""
    launched = time.perf_counter()
    import keras

    from caco_tf import data, pretrain
    from caco_tf.cli import train
    from caco_tf.evaluation import monitor
    from caco_tf.serving import export
    from caco_tf.training import callbacks

    spent = collections.defaultdict(float)
    marks = {}

    def timed(owner, name, label):
        function = getattr(owner, name)

        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[label] += time.perf_counter() - start

        setattr(owner, name, wrapper)

    for owner, label in ((monitor.KNNMonitor, "kNN monitor"),
                         (callbacks.HealthMonitor, "health ranks"),
                         (callbacks.Resume, "resume backup"),
                         (callbacks.Checkpoint, "weights checkpoint"),
                         (callbacks.HistoryJSON, "history.json"),
                         (keras.callbacks.TensorBoard, "TensorBoard"),
                         (callbacks.PreciseBatchNorm, "precise BatchNorm")):
        timed(owner, "on_epoch_end", label)
    timed(pretrain, "knn_top1", "end-of-run kNN")
    timed(export, "export_backbone", "SavedModel")
    timed(keras.Model, "save", "model.keras")
    fit = keras.Model.fit

    def marked_fit(self, *args, **kwargs):
        marks["fit"] = time.perf_counter() - launched
        try:
            return fit(self, *args, **kwargs)
        finally:
            marks["fit_end"] = time.perf_counter() - launched

    keras.Model.fit = marked_fit
    # Each epoch's begin, last step and end (the skipped-files report is the last callback).
    epochs = collections.defaultdict(dict)
    begin, report = callbacks.Throughput.on_epoch_begin, data.SkippedFiles.report

    def marked_begin(self, epoch, logs=None):
        epochs[epoch]["begin"] = time.perf_counter() - launched
        return begin(self, epoch, logs)

    def marked_report(self, when="this pass"):
        if when.startswith("epoch "):
            epochs[int(when.split()[1]) - 1]["end"] = time.perf_counter() - launched
        return report(self, when)

    callbacks.Throughput.on_epoch_begin = marked_begin
    data.SkippedFiles.report = marked_report

    def dump():
        with open(record, "w") as handle:
            json.dump({"spent": spent, "marks": marks, "epochs": epochs,
                       "exit": time.perf_counter() - launched}, handle)

    atexit.register(dump)
    return train.main(argv)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        return child(argv[1], argv[2:])
    parser = _harness.parser(__doc__)
    parser.add_argument("--set", action="append", default=[], help="passed to train.py")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        if args.tiny:
            args.set = _harness.tiny_training(folder) + args.set
        run_dir, record = os.path.join(folder, "run"), os.path.join(folder, "record.json")
        command = [sys.executable, os.path.abspath(__file__), "--child", record, "--quiet",
                   "--run-dir", run_dir] + [w for s in args.set for w in ("--set", s)]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
        start = time.perf_counter()
        subprocess.run(command, cwd=folder, env=env, check=True, timeout=6 * 3600)
        wall = time.perf_counter() - start
        inside = json.load(open(record))
        history = json.load(open(os.path.join(run_dir, "history.json")))
        metadata = json.load(open(os.path.join(run_dir, "backup", "training_metadata.json")))
        steps_per_epoch = metadata["checkpoints"][0]["steps_per_epoch"]
    step_ms = [row["step_ms"] for row in history]
    usual = statistics.median(step_ms[1:]) if len(step_ms) > 1 else step_ms[0]
    steps = sum(step_ms) * steps_per_epoch / 1000
    compiling = (step_ms[0] - usual) * steps_per_epoch / 1000
    spent, marks = inside["spent"], inside["marks"]
    epoch_parts = ("kNN monitor", "health ranks", "precise BatchNorm", "resume backup",
                   "weights checkpoint", "history.json", "TensorBoard")
    end_parts = ("end-of-run kNN", "model.keras", "SavedModel")
    in_fit = marks["fit_end"] - marks["fit"]
    epochs = len(history)
    rows = [("start: imports, data, model (launch → fit)", marks["fit"]),
            ("compilation (the first epoch's excess over the others' median step)", compiling),
            (f"steps ({epochs} epochs × {steps_per_epoch}, median {usual:.1f} ms), less "
             "the compilation", steps - compiling)]
    rows += [(f"epoch ends: {part} ({epochs} epochs)", spent.get(part, 0.0))
             for part in epoch_parts if spent.get(part)]
    marked = [inside["epochs"][str(epoch)] for epoch in range(epochs)]
    setup = marked[0]["begin"] - marks["fit"]
    between = sum(marked[e + 1]["begin"] - marked[e]["end"] for e in range(epochs - 1))
    teardown = marks["fit_end"] - marked[-1]["end"]
    rows.append(("epoch ends: the rest (Keras' epoch logs, other callbacks)",
                 in_fit - steps - setup - between - teardown
                 - sum(spent.get(part, 0.0) for part in epoch_parts)))
    rows += [("fit's own start (its iterator, the resume state)", setup),
             ("between an epoch's end and the next's begin", between),
             ("fit's own end (on_train_end)", teardown)]
    rows += [(f"end of run: {part}", spent.get(part, 0.0)) for part in end_parts]
    rows.append(("end of run: the rest (results.json, exit)",
                 inside["exit"] - marks["fit_end"] - sum(spent.get(p, 0.0) for p in end_parts)))
    rows.append(("process launch to the interpreter, and its exit", wall - inside["exit"]))
    outside = wall - (steps - compiling)
    table = [f"| {what} | {seconds:.1f} | {100 * seconds / wall:.1f} % |"
             for what, seconds in rows]
    from caco_tf import load_config
    from caco_tf.cli.train import DEFAULT_CONFIG

    full = load_config(DEFAULT_CONFIG, [])["train"]["epochs"]  # the offline default's
    per_epoch = (in_fit - steps - setup - teardown) / epochs
    once = outside - per_epoch * epochs
    command = " ".join(["python train.py"] + [f"--set {s}" for s in args.set])
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    lines = _harness.header(__file__, argv) + [
        f"`{command}` (the offline default"
        f"{' with those changes' if args.set else ''}), run once; its wall time {wall:.1f} s; "
        f"load average at its end {load} (a machine running other work: compare shares, "
        f"not seconds, with other sections).", "",
        "| part | seconds | share |", "|---|---:|---:|", *table,
        f"| **outside the steps** (all but the steps' own) | **{outside:.1f}** | "
        f"**{100 * outside / wall:.1f} %** |", "",
        f"Outside the steps, {once:.1f} s are paid once a run (start, compilation, end) and "
        f"{per_epoch:.2f} s at each epoch's end; over the offline default's {full} epochs "
        f"that is {once + full * per_epoch:.0f} s beside its steps' "
        f"{full * steps_per_epoch * usual / 1000:.0f} s at this run's median step."]
    _harness.publish(args, "outside_steps", TITLE, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
