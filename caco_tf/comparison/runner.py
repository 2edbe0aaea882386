"""A comparison's plan, runs and measurements (``caco-compare``; the package's docstring).

``Comparison(folder)`` holds ``plan.json`` (fixed when the comparison starts: a re-run with
other arguments is refused), ``state.json`` (the calibration) and, in each run's folder,
``comparison.json`` (what was measured of that run, written atomically after each
measurement: the runs of a comparison spread over machines write only their own).  The runs go
in an order where a partial comparison covers every method: the trials trial by trial across
the methods, then the chosen settings seed by seed (``Comparison.runs``); ``tuning`` hands them
out.  Each training is ``caco-train``'s (``pretrain.run``, resumed from its checkpoint after a
signal or a kill); its row's command reruns it.
"""

import contextlib
import datetime
import json
import logging
import math
import os
import shlex
import sys
import time

import numpy as np

from caco_tf import __version__
from caco_tf.comparison import splits as splits_lib
from caco_tf.comparison import trials as trials_lib
from caco_tf.config import ConfigError, config_path, load_config
from caco_tf.data import fingerprint, sources
from caco_tf.errors import StateError, UserError
from caco_tf.machine import machine, source_commit
from caco_tf.training.run_folder import write_json_atomically

ENTRY = "comparison.json"  # in each run's folder: what was measured of that run
# What defines a comparison: a re-run that differs in one of these is another comparison.
PLAN_KEYS = ("config", "data", "labels", "settings", "methods", "trials", "seeds", "seed",
             "few_labels", "validation_fraction", "test_fraction", "linear_epochs")


class Comparison:
    """The folder of one comparison: ``plan.json``, ``state.json``, ``splits/``, ``runs/``."""

    def __init__(self, folder, tolerant=False):
        """``tolerant``: a damaged file is noted in ``damaged`` ({message: None}) and read as
        absent (the report says what it could not read), instead of a ``StateError``."""
        self.folder = os.path.abspath(folder)
        self.damaged = {} if tolerant else None
        if os.path.exists(self.folder) and not os.path.isdir(self.folder):
            raise ConfigError(f"--out {folder} is a file: a comparison's folder is needed; "
                              f"pass another --out")
        self.plan_path = os.path.join(self.folder, "plan.json")
        self.state_path = os.path.join(self.folder, "state.json")
        self.plan = None
        self.state = self.read(self.state_path, "remove it: it holds only the calibration, "
                                                "which is measured again") or {}
        self.read_plan()

    def read(self, path, advice, kind=dict):
        """``read_json``, or None for a damaged file when the comparison is ``tolerant``."""
        try:
            return read_json(path, advice, kind)
        except StateError as error:
            if self.damaged is None:
                raise
            self.damaged[str(error)] = None
            return None

    def read_plan(self):
        self.plan = read_json(self.plan_path, "restore it from a copy (docs/compare.md), or "
                                              "choose another --out to start again")
        return self.plan

    def split(self, name):
        return os.path.join(self.folder, "splits", f"{name}.json")

    def run_dir(self, key):
        return os.path.join(self.folder, "runs", *key.split("/"))

    def entry(self, key):
        """What was measured of run ``key`` (its folder's ``comparison.json``), read afresh:
        another machine may have measured it."""
        return self.read(os.path.join(self.run_dir(key), ENTRY),
                         f"remove the folder {self.run_dir(key)} to train that run again, or "
                         f"restore the file from a copy") or {}

    def save_entry(self, key, entry):
        os.makedirs(self.run_dir(key), exist_ok=True)
        write_json_atomically(os.path.join(self.run_dir(key), ENTRY), entry, indent=1)

    def save(self):
        write_json_atomically(self.state_path, self.state, indent=1)

    # ------------------------------------------------------------------ the plan
    def start(self, arguments, command):
        """Fix the plan (first start) or check that ``arguments`` are the plan's (a re-run)."""
        if self.plan is not None:
            changed = [key for key in PLAN_KEYS if self.plan["arguments"].get(key)
                       != arguments.get(key)]
            if changed:
                raise ConfigError(
                    f"{self.folder} holds a comparison with other {', '.join(changed)} "
                    f"({'; '.join(_difference(k, self.plan['arguments'], arguments) for k in changed)}): "
                    f"run its own command again (plan.json) or choose another --out")
            self.check_source()
            for key, *_ in self.runs():  # a damaged record is one line now, not hours later
                self.entry(key)
            return self.plan
        os.makedirs(os.path.join(self.folder, "splits"), exist_ok=True)
        config = budget_config(arguments)
        methods = arguments["methods"]
        pinned = source_fingerprint(arguments, config)
        counts = self._write_splits(arguments, config)
        fitted = {m: trials_lib.fitted_rows(m, config, counts["tune"]) for m in methods}
        drawn = {m: trials_lib.draw_trials(m, config, arguments["trials"], arguments["seed"])
                 for m in methods}
        self.plan = {
            "arguments": arguments, "command": command, "caco_tf": __version__,
            "commit": source_commit(),  # None for an installed wheel
            "created": datetime.datetime.now().isoformat(timespec="seconds"),
            "budget_learning_rate": trials_lib.budget_learning_rate(config),
            "search_spaces": {m: [[k, list(v)] for k, v in trials_lib.search_space(m, config)]
                              for m in methods},
            "trials": drawn, "fitted": fitted, "images": counts,
            "epochs": config["train"]["epochs"], "batch_size": config["train"]["batch_size"],
            "source": pinned,
        }
        try:
            self.check()
        except UserError:
            self.plan = None  # no plan.json: the same folder takes the corrected command
            raise
        write_json_atomically(self.plan_path, self.plan, indent=1)
        return self.plan

    def check_source(self):
        """The images are still those the plan was made on (its ``source`` fingerprint): a
        rerun, or a worker on another machine, that would read others is refused."""
        pinned = self.plan.get("source")
        if pinned is None:  # a plan written before sources were pinned
            return
        arguments = self.plan["arguments"]
        try:
            now = source_fingerprint(arguments, budget_config(arguments))
        except UserError as error:
            raise sources.DataError(f"the images of the comparison in {self.folder} cannot be "
                                    f"read here: {error}") from None
        changed = fingerprint.changes(pinned, now)
        if changed:
            raise sources.DataError(
                f"the images of {arguments['data']} changed since the comparison in "
                f"{self.folder} was planned ({self.plan['created'][:10]}): {changed}; restore "
                f"them, or compare these images in another --out")

    def _write_splits(self, arguments, config):
        settings = config["data"]
        train, held_out = sources.load_source(arguments["data"], settings["channels"],
                                              settings["data_dir"], settings["manual_dir"])
        train_labels, class_names = labels_of(train, arguments["data"], arguments["labels"])
        held_out_labels = None  # a labels file labels the training images: the test is carved
        if held_out is not None and held_out.has_labels and not arguments["labels"]:
            held_out_labels = labels_of(held_out, arguments["data"], None)[0]
        carved = splits_lib.carve(train_labels, held_out_labels,
                                  arguments["validation_fraction"], arguments["test_fraction"],
                                  arguments["few_labels"], arguments["seed"])
        check_splits(carved, train_labels, held_out_labels, arguments, class_names)
        counts = {}
        for name, (part, positions) in carved.items():
            labels = None
            if arguments["labels"] and part == "train":
                labels = train_labels[positions]
            write_json_atomically(self.split(name), sources.split_file(
                arguments["data"], part, positions, labels))
            counts[name] = len(positions)
        return counts

    # ------------------------------------------------------------------ the runs
    def trial_key(self, method, trial):
        return f"tune/{method}/trial{trial}"

    def final_key(self, method, seed):
        return f"final/{method}/seed{seed}"

    def settings(self, method, trial, seed, final):
        """The ``--set`` assignments of one run, after the comparison's shared ones."""
        data, held_out = ("train", "test") if final else ("tune", "validation")
        return (list(self.plan["arguments"]["settings"])
                + [f"method.name={method}"] + self.plan["fitted"][method]
                + trials_lib.assignments(self.plan["trials"][method][trial])
                + [f"data.source=split:{self.split(data)}",
                   f"data.held_out=split:{self.split(held_out)}",
                   f"train.seed={seed}", f"data.seed={seed}"])

    def runs(self):
        """[(key, method, trial, seed, final)] in the order they run (the module docstring);
        a final run's trial is None until its method's trials have all finished."""
        arguments = self.plan["arguments"]
        order = []
        for trial in range(arguments["trials"]):
            for method in arguments["methods"]:
                order.append((self.trial_key(method, trial), method, trial, arguments["seed"],
                              False))
        chosen = {method: self.chosen(method) for method in arguments["methods"]}
        for seed in range(arguments["seeds"]):
            for method in arguments["methods"]:
                order.append((self.final_key(method, seed), method, chosen[method], seed, True))
        return order

    def chosen(self, method):
        """The trial with the best validation kNN (the first of a tie; a failed trial loses),
        or None while one has not finished."""
        entries = [self.entry(self.trial_key(method, t))
                   for t in range(self.plan["arguments"]["trials"])]
        if any("knn_top1" not in e and "failed" not in e for e in entries):
            return None
        scores = [e.get("knn_top1", -math.inf) for e in entries]
        return max(range(len(scores)), key=lambda t: (scores[t], -t))

    def command(self, key, method, trial, seed, final):
        """The ``caco-train`` command that trains this run (its row's, in the report)."""
        parts = ["caco-train", "--config", self.plan["arguments"]["config"], "--run-dir",
                 self.run_dir(key), "--quiet"]
        for assignment in self.settings(method, trial, seed, final):
            parts += ["--set", assignment]
        return shlex.join(parts)

    def config(self, method, trial, seed, final):
        return load_config(self.plan["arguments"]["config"],
                           self.settings(method, trial, seed, final))

    def check(self):
        """Every run's configuration loads and its data fit (one line otherwise): before the
        plan is written, not hours into the comparison."""
        from caco_tf.build import load_data, plan_run
        from caco_tf.run_settings import RunSettings

        loaded = {}  # the training images of the trials and of the chosen settings, read once
        for method in self.plan["arguments"]["methods"]:
            for trial in range(self.plan["arguments"]["trials"]):
                for final in (False, True):
                    config = self.config(method, trial, 0, final)
                    try:
                        settings = RunSettings.of(config)
                        if final not in loaded:
                            loaded[final] = load_data(settings.data)[0]
                        plan_run(settings, loaded[final])
                    except UserError as error:
                        raise type(error)(f"{method}, trial {trial}: {error}") from None


def read_json(path, advice, kind=dict):
    """The JSON value of ``path`` (None when there is none), or a ``StateError`` line naming
    the file, what is wrong with it and ``advice``."""
    try:
        with open(path, encoding="utf-8") as handle:
            value = json.load(handle)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise StateError(f"cannot read {path}: {error.strerror}; {advice}") from None
    except (ValueError, UnicodeDecodeError) as error:
        empty = os.path.getsize(path) == 0
        raise StateError(f"{path} is damaged ({'empty' if empty else 'not whole JSON: ' + str(error).splitlines()[0]}); "
                         f"{advice}") from None
    if not isinstance(value, kind):
        raise StateError(f"{path} is damaged (a JSON {type(value).__name__}, not the "
                         f"{'object' if kind is dict else 'list'} caco-compare writes); {advice}")
    return value


def budget_config(arguments):
    """The shared budget on the user's images (a bad setting is one line, checked against
    their source, not the budget file's own), as the first compared method trains it (the
    budget file's own method, if not compared, refuses nothing: e.g. CaCo's warm-up against
    ``--epochs 1``)."""
    method = [f"method.name={arguments['methods'][0]}"] if arguments.get("methods") else []
    return load_config(arguments["config"], arguments["settings"] + method
                       + [f"data.source={arguments['data']}"])


def source_fingerprint(arguments, config):
    """``fingerprint.fingerprint`` of the comparison's images and labels file."""
    data = config["data"]
    return fingerprint.fingerprint(arguments["data"], arguments["labels"], data["channels"],
                                   data["data_dir"], data["manual_dir"])


# The splits a comparison measures, the fewest images of each class each must hold, and what
# enlarges it.
MEASURED_SPLITS = (("test", 2, "--test-fraction (or more images in the held-out folder)"),
                   ("validation", 2, "--validation-fraction"),
                   ("few_labels", 1, "--few-labels"))


def check_splits(carved, train_labels, held_out_labels, arguments, class_names=()):
    """Every split the comparison measures holds two classes or more, each with its minimum
    of images (``MEASURED_SPLITS``): a report over one class says nothing (kNN 100 %, linear
    0 %).  One line naming the split, its counts and what to change."""
    names = {"train": np.asarray(train_labels),
             "held_out": None if held_out_labels is None else np.asarray(held_out_labels)}
    for split, least, option in MEASURED_SPLITS:
        if split not in carved:
            continue
        part, positions = carved[split]
        labels = names[part][positions]
        classes, counts = np.unique(labels, return_counts=True)
        least = min(least, arguments["few_labels"]) if split == "few_labels" else least
        short = [(c, n) for c, n in zip(classes, counts) if n < least]
        if len(positions) == 0 or len(classes) < 2 or short:
            held = ", ".join(f"{_class_name(c, class_names)}: {n}"
                             for c, n in zip(classes, counts)) or "no images"
            raise sources.DataError(
                f"the {split.replace('_', '-')} split would hold {len(positions)} image(s) of "
                f"{len(classes)} class(es) ({held}): every split a comparison measures needs "
                f"two classes or more with at least {least} image(s) each; add images of the "
                f"smaller classes or raise {option}")


def labels_of(source, spec, labels_file):
    """(the class index of every image of ``source``, the classes' names or ()): a
    ``DataError`` line without labels or with one class."""
    if labels_file:
        return read_labels_file(labels_file, source)
    if not source.has_labels:
        raise sources.DataError(
            f"{spec} has no labels: a comparison measures every method with them (labels "
            f"reach evaluation only); use a folder of class sub-folders, an .npz with "
            f"'labels', or --labels FILE (one 'relative/path.jpg,class' line per image)")
    labels = sources.class_indices(source)  # records: one pass over their labels
    if len(np.unique(labels)) < 2:
        raise sources.DataError(f"{spec} holds one class: a comparison needs two or more")
    return labels, tuple(getattr(source, "class_names", ()) or ())


def _class_name(index, names):
    return repr(names[index]) if 0 <= index < len(names) else f"class {index}"


def read_labels_file(path, source):
    """(class indices of a folder source's images, the classes' names) from ``path``: one
    ``relative/path,class`` line per image (classes by name, indexed in sorted order)."""
    import csv

    if not hasattr(source, "paths"):
        raise sources.DataError(f"--labels {path} labels the files of a folder source")
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            rows = [row for row in csv.reader(handle) if row and not row[0].startswith("#")]
    except OSError as error:
        raise sources.DataError(f"--labels {path}: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise sources.DataError(f"--labels {path} is not UTF-8 text (byte "
                                f"{error.object[error.start]:#04x} at offset {error.start}): "
                                f"save it as UTF-8") from None
    if any(len(row) != 2 for row in rows):
        raise sources.DataError(f"--labels {path}: expected 'relative/path,class' lines")
    by_path = {os.path.normpath(p.strip()): c.strip() for p, c in rows}
    root = os.path.commonpath([str(p) for p in source.paths]) if len(source.paths) else ""
    root = root if os.path.isdir(root) else os.path.dirname(root)
    names = sorted(set(by_path.values()))
    if len(names) < 2:
        raise sources.DataError(f"--labels {path} names {len(names)} class(es) "
                                f"({', '.join(names) or 'none'}): a comparison needs two or "
                                f"more")
    labels, missing = [], []
    for file in source.paths:
        relative = os.path.normpath(os.path.relpath(str(file), root))
        if relative in by_path:
            labels.append(names.index(by_path[relative]))
        else:
            missing.append(relative)
    if missing:
        raise sources.DataError(f"--labels {path} has no line for {len(missing)} image(s), "
                                f"e.g. {missing[0]}: every image needs its class")
    return np.asarray(labels, np.int64), tuple(names)


def _difference(key, old, new):
    return f"{key}: {old.get(key)!r} before, {new.get(key)!r} now"


# ---------------------------------------------------------------------- running
@contextlib.contextmanager
def collapse_warnings(found):
    """Appends to ``found`` every collapse warning the library logs meanwhile, and prints each
    of the library's warnings as ``caco-train`` does (the message alone, on standard error)."""

    class Catch(logging.StreamHandler):
        def emit(self, record):
            if record.getMessage().startswith("warning: collapse"):
                found.append(record.getMessage())
            super().emit(record)

    handler = Catch(sys.stderr)
    handler.setLevel(logging.WARNING)
    logger = logging.getLogger("caco_tf")
    logger.addHandler(handler)
    propagate, logger.propagate = logger.propagate, False
    try:
        yield found
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def train(comparison, key, method, trial, seed, final):
    """Train (or resume) one run and record its validation or test kNN and health."""
    import keras

    from caco_tf import pretrain

    entry = comparison.entry(key)
    if "knn_top1" in entry or "failed" in entry:
        return entry
    run_dir = comparison.run_dir(key)
    entry.update(method=method, trial=trial, seed=seed,
                 command=comparison.command(key, method, trial, seed, final))
    config = comparison.config(method, trial, seed, final)
    warnings, start = [], time.time()
    keras.backend.clear_session()
    try:
        with collapse_warnings(warnings):
            results = pretrain.run(config, run_dir, verbose=0)
    except pretrain.TrainingStopped as error:  # a NaN loss or a collapse: the run loses
        entry["failed"] = str(error)
        results = None
    finally:
        entry["train_seconds"] = round(entry.get("train_seconds", 0)
                                       + time.time() - start, 1)
        entry["collapse_warned"] = entry.get("collapse_warned", False) or bool(warnings)
        note_machine(entry)
        comparison.save_entry(key, entry)  # an interrupted attempt's seconds count too
    if results is not None:
        entry["knn_top1"] = results["knn_top1"]
        entry.update(health(run_dir))
        comparison.save_entry(key, entry)
    return entry


def note_machine(entry):
    """Add this machine to the run's ``machines``: a run resumed elsewhere names them all, so
    a comparison spread over machines (or sessions) says where each figure was measured."""
    here = machine()
    machines = entry.setdefault("machines", [])
    if here not in machines:
        machines.append(here)


def health(run_dir):
    """The last epoch's effective rank and uniformity (history.json)."""
    from caco_tf.training import run_folder

    history = run_folder.read_history(run_folder.RunFolder(run_dir).history)
    last = history[-1] if history else {}
    return {"rank_embedding": last.get("rank_embedding"), "uniformity": last.get("uniformity")}


# The evaluations of a final run, each a JSON in its run folder (what the report reads).
LINEAR, FEW_LABEL = "eval_linear.json", "eval_linear_few_labels.json"


def evaluate(comparison, key):
    """A final run's linear and few-label linear top-1 on the test split (once each)."""
    from caco_tf.evaluation import protocols

    entry = comparison.entry(key)
    if "knn_top1" not in entry:
        return entry
    arguments, run_dir = comparison.plan["arguments"], comparison.run_dir(key)
    linear = dict(epochs=arguments["linear_epochs"], verbose=0, seed=entry["seed"])
    note_machine(entry)
    if "linear_top1" not in entry:
        result = protocols.evaluate("linear", run=run_dir, **linear)
        write_json_atomically(os.path.join(run_dir, LINEAR), result, indent=1)
        entry["linear_top1"] = result["top1"]
        comparison.save_entry(key, entry)
    if arguments["few_labels"] and "few_label_top1" not in entry:
        result = protocols.evaluate(
            "linear", run=run_dir, data=f"split:{comparison.split('few_labels')}",
            held_out=f"split:{comparison.split('test')}", **linear)
        write_json_atomically(os.path.join(run_dir, FEW_LABEL), result, indent=1)
        entry["few_label_top1"] = result["top1"]
        comparison.save_entry(key, entry)
    return entry


# What training must beat, measured once on the test split: each baseline of caco-evaluate in
# ``OUT/baselines/NAME_knn.json`` (its JSON).
BASELINES = ("pixels", "untrained")


def baseline_path(comparison, name):
    return os.path.join(comparison.folder, "baselines", f"{name}_knn.json")


def measure_baselines(comparison, say=print):
    """kNN top-1 of the raw pixels and of the untrained network (seeded by the comparison's
    seed) on the test split, at the budget's image size and kNN settings: what a method has to
    beat to be worth its training on these images.  Built from the budget as the first method's
    final runs train it (no run folder is read: a comparison restored from its JSON files
    measures them again); each once, after a final run has been measured."""
    from caco_tf.evaluation import protocols

    if not any("knn_top1" in comparison.entry(key)
               for key, *_, final in comparison.runs() if final):
        return {}
    seed = comparison.plan["arguments"]["seed"]
    missing = [name for name in BASELINES if not os.path.exists(baseline_path(comparison, name))]
    if missing:
        config = comparison.config(comparison.plan["arguments"]["methods"][0], 0, seed, True)
    for name in missing:
        path = baseline_path(comparison, name)
        result = protocols.evaluate("knn", config=config, baseline=name, seed=seed)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_json_atomically(path, result, indent=1)
        say(f"baseline {name}: test kNN {result['top1']:.1f}%")
    return baselines(comparison)


def baselines(comparison):
    """{name: kNN top-1} of the baselines measured (``measure_baselines``)."""
    found = {}
    for name in BASELINES:
        path = baseline_path(comparison, name)
        result = comparison.read(path, f"remove it: the command measures the {name} "
                                       f"baseline again")
        if result is not None and "top1" in result:
            found[name] = float(result["top1"])
    return found


def class_count(comparison):
    """The number of classes of the test split, as a baseline measured it (None before)."""
    for name in BASELINES:
        result = comparison.read(baseline_path(comparison, name), "remove it: the command "
                                 f"measures the {name} baseline again")
        if result and result.get("classes"):
            return int(result["classes"])
    return None


def finished(comparison, key, final, entry=None):
    """Whether run ``key`` has everything measured (a failed run is finished too)."""
    entry = comparison.entry(key) if entry is None else entry
    if "failed" in entry:
        return True
    wanted = ["knn_top1"] + (["linear_top1"] if final else []) + (
        ["few_label_top1"] if final and comparison.plan["arguments"]["few_labels"] else [])
    return all(name in entry for name in wanted)


def run_one(comparison, key, say=print):
    """Train and measure run ``key`` (what it lacks); returns its entry."""
    stage, method, which = key.split("/")
    final = stage == "final"
    number = int(which.removeprefix("seed" if final else "trial"))
    trial, seed = ((comparison.chosen(method), number) if final
                   else (number, comparison.plan["arguments"]["seed"]))
    if final and all("failed" in comparison.entry(comparison.trial_key(method, t))
                     for t in range(comparison.plan["arguments"]["trials"])):
        entry = {"method": method, "seed": seed, "failed": "every trial stopped itself on the "
                 "validation split (a NaN loss or a collapse): no setting to train"}
        comparison.save_entry(key, entry)
        say(f"{key}: not trained: {entry['failed']}")
        return entry
    say(f"{key}: training{' (trial %d)' % trial if final else ''} ...")
    entry = train(comparison, key, method, trial, seed, final)
    if "failed" in entry:
        say(f"{key}: failed: {entry['failed']}")
        return entry
    if final:
        entry = evaluate(comparison, key)
    figures = f"kNN {entry['knn_top1']:.1f}%" + (
        f", linear {entry['linear_top1']:.1f}%" if "linear_top1" in entry else "") + (
        f", few-label {entry['few_label_top1']:.1f}%" if "few_label_top1" in entry else "")
    left = sum(1 for k, *_, f in comparison.runs() if not finished(comparison, k, f))
    say(f"{key}: {'test' if final else 'validation'} {figures} "
        f"({entry['train_seconds']:.0f} s; {left} run(s) left)")
    return entry


# ---------------------------------------------------------------------- the estimate
def calibrate(comparison, steps=2, say=print):
    """Seconds per training step of each method's trial 0 on this machine (a few calls of its
    model on a batch of random crops, after the first), saved in the state."""
    import keras
    import tensorflow as tf

    from caco_tf.build import build_model

    measured = comparison.state.setdefault("calibration", {})
    for method in comparison.plan["arguments"]["methods"]:
        if method in measured:
            continue
        config = comparison.config(method, 0, 0, False)
        keras.backend.clear_session()
        keras.utils.set_random_seed(0)
        start = time.time()
        model = build_model(config, steps_per_epoch=100)
        crops = tuple(tf.random.normal((config["train"]["batch_size"], size, size,
                                        config["data"]["channels"]))
                      for size in crop_sizes(config))
        function = model.make_train_function()
        per_call = model.steps_per_execution
        tf.nest.map_structure(lambda t: t.numpy(), function([crops] * per_call))
        # The last phase (after any warm-up) is the one most steps run: timed there.
        model.optimizer.iterations.assign(function.starts[-1])
        tf.nest.map_structure(lambda t: t.numpy(), function([crops] * per_call))
        setup = time.time() - start
        start = time.time()
        for _ in range(steps):
            tf.nest.map_structure(lambda t: t.numpy(), function([crops] * per_call))
        measured[method] = {"step_seconds": (time.time() - start) / (steps * per_call),
                            "setup_seconds": setup}
        comparison.save()
        say(f"calibration: {method} {1000 * measured[method]['step_seconds']:.0f} ms a step")
    if "evaluation" not in comparison.state:
        config = comparison.config(comparison.plan["arguments"]["methods"][0], 0, 0, False)
        keras.backend.clear_session()
        backbone = build_model(config, steps_per_epoch=100).backbone
        comparison.state["evaluation"] = calibrate_evaluation(
            backbone, config, comparison.plan["images"]["train"])
        comparison.save()
        say(f"calibration: the linear probe "
            f"{1000 * comparison.state['evaluation']['step_seconds']:.1f} ms a step")
    return measured


# The probes' batch: linear_evaluation's default, which the comparison's probes run with.
PROBE_BATCH_SIZE = 256


def calibrate_evaluation(backbone, config, train_images):
    """The costs of the evaluations on this machine: seconds per image of the frozen
    backbone's features; of the linear probe's fits (Keras ``fit`` of the head on cached
    features), seconds per fit, per epoch and per step (the steps timed on as many rows as the
    fits of ``train_images`` shuffle, up to 32,768)."""
    import keras
    import tensorflow as tf

    from caco_tf.evaluation import knn, linear

    size, channels = config["data"]["image_size"], config["data"]["channels"]
    batch = config["evaluation"]["batch_size"]
    images = tf.data.Dataset.from_tensors(tf.random.normal((batch, size, size, channels)))
    knn.extract_features(backbone, images, normalize=False)  # traced once, then timed
    start = time.perf_counter()
    knn.extract_features(backbone, images.repeat(2), normalize=False)
    image_seconds = (time.perf_counter() - start) / (2 * batch)

    class EpochTimes(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.seconds = []

        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self.start)

    dim, batch = int(backbone.output_shape[-1]), PROBE_BATCH_SIZE
    most = max(2, min(128, math.ceil(train_images / batch)))  # batches of the probe's size
    rows = np.random.default_rng(0).normal(size=(most * batch, dim)).astype("float32")

    def fit(batches, epochs):
        """A fit's seconds (with its test) and its typical epoch's, after the first (which
        traces and compiles), on rows shuffled every epoch as the protocol's are."""
        head, times = linear.linear_head(dim, 10), EpochTimes()
        linear.compile_classifier(head, batches * epochs)
        count = batch * batches
        start = time.perf_counter()
        head.fit(linear.feature_batches(rows[:count], np.arange(count) % 10, batch,
                                        shuffle_seed=0),
                 epochs=epochs, verbose=0, callbacks=[times],
                 shuffle=False)  # the dataset shuffles itself; Keras warns otherwise
        head.evaluate(linear.feature_batches(rows[:batch], np.arange(batch) % 10, batch),
                      verbose=0)  # each fold's test
        later = sorted(times.seconds[1:])
        return time.perf_counter() - start, later[len(later) // 2]

    keras.utils.set_random_seed(0)
    fit(1, 2)  # the process's first fit pays costs no other fit pays
    total, epoch_and_step = fit(1, 21)  # an epoch's overhead and one step
    _, epoch_and_steps = fit(most, 6)
    step = max(0.0, (epoch_and_steps - epoch_and_step) / (most - 1))
    return {"image_seconds": image_seconds, "fit_seconds": max(0.0, total - 21 * epoch_and_step),
            "epoch_seconds": max(0.0, epoch_and_step - step), "step_seconds": step}


def linear_seconds(costs, train_count, test_count, epochs, batch_size=None):
    """The linear protocol's cost for ``train_count`` training and ``test_count`` test images:
    the features of both, then λ's cross-validation (``L2_GRID`` × ``L2_FOLDS`` fits, each on
    all folds but one) and the final fit (``linear.linear_evaluation``)."""
    from caco_tf.evaluation import L2_FOLDS, L2_GRID

    batch_size = batch_size or PROBE_BATCH_SIZE
    held = train_count / L2_FOLDS
    fits = [train_count - held] * (len(L2_GRID) * L2_FOLDS) + [train_count]
    steps = sum(epochs * math.ceil(rows / batch_size) for rows in fits)
    return (costs["image_seconds"] * (train_count + test_count)
            + len(fits) * costs["fit_seconds"] + len(fits) * epochs * costs["epoch_seconds"]
            + steps * costs["step_seconds"])


def crop_sizes(config):
    size, local = config["data"]["image_size"], config["data"]["multicrop"]
    if config["data"]["views"] == "multicrop":
        return [size, size] + [local["local_size"]] * local["local_crops"]
    return [size, size]


# The steps of a run cost more than the calibration's (the input pipeline, the epoch's end and
# the export): a factor, and seconds per run, measured on this project's runs.
OVERHEAD_FACTOR = 1.3
SECONDS_PER_RUN = 20.0


def estimate_seconds(comparison):
    """The seconds the runs the state lacks will take, from the calibration: the training
    steps, the kNN at each run's end and, per seed, the linear and few-label evaluations."""
    calibration = comparison.state.get("calibration", {})
    costs = comparison.state.get("evaluation")
    plan, images = comparison.plan, comparison.plan["images"]
    arguments = plan["arguments"]
    total = 0.0
    for key, method, trial, seed, final in comparison.runs():
        entry = comparison.entry(key)  # read once: finished() and the sums below use it
        if finished(comparison, key, final, entry):
            continue
        steps = images["train" if final else "tune"] // plan["batch_size"] * plan["epochs"]
        measured = calibration.get(method, {"step_seconds": 0.0, "setup_seconds": 0.0})
        if "knn_top1" not in entry:
            total += (steps * measured["step_seconds"] * OVERHEAD_FACTOR
                      + measured["setup_seconds"] + SECONDS_PER_RUN)
            if costs:  # the kNN's features of the run's training and held-out images
                total += costs["image_seconds"] * (
                    images["train"] + images["test"] if final
                    else images["tune"] + images["validation"])
        if final and costs:
            epochs = arguments["linear_epochs"]
            if "linear_top1" not in entry:
                total += linear_seconds(costs, images["train"], images["test"], epochs)
            if arguments["few_labels"] and "few_label_top1" not in entry:
                total += linear_seconds(costs, images["few_labels"], images["test"], epochs)
    return total


def config_argument(name):
    """``--config`` as the plan records it: a shipped name, else the file's absolute path."""
    from caco_tf.config import shipped_configs

    return name if name in shipped_configs() else os.path.abspath(config_path(name))
