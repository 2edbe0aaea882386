"""caco-evaluate: kNN and linear on a run's own data, TFDS transfer, raw pixels,
the printed table and JSON, and one-line errors.  TFDS data is tfds.testing.mock_data."""

import json
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow_datasets as tfds

from caco_tf.run_settings import RunSettings
from caco_tf.training.run_folder import RunFolder
from caco_tf import build
from caco_tf.evaluation.monitor import knn_top1
from caco_tf.cli import evaluate
from caco_tf.evaluation import features, protocols
from caco_tf.errors import ConfigError
from caco_tf.methods import ijepa
from caco_tf.nets import tokens
from tiny_run import make_run

EXAMPLES = 48  # per mocked split


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("run"))[0]


def cli(capsys, *args):
    with tfds.testing.mock_data(num_examples=EXAMPLES):
        status = evaluate.main(list(args))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.slow
def test_knn_uses_the_runs_own_split_and_matches_train_py(run_dir, capsys):
    status, out, _ = cli(capsys, "knn", "--run", run_dir)
    assert status == 0
    result = json.load(open(os.path.join(run_dir, "eval_knn.json")))
    assert result["data"] == "tfds:mnist"  # the run's config.yaml source
    assert (result["train_images"], result["test_images"]) == (EXAMPLES, EXAMPLES)
    assert (result["k"], result["temperature"]) == (3, 0.07)  # the run's evaluation settings
    # The same number as train.py's end-of-run kNN (the same function, on its samples).
    run = build.load_run(run_dir)
    with tfds.testing.mock_data(num_examples=EXAMPLES):
        settings = RunSettings.of(run.config)
        train, held_out = build.load_data(settings.data)
        expected = knn_top1(run.model.backbone, run.views, settings, train, held_out)
    assert result["top1"] == pytest.approx(expected)
    assert result["top5"] >= result["top1"]
    assert out.strip().endswith(f"kNN top-1: {expected:.1f}%")
    assert "| knn (k=3, T=0.07) |" in out


@pytest.mark.slow
def test_linear_prints_table_and_final_line_and_writes_json(run_dir, capsys):
    status, out, _ = cli(capsys, "linear", "--run", run_dir, "--epochs", "3")
    assert status == 0
    result = json.load(open(os.path.join(run_dir, "eval_linear.json")))
    lines = out.strip().splitlines()
    assert lines[0].startswith("| protocol | encoder | data |")
    assert re.fullmatch(r"linear top-1: \d+\.\d%", lines[-1])
    assert lines[-1] == f"linear top-1: {result['top1']:.1f}%"
    assert result["path"] == "cached features" and result["epochs"] == 3
    # λ chosen by 5-fold cross-validation on the training split (the default).
    assert result["l2_folds"] == 5 and set(result["l2_scores"]) == {"0", "0.0001", "0.001",
                                                                    "0.01", "0.1"}
    assert f"L2 {result['l2']:g} (5-fold CV)" in out
    assert result["classes"] == 10 and result["train_images"] == EXAMPLES
    assert 0.0 <= result["top1"] <= result["top5"] <= 100.0


@pytest.mark.slow
def test_transfer_to_a_tfds_dataset_by_name(run_dir, capsys, tmp_path):
    # CIFAR-10 is 32×32 RGB; the run's backbone takes 28×28 grayscale: converted on the way.
    out_json = tmp_path / "cifar.json"
    status, out, err = cli(capsys, "linear", "--run", run_dir, "--data", "tfds:cifar10",
                           "--epochs", "2", "--l2", "0", "--json", str(out_json))
    assert status == 0, err
    result = json.load(open(out_json))
    assert result["data"] == "tfds:cifar10" and result["classes"] == 10
    assert result["test_images"] == EXAMPLES
    assert out.strip().splitlines()[-1].startswith("linear top-1: ")


def test_default_json_name_names_the_data():
    assert protocols.default_json_path("R", "linear", "tfds:cifar10", False) == os.path.join(
        "R", "eval_linear_tfds_cifar10.json")
    assert protocols.default_json_path("R", "knn", None, "pixels") == os.path.join(
        "R", "eval_knn_pixels.json")
    assert protocols.default_json_path("R", "knn", "folder:x", "untrained") == os.path.join(
        "R", "eval_knn_untrained_folder_x.json")
    assert protocols.default_json_path("R", "linear", None, "untrained",
                                       "class+patch_mean") == os.path.join(
        "R", "eval_linear_untrained_class_and_patch_mean.json")
    assert protocols.default_json_path(None, "knn", None, "pixels") is None


def test_raw_pixel_baseline_needs_no_run(capsys, tmp_path):
    out_json = tmp_path / "pixels.json"
    status, out, err = cli(capsys, "knn", "--pixels", "--data", "tfds:mnist", "--k", "1",
                           "--json", str(out_json))
    assert status == 0, err
    result = json.load(open(out_json))
    assert result["encoder"] == "raw pixels"
    # 1-NN on raw pixels, recomputed in NumPy from the same mocked images.
    with tfds.testing.mock_data(num_examples=EXAMPLES):
        splits = [list(tfds.as_numpy(tfds.load("mnist", split=s, as_supervised=True)))
                  for s in ("train", "test")]
    (train_x, train_y), (test_x, test_y) = [
        (np.stack([x for x, _ in split]).reshape(len(split), -1) / 255.0,
         np.array([y for _, y in split])) for split in splits]

    def unit(v):
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    nearest = np.argmax(unit(test_x) @ unit(train_x).T, axis=1)
    assert result["top1"] == pytest.approx(100.0 * np.mean(train_y[nearest] == test_y))


@pytest.mark.slow
def test_untrained_baseline_is_the_runs_network_before_training(run_dir, capsys):
    status, out, err = cli(capsys, "knn", "--run", run_dir, "--untrained", "--seed", "3")
    assert status == 0, err
    result = json.load(open(os.path.join(run_dir, "eval_knn_untrained.json")))
    assert result["encoder"].startswith("untrained small_convnet (seed 3) of ")
    run = build.load_run(run_dir)
    fresh = protocols.untrained_backbone(run.config, 3)
    trained, again = run.model.backbone.get_weights(), fresh.get_weights()
    assert [w.shape for w in trained] == [w.shape for w in again]  # the same network...
    assert any(not np.allclose(a, b) for a, b in zip(trained, again))  # ...not its weights
    # Seeded as train.seed seeds the build: seed 0 is the tiny run's own initial network.
    assert all(np.array_equal(a, b) for a, b in
               zip(trained, protocols.untrained_backbone(run.config, 0).get_weights()))
    with tfds.testing.mock_data(num_examples=EXAMPLES):
        labelled = protocols.load_labelled_data(None, run.config)
        expected = protocols.knn(fresh, labelled, protocols.preprocessing_for(run.config), 3,
                                 0.07)
    assert result["top1"] == pytest.approx(expected["top1"])
    # A baseline reads no weights: a run folder before its first checkpoint has one too.
    early = os.path.join(os.path.dirname(run_dir), "before_its_first_epoch")
    os.makedirs(early)
    shutil.copy(os.path.join(run_dir, "config.yaml"), early)
    status, out, err = cli(capsys, "knn", "--run", early, "--untrained", "--seed", "3")
    assert status == 0, err
    assert json.load(open(os.path.join(early, "eval_knn_untrained.json")))["top1"] == \
        result["top1"]


def test_teacher_evaluates_the_momentum_teachers_backbone(tmp_path, capsys):
    run_dir, model = make_run(tmp_path / "byol", overrides=["method.name=byol"])
    teacher = model.key_encoder.layers[1]
    for weight in teacher.trainable_weights:  # a teacher that has moved away from the student
        weight.assign(weight * 1.5)
    model.save_weights(RunFolder(run_dir).checkpoint)
    status, out, err = cli(capsys, "knn", "--run", run_dir, "--teacher")
    assert status == 0, err
    result = json.load(open(os.path.join(run_dir, "eval_knn_teacher.json")))
    assert result["encoder"] == f"teacher of {os.path.abspath(run_dir)}"
    run = build.load_run(run_dir)
    read = protocols.teacher_backbone(run.model)
    assert read is not run.model.backbone and read.name.startswith(run.model.backbone.name)
    for saved, loaded in zip(teacher.get_weights(), read.get_weights()):
        np.testing.assert_array_equal(saved, loaded)
    assert any(not np.array_equal(a, b) for a, b in
               zip(read.get_weights(), run.model.backbone.get_weights()))
    with tfds.testing.mock_data(num_examples=EXAMPLES):
        labelled = protocols.load_labelled_data(None, run.config)
        expected = protocols.knn(read, labelled, protocols.preprocessing_for(run.config), 3,
                                 0.07)
    assert result["top1"] == pytest.approx(expected["top1"])
    # A method without a momentum teacher: one line naming those with one; nothing written.
    simclr, _ = make_run(tmp_path / "simclr", overrides=["method.name=simclr"])
    status, _, err = cli(capsys, "knn", "--run", simclr, "--teacher")
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("error: --teacher: simclr trains no momentum teacher; the methods "
                          "that do: caco, "), err
    assert "byol" in err and "dino" in err and "simsiam" not in err
    assert not os.path.exists(os.path.join(simclr, "eval_knn_teacher.json"))


def test_features_pool_a_vits_patch_tokens_and_name_their_json(tmp_path, capsys):
    run_dir, model = make_run(tmp_path / "mae", overrides=["method.name=mae",
                                                           "model.backbone=vit_micro_patch4",
                                                           "evaluation.features=patch_mean"])
    images = np.random.default_rng(0).random((3, 28, 28, 1), dtype=np.float32)
    encoded = tokens.encode(model.backbone, images)
    patch_mean = encoded.patches.numpy().mean(axis=(1, 2))  # MAE's global pool
    np.testing.assert_allclose(
        features.pooled_backbone(model.backbone, "patch_mean")(images), patch_mean, atol=1e-5)
    np.testing.assert_allclose(  # DINOv2's linear evaluation: [class, mean patch]
        features.pooled_backbone(model.backbone, "class+patch_mean")(images),
        np.concatenate([encoded.cls.numpy(), patch_mean], axis=-1), atol=1e-5)
    assert features.pooled_backbone(model.backbone, "class") is model.backbone
    ijepa_vit = ijepa.patch_mean_backbone(model.backbone)  # no class token: already patch_mean
    assert features.pooled_backbone(ijepa_vit, "patch_mean") is ijepa_vit
    with pytest.raises(ConfigError, match=r"^--features class\+patch_mean: the backbone "):
        features.pooled_backbone(ijepa_vit, "class+patch_mean")
    # Without --features: the run's evaluation.features.
    status, out, err = cli(capsys, "knn", "--run", run_dir, "--untrained", "--seed", "2")
    assert status == 0, err
    result = json.load(open(os.path.join(run_dir, "eval_knn_untrained_patch_mean.json")))
    assert result["features"] == "patch_mean"
    assert result["encoder"].endswith(", features patch_mean")
    config = build.load_run_config(run_dir).config
    with tfds.testing.mock_data(num_examples=EXAMPLES):
        expected = protocols.knn(
            features.pooled_backbone(protocols.untrained_backbone(config, 2), "patch_mean"),
            protocols.load_labelled_data(None, config), protocols.preprocessing_for(config),
            3, 0.07)
    assert result["top1"] == pytest.approx(expected["top1"])
    status, out, err = cli(capsys, "knn", "--run", run_dir, "--untrained", "--seed", "2",
                           "--features", "class")
    assert status == 0, err
    assert json.load(open(os.path.join(run_dir, "eval_knn_untrained.json")))["features"] == \
        "class"
    # A ConvNet has no patch tokens: one line, nothing written.
    convnet, _ = make_run(tmp_path / "simclr", overrides=["method.name=simclr"])
    status, _, err = cli(capsys, "knn", "--run", convnet, "--features", "class+patch_mean")
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("error: --features class+patch_mean pools a Vision Transformer's "
                          "patch tokens and the backbone "), err
    assert not any(name.startswith("eval_") for name in os.listdir(convnet))


@pytest.mark.parametrize("args, message", [
    (["linear"], "error: --run RUN_DIR is required"),
    (["knn", "--run", "/no/such/run"], "error: no config.yaml in /no/such/run"),
    (["linear", "--pixels", "--epochs", "0"], "error: --epochs must be positive"),
    (["knn", "--untrained"], "error: --run RUN_DIR is required"),
    (["knn", "--pixels", "--untrained"], "error: --pixels and --untrained are two baselines"),
    (["knn", "--pixels", "--teacher"], "error: --teacher reads a trained run's teacher"),
    (["knn", "--pixels", "--features", "patch_mean"], "error: --features patch_mean pools a "
                                                      "backbone's tokens: drop it with --pixels"),
    (["knn", "--pixels", "--data", "tfds:no_such_dataset_xyz"], "error: unknown TFDS data set"),
    (["knn", "--pixels", "--data", "bogus"], "error: unknown data source 'bogus'"),
    (["linear", "--pixels", "--l2", "-1"], "error: --l2 must be auto or a number >= 0"),
    (["linear", "--pixels", "--l2", "much"], "error: --l2 must be auto or a number >= 0"),
    (["linear", "--pixels", "--l2-folds", "1"], "error: --l2-folds must be at least 2"),
    (["linear", "--pixels", "--l2", "auto", "--augment", "digits"],
     "error: --l2 auto chooses λ on cached features"),
])
def test_bad_input_is_a_one_line_error(args, message, capsys):
    status, out, err = cli(capsys, *args)
    assert status == 2
    assert err.startswith(message), err
    assert len(err.strip().splitlines()) == 1


def test_data_without_held_out_split_is_an_error(capsys, tmp_path):
    path = tmp_path / "digits.npz"
    np.savez(path, images=np.zeros((8, 28, 28), np.uint8), labels=np.arange(8))
    status, _, err = cli(capsys, "knn", "--pixels", "--data", f"npz:{path}")
    assert status == 2
    assert "has no labelled held-out split; pass --held-out SOURCE" in err
