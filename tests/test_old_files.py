"""Files written by caco_tf 0.2 (tests/data/v0_2, made by its make.py at commit cf75f45) load.

0.2 kept the bank's three variables on the model itself and its settings in a ``caco`` section;
0.3 gives the bank its own layer (``MemoryBank``) and names the section ``method``.
"""

import json
import os
import shutil

import keras
import numpy as np
import pytest
import yaml

from caco_tf import build, pretrain
from caco_tf.config import load_config
from caco_tf.training.callbacks import is_wall_clock
from caco_tf.training.run_folder import RunFolder, weight_arrays

OLD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "v0_2")
# make.py's settings over the mnist configuration, in today's names.
TINY = ["model.widths=[4,8,8,8]", "model.projector_hidden=16", "model.embedding_dim=8",
        "method.caco.bank_size=64", "train.batch_size=32", "train.epochs=2",
        "method.caco.warmup_epochs=1",
        "evaluation.knn_monitor_every=0", "evaluation.health_images=0",
        "evaluation.knn_train_images=500", "evaluation.knn_test_images=200"]


def arrays(path):
    """Every array of a weights file by its path, the 0.2 bank's place named as today's."""
    return {"/" + name.replace("layers/memory_bank/vars/", "vars/"): value
            for name, value in weight_arrays(path).items()}


def test_an_old_run_folder_and_keras_files_load():
    run = build.load_run(os.path.join(OLD, "run"))
    assert (run.config["method"]["name"] == "caco"
            and run.config["method"]["caco"]["bank_size"] == 64)
    saved = arrays(os.path.join(OLD, "run", "checkpoints", "last.weights.h5"))
    np.testing.assert_array_equal(run.model.memory_bank.rows.numpy(), saved["/vars/0"])
    np.testing.assert_array_equal(run.model.memory_bank.velocity.numpy(), saved["/vars/1"])
    assert int(run.model.memory_bank.pointer.numpy()) == int(saved["/vars/2"])
    trained = keras.models.load_model(os.path.join(OLD, "run", "model.keras"))
    for mine, theirs in zip(trained.weights, run.model.weights):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    # 0.2's SimCLR carried a bank and a key encoder it never used: they are left aside.
    simclr = keras.models.load_model(os.path.join(OLD, "simclr.keras"))
    assert simclr.memory_bank is None and simclr.key_encoder is None


@pytest.mark.slow
def test_an_old_run_folder_resumes_to_the_old_runs_end(tmp_path):
    """Its backup after epoch 1, resumed by today's code, ends as the 0.2 run did (bit for bit on
    the CPU model that made it; to float32 drift on another)."""
    folder = str(tmp_path / "run")
    shutil.copytree(os.path.join(OLD, "run"), folder)
    for name in ("checkpoints", "model.keras", "results.json", "history.json"):
        path = os.path.join(folder, name)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    with open(os.path.join(OLD, "run", "history.json")) as handle:
        old_history = json.load(handle)
    with open(os.path.join(folder, "history.json"), "w") as handle:
        json.dump(old_history[:1], handle)  # what the run had written when it stopped
    with open(os.path.join(folder, "config.yaml")) as handle:
        assert "caco" in yaml.safe_load(handle)  # the old layout
    config = load_config("mnist", TINY)  # train.py's default configuration
    # The rename is no change; the one setting added since 0.2 is (mnist.yaml sets it).
    assert pretrain.changes_since_backup(RunFolder(folder), config) == [
        "train.steps_per_execution: None -> 10"]
    results = pretrain.run(config, folder, verbose=0)
    # The 0.2 run was made on another CPU model (a seeded run repeats bit for bit on one CPU
    # model only, docs/long-runs.md): its end is matched to float32 rounding's drift over an
    # epoch, its layout exactly.
    assert abs(results["knn_top1"] - 61.0) <= 1.0  # the 0.2 run's results.json
    old = arrays(os.path.join(OLD, "run", "checkpoints", "last.weights.h5"))
    new = arrays(os.path.join(folder, "checkpoints", "last.weights.h5"))
    assert sorted(old) == sorted(new)
    with open(os.path.join(folder, "history.json")) as handle:
        new_history = json.load(handle)
    compute = {"steps", "images_seen", "train_seconds"}  # recorded since 0.4 (learning curves)
    assert [sorted(set(epoch) - compute) for epoch in new_history] == [
        sorted(epoch) for epoch in old_history]
    for new_epoch, old_epoch in zip(new_history, old_history):
        for key in (k for k in old_epoch if not is_wall_clock(k)):
            assert new_epoch[key] == pytest.approx(old_epoch[key], rel=1e-2, abs=1e-3), key
