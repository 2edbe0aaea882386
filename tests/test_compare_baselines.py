"""caco-compare's complete baselines and few-label draws: the raw pixels and the untrained
network measured by every probe (kNN, linear, each few-label draw) and read back into the
report; the few-label figure of a run the mean over K label draws, each a split of its own;
the paper's ImageNet figures in a table of their own; a plan written before the draws still
reports."""

import json
import math
import os
import shutil
import time

import numpy as np
import pytest

from caco_tf.cli import compare as compare_cli
from caco_tf.comparison import report, runner, splits
from caco_tf.data import sources

from test_compare_mistakes import PLANNED, plan
from test_comparison import ROOT, compare, fake_comparison, write_folder

# The baselines' figures the fake protocol gives: kNN and linear, and each few-label draw's.
FIGURES = {("pixels", "knn"): 88.0, ("pixels", "linear"): 89.0,
           ("untrained", "knn"): 40.0, ("untrained", "linear"): 50.0}
DRAWS = {"pixels": [40.0, 41.0, 45.0], "untrained": [30.0, 30.0, 30.0]}


def draw_of(spec):
    """The draw a few-label split names: ``split:.../few_labels_<d>.json`` → d."""
    return int(spec.rsplit("_", 1)[1].removesuffix(".json"))


def with_draws(comparison, draws=3, per_class=2):
    """``fake_comparison``'s plan as one written with ``--few-labels per_class`` and
    ``--few-label-draws draws`` (its few-label draws each of ``per_class`` × 10 images)."""
    comparison.plan["arguments"].update(few_labels=per_class, few_label_draws=draws)
    comparison.plan["images"]["few_labels"] = 10 * per_class
    return comparison


def write_few_labels(comparison, figures):
    """Each final run's few-label JSON of each draw: ``figures`` {method: f(seed, draw)}."""
    for method, figure in figures.items():
        for seed in range(comparison.plan["arguments"]["seeds"]):
            run_dir = comparison.run_dir(comparison.final_key(method, seed))
            for draw, split in enumerate(runner.few_label_splits(comparison)):
                with open(os.path.join(run_dir, runner.few_label_file(split)), "w") as handle:
                    json.dump({"top1": figure(seed, draw)}, handle)


@pytest.fixture
def fake_protocols(monkeypatch):
    """``protocols.evaluate`` answering each baseline's probe with ``FIGURES`` / ``DRAWS``
    (nothing trained or read); the calls made, in ``asked``."""
    asked = []

    def evaluate(protocol, **given):
        asked.append((protocol, given))
        name = given["baseline"]
        top1 = (DRAWS[name][draw_of(given["data"])] if "data" in given
                else FIGURES[(name, protocol)])
        return {"protocol": protocol, "top1": top1, "classes": 10}

    monkeypatch.setattr("caco_tf.evaluation.protocols.evaluate", evaluate)
    return asked


# ---------------------------------------------------------------------- the draws
def test_the_few_label_draws_are_disjoint_from_the_test_each_per_class_and_different():
    labels = np.repeat(np.arange(4), [10, 20, 30, 40])
    carved = splits.carve(labels, None, 0.2, 0.25, per_class=3, seed=0, draws=5)
    names = splits.few_label_names(3, 5)
    assert names == [f"few_labels_{d}" for d in range(5)] and "few_labels" not in carved
    test, train = set(carved["test"][1]), set(carved["train"][1])
    drawn = []
    for name in names:
        part, positions = carved[name]
        assert part == "train" and set(positions) <= train and not set(positions) & test
        assert np.bincount(labels[positions]).tolist() == [3, 3, 3, 3]
        drawn.append(tuple(positions))
    assert len(set(drawn)) == 5  # five different draws
    again = splits.carve(labels, None, 0.2, 0.25, per_class=3, seed=0, draws=5)
    assert all(np.array_equal(again[n][1], carved[n][1]) for n in names)  # seeded
    other = splits.carve(labels, None, 0.2, 0.25, per_class=3, seed=1, draws=5)
    assert not np.array_equal(other[names[0]][1], carved[names[0]][1])
    # A plan written before the draws: its one few_labels split, as it carved it.
    old = splits.carve(labels, None, 0.2, 0.25, per_class=3, seed=0)
    assert splits.few_label_names(3, None) == ["few_labels"] and "few_labels" in old
    assert not any(name.startswith("few_labels_") for name in old)
    assert splits.few_label_names(0, 5) == [] and not any(
        name.startswith("few") for name in splits.carve(labels, None, 0.2, 0.25, 0, 0, 5))


def test_a_plan_records_its_draws_and_writes_each_as_a_split_file(tmp_path):
    folder = write_folder(tmp_path / "photos", per_class=12)
    argv = list(PLANNED)
    argv[argv.index("--few-labels") + 1] = "3"
    planned = plan(argv + ["--data", f"folder:{folder}", "--few-label-draws", "4"],
                   tmp_path / "c")
    assert planned["arguments"]["few_label_draws"] == 4 and planned["images"]["few_labels"] == 9
    written = json.loads((tmp_path / "c" / "plan.json").read_text())
    assert written["arguments"]["few_label_draws"] == 4
    test = set(json.loads((tmp_path / "c" / "splits" / "test.json").read_text())["positions"])
    drawn = []
    for draw in range(4):
        path = tmp_path / "c" / "splits" / f"few_labels_{draw}.json"
        positions = json.loads(path.read_text())["positions"]
        assert not set(positions) & test
        source = sources.load_source(f"split:{path}")[0]
        assert np.bincount(sources.class_indices(source)).tolist() == [3, 3, 3]
        drawn.append(tuple(positions))
    assert len(set(drawn)) == 4 and not (tmp_path / "c" / "splits" / "few_labels.json").exists()
    # Without the flag, a new plan takes the default number of draws.
    default = plan(argv + ["--data", f"folder:{folder}"], tmp_path / "d")
    assert default["arguments"]["few_label_draws"] == runner.FEW_LABEL_DRAWS == 5
    assert sorted(os.listdir(tmp_path / "d" / "splits")) == sorted(
        [f"few_labels_{d}.json" for d in range(5)]
        + ["test.json", "train.json", "tune.json", "validation.json"])


def test_zero_draws_is_one_error_line(tmp_path, capsys):
    status, lines = compare(["--config", "mnist", "--data", "mnist", "--few-label-draws", "0",
                             "--out", str(tmp_path / "c")], capsys)
    assert status == 2 and lines == ["error: --few-label-draws must be at least 1, got 0"]


def test_a_final_run_measures_every_draw_once_and_records_their_mean_and_spread(
        tmp_path, monkeypatch):
    comparison = with_draws(fake_comparison(tmp_path / "c", {"caco": [90.0, 91.0, 92.0]}))
    key = "final/caco/seed1"
    asked = []

    def evaluate(protocol, **given):
        asked.append(given)
        time.sleep(0.2)  # a probe's time, which the entry adds up
        return {"top1": [61.0, 63.5, 58.0][draw_of(given["data"])]}

    monkeypatch.setattr("caco_tf.evaluation.protocols.evaluate", evaluate)
    # Stopped after its first draw: the run resumes at the second.
    comparison.save_entry(key, {"seed": 1, "knn_top1": 91.0, "linear_top1": 92.0,
                                "few_label_top1_draws": [61.0], "probe_seconds": 5.0})
    assert not runner.finished(comparison, key, True)
    entry = runner.evaluate(comparison, key)
    assert [draw_of(given["data"]) for given in asked] == [1, 2]
    assert all(given["held_out"].endswith("test.json") and given["seed"] == 1
               for given in asked)
    sd = math.sqrt(((61 - 60.833333) ** 2 + (63.5 - 60.833333) ** 2 + (58 - 60.833333) ** 2) / 2)
    assert entry["few_label_top1_draws"] == [61.0, 63.5, 58.0]
    assert entry["few_label_top1"] == pytest.approx(182.5 / 3)
    assert entry["few_label_top1_sd"] == pytest.approx(sd, abs=1e-6)
    assert 5.35 <= entry["probe_seconds"] < 10  # the first session's 5 s and these two draws'
    assert comparison.entry(key) == entry and runner.finished(comparison, key, True)
    # The report reads the same figures back from the run folder's JSONs.
    comparison.save_entry(key, dict(entry, few_label_top1_draws=[61.0]))  # not what it reads
    with open(os.path.join(comparison.run_dir(key), runner.few_label_file("few_labels_0")),
              "w") as handle:
        json.dump({"top1": 61.0}, handle)
    figures = report.measured(comparison, key)
    assert figures["few_label_top1_draws"] == [61.0, 63.5, 58.0]
    assert figures["few_label_top1"] == pytest.approx(entry["few_label_top1"])
    assert figures["few_label_top1_sd"] == pytest.approx(sd, abs=1e-6)
    runner.evaluate(comparison, "final/caco/seed1")  # measured: nothing again
    assert len(asked) == 2


# ---------------------------------------------------------------------- the baselines
def test_every_probe_of_the_baselines_is_measured_once_and_read_back_into_the_report(
        tmp_path, fake_protocols):
    comparison = with_draws(fake_comparison(tmp_path / "c", {"caco": [90.0, 90.5, 91.0],
                                                             "byol": [85.0, 85.2, 85.4]}))
    write_few_labels(comparison, {"caco": lambda seed, draw: 60.0 + seed + 2 * draw,
                                  "byol": lambda seed, draw: 50.0 + seed + draw})
    said = []
    assert runner.measure_baselines(comparison, say=said.append) == {"pixels": 88.0,
                                                                     "untrained": 40.0}
    probes = ["knn", "linear", "few_labels_0", "few_labels_1", "few_labels_2"]
    assert runner.baseline_probes(comparison) == probes
    assert sorted(os.listdir(os.path.join(comparison.folder, "baselines"))) == sorted(
        f"{name}_{probe}.json" for name in runner.BASELINES for probe in probes)
    assert len(fake_protocols) == 10 and all(
        given.get("run") is None and given["config"]["train"]["seed"] == 0
        and given["seed"] == 0 for _, given in fake_protocols)
    linear = [given for protocol, given in fake_protocols if protocol == "linear"]
    assert len(linear) == 8 and all(given["epochs"] == 1 for given in linear)
    assert sum("data" in given for given in linear) == 6  # 3 draws x 2 baselines
    assert "baseline pixels: test few-label (few_labels_2) 45.0%" in said
    runner.measure_baselines(comparison, say=said.append)
    assert len(fake_protocols) == 10  # each once
    found = runner.baseline_figures(comparison)
    assert found["pixels"]["linear_top1"] == 89.0 and found["untrained"]["knn_top1"] == 40.0
    assert found["pixels"]["few_label_top1"] == pytest.approx(42.0)
    assert found["pixels"]["few_label_top1_draws"] == [40.0, 41.0, 45.0]
    assert found["pixels"]["few_label_top1_sd"] == pytest.approx(math.sqrt(7))
    assert found["untrained"]["few_label_top1_sd"] == 0.0

    text = open(os.path.join(report.write(comparison), "report.md")).read()
    assert ("| method | chosen trial | seeds | kNN top-1 | linear top-1 | few-label linear "
            "top-1 (mean of 3 label draws) |") in text
    assert ("| raw pixels (baseline) | – | no training | 88.0 | 89.0 | 42.0 (sd 2.6 over 3 "
            "draws) |") in text
    assert ("| untrained network (baseline) | – | none (weights seeded 0) | 40.0 | 50.0 | 30.0 "
            "(sd 0.0 over 3 draws) |") in text
    # Against 89 on the linear top-1: caco's 91, 91.5, 92 (p 0.013), byol's 86, 86.2, 86.4 (p
    # 0.0017); Holm over the 2 methods: 0.026 and 0.0034, both below 0.05.
    assert ("Without pre-training, on the same test split (kNN top-1 · linear top-1 · "
            "few-label linear top-1 (mean of 3 label draws)): the raw pixels 88.0 % · 89.0 % · "
            "42.0 %; the untrained network 40.0 % · 50.0 % · 30.0 %. On the kNN top-1, above "
            "the raw pixels (t-test over seeds, Holm over the 2 methods at 0.05): caco; below "
            "them: byol. Above the untrained network (the same test, Holm over the 2 methods): "
            "caco, byol. On the linear top-1, above the raw pixels (t-test over seeds, Holm "
            "over the 2 methods at 0.05): caco; below them: byol. Above the untrained network "
            "(the same test, Holm over the 2 methods): caco, byol. On the few-label linear "
            "top-1 (mean of 3 label draws), above the raw pixels (t-test over seeds, Holm over "
            "the 2 methods at 0.05): caco, byol. Above the untrained network (the same test, "
            "Holm over the 2 methods): caco, byol.") in text
    # The spread over the draws: caco's draws 60 + s, 62 + s, 64 + s (sd 2), byol's 1.
    assert ("Its spread over the draws (the standard deviation of a run's 3 figures, the mean "
            "over a method's seeds), in points: caco 2.0; byol 1.0; the raw pixels 2.6; the "
            "untrained network 0.0.") in text
    assert "| caco | 0 | 60.0 | 62.0 | 64.0 | 62.0 | 2.00 |" in text  # every draw, per run
    assert "| raw pixels (baseline) | – | 40.0 | 41.0 | 45.0 | 42.0 | 2.65 |" in text
    assert "63.0 [60.5, 65.5]" in text  # caco's few-label: the seeds' means 62, 63, 64


def test_the_estimate_counts_every_draw_and_the_baselines_probes(tmp_path):
    comparison = with_draws(fake_comparison(tmp_path / "c", {"caco": [90.0, 91.0, 92.0]}))
    unit = dict(image_seconds=0.0, fit_seconds=0.0, epoch_seconds=0.0, step_seconds=1.0)
    comparison.state = {"calibration": {"caco": {"step_seconds": 0.0, "setup_seconds": 0.0}},
                        "evaluation": unit}
    for seed in range(3):
        key = comparison.final_key("caco", seed)
        comparison.save_entry(key, dict(comparison.entry(key), few_label_top1=50.0))
    few = runner.linear_seconds(unit, 20, 1000, 1)
    linear = runner.linear_seconds(unit, 4000, 1000, 1)
    baselines = 2 * (linear + 3 * few)  # both baselines: linear, three draws (the kNN: 0 here)
    assert runner.baseline_seconds(comparison, unit) == pytest.approx(baselines)
    assert runner.estimate_seconds(comparison) == pytest.approx(baselines)
    os.makedirs(os.path.join(comparison.folder, "baselines"))
    for name in runner.BASELINES:
        for probe in runner.baseline_probes(comparison):
            runner.write_json_atomically(runner.baseline_path(comparison, name, probe),
                                         {"top1": 1.0})
    assert runner.estimate_seconds(comparison) == 0.0
    key = "final/caco/seed2"  # one of its three draws measured: two left
    comparison.save_entry(key, {"knn_top1": 92.0, "linear_top1": 93.0,
                                "few_label_top1_draws": [50.0]})
    assert runner.estimate_seconds(comparison) == pytest.approx(2 * few)


# ---------------------------------------------------------------------- the paper's figures
def test_the_papers_figures_are_a_table_of_their_own(tmp_path, monkeypatch):
    comparison = fake_comparison(tmp_path / "c", {"caco": [90.0, 91.0, 92.0],
                                                  "byol": [85.0, 86.0, 86.5]})
    monkeypatch.chdir(tmp_path)
    text = report.section(comparison, [], "results.md")
    main = text[:text.index("### What the authors report at ImageNet scale")]
    assert report.PAPER_COLUMN not in main and "74.3 (1000 ep)" not in main
    paper = text[text.index("### What the authors report at ImageNet scale"):]
    assert ("| method | what the authors report: ImageNet linear top-1 (%), ResNet-50, their "
            "epochs |") in paper
    assert "| byol | 70.6 (200 ep, b4096); 74.3 (1000 ep) |" in paper
    assert "not comparable with its figures" in paper
    assert "| caco | 1: `train.learning_rate=0.09` | 0, 1, 2 | 91.0 [88.5, 93.5] |" in main


# ---------------------------------------------------------------------- an old plan
def test_a_plan_written_before_the_draws_still_reports(tmp_path, capsys):
    """The published shapes comparison (one few_labels.json, kNN baselines only), its JSON
    files copied: --report-only reports it, its one draw's figures as measured."""
    old = os.path.join(ROOT, "benchmarks", "shapes_comparison")
    copy = tmp_path / "shapes"
    for folder, _, files in os.walk(old):
        for name in files:
            if name.endswith(".json"):
                target = copy / os.path.relpath(os.path.join(folder, name), old)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(os.path.join(folder, name), target)
    comparison = runner.Comparison(copy)
    assert "few_label_draws" not in comparison.plan["arguments"]
    assert runner.few_label_splits(comparison) == ["few_labels"]
    assert runner.baseline_probes(comparison) == ["knn"]
    assert runner.estimate_seconds(comparison) == 0.0  # every run and baseline measured
    key = "final/byol/seed0"
    assert runner.finished(comparison, key, True)
    assert report.measured(comparison, key)["few_label_top1"] == pytest.approx(
        comparison.entry(key)["few_label_top1"])
    status = compare_cli.main(["--out", str(copy), "--report-only"])
    assert status == 0, capsys.readouterr().err[-2000:]
    text = (copy / "report" / "report.md").read_text()
    assert "| few-label linear top-1 (one label draw) |" in text
    assert "| raw pixels (baseline) | – | no training | 70.8 | not planned | not planned |" in text
    assert ("Without pre-training, on the same test split (kNN top-1): the raw pixels 70.8 %; "
            "the untrained network 36.5 %. On the kNN top-1, above the raw pixels") in text
    assert "The few-label draws" not in text and "Its spread over the draws" not in text
    assert "| byol | 1: `train.learning_rate=0.05, method.byol.key_momentum=0.99` | 0, 1, 2 | " \
           "50.9 [47.1, 54.7] | 54.4 [49.8, 59.1] | 23.0 [20.3, 25.7] |" in text


def test_the_linear_protocol_measures_both_baselines_from_a_configuration(tmp_path):
    """``protocols.evaluate("linear", config=..., baseline=...)``, as ``measure_baselines``
    calls it: no run folder, the budget's configuration; on a few-label split too."""
    from caco_tf.config import load_config
    from caco_tf.evaluation import protocols

    rng = np.random.default_rng(0)
    labels = np.arange(60) % 3
    images = (rng.integers(0, 90, (60, 16, 16, 1)) + 80 * labels[:, None, None, None])
    np.savez(tmp_path / "d.npz", images=images.astype(np.uint8), labels=labels)
    train, test = tmp_path / "train.json", tmp_path / "test.json"
    for path, positions in ((train, range(0, 45)), (test, range(45, 60))):
        path.write_text(json.dumps(sources.split_file(f"npz:{tmp_path / 'd.npz'}", "train",
                                                      positions)))
    few = tmp_path / "few.json"
    few.write_text(json.dumps(sources.split_file(f"npz:{tmp_path / 'd.npz'}", "train",
                                                 list(range(0, 6)))))
    config = load_config("mnist", [f"data.source=split:{train}",
                                   f"data.held_out=split:{test}", "data.image_size=16",
                                   "model.widths=[4, 8, 8, 8]", "train.jit_compile=false"])
    quick = dict(epochs=1, l2=0.0, verbose=0)  # one fit: no cross-validation
    pixels = protocols.evaluate("linear", config=config, baseline="pixels", seed=0, **quick)
    assert pixels["encoder"] == "raw pixels"
    assert (pixels["train_images"], pixels["test_images"], pixels["classes"]) == (45, 15, 3)
    untrained = protocols.evaluate("linear", config=config, baseline="untrained", seed=0,
                                   data=f"split:{few}", held_out=f"split:{test}", **quick)
    assert untrained["encoder"].startswith("untrained ") and untrained["train_images"] == 6
    assert untrained["test_images"] == 15 and 0.0 <= untrained["top1"] <= 100.0


def test_the_few_label_probe_takes_its_own_epochs_else_the_linear_protocols(
        tmp_path, monkeypatch, fake_protocols):
    comparison = with_draws(fake_comparison(tmp_path / "c", {"caco": [90.0, 91.0, 92.0]}))
    assert runner.few_label_epochs(comparison.plan["arguments"]) == 1  # a plan without it
    comparison.plan["arguments"]["few_label_epochs"] = 7
    runner.measure_baselines(comparison, say=lambda line: None)
    assert sorted({("data" in given, given.get("epochs")) for protocol, given in fake_protocols
                   if protocol == "linear"}) == [(False, 1), (True, 7)]
    unit = dict(image_seconds=0.0, fit_seconds=0.0, epoch_seconds=0.0, step_seconds=1.0)
    shutil.rmtree(os.path.join(comparison.folder, "baselines"))  # the estimate counts them all
    assert runner.baseline_seconds(comparison, unit) == pytest.approx(2 * (
        runner.linear_seconds(unit, 4000, 1000, 1) + 3 * runner.linear_seconds(unit, 20, 1000, 7)))
    asked = []

    def evaluate(protocol, **given):
        asked.append(given)
        return {"top1": 60.0}

    key = "final/caco/seed1"
    comparison.save_entry(key, {"seed": 1, "knn_top1": 91.0})
    monkeypatch.setattr("caco_tf.evaluation.protocols.evaluate", evaluate)
    runner.evaluate(comparison, key)
    assert [(given.get("data") is None, given["epochs"]) for given in asked] == [
        (True, 1), (False, 7), (False, 7), (False, 7)]  # linear at --linear-epochs, 3 draws

def test_few_label_epochs_below_one_is_one_error_line(tmp_path, capsys):
    status, lines = compare(["--config", "mnist", "--data", "mnist", "--few-label-epochs", "0",
                             "--out", str(tmp_path / "c")], capsys)
    assert status == 2 and lines == ["error: --few-label-epochs must be at least 1, got 0"]
