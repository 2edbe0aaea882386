"""caco-compare: the splits, the trials, the statistics of the report, and the command itself
(resumed after a SIGTERM with nothing measured twice)."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image

from caco_tf.cli import compare as compare_cli
from caco_tf.comparison import report, runner, splits, trials
from caco_tf.config import load_config
from caco_tf.data import sources
from caco_tf.machine import machine
from caco_tf.methods import METHODS

import launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------- the splits
def test_the_splits_are_stratified_disjoint_and_seeded():
    labels = np.repeat(np.arange(4), [10, 20, 30, 40])
    kept, carved = splits.stratified(labels, 0.2, seed=3)
    assert not set(kept) & set(carved) and len(kept) + len(carved) == len(labels)
    assert [int((labels[carved] == c).sum()) for c in range(4)] == [2, 4, 6, 8]
    again = splits.stratified(labels, 0.2, seed=3)[1]
    other = splits.stratified(labels, 0.2, seed=4)[1]
    assert np.array_equal(carved, again) and not np.array_equal(carved, other)

    carved_all = splits.carve(labels, None, 0.2, 0.25, per_class=3, seed=0)
    names = {name: set(positions) for name, (_, positions) in carved_all.items()}
    assert all(part == "train" for part, _ in carved_all.values())
    assert not names["test"] & names["train"]  # the test is carved from the images first
    assert not names["tune"] & names["validation"]
    assert names["tune"] | names["validation"] == names["train"]
    assert names["few_labels"] <= names["train"]
    assert np.bincount(labels[sorted(names["few_labels"])]).tolist() == [3, 3, 3, 3]

    with_held_out = splits.carve(labels, np.arange(7) % 2, 0.2, 0.25, per_class=0, seed=0)
    assert with_held_out["test"][0] == "held_out" and len(with_held_out["test"][1]) == 7
    assert len(with_held_out["train"][1]) == len(labels) and "few_labels" not in with_held_out


def test_a_split_file_names_its_images_and_may_relabel_them(tmp_path):
    images = np.arange(10 * 4 * 4, dtype=np.uint8).reshape(10, 4, 4, 1)
    path = tmp_path / "d.npz"
    np.savez(path, images=images, labels=np.arange(10) % 2)
    split = tmp_path / "s.json"
    split.write_text(json.dumps(sources.split_file(f"npz:{path}", "train", [1, 4, 7],
                                                   labels=[5, 6, 5])))
    source, held_out = sources.load_source(f"split:{split}")
    assert held_out is None and np.array_equal(source.images, images[[1, 4, 7]])
    assert source.labels.tolist() == [5, 6, 5]
    split.write_text(json.dumps(sources.split_file(f"npz:{path}", "train", [3, 12])))
    with pytest.raises(sources.DataError, match="names image 12 of .* which holds 10"):
        sources.load_source(f"split:{split}")
    split.write_text("{")
    with pytest.raises(sources.DataError, match="is not a split"):
        sources.load_source(f"split:{split}")
    assert load_config(None, [f"data.source=split:{split}",
                              f"data.held_out=split:{split}"])["data"]["held_out"]


def test_a_record_source_is_carved_by_its_labels_and_its_splits_train_and_evaluate(tmp_path):
    import tensorflow as tf

    from caco_tf import data
    from test_data import EchoImageViews
    from test_user_data import write_shards

    spec = f"tfrecord:{write_shards(tmp_path / 'shards')}"  # 24 PNGs: pixel 10n + 1, label n % 4
    source = sources.load_source(spec)[0]

    def numbers(dataset):  # each element's image number, from its pixel
        return [(int(tf.io.decode_png(item[0])[0, 0, 0]) - 1) // 10 for item, _ in dataset]

    order = numbers(source.ordered())
    labels = runner.labels_of(source, spec, None)[0]  # one pass over the records' labels
    assert labels.tolist() == [n % 4 for n in order] and sorted(order) == list(range(24))
    carved = splits.carve(labels, None, 0.25, 0.25, 2, seed=0)
    part, tune = carved["tune"]
    path = tmp_path / "tune.json"
    path.write_text(json.dumps(sources.split_file(spec, part, tune)))
    chosen = sources.load_source(f"split:{path}")[0]
    expected = [order[p] for p in tune]
    assert len(chosen) == len(tune) and numbers(chosen.ordered()) == expected
    assert sources.class_indices(chosen).tolist() == [n % 4 for n in expected]
    assert sources.num_classes(chosen) == 4
    seen = []
    for pipeline in range(2):  # two input pipelines: each every other chosen record
        context = tf.distribute.InputContext(2, pipeline, 2)
        stream = data.pretrain_dataset(chosen, 4, EchoImageViews(6), seed=1,
                                       input_context=context, image_size=6, channels=1,
                                       steps_per_epoch=len(tune) // 4)
        for view, _ in stream.take(len(tune) // 4):
            seen += [(int(round(v)) - 1) // 10 for v in view.numpy()[:, 0, 0, 0]]
    assert sorted(seen) == sorted(expected)  # one epoch: every chosen record, once
    batches = data.eval_dataset(chosen, 4, lambda x: x, image_size=6, channels=1)
    assert np.concatenate([b[1].numpy() for b in batches]).tolist() == [n % 4 for n in expected]


# ---------------------------------------------------------------------- the trials
@pytest.fixture(scope="module")
def budget():
    return load_config("mnist")


def test_every_method_gets_the_same_trials_over_the_same_kinds_of_knobs(budget):
    methods = trials.comparison_methods()
    assert "caco" in methods and "moco_v2" in methods and "none" not in methods
    spaces = {m: trials.search_space(m, budget) for m in methods}
    # The encoder's learning rate and one setting of the method's own: its three declared
    # values, and the budget's own when it is not one of them.
    for method, space in spaces.items():
        assert [key.split(".")[0] for key, _ in space] == ["train", "method"], method
        assert space[1][0].startswith(f"method.{method}.")
        assert len(space[0][1]) == 3 and len(space[1][1]) in (3, 4), method
    most = trials.max_trials(methods, budget)
    assert most == min(len(trials.grid(space)) for space in spaces.values()) >= 9
    for method in methods:
        drawn, spares = trials.draw_trials(method, budget, most, seed=0)
        assert len(drawn) == most  # a method cannot get more trials than another
        assert len({json.dumps(t, sort_keys=True) for t in drawn + spares}) == len(
            trials.grid(spaces[method]))  # the spares: the rest of the grid
        first = drawn[0]  # the budget as given, inside the space
        assert first["train.learning_rate"] == 0.03
        assert all(first[key] in values for key, values in spaces[method])
        assert (drawn, spares) == trials.draw_trials(method, budget, most, seed=0)
        for trial in drawn:  # every trial is a valid configuration
            load_config("mnist", trials.assignments(trial) + [f"method.name={method}"])
    # The comparison's seed breaks the design's ties: another seed, another draw.
    assert len({json.dumps(trials.draw_trials("byol", budget, 3, seed)[0])
                for seed in range(8)}) > 1
    with pytest.raises(ValueError, match="at most"):
        trials.draw_trials("byol", budget, 10, 0)


@pytest.mark.parametrize("budget_name", ["mnist", "shapes"])
def test_every_declared_dimension_takes_as_many_values_as_the_trials_allow(budget_name):
    """Equal search in effect: with T trials every dimension of n values takes min(T, n) of
    them, for every method (two trials: both dimensions move; the full grid at its size)."""
    config = load_config(budget_name)
    methods = trials.comparison_methods()
    for count in range(1, trials.max_trials(methods, config) + 1):
        for method in methods:
            space = trials.search_space(method, config)
            drawn, _ = trials.draw_trials(method, config, count, seed=3)
            for key, values in space:
                assert len({t[key] for t in drawn}) == min(count, len(values)), (
                    method, count, key)


def test_a_plan_records_the_commit_it_started_at():
    """A checkout's HEAD (with "+changes" when caco_tf's files differ), None without git."""
    import shutil

    from caco_tf.machine import source_commit

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(runner.__file__))))
    if not (shutil.which("git") and os.path.exists(os.path.join(root, ".git"))):
        assert source_commit() is None
        return
    head = subprocess.run(["git", "-C", root, "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert source_commit() in (head, head + "+changes")


def test_banks_and_queues_are_fitted_to_the_images(budget):
    assert trials.fitted_rows("caco", budget, 4000) == []  # 1,024 rows fit 4,000 images
    assert trials.fitted_rows("caco", budget, 300) == ["method.caco.bank_size=256"]
    assert trials.fitted_rows("nnclr", budget, 300) == ["method.nnclr.queue_size=256",
                                                        "method.nnclr.warmup_bank_size=256"]
    assert all(setting.rows == (key in ("bank_size", "queue_size", "warmup_bank_size"))
               for cls in METHODS.values() for key, setting in cls.SETTINGS.items())


# ---------------------------------------------------------------------- the report's words
def rows_of(figures):
    return {m: {"trial": 0, "health": [], "seeds": {s: {"knn_top1": v}
                                                   for s, v in enumerate(values)}}
            for m, values in figures.items()}


def test_a_ranking_sentence_needs_a_paired_test_that_survives_holms_correction():
    rows = rows_of({"a": [90.0, 91.0, 92.0], "b": [89.0, 89.9, 91.1], "c": [80.0, 95.0, 91.0]})
    said = report.sentences(rows, "knn_top1", "kNN top-1")
    # a - b = 1.0, 1.1, 0.9: mean 1.0, t interval 1.0 ± 4.303·0.1/√3, t = 10√3, two-sided p
    # 1 - t / √(2 + t²) with 2 degrees of freedom (closed form); the smallest of the family's 3
    # p values, so Holm multiplies it by 3.
    half, t = 4.302652729911275 * 0.1 / np.sqrt(3), 10 * np.sqrt(3)
    p = 1 - t / np.sqrt(2 + t * t)
    assert said[1] == (f"a above b: +1.0 points, uncorrected 95 % interval [{1 - half:+.2f}, "
                       f"{1 + half:+.2f}], p {p:.3f}, Holm-adjusted p {3 * p:.3f} (3 paired "
                       f"seeds).")
    assert "no difference measured between a and c" in said[2]
    assert said[0] == ("On kNN top-1, a has the highest mean; after Holm's correction over the "
                       "3 pairs it is above b, and not distinguishable from c.")
    # In a family of 10 pairs, the same p is the third smallest: Holm multiplies it by 8.
    rows.update(rows_of({"d": [10.0, 30.0, 20.0], "e": [12.0, 33.0, 19.0]}))
    noisy = report.sentences(rows, "knn_top1", "kNN top-1")
    assert f"p {p:.3f}, Holm-adjusted p {8 * p:.3f} (3 paired seeds)." in noisy[1]
    assert report.sentences(rows_of({"a": [1.0, 2.0]}), "knn_top1", "kNN") == []
    # Methods with one seed so far: one sentence for them, not "not distinguishable".
    rows = rows_of({"a": [90.0, 91.0, 92.0], "b": [89.0, 89.9, 91.1], "c": [80.0, 95.0, 91.0]})
    rows.update(rows_of({"d": [50.0], "e": [40.0]}))
    said = report.sentences(rows, "knn_top1", "kNN top-1")
    assert said[0].endswith("over the 3 pairs it is above b, and not distinguishable from c.")
    assert said[-1] == "a against d, e: fewer than two common seeds, nothing measured."


def fake_comparison(folder, knn):
    """A comparison folder as the runner leaves it, without training: plan, state, and the
    run folders' figures (``knn``: {method: [figure per seed]})."""
    comparison = runner.Comparison(folder)
    methods = list(knn)
    comparison.plan = {
        "arguments": {"config": "mnist", "data": "mnist", "labels": None, "settings": [],
                      "methods": methods, "trials": 2, "seeds": 3, "seed": 0,
                      "few_labels": 0, "validation_fraction": 0.2, "test_fraction": 0.2,
                      "linear_epochs": 1},
        "command": "caco-compare --data mnist", "caco_tf": "test", "created": "today",
        "commit": "0123456789ab",
        "budget_learning_rate": 0.03, "epochs": 1, "batch_size": 16,
        "images": {"tune": 3200, "validation": 800, "train": 4000, "test": 1000},
        "search_spaces": {m: [["train.learning_rate", [0.01, 0.03, 0.09]]] for m in methods},
        "trials": {m: [{"train.learning_rate": 0.03}, {"train.learning_rate": 0.09}]
                   for m in methods},
        "fitted": {m: [] for m in methods}}
    for method, values in knn.items():
        for trial, figure in enumerate((50.0, 60.0)):
            key = comparison.trial_key(method, trial)
            comparison.save_entry(key, {"knn_top1": figure})
            with open(os.path.join(comparison.run_dir(key), "results.json"), "w") as handle:
                json.dump({"knn_top1": figure}, handle)
        for seed, figure in enumerate(values):
            key = comparison.final_key(method, seed)
            comparison.save_entry(key, {"knn_top1": figure, "linear_top1": 0.0,
                                        "command": "cmd", "machines": ["CPU A, 2 cores"] + (
                                            ["CPU B, 2 cores"] if seed == 2 else [])})
            for file, value in (("results.json", {"knn_top1": figure}),
                                (runner.LINEAR, {"top1": figure + 1}),
                                ("history.json", [{"epoch": 1, "loss": 2.0,
                                                   "rank_embedding": 10.0,
                                                   "uniformity": -2.0}])):
                with open(os.path.join(comparison.run_dir(key), file), "w") as handle:
                    json.dump(value, handle)
    return comparison


def test_the_report_says_which_cpu_trained_each_seed_and_names_a_seed_spread_over_two(tmp_path):
    """A paired test compares two methods' runs of one seed: the report says each seed's CPU,
    and names a seed whose runs ran on two (a seeded run repeats on one CPU model only)."""
    comparison = fake_comparison(tmp_path / "c", {"caco": [90.0, 91.0, 92.0],
                                                  "byol": [80.0, 80.5, 81.0]})
    for method in ("caco", "byol"):  # seed 2 resumed on CPU B for every method: mixed
        for seed in (0, 1):
            key = comparison.final_key(method, seed)
            comparison.save_entry(key, dict(comparison.entry(key), machines=[
                "CPU A, 2 cores" if seed == 0 else "CPU B, 2 cores"]))
    said = report.seeds_sentence(comparison)
    assert said == (
        "Seed 2's final runs ran on more than one CPU (CPU A, 2 cores + CPU B, 2 cores: caco, "
        "byol): a pair across two of them holds the CPUs' difference too (a seeded run repeats "
        "only on one CPU model); to pair them alone, remove the folders of the runs not of one "
        "CPU and run the comparison's command again on it.")
    key = comparison.final_key("byol", 2)
    comparison.save_entry(key, dict(comparison.entry(key), machines=["CPU B, 2 cores"]))
    assert report.seeds_sentence(comparison).startswith(
        "Seed 2's final runs ran on more than one CPU (CPU A, 2 cores + CPU B, 2 cores: caco; "
        "CPU B, 2 cores: byol)")
    key = comparison.final_key("caco", 2)
    comparison.save_entry(key, dict(comparison.entry(key), machines=["CPU B, 2 cores"]))
    assert report.seeds_sentence(comparison) == (
        "Each seed's final runs ran on one CPU (seed 0: CPU A, 2 cores; seeds 1, 2: CPU B, 2 "
        "cores), so every paired test compares runs of one CPU.")
    assert report.seeds_sentence(comparison) in report.markdown(report.document(comparison, []))


def test_the_linear_protocols_cost_counts_every_fit_of_its_cross_validation():
    from caco_tf.evaluation import L2_FOLDS, L2_GRID

    assert (len(L2_GRID), L2_FOLDS) == (5, 5)  # the closed forms below count 25 + 1 fits
    unit = dict(image_seconds=0.0, fit_seconds=0.0, epoch_seconds=0.0, step_seconds=1.0)
    # 1,000 images: folds of 200, each fit on 800 rows = 4 batches of 256; the final on 4.
    assert runner.linear_seconds(unit, 1000, 500, epochs=10) == 25 * 10 * 4 + 10 * 4
    assert runner.linear_seconds(dict(unit, step_seconds=0.0, fit_seconds=1.0,
                                      epoch_seconds=0.5, image_seconds=0.01),
                                 1000, 500, epochs=10) == 26 + 15  # epochs in one pass
    # One head traced once: the first fit pays the tracing, the 25 after it a refit each.
    assert runner.linear_seconds(dict(unit, step_seconds=0.0, fit_seconds=1.0,
                                      refit_seconds=0.1, image_seconds=0.01),
                                 1000, 500, epochs=10) == pytest.approx(1 + 25 * 0.1 + 15)


def test_the_estimate_counts_what_is_left_evaluations_included(tmp_path):
    comparison = fake_comparison(tmp_path / "c", {"caco": [90.0, 91.0, 92.0]})
    comparison.state = {"calibration": {"caco": {"step_seconds": 0.0, "setup_seconds": 0.0}},
                        "evaluation": dict(image_seconds=0.0, fit_seconds=0.0,
                                           epoch_seconds=0.0, step_seconds=1.0)}
    arguments = comparison.plan["arguments"]
    assert runner.estimate_seconds(comparison) == 0.0  # every run measured
    comparison.save_entry("final/caco/seed2", {"knn_top1": 92.0})  # its linear not yet
    linear = runner.linear_seconds(
        comparison.state["evaluation"], 4000, 1000, arguments["linear_epochs"])
    assert runner.estimate_seconds(comparison) == pytest.approx(linear)
    comparison.save_entry("final/caco/seed1", {})  # not trained: its training counts too
    assert runner.estimate_seconds(comparison) == pytest.approx(
        2 * linear + runner.SECONDS_PER_RUN)


def test_the_estimate_times_a_methods_training_by_its_runs_finished_on_this_machine(tmp_path):
    from caco_tf.machine import machine

    comparison = fake_comparison(tmp_path / "c", {"caco": [90.0, 91.0, 92.0]})
    comparison.state = {"calibration": {"caco": {"step_seconds": 1.0, "setup_seconds": 0.0}}}
    comparison.save_entry("final/caco/seed2", {})  # not trained yet: 4,000 images, 1 epoch
    calibrated = 4000 // 16 * 1.0 * runner.OVERHEAD_FACTOR + runner.SECONDS_PER_RUN
    assert runner.estimate_seconds(comparison) == pytest.approx(calibrated)  # nothing timed here
    for trial, seconds in enumerate((64.0, 96.0)):  # trials of 3,200 images
        comparison.save_entry(comparison.trial_key("caco", trial), {
            "knn_top1": 50.0, "train_seconds": seconds, "machines": [machine()]})
    median = (64.0 / 3200 + 96.0 / 3200) / 2
    assert runner.estimate_seconds(comparison) == pytest.approx(median * 4000)
    # A run measured (even in part) on another machine is not this machine's time.
    comparison.save_entry(comparison.trial_key("caco", 1), {
        "knn_top1": 50.0, "train_seconds": 96.0, "machines": [machine(), "CPU B, 2 cores"]})
    assert runner.estimate_seconds(comparison) == pytest.approx(64.0 / 3200 * 4000)


def test_on_a_new_machine_the_estimate_times_a_method_by_its_runs_finished_on_another(tmp_path):
    """Resumed on a machine of another kind: a method's runs finished on one other machine
    time its runs left before the calibration's two steps do; this machine's, once it has
    some, before both; a run spread over two machines times none."""
    from caco_tf.machine import machine

    comparison = fake_comparison(tmp_path / "c", {"caco": [90.0, 91.0, 92.0]})
    comparison.state = {"calibration": {"caco": {"step_seconds": 1.0, "setup_seconds": 0.0}}}
    comparison.save_entry("final/caco/seed2", {})  # not trained yet: 4,000 images, 1 epoch
    comparison.save_entry(comparison.trial_key("caco", 0), {
        "knn_top1": 50.0, "train_seconds": 32.0, "machines": ["CPU B, 2 cores"]})
    comparison.save_entry(comparison.trial_key("caco", 1), {
        "knn_top1": 50.0, "train_seconds": 320.0, "machines": ["CPU B, 2 cores", machine()]})
    assert runner.estimate_seconds(comparison) == pytest.approx(32.0 / 3200 * 4000)
    comparison.save_entry(comparison.trial_key("caco", 1), {
        "knn_top1": 50.0, "train_seconds": 64.0, "machines": [machine()]})
    assert runner.estimate_seconds(comparison) == pytest.approx(64.0 / 3200 * 4000)


def test_the_estimate_times_a_methods_probes_by_its_finals_probed_on_this_machine(tmp_path):
    """A final run's probes (linear, no few-label draws in this plan) are timed by the median
    of its method's finished finals on this machine, else by the calibration."""
    from caco_tf.machine import machine

    comparison = fake_comparison(tmp_path / "c", {"caco": [90.0, 91.0, 92.0]})
    costs = {"image_seconds": 0.001, "fit_seconds": 2.0, "step_seconds": 0.01}
    comparison.state = {"calibration": {"caco": {"step_seconds": 0.0, "setup_seconds": 0.0}},
                        "evaluation": costs}
    comparison.save_entry("final/caco/seed2", {"knn_top1": 92.0})  # trained, not probed
    calibrated = runner.linear_seconds(costs, 4000, 1000, 1) + runner.baseline_seconds(
        comparison, costs)
    assert runner.estimate_seconds(comparison) == pytest.approx(calibrated)
    for seed, seconds in ((0, 30.0), (1, 50.0)):
        comparison.save_entry(comparison.final_key("caco", seed), {
            "knn_top1": 90.0, "linear_top1": 91.0, "probe_seconds": seconds,
            "machines": [machine()]})
    timed = 40.0 + runner.baseline_seconds(comparison, costs)
    assert runner.estimate_seconds(comparison) == pytest.approx(timed)
    # Probed (even in part) on another machine: not this machine's time.
    comparison.save_entry(comparison.final_key("caco", 1), {
        "knn_top1": 90.0, "linear_top1": 91.0, "probe_seconds": 50.0,
        "machines": [machine(), "CPU B, 2 cores"]})
    assert runner.estimate_seconds(comparison) == pytest.approx(
        30.0 + runner.baseline_seconds(comparison, costs))
    # Probed on one other machine only: its time, before the calibration's.
    comparison.save_entry(comparison.final_key("caco", 0), {
        "knn_top1": 90.0, "linear_top1": 91.0, "probe_seconds": 70.0,
        "machines": ["CPU B, 2 cores"]})
    assert runner.estimate_seconds(comparison) == pytest.approx(
        70.0 + runner.baseline_seconds(comparison, costs))


def test_the_report_reads_its_figures_back_from_the_run_folders(tmp_path):
    comparison = fake_comparison(tmp_path / "c", {"caco": [90.0, 91.0, 92.0],
                                                  "byol": [85.0, 86.0, 86.5]})
    comparison.save()
    folder = report.write(comparison)
    text = open(os.path.join(folder, "report.md")).read()
    assert "91.0 [88.5, 93.5]" in text  # caco's kNN: mean 91, t interval 91 ± 4.303·1/√3
    assert "started today at caco-tf commit 0123456789ab with:" in text
    assert "Runs measured on CPU A, 2 cores (6 runs); CPU B, 2 cores (2 runs)" in text
    assert "| byol | 1: `train.learning_rate=0.09`" in text  # its better validation trial
    assert "caco above byol" in text
    # The test split's own standard error at each method's mean kNN: caco 91.0, byol 85.83 on
    # 1,000 images, sqrt(p (1 - p) / n) = 0.905 and 1.103 points.
    assert "On 1,000 test images, one standard error of an accuracy, √(p (1 − p) / n), is " \
           "0.90–1.10 point at the methods' kNN top-1;" in text
    for name in ("report.html", "accuracy.png", "curves.png", "health.png"):
        assert os.path.getsize(os.path.join(folder, name)) > 1000
    assert "data:image/png;base64," in open(os.path.join(folder, "report.html")).read()
    # A figure changed in a run folder changes the report: nothing is typed in.
    with open(os.path.join(comparison.run_dir("final/byol/seed0"), "results.json"), "w") as f:
        json.dump({"knn_top1": 95.0}, f)
    report.write(comparison)
    assert "89.2 [" in open(os.path.join(folder, "report.md")).read()
    assert "Not finished" not in open(os.path.join(folder, "report.md")).read()
    # A seed not measured yet: the report says first that the comparison goes on.
    comparison.save_entry("final/byol/seed2", {"knn_top1": 86.5})  # its linear probe to come
    report.write(comparison)
    assert "**Not finished**: 5 of 6 final runs measured;" in open(
        os.path.join(folder, "report.md")).read()


def test_the_report_sets_each_method_against_the_raw_pixels_after_holms_correction(tmp_path):
    comparison = fake_comparison(tmp_path / "c", {"caco": [90.0, 90.5, 91.0],
                                                  "byol": [85.0, 85.2, 85.4],
                                                  "dino": [80.0, 90.0, 95.0]})
    assert runner.baselines(comparison) == {}  # none measured: the report says nothing of them
    assert "Without pre-training" not in open(
        os.path.join(report.write(comparison), "report.md")).read()
    os.makedirs(os.path.join(comparison.folder, "baselines"))
    for name, figure in (("pixels", 88.0), ("untrained", 40.0)):
        with open(os.path.join(comparison.folder, "baselines", f"{name}_knn.json"), "w") as f:
            json.dump({"protocol": "knn", "top1": figure}, f)
    text = open(os.path.join(report.write(comparison), "report.md")).read()
    # Against 88: caco's t = 2.5 / (0.5 / √3), p = 0.013, byol's p = 0.002, dino's 0.95; Holm
    # over the 3 methods: 0.005, 0.026 (below 0.05), 0.95.
    assert ("Without pre-training, on the same test split (kNN top-1): the raw pixels 88.0 %; "
            "the untrained network 40.0 %. On the kNN top-1, above the raw pixels (t-test over "
            "seeds, Holm over the 3 methods at 0.05): caco; below them: byol; not told apart "
            "from them: dino.") in text
    os.remove(os.path.join(comparison.run_dir("final/dino/seed1"), "results.json"))
    os.remove(os.path.join(comparison.run_dir("final/dino/seed2"), "results.json"))
    assert report.against_baselines(report.table_rows(comparison), {"pixels": 88.0}).endswith(
        "below them: byol; a single seed, nothing measured: dino.")


def test_a_page_quotes_the_report_between_its_markers(tmp_path, monkeypatch):
    comparison = fake_comparison(tmp_path / "c", {"caco": [90.0, 91.0, 92.0],
                                                  "byol": [85.0, 86.0, 86.5]})
    comparison.save()
    folder = report.write(comparison)
    page = tmp_path / "docs" / "results.md"
    page.parent.mkdir()
    page.write_text(f"# Results\n\n## The comparison\n\n{report.BEGIN}\nstale\n{report.END}"
                    "\n\nkept\n")
    monkeypatch.chdir(tmp_path)  # the command it names, as typed from here
    report.publish(comparison, folder, "docs/results.md")
    text = page.read_text()
    assert ("Written by `caco-compare --out c --report-only --publish docs/results.md` from "
            "`caco-compare --data mnist` (today);") in text
    assert text.startswith("# Results\n\n## The comparison\n\n" + report.BEGIN)
    assert text.endswith(report.END + "\n\nkept\n") and "stale" not in text
    quoted = text[text.index(report.BEGIN):]
    assert "| caco | 1: `train.learning_rate=0.09`" in quoted and "caco above byol" in quoted
    assert "| 70.6 (200 ep, b4096); 74.3 (1000 ep) |" in quoted  # BYOL's row: the paper's
    assert "### What the kNN top-1 can say" in quoted  # one level below the page's section
    assert "![Each method on the test split" in quoted and "(comparison/accuracy.png)" in quoted
    assert "Every trial on the validation split" not in quoted  # that stays in the report
    for name in ("report.md", "accuracy.png", "curves.png", "health.png"):
        assert (page.parent / "comparison" / name).stat().st_size > 1000
    report.publish(comparison, folder, str(page))  # rewritten in place, once
    assert page.read_text() == text
    # The paper's column is what each method declares, not a copy typed into the report.
    monkeypatch.setitem(METHODS["byol"].DOCS_ROW, "paper", "99.9 (a declared figure)")
    report.publish(comparison, folder, str(page))
    assert "| 99.9 (a declared figure) |" in page.read_text()


def test_the_published_comparison_is_what_its_tracked_measurements_give(monkeypatch):
    """docs/results.md's section is the report of benchmarks/shapes_comparison_v2, as
    ``caco-compare --out benchmarks/shapes_comparison_v2 --report-only --publish
    docs/results.md`` writes it: a measurement, a method's declared paper figure or the
    report's wording changed without publishing again fails here."""
    monkeypatch.chdir(ROOT)  # the command is typed at the repository's root
    folder = os.path.join("benchmarks", "shapes_comparison_v2")
    comparison = runner.Comparison(folder)
    assert comparison.plan is not None and comparison.plan["command"].startswith("caco-compare ")
    rows = report.table_rows(comparison)
    expected = report.section(comparison, report.plots_for(rows),
                              os.path.join("docs", "results.md"))
    with open(os.path.join(ROOT, "docs", "results.md")) as handle:
        text = handle.read()
    published = text[text.index(report.BEGIN):text.index(report.END) + len(report.END)]
    assert published == expected, (
        f"docs/results.md's comparison differs from its measurements: run caco-compare --out "
        f"{folder} --report-only --publish docs/results.md")
    for image in re.findall(r"\]\((comparison/[^)]+)\)", published):
        assert os.path.exists(os.path.join(ROOT, "docs", image)), image


# ---------------------------------------------------------------------- the command's errors
def write_folder(root, classes=3, per_class=40, size=16, labelled=True, seed=0):
    """PNG images of ``classes`` patterns (a bright square at a class's corner on noise)."""
    rng = np.random.default_rng(seed)
    for label in range(classes):
        folder = root / (f"class{label}" if labelled else "")
        folder.mkdir(parents=True, exist_ok=True)
        for index in range(per_class):
            image = rng.integers(0, 120, (size, size, 3)).astype(np.uint8)
            corner = [(0, 0), (0, size // 2), (size // 2, 0)][label % 3]
            image[corner[0]:corner[0] + size // 2, corner[1]:corner[1] + size // 2] += 120
            Image.fromarray(image).save(folder / f"{label}_{index}.png")
    return root


def compare(argv, capsys):
    status = compare_cli.main(argv)
    return status, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("argv, words", [
    (["--methods", "caco,nope"], "--methods: unknown nope; choose from caco, "),
    (["--methods", "caco,caco"], "--methods names a method twice"),
    (["--trials", "10"], "--trials must be at most 9"),
    (["--seeds", "0"], "--seeds must be at least 1, got 0"),
    (["--set", "data.source=mnist"], "--set data.source=mnist: the comparison sets"),
    (["--validation-fraction", "1.5"], "--validation-fraction must be between 0 and 1"),
    (["--epochs", "0"], "train.epochs must be an integer >= 1, got 0"),
])
def test_a_bad_argument_is_one_error_line(argv, words, tmp_path, capsys):
    status, lines = compare(["--config", "mnist", "--data", "mnist", "--out",
                             str(tmp_path / "c")] + argv, capsys)
    assert status == 2 and len(lines) == 1 and lines[0].startswith("error: " + words), lines


def test_a_budget_is_checked_as_the_compared_methods_train_it():
    # CaCo is not compared: nothing of its is assigned.
    args = compare_cli.parse_args(["--methods", "byol,simclr", "--epochs", "1"])
    assert compare_cli.arguments_of(args)["settings"] == ["train.epochs=1"]
    # CaCo's warm-up, 1 of the shapes budget's 8 epochs, keeps its share of 1 epoch: none.
    args = compare_cli.parse_args(["--methods", "caco,simclr", "--epochs", "1"])
    assert compare_cli.arguments_of(args)["settings"] == ["train.epochs=1",
                                                          "method.caco.warmup_epochs=0"]
    # A warm-up the user wrote is theirs: refused in one line naming it.
    with pytest.raises(Exception, match=r"method.caco.warmup_epochs must be below train.epochs "
                                        r"\(1\), got 1"):
        compare_cli.arguments_of(compare_cli.parse_args(
            ["--methods", "caco", "--epochs", "1", "--set", "method.caco.warmup_epochs=1"]))


def test_images_without_labels_are_one_error_line(tmp_path, capsys):
    folder = write_folder(tmp_path / "flat", per_class=3, labelled=False)
    status, lines = compare(["--config", "mnist", "--data", f"folder:{folder}", "--out",
                             str(tmp_path / "c")], capsys)
    assert status == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: folder:{folder} has no labels: a comparison measures")
    # A labels file labels them.
    labels = tmp_path / "labels.csv"
    labels.write_text("".join(f"{name},{name[0]}\n" for name in
                              sorted(os.listdir(folder))[:-1]))
    status, lines = compare(["--config", "mnist", "--data", f"folder:{folder}", "--labels",
                             str(labels), "--out", str(tmp_path / "d")], capsys)
    assert status == 2 and "has no line for 1 image(s)" in lines[-1], lines


def test_another_comparisons_folder_is_refused(tmp_path, capsys):
    comparison = fake_comparison(tmp_path / "c", {"caco": [1.0]})
    with open(comparison.plan_path, "w") as handle:
        json.dump(comparison.plan, handle)
    status, lines = compare(["--config", "mnist", "--data", "mnist", "--methods", "caco",
                             "--trials", "2", "--seeds", "2", "--few-labels", "0",
                             "--linear-epochs", "1", "--out", str(tmp_path / "c")], capsys)
    assert status == 2 and len(lines) == 1, lines
    assert lines[0] == (f"error: {tmp_path / 'c'} holds a comparison with other seeds (seeds: 3 "
                        f"before, 2 now): run its own command again (plan.json) or choose "
                        f"another --out")


# ---------------------------------------------------------------------- the command
TINY = ["--image-size", "16", "--batch-size", "16", "--views", "symmetric", "--set",
        "model.widths=[8, 16, 32, 64]", "--set", "model.projector_hidden=32", "--set",
        "model.embedding_dim=16", "--set", "train.jit_compile=false", "--set",
        "train.steps_per_execution=1", "--set", "method.caco.warmup_epochs=1", "--set",
        "evaluation.health_images=64", "--set", "evaluation.knn_monitor_every=0",
        "--few-labels", "4", "--linear-epochs", "2",
        # One label draw: the draws' mean is tests/test_compare_baselines.py's; here each draw
        # would be one more probe of every seed and baseline.
        "--few-label-draws", "1"]


def measured(out):
    """{run key: its comparison.json} of every run folder of a comparison."""
    found = {}
    for stage in ("tune", "final"):
        for method in sorted(os.listdir(out / "runs" / stage)) if (
                out / "runs" / stage).exists() else ():
            for run in sorted(os.listdir(out / "runs" / stage / method)):
                path = out / "runs" / stage / method / run / runner.ENTRY
                if path.exists():
                    found[f"{stage}/{method}/{run}"] = json.loads(path.read_text())
    return found


def compare_command(folder, out):
    return [sys.executable, "-m", "caco_tf.cli.compare", "--data", f"folder:{folder}",
            "--config", "mnist", "--methods", "caco", "--epochs", "2",
            "--trials", "2", "--seeds", "1", "--out", str(out)] + TINY


@pytest.mark.slow
def test_a_comparison_stopped_by_sigterm_continues_with_nothing_measured_twice(tmp_path):
    folder = write_folder(tmp_path / "images", classes=3, per_class=40)
    out = tmp_path / "comparison"
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    log = tmp_path / "first.log"
    with open(log, "w") as output:
        process = launch.Popen(compare_command(folder, out), cwd=ROOT, env=env,
                               stdout=output, stderr=output)
        deadline = time.time() + 300
        while "tune/caco/trial1: training" not in log.read_text():
            assert process.poll() is None and time.time() < deadline, log.read_text()
            time.sleep(0.2)
        time.sleep(3)  # inside its second training
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 128 + signal.SIGTERM, log.read_text()
    state = measured(out)
    before = {key: dict(entry) for key, entry in state.items() if "knn_top1" in entry}
    assert set(before) == {"tune/caco/trial0"}, log.read_text()
    stamps = {key: os.path.getmtime(out / "runs" / key / "results.json") for key in before}

    second = launch.run(compare_command(folder, out), cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    lines = second.stderr.splitlines()
    # trial 0 is not trained again (a close choice's second seed, trial0-seed1, is another run)
    assert not any(line.startswith("tune/caco/trial0:") for line in lines)
    state = measured(out)
    for key, entry in before.items():  # measured once: the same figure, the file untouched
        assert state[key]["knn_top1"] == entry["knn_top1"]
        assert os.path.getmtime(out / "runs" / key / "results.json") == stamps[key]
    # The second trial resumed: each of its epochs trained once.
    history = json.loads((out / "runs" / "tune/caco/trial1" / "history.json").read_text())
    assert [row["epoch"] for row in history] == [1, 2]
    # A choice closer than one validation error adds each close trial's second seed.
    seconds = [f"tune/caco/trial{t}-seed1" for t in runner.Comparison(out).close_trials("caco")]
    assert sorted(state) == sorted(["final/caco/seed0", "tune/caco/trial0", "tune/caco/trial1"]
                                   + seconds)
    assert all("knn_top1" in entry for entry in state.values())
    assert all(entry["machines"] == [machine()] for entry in state.values())  # where measured
    finals = [e for k, e in state.items() if k.startswith("final/")]
    assert all("linear_top1" in e and "few_label_top1" in e for e in finals)
    # The probes read the checkpoint: no run wrote model.keras or a SavedModel.
    assert all("train.export=false" in entry["command"] for entry in state.values())
    assert not list(out.glob("runs/*/*/*/model.keras")) + list(out.glob("runs/*/*/*/saved_model"))
    text = (out / "report" / "report.md").read_text()
    assert "| caco | 0: `" in text or "| caco | 1: `" in text  # its chosen trial
    pixels = json.loads((out / "baselines" / "pixels_knn.json").read_text())
    untrained = json.loads((out / "baselines" / "untrained_knn.json").read_text())
    assert pixels["encoder"] == "raw pixels" and pixels["test_images"] == untrained["test_images"]
    # Every probe's baseline in one sentence, kNN first: "the raw pixels K % · L % · F %; ...".
    said = text[text.index("Without pre-training, on the same test split (kNN top-1 · "):]
    said = said[:said.index("\n")]
    assert f"the raw pixels {pixels['top1']:.1f} % · " in said
    assert f"; the untrained network {untrained['top1']:.1f} % · " in said
    for plot in ("accuracy.png", "curves.png", "health.png"):
        assert (out / "report" / plot).stat().st_size > 1000
    assert second.stdout.strip().endswith(f"report: {out / 'report' / 'report.md'}")

    # docs/compare.md's recovery: the plan, state, splits and finished runs' JSON copied into
    # a new folder (no baselines, no checkpoints); the same command trains nothing and
    # measures the baselines again, to the same figures.
    restored = tmp_path / "restored"
    for name in ("plan.json", "state.json"):
        (restored / name).parent.mkdir(parents=True, exist_ok=True)
        (restored / name).write_bytes((out / name).read_bytes())
    for path in list(out.glob("splits/*.json")) + list(out.glob("runs/*/*/*/*.json")):
        target = restored / path.relative_to(out)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    third = launch.run(compare_command(folder, restored), cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    assert third.returncode == 0, third.stderr[-3000:]
    assert not any(": training" in line for line in third.stderr.splitlines()), third.stderr
    for name, figure in (("pixels", pixels), ("untrained", untrained)):
        again = json.loads((restored / "baselines" / f"{name}_knn.json").read_text())
        assert again["top1"] == figure["top1"], name


def free_port():
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_runs_spread_over_two_workers_a_killed_one_resumes_its_run(tmp_path):
    """KerasTuner's distributed tuning on 127.0.0.1: a chief serving the oracle, two workers;
    one worker is killed (SIGKILL) mid-training, started again with its tuner id, and resumes
    the same run: every run trained and counted once."""
    rng = np.random.default_rng(0)
    labels = np.arange(120) % 3
    images = (rng.integers(0, 100, (120, 16, 16, 3)) + 100 * labels[:, None, None, None])
    np.savez(tmp_path / "images.npz", images=images.astype(np.uint8), labels=labels)
    out = tmp_path / "comparison"
    command = [sys.executable, "-m", "caco_tf.cli.compare", "--data",
               f"npz:{tmp_path / 'images.npz'}",
               "--config", "mnist", "--methods", "caco,vicreg", "--epochs", "2", "--trials",
               "1", "--seeds", "1", "--out", str(out)] + TINY
    port = str(free_port())

    def start(tuner_id, log):
        env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3",
                   CUDA_VISIBLE_DEVICES="", KERASTUNER_TUNER_ID=tuner_id,
                   KERASTUNER_ORACLE_IP="127.0.0.1", KERASTUNER_ORACLE_PORT=port)
        with open(log, "w") as output:
            return launch.Popen(command, cwd=ROOT, env=env, stdout=output,
                                stderr=subprocess.STDOUT)

    logs = {name: tmp_path / f"{name}.log" for name in ("chief", "tuner0", "tuner1", "again")}
    chief = start("chief", logs["chief"])
    first = start("tuner0", logs["tuner0"])
    second = start("tuner1", logs["tuner1"])
    deadline = time.time() + 300
    while "training" not in logs["tuner0"].read_text():
        assert first.poll() is None and time.time() < deadline, logs["tuner0"].read_text()
        time.sleep(0.2)
    killed_key = [line for line in logs["tuner0"].read_text().splitlines()
                  if ": training" in line][0].split(":")[0]
    time.sleep(2)
    first.kill()  # SIGKILL: nothing saved since the last checkpoint
    first.wait()
    again = start("tuner0", logs["again"])
    assert again.wait(timeout=600) == 0, logs["again"].read_text()
    assert second.wait(timeout=600) == 0, logs["tuner1"].read_text()
    # The chief measures the baselines and writes the report after the last run: on a loaded
    # machine (two test workers and a training) that took more than 120 s.
    assert chief.wait(timeout=600) == 0, logs["chief"].read_text()
    started = [line for line in logs["again"].read_text().splitlines() if ": training" in line]
    assert started[0].startswith(f"{killed_key}: training"), started  # its own run back first
    state = measured(out)
    assert sorted(state) == ["final/caco/seed0", "final/vicreg/seed0", "tune/caco/trial0",
                             "tune/vicreg/trial0"]
    for key, entry in state.items():
        assert "knn_top1" in entry, key
        history = json.loads((out / "runs" / key / "history.json").read_text())
        assert [row["epoch"] for row in history] == [1, 2], key  # each epoch once
    completed = [json.loads(path.read_text())
                 for path in (out / "tuner").glob("trial_*/trial.json")]
    runs = [trial["hyperparameters"]["values"]["run"] for trial in completed
            if trial["status"] == "COMPLETED"]
    assert sorted(runs) == sorted(state)  # each run counted once
    assert (out / "report" / "report.md").exists()


def test_eight_identical_methods_are_told_apart_in_at_most_5_percent_of_draws():
    """The family-wise error of the report's claims: 8 methods of one distribution, with a
    shared seed effect (the same split and data order for a seed), 200 simulated comparisons of
    3 seeds; any pair told apart is a false claim."""
    rng = np.random.default_rng(0)
    false_claims, uncorrected = 0, 0
    for _ in range(200):
        seed_effect = rng.normal(0.0, 3.0, 3)
        figures = {f"m{i}": list(80.0 + seed_effect + rng.normal(0.0, 2.0, 3)) for i in range(8)}
        rows = rows_of(figures)
        false_claims += bool(report.every_pair(rows, "knn_top1")[0])
        uncorrected += bool(report.uncorrected_count(rows, "knn_top1"))
    assert false_claims <= 10, false_claims  # at least 95 % of the draws claim nothing
    assert uncorrected > 60  # what the uncorrected intervals would have claimed


def test_every_pair_told_apart_after_holms_correction():
    rows = rows_of({"a": [90.0, 91.0, 92.0], "b": [89.0, 89.9, 91.1], "c": [88.8, 89.8, 90.8]})
    apart, untold, unmeasured = report.every_pair(rows, "knn_top1")
    # a - c = 1.2 on every seed: p 0, an interval of no width; a - b: p 0.0033 (t = 10√3),
    # times 2 by Holm's second step; b - c = 0.2, 0.1, 0.3: t = 2√3, p 0.074, not apart.
    t = 10 * np.sqrt(3)
    p = 1 - t / np.sqrt(2 + t * t)
    assert apart == ["a above c: +1.2 points, uncorrected 95 % interval [+1.20, +1.20], p < "
                     "0.001, Holm-adjusted p < 0.001 (3 paired seeds) (the same difference on "
                     "every seed: an interval of no width)",
                     f"a above b: +1.0 points, uncorrected 95 % interval [+0.75, +1.25], p "
                     f"{p:.3f}, Holm-adjusted p {2 * p:.3f} (3 paired seeds)"]
    assert (untold, unmeasured) == (1, 0)
    assert report.uncorrected_count(rows, "knn_top1") == 2
    rows["d"] = {"seeds": {0: {"knn_top1": 99.0}}}  # one seed: paired with none, not "untold"
    assert report.every_pair(rows, "knn_top1")[1:] == (1, 3)


def test_a_run_that_stops_itself_loses_without_ending_the_search(tmp_path, monkeypatch):
    """A NaN loss is a finished, failed run: KerasTuner gets a losing score, not a failed trial
    (three of which in a row would end its search with a traceback)."""
    from caco_tf.comparison import tuning

    comparison = fake_comparison(tmp_path / "c", {"caco": [1.0]})
    tuner = tuning.ComparisonTuner(comparison)
    monkeypatch.setattr(runner, "run_one", lambda c, key, say: {"failed": "the loss became nan"})
    trial = tuner.oracle.create_trial("tuner0")
    trial.hyperparameters.values["run"] = "tune/caco/trial0"
    assert tuner.run_trial(trial) == {"knn_top1": tuning.FAILED_SCORE}


def test_a_method_whose_every_trial_failed_trains_no_seed(tmp_path):
    comparison = fake_comparison(tmp_path / "c", {"caco": []})
    for trial in range(2):
        comparison.save_entry(comparison.trial_key("caco", trial), {"failed": "nan"})
    said = []
    entry = runner.run_one(comparison, "final/caco/seed0", say=said.append)
    assert "no setting to train" in entry["failed"] and said[0].startswith(
        "final/caco/seed0: not trained")
    assert runner.finished(comparison, "final/caco/seed0", True)


def test_a_run_the_data_cannot_hold_is_refused_before_the_plan_is_fixed(tmp_path, capsys):
    """The check of every run comes before plan.json: the corrected command then starts in the
    same folder instead of being refused as another comparison's."""
    labels = np.arange(40) % 2
    images = (np.random.default_rng(0).integers(0, 100, (40, 16, 16, 1))
              + 100 * labels[:, None, None, None]).astype(np.uint8)
    np.savez(tmp_path / "d.npz", images=images, labels=labels)
    out = tmp_path / "c"
    argv = ["--config", "mnist", "--data", f"npz:{tmp_path / 'd.npz'}", "--methods", "caco",
            "--trials", "1", "--seeds", "1", "--few-labels", "0", "--out", str(out),
            "--image-size", "16", "--dry-run"] + TINY[6:16]
    status, lines = compare(argv + ["--batch-size", "64"], capsys)
    assert status == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: caco, trial 0: train.batch_size 64 is larger than the "
                               "data set"), lines
    assert not (out / "plan.json").exists()
    status, lines = compare(argv + ["--batch-size", "8", "--set", "method.caco.bank_size=16"],
                            capsys)
    assert (out / "plan.json").exists() and not any("holds a comparison" in l for l in lines)


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_leaves_no_half_written_file(tmp_path):
    """A real full disk (a tmpfs too small for the splits): exit 74, one error line naming
    the file and what to do, and no split file cut short."""
    from test_long_run_faults import tmpfs

    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    with tmpfs(tmp_path / "disk", 24 << 10) as disk:
        result = launch.run([sys.executable, "-m", "caco_tf.cli.compare", "--config", "mnist",
                             "--data", "mnist", "--methods", "caco", "--out",
                             os.path.join(disk, "c")], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 74, result.stderr[-2000:]
        assert len(lines) == 1 and lines[0].startswith("error: ") and "free space" in lines[0]
        for name in os.listdir(os.path.join(disk, "c", "splits")):
            with open(os.path.join(disk, "c", "splits", name)) as handle:
                json.load(handle)  # whole, or absent
        assert not os.path.exists(os.path.join(disk, "c", "plan.json"))


def test_a_collapse_or_not_outcome_is_shown_per_seed_not_as_an_interval():
    healthy = [(10.0, -2.0, False)] * 3
    row = {"seeds": {0: {"knn_top1": 38.8}, 1: {"knn_top1": 33.2}, 2: {"knn_top1": 10.6}},
           "health": healthy}
    assert report.bimodal(row, chance=10.0) == "1 of 3 seeds at chance (10 %)"
    assert report.per_seed_text(row, "knn_top1", "x") == "per seed: 38.8 · 33.2 · 10.6 (x)"
    assert report.bimodal(row) == ""  # chance unknown, no warnings
    row["health"] = [(10.0, -2.0, True), (10.0, -2.0, False), (10.0, -2.0, False)]
    assert report.bimodal(row) == "collapse warned on 1 of 3 seeds"
    row["health"] = [(10.0, -2.0, True)] * 3  # collapsed on every seed: one outcome
    assert report.bimodal(row) == "" and report.bimodal(
        {"seeds": {0: {"knn_top1": 80.0}, 1: {"knn_top1": 82.0}}, "health": []}, 10.0) == ""
