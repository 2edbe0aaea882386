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
             "few_labels", "validation_fraction", "test_fraction", "linear_epochs",
             "curve_every", "curve_images", "few_label_draws", "few_label_epochs", "export_runs")
# Arguments plans gained after they were first written: {key: (what a plan without it meant,
# a new plan's default)}.  A command that leaves one unset (None) takes its plan's.
LATER_ARGUMENTS = {"curve_every": (0, 1), "curve_images": (None, [2000, 1000]),
                   "few_label_draws": (None, 5), "few_label_epochs": (None, None),
                   "export_runs": (True, False)}


class Comparison:
    """The folder of one comparison: ``plan.json``, ``state.json``, ``splits/``, ``runs/``."""

    def __init__(self, folder, tolerant=False):
        """``tolerant``: a damaged file is noted in ``damaged`` ({message: None}) and read as
        absent (the report says what it could not read), instead of a ``StateError``."""
        self.folder = os.path.abspath(folder)
        self.damaged = {} if tolerant else None
        self.trials_only = False  # a pilot's: the runs on the validation split alone
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
        arguments = dict(arguments)
        for key, (before, default) in LATER_ARGUMENTS.items():
            if arguments.get(key) is None:
                arguments[key] = (default if self.plan is None
                                  else self.plan["arguments"].get(key, before))
        if self.plan is not None:
            changed = [key for key in PLAN_KEYS
                       if self.plan["arguments"].get(key, LATER_ARGUMENTS.get(key, (None,))[0])
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
        own = {m: trials_lib.own_settings(m, config, arguments["settings"]) for m in methods}
        drawn = {m: trials_lib.draw_trials(m, config, arguments["trials"], arguments["seed"])
                 for m in methods}
        self.plan = {
            "arguments": arguments, "command": command, "caco_tf": __version__,
            "commit": source_commit(),  # None for an installed wheel
            "created": datetime.datetime.now().isoformat(timespec="seconds"),
            "budget_learning_rate": trials_lib.budget_learning_rate(config),
            "search_spaces": {m: [[k, list(v)] for k, v in trials_lib.search_space(m, config)]
                              for m in methods},
            "trials": {m: designed for m, (designed, _) in drawn.items()},
            "spares": {m: spares for m, (_, spares) in drawn.items()},
            "own_settings": own, "fitted": fitted, "images": counts,
            "epochs": config["train"]["epochs"], "batch_size": config["train"]["batch_size"],
            "source": pinned, "knn_k": config["evaluation"]["knn_k"],
            "knn_temperature": config["evaluation"]["knn_temperature"],
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
        """Carve and write the splits (``splits_lib.carve``), each checked (``check_splits``;
        each few-label draw as the few-label split); {split: images}, the few-label draws
        counted once (``few_labels``: each holds as many).  ``arguments`` without
        ``few_label_draws`` take ``FEW_LABEL_DRAWS``, which the plan then records."""
        if arguments.get("few_label_draws") is None:
            arguments["few_label_draws"] = FEW_LABEL_DRAWS
        settings = config["data"]
        train, held_out = sources.load_source(arguments["data"], settings["channels"],
                                              settings["data_dir"], settings["manual_dir"])
        train_labels, class_names = labels_of(train, arguments["data"], arguments["labels"])
        held_out_labels = None  # a labels file labels the training images: the test is carved
        if held_out is not None and held_out.has_labels and not arguments["labels"]:
            held_out_labels = labels_of(held_out, arguments["data"], None)[0]
        carved = splits_lib.carve(train_labels, held_out_labels,
                                  arguments["validation_fraction"], arguments["test_fraction"],
                                  arguments["few_labels"], arguments["seed"],
                                  draws=arguments["few_label_draws"])
        draws = splits_lib.few_label_names(arguments["few_labels"], arguments["few_label_draws"])
        check_splits({n: s for n, s in carved.items() if n not in draws}, train_labels,
                     held_out_labels, arguments, class_names)
        for name in draws:
            check_splits({"few_labels": carved[name]}, train_labels, held_out_labels,
                         arguments, class_names)
        counts = {}
        for name, (part, positions) in carved.items():
            labels = None
            if arguments["labels"] and part == "train":
                labels = train_labels[positions]
            write_json_atomically(self.split(name), sources.split_file(
                arguments["data"], part, positions, labels))
            counts["few_labels" if name in draws else name] = len(positions)
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
                + [f"method.name={method}"] + self.own_settings(method)
                + self.plan["fitted"][method]
                + trials_lib.assignments(self.trial_point(method, trial))
                + [f"data.source=split:{self.split(data)}",
                   f"data.held_out=split:{self.split(held_out)}",
                   f"train.seed={seed}", f"data.seed={seed}"] + self.curve_settings()
                + self.export_settings())

    def export_settings(self):
        """No ``model.keras`` or SavedModel in a run's folder: its probes read the checkpoint,
        and a comparison of ResNet-50s would write 96 of each (``caco-export --run RUN`` makes
        them); a plan written before exported them, and its runs still do."""
        exported = self.plan["arguments"].get("export_runs", LATER_ARGUMENTS["export_runs"][0])
        return [] if exported else ["train.export=false"]

    def own_settings(self, method):
        """What ``method`` trains with after the budget's settings (``trials.own_settings``:
        its authors' views, the ViT options it needs); none in a plan written before them."""
        return self.plan.get("own_settings", {}).get(method, [])

    def curve_settings(self):
        """The learning curve every run records: each ``curve_every`` epochs, the kNN top-1 of
        a fixed sample of the validation split against one of the tune split (never the
        test's), with the budget's kNN (none in a plan written before curves)."""
        arguments = self.plan["arguments"]
        every = arguments.get("curve_every", LATER_ARGUMENTS["curve_every"][0])
        if not every:
            return []
        memory, queries = arguments["curve_images"]
        return [f"evaluation.knn_monitor_every={every}",
                f"evaluation.knn_monitor_memory=split:{self.split('tune')}",
                f"evaluation.knn_monitor_queries=split:{self.split('validation')}",
                f"evaluation.knn_monitor_train_images={memory}",
                f"evaluation.knn_monitor_test_images={queries}",
                f"evaluation.knn_monitor_k={self.plan['knn_k']}",
                f"evaluation.knn_monitor_temperature={self.plan['knn_temperature']}"]

    def trial_point(self, method, trial):
        """The settings of ``method``'s trial ``trial``: a designed one, else a spare."""
        designed = self.plan["trials"][method]
        if trial < len(designed):
            return designed[trial]
        return self.plan["spares"][method][trial - len(designed)]

    def tie_key(self, method, trial):
        """The key of a trial's second run (another seed), which settles a close choice."""
        return f"{self.trial_key(method, trial)}-seed{self.plan['arguments']['seed'] + 1}"

    def trials_of(self, method):
        """The trials ``method`` runs: its designed ones and, for each that failed (stopped
        itself, or its collapse was warned), the next spare while spares last (a plan made
        before spares replaces none)."""
        listed = list(range(self.plan["arguments"]["trials"]))
        spares = len(self.plan.get("spares", {}).get(method, []))
        replaced = 0
        for trial in listed:  # grows as replacements are appended
            if replaced < spares and failed_trial(self.entry(self.trial_key(method, trial))):
                listed.append(len(self.plan["trials"][method]) + replaced)
                replaced += 1
        return listed

    def close_trials(self, method):
        """The trials whose validation kNN lies within one standard error of the best (the
        binomial error of the best on the validation split), when more than one does: their
        choice is settled by a second seed each.  [] in a plan made before (no spares), or
        while a trial has not finished."""
        if "spares" not in self.plan:
            return []
        entries = {t: self.entry(self.trial_key(method, t)) for t in self.trials_of(method)}
        if any(not trial_finished(e) for e in entries.values()):
            return []
        scores = {t: e["knn_top1"] for t, e in entries.items()
                  if "knn_top1" in e and not failed_trial(e)}
        if len(scores) < 2:
            return []
        best = max(scores.values())
        error = validation_error(best, self.plan["images"]["validation"])
        close = [t for t, score in scores.items() if score >= best - error]
        return close if len(close) > 1 else []

    def runs(self):
        """[(key, method, trial, seed, final)] in the order they run (the module docstring);
        a final run's trial is None until its method's trials have all finished.  A trial's
        replacement and a close choice's second seeds join as their need is known."""
        arguments = self.plan["arguments"]
        order = []
        listed = {method: self.trials_of(method) for method in arguments["methods"]}
        for place in range(max(len(trials) for trials in listed.values())):
            for method in arguments["methods"]:
                if place < len(listed[method]):
                    trial = listed[method][place]
                    order.append((self.trial_key(method, trial), method, trial,
                                  arguments["seed"], False))
        for method in arguments["methods"]:
            for trial in self.close_trials(method):
                order.append((self.tie_key(method, trial), method, trial,
                              arguments["seed"] + 1, False))
        chosen = {method: self.chosen(method) for method in arguments["methods"]}
        for seed in range(arguments["seeds"]):
            for method in arguments["methods"]:
                order.append((self.final_key(method, seed), method, chosen[method], seed, True))
        return order

    def chosen(self, method):
        """The trial with the best validation kNN (the first of a tie; a failed trial loses
        to any that did not fail), its close rivals judged by the mean of their two seeds; None
        while one has not finished."""
        trials = self.trials_of(method)
        entries = {t: self.entry(self.trial_key(method, t)) for t in trials}
        if any(not trial_finished(e) for e in entries.values()):
            return None
        close = self.close_trials(method)
        if close:
            seconds = {t: self.entry(self.tie_key(method, t)) for t in close}
            if any(not trial_finished(e) for e in seconds.values()):
                return None
            scores = {t: (entries[t]["knn_top1"] + seconds[t].get("knn_top1", -math.inf)) / 2
                      for t in close}
        else:
            scores = {t: (e.get("knn_top1", -math.inf) - (math.inf if failed_trial(e) and
                                                           "spares" in self.plan else 0))
                      for t, e in entries.items()}
            if all(score == -math.inf for score in scores.values()):  # every trial failed:
                scores = {t: e.get("knn_top1", -math.inf) for t, e in entries.items()}
        return max(scores, key=lambda t: (scores[t], -t))

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
        from caco_tf.build import batch_cautions, load_data, plan_run
        from caco_tf.run_settings import RunSettings

        cautions = {}  # each warning once, however many runs it concerns
        loaded = {}  # the training images of the trials and of the chosen settings, read once
        for method in self.plan["arguments"]["methods"]:
            spares = len(self.plan.get("spares", {}).get(method, []))
            for trial in range(self.plan["arguments"]["trials"] + spares):
                for final in (False, True):
                    config = self.config(method, trial, 0, final)
                    try:
                        settings = RunSettings.of(config)
                        if final not in loaded:
                            loaded[final] = load_data(settings.data)[0]
                        plan = plan_run(settings, loaded[final], warn=False)
                    except UserError as error:
                        raise type(error)(f"{method}, trial {trial}: {error}") from None
                    cautions.update(dict.fromkeys(batch_cautions(plan)))
        for caution in cautions:
            logging.getLogger("caco_tf").warning("warning: %s", caution)


def failed_trial(entry):
    """Whether a trial failed: it stopped itself (a NaN loss, a collapse) or its collapse was
    warned; it is replaced by a spare and loses the choice to any that did not fail."""
    return "failed" in entry or bool(entry.get("collapse_warned"))


def trial_finished(entry):
    return "knn_top1" in entry or "failed" in entry


def validation_error(top1, images):
    """One standard error (points) of a top-1 of ``top1`` % measured on ``images`` images."""
    p = min(max(top1 / 100.0, 0.0), 1.0)
    return 100.0 * math.sqrt(p * (1 - p) / max(images, 1))


def parse_key(key):
    """(final, method, trial or seed number, seed of a trial's second run or None) of a run's
    key: ``final/METHOD/seedS``, ``tune/METHOD/trialT`` or ``tune/METHOD/trialT-seedS``."""
    stage, method, which = key.split("/")
    if stage == "final":
        return True, method, int(which.removeprefix("seed")), None
    trial, _, seed = which.removeprefix("trial").partition("-seed")
    return False, method, int(trial), int(seed) if seed else None


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


def check_backbone(methods, config):
    """Methods of a ViT's tokens (``CONSUMES``) on a budget whose backbone has none are refused
    in one line naming them all, before anything is written."""
    from caco_tf.build import gives_tokens

    model = config["model"]
    needing = [m for m in methods if m in trials_lib.vit_methods()]
    if needing and not gives_tokens(model["backbone"]):
        works = "they work" if len(needing) > 1 else "it works"
        # What the budget's ConvNet declares and a ViT refuses goes too.
        extra = ((" --set model.widths=null" if model["widths"] is not None else "")
                 + (" --set model.pool_grid=1" if model["pool_grid"] != 1 else ""))
        raise ConfigError(f"--methods {', '.join(needing)}: {works} on a Vision Transformer's "
                          f"patch tokens, and the budget's model.backbone {model['backbone']} "
                          f"has none: pass --backbone vit_micro_patch4{extra} (or another ViT "
                          f"preset: docs/vit.md)")


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
        entry["step_flops"] = step_flops(config)
        comparison.save_entry(key, entry)
    return entry


def step_flops(config):
    """The counted model FLOPs of one training step of ``config``'s model
    (``profiling.method_step_flops``): the compute its curve is read against."""
    import keras

    from caco_tf.build import build_model
    from caco_tf.nets import profiling

    keras.backend.clear_session()
    model = build_model(config, steps_per_epoch=100)
    return float(profiling.method_step_flops(model, crop_sizes(config),
                                             config["train"]["batch_size"], config))


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


# The evaluations of a final run, each a JSON in its run folder (what the report reads): the
# linear protocol's, and the few-label linear protocol's of each label draw (``few_label_file``;
# ``FEW_LABEL``: a plan's one draw, written before the draws).
LINEAR, FEW_LABEL = "eval_linear.json", "eval_linear_few_labels.json"
# The few-label draws of a new plan (``--few-label-draws``): a run's few-label figure is their
# mean, so that it measures the method, not the luck of one draw of labelled images.
FEW_LABEL_DRAWS = LATER_ARGUMENTS["few_label_draws"][1]


def few_label_splits(comparison):
    """The comparison's few-label splits, one per label draw (``splits.few_label_names``):
    ``few_labels_0``, ...; a plan written before the draws: its one ``few_labels``."""
    arguments = comparison.plan["arguments"]
    return splits_lib.few_label_names(arguments["few_labels"], arguments.get("few_label_draws"))


def few_label_epochs(arguments):
    """The few-label probe's epochs: ``--few-label-epochs``, else (and in older plans) the
    linear protocol's.  With 10 images a class an epoch is one step of the probe, so the
    epochs that suit 20,000 images leave it short of converged."""
    return arguments.get("few_label_epochs") or arguments["linear_epochs"]


def few_label_file(split):
    """A run folder's JSON of the few-label evaluation on ``split``
    (``eval_linear_few_labels_<d>.json``; ``FEW_LABEL`` for ``few_labels``)."""
    return f"eval_linear_{split}.json"


def few_label_summary(values):
    """The few-label figure of a run (or of a baseline) from its draws' top-1: their mean
    (``few_label_top1``), each draw's (``few_label_top1_draws``, in draw order) and their
    standard deviation over the draws (``few_label_top1_sd``; None for one draw)."""
    values = [float(v) for v in values]
    mean = sum(values) / len(values)
    sd = (math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
          if len(values) > 1 else None)
    return {"few_label_top1": mean, "few_label_top1_draws": values, "few_label_top1_sd": sd}


def evaluate(comparison, key):
    """A final run's linear top-1 on the test split and its few-label linear top-1 on each
    label draw (``few_label_splits``), each once: the entry records each draw's figure as it is
    measured (a stopped run resumes at the next draw), then their mean and standard deviation
    (``few_label_summary``); a plan written before the draws records its one figure alone."""
    from caco_tf.evaluation import protocols

    entry = comparison.entry(key)
    if "knn_top1" not in entry:
        return entry
    arguments, run_dir = comparison.plan["arguments"], comparison.run_dir(key)
    linear = dict(epochs=arguments["linear_epochs"], verbose=0, seed=entry["seed"])
    note_machine(entry)
    started = time.monotonic()

    def timed():  # the probes' seconds so far, summed over the sessions that ran them
        entry["probe_seconds"] = round(entry.get("probe_seconds", 0.0)
                                       + time.monotonic() - started, 1)

    if "linear_top1" not in entry:
        result = protocols.evaluate("linear", run=run_dir, **linear)
        write_json_atomically(os.path.join(run_dir, LINEAR), result, indent=1)
        entry["linear_top1"] = result["top1"]
        timed()
        comparison.save_entry(key, entry)
        started = time.monotonic()
    draws = few_label_splits(comparison)
    if draws and "few_label_top1" not in entry:
        values = list(entry.get("few_label_top1_draws", []))
        few = dict(linear, epochs=few_label_epochs(arguments))
        for split in draws[len(values):]:
            result = protocols.evaluate(
                "linear", run=run_dir, data=f"split:{comparison.split(split)}",
                held_out=f"split:{comparison.split('test')}", **few)
            write_json_atomically(os.path.join(run_dir, few_label_file(split)), result,
                                  indent=1)
            values.append(result["top1"])
            timed()
            started = time.monotonic()
            if split != "few_labels":  # a plan's one draw of old: its figure alone, as before
                entry["few_label_top1_draws"] = values
                comparison.save_entry(key, entry)
        if draws == ["few_labels"]:
            entry["few_label_top1"] = values[0]
        else:
            entry.update(few_label_summary(values))
        comparison.save_entry(key, entry)
    return entry


# What training must beat, measured once on the test split, each by every probe of the final
# runs (``baseline_probes``): each baseline of caco-evaluate in ``OUT/baselines/NAME_PROBE.json``
# (its JSON; ``NAME_knn.json``, ``NAME_linear.json``, ``NAME_few_labels_<d>.json``).
BASELINES = ("pixels", "untrained")


def baseline_probes(comparison):
    """The probes of the baselines: ``knn``, ``linear`` and each few-label draw
    (``few_label_splits``); a plan written before the draws, whose baselines were measured by
    the kNN alone: ``knn`` (what it planned; its report shows the others as not measured)."""
    if comparison.plan["arguments"].get("few_label_draws") is None:
        return ["knn"]
    return ["knn", "linear"] + few_label_splits(comparison)


def baseline_path(comparison, name, probe="knn"):
    return os.path.join(comparison.folder, "baselines", f"{name}_{probe}.json")


def measure_baselines(comparison, say=print):
    """The raw pixels and the untrained network (seeded by the comparison's seed) measured on
    the test split by every probe (``baseline_probes``): the kNN at the budget's image size and
    kNN settings, the linear protocol on the training images and on each few-label draw, at
    ``--linear-epochs`` (a few-label draw at ``few_label_epochs``): what a method has to beat to be worth its training on these images.
    Built from the budget as the first method's final runs train it (no run folder is read: a
    comparison restored from its JSON files measures them again); each once, after a final run
    has been measured.  Returns ``baselines`` (the kNN figures)."""
    from caco_tf.evaluation import protocols

    if not any("knn_top1" in comparison.entry(key)
               for key, *_, final in comparison.runs() if final):
        return {}
    arguments = comparison.plan["arguments"]
    seed = arguments["seed"]
    missing = [(name, probe) for probe in baseline_probes(comparison) for name in BASELINES
               if not os.path.exists(baseline_path(comparison, name, probe))]
    if missing:
        config = comparison.config(arguments["methods"][0], 0, seed, True)
    linear = dict(epochs=arguments["linear_epochs"], verbose=0)
    for name, probe in missing:
        path = baseline_path(comparison, name, probe)
        if probe == "knn":
            result = protocols.evaluate("knn", config=config, baseline=name, seed=seed)
        elif probe == "linear":
            result = protocols.evaluate("linear", config=config, baseline=name, seed=seed,
                                        **linear)
        else:  # a few-label draw
            result = protocols.evaluate(
                "linear", config=config, baseline=name, seed=seed,
                data=f"split:{comparison.split(probe)}",
                held_out=f"split:{comparison.split('test')}",
                **dict(linear, epochs=few_label_epochs(arguments)))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_json_atomically(path, result, indent=1)
        words = {"knn": "kNN", "linear": "linear"}.get(probe, f"few-label ({probe})")
        say(f"baseline {name}: test {words} {result['top1']:.1f}%")
    return baselines(comparison)


def _baseline_top1(comparison, name, probe):
    result = comparison.read(baseline_path(comparison, name, probe),
                             f"remove it: the command measures the {name} baseline again")
    if result is not None and isinstance(result.get("top1"), (int, float)):
        return float(result["top1"])
    return None


def baselines(comparison):
    """{name: kNN top-1} of the baselines measured (``measure_baselines``)."""
    found = {}
    for name in BASELINES:
        figure = _baseline_top1(comparison, name, "knn")
        if figure is not None:
            found[name] = figure
    return found


def baseline_figures(comparison):
    """{name: {protocol: top-1}} of the baselines measured, by the report's protocol keys:
    ``knn_top1``, ``linear_top1`` and, once every draw is measured, ``few_label_summary``'s."""
    found = {}
    for name in BASELINES:
        figures = {}
        for probe, key in (("knn", "knn_top1"), ("linear", "linear_top1")):
            if probe in baseline_probes(comparison):
                figure = _baseline_top1(comparison, name, probe)
                if figure is not None:
                    figures[key] = figure
        draws = [split for split in baseline_probes(comparison) if split.startswith("few_")]
        values = [_baseline_top1(comparison, name, split) for split in draws]
        if draws and None not in values:
            figures.update(few_label_summary(values))
        if figures:
            found[name] = figures
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
    """Whether run ``key`` has everything measured (a failed run is finished too): a final
    run's few-label figure once every draw is measured."""
    entry = comparison.entry(key) if entry is None else entry
    if "failed" in entry:
        return True
    wanted = ["knn_top1"] + (["linear_top1"] if final else []) + (
        ["few_label_top1"] if final and few_label_splits(comparison) else [])
    return all(name in entry for name in wanted)


def run_one(comparison, key, say=print):
    """Train and measure run ``key`` (what it lacks); returns its entry."""
    final, method, number, second_seed = parse_key(key)
    trial, seed = ((comparison.chosen(method), number) if final
                   else (number, second_seed if second_seed is not None
                         else comparison.plan["arguments"]["seed"]))
    if final and all("failed" in comparison.entry(comparison.trial_key(method, t))
                     for t in comparison.trials_of(method)):
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

    from caco_tf.build import build_model, view_masks
    from caco_tf.run_settings import RunSettings

    measured = comparison.state.setdefault("calibration", {})
    for method in comparison.plan["arguments"]["methods"]:
        if method in measured:
            continue
        config = comparison.config(method, 0, 0, False)
        keras.backend.clear_session()
        keras.utils.set_random_seed(0)
        start = time.time()
        model = build_model(config, steps_per_epoch=100)
        batch = config["train"]["batch_size"]
        crops = tuple(tf.random.normal((batch, size, size, config["data"]["channels"]))
                      for size in crop_sizes(config))
        drawn = view_masks(RunSettings.of(config))
        if drawn:  # a method of masks takes them after its crops, as the pipeline draws them
            kinds, (rows, cols) = drawn
            crops += tuple(kind.draw(tf.constant([0, i], tf.int64), batch, rows, cols)
                           for i, kind in enumerate(kinds))
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
    features), seconds per fit (its tracing), per later fit of the same head (``HeadFits``),
    per epoch and per step (the steps timed on as many rows as the
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

    def refit(fits):
        """A fit of one step (and its test) on ``fits``' head, traced already: its seconds."""
        start = time.perf_counter()
        head = fits.fresh(0.0)
        fits.total_steps.assign(1.0)
        head.fit(linear.feature_batches(rows[:batch], np.arange(batch) % 10, batch),
                 epochs=1, verbose=0, shuffle=False)
        head.evaluate(linear.feature_batches(rows[:batch], np.arange(batch) % 10, batch),
                      verbose=0)
        return time.perf_counter() - start

    keras.utils.set_random_seed(0)
    fit(1, 2)  # the process's first fit pays costs no other fit pays
    total, epoch_and_step = fit(1, 21)  # an epoch's overhead and one step
    _, epoch_and_steps = fit(most, 6)
    step = max(0.0, (epoch_and_steps - epoch_and_step) / (most - 1))
    fits = linear.HeadFits(dim, 10)
    refit(fits)  # traces
    again = sorted(refit(fits) for _ in range(3))[1]
    return {"image_seconds": image_seconds, "fit_seconds": max(0.0, total - 21 * epoch_and_step),
            "refit_seconds": max(0.0, again - step),
            "epoch_seconds": max(0.0, epoch_and_step - step), "step_seconds": step}


def linear_seconds(costs, train_count, test_count, epochs, batch_size=None):
    """The linear protocol's cost for ``train_count`` training and ``test_count`` test images:
    the features of both, then λ's cross-validation (``L2_GRID`` × ``L2_FOLDS`` fits, each on
    all folds but one) and the final fit (``linear.linear_evaluation``), on one head traced
    once (``refit_seconds`` each fit after the first; a calibration without it, the first's)."""
    from caco_tf.evaluation import L2_FOLDS, L2_GRID

    batch_size = batch_size or PROBE_BATCH_SIZE
    held = train_count / L2_FOLDS
    fits = [train_count - held] * (len(L2_GRID) * L2_FOLDS) + [train_count]
    steps = sum(epochs * math.ceil(rows / batch_size) for rows in fits)
    # No epoch's overhead (``epoch_seconds``): a fit runs its epochs in one pass.
    refit = costs.get("refit_seconds", costs["fit_seconds"])
    return (costs["image_seconds"] * (train_count + test_count) + costs["fit_seconds"]
            + (len(fits) - 1) * refit + steps * costs["step_seconds"])


def crop_sizes(config):
    """The sides of the crops a batch of the run holds: two global crops then the local ones
    (multi-crop), else the method's K equal views (W-MSE's K, MAE's one)."""
    from caco_tf.run_settings import RunSettings

    size, local = config["data"]["image_size"], config["data"]["multicrop"]
    if config["data"]["views"] == "multicrop":
        return [size, size] + [local["local_size"]] * local["local_crops"]
    return [size] * RunSettings.of(config).views_per_image


# The steps of a run cost more than the calibration's (the input pipeline, the epoch's end and
# the export): a factor, and seconds per run, measured on this project's runs.
OVERHEAD_FACTOR = 1.3
SECONDS_PER_RUN = 20.0


def estimate_seconds(comparison):
    """The seconds the runs the state lacks will take: the training (from the method's runs
    finished on this machine, ``seconds_per_image_trained``, else on any one machine, else from
    the calibration: the steps and the kNN at the run's end) and, per seed, the linear
    evaluation and the few-label one of each label draw not measured yet (from the method's
    finals probed on this machine, ``probe_seconds``, else on any one machine, else from the
    calibration); then the baselines not measured yet (``baseline_seconds``).  A comparison
    resumed on a machine of another kind has no run of its own yet: the runs finished
    elsewhere count the pipeline, the epoch's end and the probes as they ran, which the
    calibration's two steps, taken when the plan was made, do not."""
    calibration = comparison.state.get("calibration", {})
    costs = comparison.state.get("evaluation")
    plan, images = comparison.plan, comparison.plan["images"]
    arguments = plan["arguments"]
    draws = len(few_label_splits(comparison))
    entries = {key: comparison.entry(key) for key, *_ in comparison.runs()}  # each read once
    per_image = {**seconds_per_image_trained(comparison, entries, here=None),
                 **seconds_per_image_trained(comparison, entries)}
    probes = {**probe_seconds(comparison, entries, here=None),
              **probe_seconds(comparison, entries)}
    total = 0.0
    for key, method, trial, seed, final in comparison.runs():
        entry = entries[key]
        if finished(comparison, key, final, entry):
            continue
        trained = images["train" if final else "tune"] * plan["epochs"]
        steps = images["train" if final else "tune"] // plan["batch_size"] * plan["epochs"]
        measured = calibration.get(method, {"step_seconds": 0.0, "setup_seconds": 0.0})
        if "knn_top1" not in entry and method in per_image:
            total += per_image[method] * trained
        elif "knn_top1" not in entry:
            total += (steps * measured["step_seconds"] * OVERHEAD_FACTOR
                      + measured["setup_seconds"] + SECONDS_PER_RUN)
            if costs:  # the kNN's features of the run's training and held-out images
                total += costs["image_seconds"] * (
                    images["train"] + images["test"] if final
                    else images["tune"] + images["validation"])
        if final and method in probes and "linear_top1" not in entry \
                and not entry.get("few_label_top1_draws"):
            total += probes[method]  # every probe of the run, as its finished seeds took
        elif final and costs:
            epochs = arguments["linear_epochs"]
            if "linear_top1" not in entry:
                total += linear_seconds(costs, images["train"], images["test"], epochs)
            if draws and "few_label_top1" not in entry:
                left = draws - len(entry.get("few_label_top1_draws", []))
                total += left * linear_seconds(costs, images["few_labels"], images["test"],
                                               few_label_epochs(arguments))
    if costs:
        total += baseline_seconds(comparison, costs)
    return total


def seconds_per_image_trained(comparison, entries, here=""):
    """{method: the median over its runs trained to the end on machine ``here`` alone (default
    this one; None: any, each run on one machine) of their ``train_seconds`` (setup, steps, the
    run's kNN and export) per image trained}; ``entries``: {key: entry}.  The calibration is
    taken once, when the plan is made, perhaps on another machine or beside other work: a
    method's own finished runs say more."""
    here, found = machine() if here == "" else here, {}
    images, epochs = comparison.plan["images"], comparison.plan["epochs"]
    for key, method, trial, seed, final in comparison.runs():
        entry = entries[key]
        if "knn_top1" in entry and entry.get("train_seconds") and on_one(entry, here):
            found.setdefault(method, []).append(
                entry["train_seconds"] / (images["train" if final else "tune"] * epochs))
    return {method: float(np.median(values)) for method, values in found.items()}


def on_one(entry, here):
    """The run was trained and measured on machine ``here`` alone (None: on any one machine):
    a run spread over machines of other kinds times neither."""
    machines = entry.get("machines") or []
    return len(machines) == 1 and (here is None or machines == [here])


def probe_seconds(comparison, entries, here=""):
    """{method: the median over its final runs probed to the end on machine ``here`` alone (as
    ``seconds_per_image_trained``) of their ``probe_seconds`` (the linear probe and every
    few-label draw)}: a method's own probes say more than the calibration."""
    here, found = machine() if here == "" else here, {}
    for key, method, trial, seed, final in comparison.runs():
        entry = entries[key]
        if final and entry.get("probe_seconds") and on_one(entry, here) \
                and finished(comparison, key, final, entry):
            found.setdefault(method, []).append(entry["probe_seconds"])
    return {method: float(np.median(values)) for method, values in found.items()}


def baseline_seconds(comparison, costs):
    """The seconds the baselines not measured yet will take (``baseline_probes``): the kNN's
    features of the training and test images, the linear protocol's fits on the training
    images and on each few-label draw (the raw pixels' features, wider than the network's,
    are counted as the network's)."""
    images, arguments = comparison.plan["images"], comparison.plan["arguments"]
    total = 0.0
    for name in BASELINES:
        for probe in baseline_probes(comparison):
            if os.path.exists(baseline_path(comparison, name, probe)):
                continue
            if probe == "knn":
                total += costs["image_seconds"] * (images["train"] + images["test"])
            elif probe == "linear":
                total += linear_seconds(costs, images["train"], images["test"],
                                        arguments["linear_epochs"])
            else:
                total += linear_seconds(costs, images["few_labels"], images["test"],
                                        few_label_epochs(arguments))
    return total


def config_argument(name):
    """``--config`` as the plan records it: a shipped name, else the file's absolute path."""
    from caco_tf.config import shipped_configs

    return name if name in shipped_configs() else os.path.abspath(config_path(name))
