"""caco-compare's equal search and learning curves: a failed trial replaced by a spare, a close
choice settled by a second seed, each run's curve read from its history, the under-trained
flag, the ranking at equal seconds (no training: run folders written by hand)."""

import json
import os

import numpy as np
import pytest

from caco_tf.comparison import curves, report, runner
from test_comparison import fake_comparison


def searched(folder, scores, spares=2, validation=800):
    """A comparison of one method, ``caco``, whose trials scored ``scores`` ({trial: entry
    fields}) with ``spares`` spare points, made by this version (it replaces and settles)."""
    comparison = fake_comparison(folder, {"caco": [90.0, 91.0, 92.0]})
    comparison.plan["spares"] = {"caco": [{"train.learning_rate": 0.01 * (n + 1)}
                                          for n in range(spares)]}
    comparison.plan["images"]["validation"] = validation
    for trial in range(comparison.plan["arguments"]["trials"] + spares):
        key = comparison.trial_key("caco", trial)
        if os.path.exists(os.path.join(comparison.run_dir(key), runner.ENTRY)):
            os.remove(os.path.join(comparison.run_dir(key), runner.ENTRY))
    for trial, entry in scores.items():
        comparison.save_entry(comparison.trial_key("caco", trial), entry)
    return comparison


def trial_keys(comparison):
    return [key for key, *_, final in comparison.runs() if not final]


def test_a_failed_trial_is_replaced_by_the_next_spare(tmp_path):
    comparison = searched(tmp_path / "c", {0: {"knn_top1": 70.0}, 1: {"failed": "nan loss"}})
    assert trial_keys(comparison) == ["tune/caco/trial0", "tune/caco/trial1",
                                      "tune/caco/trial2"]
    assert comparison.trial_point("caco", 2) == {"train.learning_rate": 0.01}  # spare 0
    assert comparison.chosen("caco") is None  # the replacement runs first
    comparison.save_entry("tune/caco/trial2", {"knn_top1": 60.0, "collapse_warned": True})
    # A warned collapse fails too: the last spare replaces it, and then none is left.
    assert trial_keys(comparison)[-1] == "tune/caco/trial3"
    comparison.save_entry("tune/caco/trial3", {"failed": "collapse"})
    assert trial_keys(comparison)[-1] == "tune/caco/trial3"
    assert comparison.chosen("caco") == 0  # a failed trial loses to any that did not fail
    assert "settings" not in comparison.settings("caco", 3, 0, False)[-1]  # a valid --set list
    assert any("train.learning_rate=0.02" == s for s in comparison.settings("caco", 3, 0, False))


def test_a_close_choice_is_settled_by_a_second_seed(tmp_path):
    # 800 validation images: one standard error at 70 % is 1.62 points.
    assert runner.validation_error(70.0, 800) == pytest.approx(100 * (0.7 * 0.3 / 800) ** 0.5)
    comparison = searched(tmp_path / "c", {0: {"knn_top1": 70.0}, 1: {"knn_top1": 69.0}})
    assert comparison.close_trials("caco") == [0, 1]
    assert comparison.chosen("caco") is None  # not by one image: by a second seed each
    assert trial_keys(comparison)[-2:] == ["tune/caco/trial0-seed1", "tune/caco/trial1-seed1"]
    final, method, trial, seed = runner.parse_key("tune/caco/trial1-seed1")
    assert (final, method, trial, seed) == (False, "caco", 1, 1)
    assert "train.seed=1" in comparison.command("tune/caco/trial1-seed1", "caco", 1, 1, False)
    comparison.save_entry("tune/caco/trial0-seed1", {"knn_top1": 66.0})
    comparison.save_entry("tune/caco/trial1-seed1", {"knn_top1": 69.5})
    assert comparison.chosen("caco") == 1  # 69.25 on average against 68.0


def test_a_choice_clear_by_more_than_its_error_needs_no_second_seed(tmp_path):
    comparison = searched(tmp_path / "c", {0: {"knn_top1": 70.0}, 1: {"knn_top1": 60.0}})
    assert comparison.close_trials("caco") == []
    assert comparison.chosen("caco") == 0
    assert not any("-seed" in key for key in trial_keys(comparison))


def test_a_plan_made_before_spares_chooses_as_it_did(tmp_path):
    """The published comparison's plans have no spares: no replacement, no second seed."""
    comparison = fake_comparison(tmp_path / "c", {"caco": [90.0, 91.0, 92.0]})
    comparison.save_entry("tune/caco/trial0", {"knn_top1": 60.0, "collapse_warned": True})
    comparison.save_entry("tune/caco/trial1", {"knn_top1": 59.9})
    assert comparison.chosen("caco") == 0
    assert trial_keys(comparison) == ["tune/caco/trial0", "tune/caco/trial1"]


# ---------------------------------------------------------------------- curves
def history(tops, seconds=10.0, steps=100, batch=32, monitor=0.5):
    """history.json rows of a run whose curve is ``tops`` (one per epoch)."""
    return [{"epoch": e + 1, "loss": 1.0, "train_seconds": seconds, "steps": steps * (e + 1),
             "images_seen": steps * batch * (e + 1), "knn_top1": top,
             "knn_top1_seconds": monitor} for e, top in enumerate(tops)]


def test_a_curve_cumulates_the_steps_seconds_and_leaves_the_monitor_out():
    rows = history([50.0, 60.0, 65.0, 66.0], seconds=10.0, monitor=0.5)
    del rows[0]["knn_top1"]  # an epoch the monitor skipped
    found = curves.curve(rows)
    assert found["epoch"].tolist() == [2, 3, 4]
    assert found["seconds"].tolist() == [20.0, 30.0, 40.0]
    assert found["images_seen"].tolist() == [6400, 9600, 12800]
    assert (found["monitor_seconds"], found["train_seconds"]) == (2.0, 40.0)
    assert curves.value_at(found, "seconds", 25.0) == pytest.approx(62.5)
    assert curves.value_at(found, "seconds", 50.0) is None
    assert curves.curve([{"epoch": 1, "loss": 1.0}]) is None


def test_the_under_trained_flag_on_rising_and_flat_curves():
    rng = np.random.default_rng(0)
    epochs = np.arange(1, 13)
    rising = {s: curves.curve(history(list(40 + 3 * epochs + rng.normal(0, 0.3, 12))))
              for s in range(5)}
    gain, noise, flagged = curves.still_rising(rising)
    assert flagged and gain == pytest.approx(9.0, abs=1.0) and noise < 1.0
    flat = {s: curves.curve(history(list(np.minimum(40 + 10 * epochs, 80)
                                         + rng.normal(0, 0.3, 12)))) for s in range(5)}
    assert not curves.still_rising(flat)[2]
    # Rising by less than the seeds disagree: not flagged (its rank is not the budget's).
    noisy = {s: curves.curve(history(list(70 + 0.1 * epochs + 5 * s))) for s in range(5)}
    gain, noise, flagged = curves.still_rising(noisy)
    assert gain == pytest.approx(0.3) and noise > gain and not flagged


def test_the_report_shows_the_curves_the_flags_and_the_ranking_at_equal_seconds(tmp_path):
    comparison = fake_comparison(tmp_path / "c", {"caco": [90.0, 91.0, 92.0],
                                                  "byol": [80.0, 80.5, 81.0]})
    comparison.plan["arguments"].update(curve_every=1, curve_images=[2000, 1000])
    comparison.plan["knn_k"] = 5
    for seed in range(3):  # caco: fast and flat; byol: twice as slow a step, still rising
        for method, tops, seconds in (("caco", [60, 70, 71, 71], 10.0),
                                      ("byol", [30, 40, 50, 60], 20.0)):
            path = os.path.join(comparison.run_dir(comparison.final_key(method, seed)),
                                "history.json")
            with open(path, "w") as handle:
                json.dump(history([t + seed * 0.1 for t in tops], seconds=seconds), handle)
        key = comparison.final_key("caco", seed)
        comparison.save_entry(key, dict(comparison.entry(key), step_flops=2.5e9))
    text = report.markdown(report.document(comparison, []))
    assert "## Learning curves" in text
    assert "1 of 2 methods still rising" in text
    assert "**byol: under-trained at this budget, its rank may change**: +10.0 points" in text
    assert "in the verdicts caco above byol" in text
    # Every method's seed 2 was trained on CPU A and resumed on CPU B: its seconds are two
    # CPUs', so equal seconds are read on seeds 0 and 1 (CPU A).
    assert ("40 s on CPU A, 2 cores (runs on CPU A, 2 cores + CPU B, 2 cores, which did not "
            "train every method or trained a run in part, left out)") in text
    table = text[text.index("| method | training seconds"):]
    # 400 steps of 2.5 GFLOPs: 1 TFLOP.
    assert table.splitlines()[2].startswith("| caco | 40 | 12,800 | 1.0 | 71.1 [")
    # At 40 s, byol's second epoch: 40.0 and 40.1 on seeds 0 and 1.
    assert "| byol | 80 | 12,800 | – | 60.1 [59.9, 60.3] | 2 | 40.0 [39.4, 40.7] | 2 |" in table
    # The monitor's 2 s a run against 40 s (caco) and 80 s (byol) of steps.
    assert "curves cost 3.3 % of the training steps' time" in text
    folder = report.write(comparison)
    assert os.path.getsize(os.path.join(folder, curves.PLOT[0])) > 0


def test_equal_seconds_are_read_on_the_cpu_that_trained_each_run():
    """Seeds resumed on a CPU twice as fast: each run read at its own CPU's equal time (the
    slow CPU's 40 s, the fast one's 20 s: the same point of every curve), not at one time
    over both; a CPU that did not train every method is left out."""
    def on(machine, tops, seconds):
        return dict(curves.curve(history(tops, seconds=seconds)), machines=(machine,))

    found = {"caco": {0: on("A", [60, 70, 71, 71], 10.0), 1: on("B", [62, 72, 73, 73], 5.0),
                      2: on("C", [61, 71, 72, 72], 10.0)},
             "byol": {0: on("A", [30, 40, 50, 60], 20.0), 1: on("B", [32, 42, 52, 62], 10.0)}}
    seconds, read = curves.at_equal_seconds(found)
    assert seconds == {"A": 40.0, "B": 20.0}  # the shortest run on each; C trained caco alone
    assert read == {"caco": [71.0, 73.0], "byol": [40.0, 42.0]}  # byol's second epoch on both
    words = curves.equal_seconds_words(seconds, found)
    assert ("40 s on A; 20 s on B (runs on C, which did not train every method or trained a run "
            "in part, left out)") in words
    # Read at one time over every CPU (the shortest run's, 20 s), byol's two seeds would be
    # read at different points of their curves: epoch 1 on A, epoch 2 on B.
    mixed = {m: {s: dict(c, machines=()) for s, c in seeds.items()} for m, seeds in found.items()}
    assert curves.at_equal_seconds(mixed)[1]["byol"] == [30.0, 42.0]
    # A seed slowed by other work: every seed is still read, at the shortest run's time.
    found["caco"][2] = on("A", [61, 71, 72, 72], 30.0)  # ends at 120 s
    found["caco"][0] = on("A", [60, 70, 71, 71], 9.0)  # ends at 36 s
    seconds, read = curves.at_equal_seconds(found)
    assert seconds == {"A": 36.0, "B": 20.0}
    assert len(read["caco"]) == 3 and read["caco"][1] == 73.0
    assert curves.slowed_runs(found) == ["caco seed 2 (120 s against 78 s)"]


def test_a_final_run_that_stopped_itself_has_no_place_in_the_curves(tmp_path):
    """A seed whose loss went NaN early is out of the test table: its short curve must not set
    the time every other run is read at, nor enter its method's band."""
    comparison = fake_comparison(tmp_path / "c", {"caco": [90.0, 91.0, 92.0],
                                                  "byol": [80.0, 80.5, 81.0]})
    for seed in range(3):
        for method in ("caco", "byol"):
            key = comparison.final_key(method, seed)
            rows = history([60, 70, 71, 71], seconds=10.0)
            if (method, seed) == ("byol", 2):
                rows = history([20], seconds=2.0)
                comparison.save_entry(key, dict(comparison.entry(key),
                                                failed="the loss is NaN at step 110"))
            with open(os.path.join(comparison.run_dir(key), "history.json"), "w") as handle:
                json.dump(rows, handle)
    found = curves.final_curves(comparison)
    assert sorted(found["caco"]) == [0, 1, 2] and sorted(found["byol"]) == [0, 1]
    assert curves.at_equal_seconds(found)[0] == {"CPU A, 2 cores": 40.0}


def test_the_monitor_reads_its_own_neighbours_and_queries(tmp_path):
    """A comparison's curve: a sample of the tune split against one of the validation split,
    whatever the run trains and is tested on."""
    from caco_tf import build
    from caco_tf.config import load_config
    from caco_tf.evaluation.monitor import knn_monitor
    from caco_tf.run_settings import RunSettings

    rng = np.random.default_rng(0)
    paths = {}
    for name, count in (("memory", 60), ("queries", 40), ("train", 30), ("test", 20)):
        paths[name] = str(tmp_path / f"{name}.npz")
        np.savez(paths[name], images=rng.integers(0, 255, (count, 28, 28, 1), np.uint8),
                 labels=np.arange(count) % 4)
    config = load_config("mnist", [
        f"data.source=npz:{paths['train']}", f"data.held_out=npz:{paths['test']}",
        "evaluation.knn_monitor_every=1", f"evaluation.knn_monitor_memory=npz:{paths['memory']}",
        f"evaluation.knn_monitor_queries=npz:{paths['queries']}",
        "evaluation.knn_monitor_train_images=40", "evaluation.knn_monitor_test_images=20"])
    settings = RunSettings.of(config)
    monitor = knn_monitor(settings, build.run_views(config), *build.load_data(settings.data))
    assert (monitor.train_data.count, monitor.test_data.count) == (40, 20)
    unset = load_config("mnist", [f"data.source=npz:{paths['train']}",
                                  f"data.held_out=npz:{paths['test']}",
                                  "evaluation.knn_monitor_every=1"])
    settings = RunSettings.of(unset)
    monitor = knn_monitor(settings, build.run_views(unset), *build.load_data(settings.data))
    assert (monitor.train_data.count, monitor.test_data.count) == (30, 20)


def test_a_pilot_says_what_the_planned_seeds_can_resolve(tmp_path):
    pilot = fake_comparison(tmp_path / "pilot", {"caco": [90.0, 91.0, 92.0],
                                                 "byol": [80.0, 80.5, 81.0],
                                                 "simclr": [85.0, 87.0, 86.0]})
    lines = report.pilot_resolution(pilot, 5, ["caco", "byol", "simclr", "dino"])
    assert lines[0].startswith("  kNN top-1: a paired difference over seeds has a median "
                               "standard deviation of")
    assert "with 5 seeds and 6 pairs" in lines[0]  # the planned design's family, not the pilot's
    assert report.pilot_resolution(fake_comparison(tmp_path / "one", {"caco": [90.0]}),
                                   5, ["caco", "byol"]) == []


def test_a_pilot_folder_without_a_comparison_is_one_line(tmp_path):
    from caco_tf.cli import compare
    from caco_tf.config import ConfigError

    comparison = fake_comparison(tmp_path / "c", {"caco": [90.0, 91.0, 92.0]})
    with pytest.raises(ConfigError, match="--pilot .* holds no comparison"):
        compare.resolution_lines(comparison, str(tmp_path / "nothing"), report)
    assert compare.resolution_lines(comparison, None, report) == []  # one method: no pair


@pytest.mark.slow
def test_a_pilot_trains_the_trials_alone_and_reports_their_curves(tmp_path, capsys):
    """``--trials-only``: each run's curve measured every epoch on the validation sample
    (the monitor's own neighbours and queries), no seed trained, no test image read."""
    from test_comparison import TINY, compare, write_folder

    folder = write_folder(tmp_path / "images", classes=3, per_class=20)
    out = tmp_path / "pilot"
    status, err = compare(["--data", f"folder:{folder}", "--config", "mnist", "--methods",
                           "simclr", "--epochs", "3", "--trials", "1", "--seeds", "2",
                           "--curve-images", "24,12", "--trials-only", "--out", str(out)]
                          + TINY + ["--set", "evaluation.health_images=0"], capsys)
    assert status == 0, err
    rows = json.load(open(out / "runs" / "tune" / "simclr" / "trial0" / "history.json"))
    assert [row["epoch"] for row in rows if "knn_top1" in row] == [1, 2, 3]
    assert not (out / "runs" / "tune" / "simclr" / "trial1").exists()  # nothing failed
    assert all(row["images_seen"] == row["steps"] * 16 and row["train_seconds"] > 0
               for row in rows)
    assert not (out / "runs" / "final").exists() and not (out / "baselines").exists()
    text = open(out / "report" / "report.md").read()
    assert "## Learning curves of the trials (validation split)" in text
    assert "| simclr | 0 |" in text and os.path.exists(out / "report" / curves.PLOT[0])
    config = json.load(open(out / "plan.json"))["arguments"]
    assert (config["curve_every"], config["curve_images"]) == (1, [24, 12])


def test_the_calibration_crops_are_the_methods_views():
    """The crops the estimate times: the method's K equal views (W-MSE's 4, MAE's one), or
    multi-crop's global and local crops."""
    from caco_tf.config import load_config

    assert runner.crop_sizes(load_config("mnist")) == [28, 28]
    assert runner.crop_sizes(load_config("mnist", ["method.name=w_mse",
                                                   "method.w_mse.views=4"])) == [28] * 4
    assert runner.crop_sizes(load_config("mnist_mae")) == [28]
    multicrop = load_config("mnist_dinov2")["data"]["multicrop"]
    assert runner.crop_sizes(load_config("mnist_dinov2")) == [28, 28] + [
        multicrop["local_size"]] * multicrop["local_crops"]
