"""caco-compare on a ViT budget: the methods of a ViT's tokens join a comparison when named,
each on the views its authors train with (``AUTHORS_VIEWS``) unless ``--views`` is typed, and a
plan written before them reads and runs as it did."""

import json
import os
import shlex
import sys

import pytest

from caco_tf.comparison import runner, trials
from caco_tf.config import load_config, shipped_configs
from caco_tf.methods import METHODS
from caco_tf.nets.sizes import VIT_SHAPES

from test_compare_mistakes import plan
from test_comparison import ROOT, TINY, write_folder
from tiny_methods import CONFIG_OVERRIDES
import launch

COMPARED = ["mae", "dinov2", "ijepa", "dino"]  # the three token methods and a pooled one
# test_comparison's tiny budget on the micro ViT (its views and ConvNet widths left out), the
# compared methods' sections at their tiny sizes.
VIT_TINY = (["--config", "mnist_vit", "--backbone", "vit_micro_patch4", "--epochs", "1",
             "--trials", "1"] + TINY[:4] + TINY[8:]
            + [part for setting in CONFIG_OVERRIDES if setting.split(".")[1] in COMPARED
               for part in ("--set", setting)])


def planned(tmp_path, extra=()):
    """(the comparison, its plan) of ``COMPARED`` on a tiny ViT budget: planned, every run's
    configuration checked, nothing trained."""
    folder = write_folder(tmp_path / "images", per_class=20)
    written = plan(VIT_TINY + ["--data", f"folder:{folder}", "--methods", ",".join(COMPARED),
                               "--seeds", "1"] + list(extra), tmp_path / "c")
    return runner.Comparison(tmp_path / "c"), written


def assigned(command):
    """The ``--set`` assignments of a ``caco-train`` command."""
    parts = shlex.split(command)
    return [value for flag, value in zip(parts, parts[1:]) if flag == "--set"]


@pytest.mark.parametrize("method", trials.vit_methods())
def test_the_views_a_method_declares_are_its_imagenet_recipes(method):
    (recipe,) = [name for name in shipped_configs() if name.startswith(f"{method}_imagenet_")]
    config = load_config(recipe)
    declared = METHODS[method].authors_views(config["data"]["image_size"],
                                             VIT_SHAPES[config["model"]["backbone"]][0])
    assert declared["data.views"] == config["data"]["views"]
    for key, value in declared.items():
        found = config
        for part in key.split("."):
            found = found[part]
        assert found == value, (recipe, key)


def test_each_method_trains_on_its_authors_views_in_every_run(tmp_path):
    comparison, plan_json = planned(tmp_path)
    assert plan_json["own_settings"]["mae"] == ['data.views="crop_flip"',
                                                "data.crop_scale=[0.2, 1.0]"]
    assert plan_json["own_settings"]["dino"] == []  # it declares none: the budget's
    assert "model.mask_token=true" in plan_json["own_settings"]["dinov2"]
    for method in COMPARED:
        declared = METHODS[method].AUTHORS_VIEWS
        for key, final in ((comparison.trial_key(method, 0), False),
                           (comparison.final_key(method, 0), True)):
            config = comparison.config(method, 0, 0, final)
            assert config["data"]["views"] == (declared.views if declared else "digits")
            settings = assigned(comparison.command(key, method, 0, 0, final))
            assert set(plan_json["own_settings"][method]) <= set(settings), settings
    ijepa, dinov2 = (comparison.config(m, 0, 0, True)["data"] for m in ("ijepa", "dinov2"))
    assert ijepa["crop_scale"] == [0.3, 1.0]
    # 98 of 224 px at 16 px: 7, in whole 4 px patches: 4, a local crop below the image.
    assert dinov2["multicrop"]["local_size"] == 4 and dinov2["multicrop"]["local_crops"] == 8


@pytest.mark.parametrize("typed", [["--views", "crop"], ["--set", "data.views=crop"]])
def test_views_typed_are_every_methods_as_typed(typed, tmp_path):
    comparison, plan_json = planned(tmp_path, typed)
    assert plan_json["own_settings"] == {"mae": [], "dinov2": ["model.mask_token=true"],
                                         "ijepa": [], "dino": []}
    assert {comparison.config(m, 0, 0, True)["data"]["views"] for m in COMPARED} == {"crop"}


def test_a_setting_of_the_views_typed_stays_the_users(tmp_path):
    comparison, plan_json = planned(tmp_path, ["--set", "data.crop_scale=[0.5, 1.0]"])
    assert plan_json["own_settings"]["mae"] == ['data.views="crop_flip"']
    assert comparison.config("mae", 0, 0, True)["data"]["crop_scale"] == [0.5, 1.0]


@pytest.mark.parametrize("folder", ["shapes_comparison", "shapes_pilot16"])
def test_a_plan_written_before_trains_every_run_with_the_command_it_recorded(folder):
    """A plan without ``own_settings``: each run's command now is the one its folder recorded
    when it trained (the comparison's folder named as it was then)."""
    comparison = runner.Comparison(os.path.join(ROOT, "benchmarks", folder))
    assert "own_settings" not in comparison.plan
    checked = 0
    for key, method, trial, seed, final in comparison.runs():
        entry = comparison.entry(key)
        if "command" not in entry:
            continue
        run_dir = entry["command"].split(" --run-dir ")[1].split(" ")[0]
        then = run_dir[:-len(f"/runs/{key}")]
        now = comparison.command(key, method, entry["trial"], entry["seed"], final)
        assert now.replace(comparison.folder, then) == entry["command"], key
        checked += 1
    assert checked >= 12


@pytest.mark.slow
def test_a_tiny_vit_comparison_reports_a_row_per_method(tmp_path):
    """The three token methods and DINO, each on its own views, through calibration, trials,
    final runs, the kNN, linear and few-label probes, the learning curves and the report.  In
    a process of its own: its twelve trainings' graphs would stay in the test worker's memory
    (the suite's two workers ran out of 24 GiB with it in-process)."""
    folder = write_folder(tmp_path / "images", per_class=20)
    out = tmp_path / "c"
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    result = launch.run(
        [sys.executable, "-m", "caco_tf.cli.compare"] + VIT_TINY
        + ["--data", f"folder:{folder}", "--methods", ",".join(COMPARED), "--seeds", "1",
           "--curve-images", "24,12", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 0, lines[-20:]
    assert "  mae's own, after the budget's: data.views=\"crop_flip\" data.crop_scale=[0.2, 1.0]" \
        in lines
    text = (out / "report" / "report.md").read_text()
    assert "Trained on their authors' views, not the budget's: mae, dinov2, ijepa." in text
    for method in COMPARED:
        row = next(line for line in text.splitlines() if line.startswith(f"| {method} | 0: "))
        assert "nan" not in row, row  # a method of one view logs no uniformity: –
        entry = json.loads((out / "runs" / "final" / method / "seed0" / runner.ENTRY)
                           .read_text())
        assert {"knn_top1", "linear_top1", "few_label_top1", "step_flops"} <= set(entry), entry
        history = json.loads((out / "runs" / "final" / method / "seed0" / "history.json")
                             .read_text())
        assert "knn_top1" in history[-1], method  # the learning curve's point
