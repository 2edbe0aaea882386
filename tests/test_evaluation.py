"""Weighted kNN against brute-force NumPy, feature extraction, the kNN monitor callback and the
online linear probe (which must never change the encoder)."""

import dataclasses
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from caco_tf.run_settings import RunSettings
from caco_tf.evaluation import knn as evaluation
from caco_tf.evaluation.monitor import KNNMonitor, knn_monitor
from caco_tf.nets import backbones
from caco_tf.training import callbacks
from caco_tf.nets.layers import BatchNormalization
from caco_tf.methods.caco import CaCo


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def numpy_knn(train, labels, test, k, temperature, classes):
    predictions = []
    for query in test:
        similarity = train @ query
        top = np.argsort(-similarity)[:k]
        votes = np.zeros(classes)
        for index in top:
            votes[labels[index]] += np.exp(similarity[index] / temperature)
        predictions.append(np.argmax(votes))
    return np.array(predictions)


def test_knn_matches_numpy():
    rng = np.random.default_rng(0)
    train, test = _unit(rng.normal(size=(200, 16))), _unit(rng.normal(size=(50, 16)))
    labels = rng.integers(0, 4, size=200)
    for k, temperature in [(1, 0.07), (5, 0.07), (20, 0.5)]:
        got = evaluation.knn_predict(train, labels, test, k, temperature, num_classes=4, chunk=7)
        np.testing.assert_array_equal(got, numpy_knn(train, labels, test, k, temperature, 4))


def test_weighting_can_overrule_majority():
    train = _unit(np.array([[1.0, 0.0], [0.0, 1.0], [0.1, 1.0]]))
    labels = np.array([0, 1, 1])
    query = _unit(np.array([[1.0, 0.05]]))
    # Two far neighbours of class 1 against one very close neighbour of class 0.
    assert evaluation.knn_predict(train, labels, query, k=3, temperature=0.07)[0] == 0
    assert evaluation.knn_predict(train, labels, query, k=3, temperature=100.0)[0] == 1


def test_knn_accuracy_on_separable_clusters():
    rng = np.random.default_rng(1)
    centres = _unit(rng.normal(size=(3, 8)))
    labels = np.repeat(np.arange(3), 30)
    train = _unit(centres[labels] + 0.05 * rng.normal(size=(90, 8)))
    test = _unit(centres[labels] + 0.05 * rng.normal(size=(90, 8)))
    assert evaluation.knn_accuracy(train, labels, test, labels, k=5) == 1.0
    assert evaluation.knn_accuracy(train, labels, test, (labels + 1) % 3, k=5) == 0.0


def test_top5_and_votes_match_numpy():
    rng = np.random.default_rng(2)
    train, test = _unit(rng.normal(size=(100, 8))), _unit(rng.normal(size=(30, 8)))
    labels, test_labels = rng.integers(0, 7, size=100), rng.integers(0, 7, size=30)
    votes = evaluation.knn_votes(train, labels, test, k=10, temperature=0.2, num_classes=7)
    for row, query in zip(votes, test):
        similarity = train @ query
        top = np.argsort(-similarity)[:10]
        expected = np.zeros(7)
        np.add.at(expected, labels[top], np.exp(similarity[top] / 0.2))
        np.testing.assert_allclose(row, expected, rtol=1e-4)
    ranked = np.argsort(-votes, axis=1, kind="stable")
    for k in (1, 5):
        expected = np.mean([t in r[:k] for t, r in zip(test_labels, ranked)])
        assert evaluation.top_k_accuracy(votes, test_labels, k) == pytest.approx(expected)
    assert evaluation.top_k_accuracy(votes, test_labels, 7) == 1.0


def test_extract_features_normalizes_only_when_asked():
    backbone = keras.Sequential([keras.Input((3,)), keras.layers.Dense(
        2, kernel_initializer="ones", use_bias=False)])
    x = np.array([[1.0, 0.0, 0.0], [1.0, 2.0, 0.0]], np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((x, np.array([4, 5]))).batch(1)
    raw, labels = evaluation.extract_features(backbone, dataset, normalize=False)
    np.testing.assert_allclose(raw, [[1.0, 1.0], [3.0, 3.0]])
    np.testing.assert_array_equal(labels, [4, 5])
    unit = evaluation.extract_features(backbone, dataset.map(lambda a, b: a))
    np.testing.assert_allclose(unit, np.full((2, 2), 2 ** -0.5), rtol=1e-6)


# ---------------------------------------------------------------------------- KNNMonitor
def test_knn_monitor_logs_every_n_epochs_and_the_last(tmp_path):
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(3)
    backbone = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4)], name="backbone")
    model = keras.Sequential([backbone, keras.layers.Dense(2)])
    model.backbone = backbone  # the attribute KNNMonitor reads, as on CaCo
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    train_x, test_x = rng.normal(size=(40, 6)), rng.normal(size=(20, 6))
    train_y, test_y = rng.integers(0, 3, 40), rng.integers(0, 3, 20)

    def batches(x, y):
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(16)

    monitor = KNNMonitor(batches(train_x, train_y), batches(test_x, test_y), every=2,
                         k=3, temperature=0.1)
    path = str(tmp_path / "history.json")
    history = model.fit(rng.normal(size=(32, 6)), rng.normal(size=(32, 2)), epochs=3, verbose=0,
                        callbacks=[monitor, callbacks.HistoryJSON(path)])
    rows = json.load(open(path))
    assert ["knn_top1" in row for row in rows] == [False, True, True]  # epoch 2, last epoch
    assert len(history.history["knn_top1"]) == 2
    # The last measurement is the kNN of the final backbone, computed here independently.
    train_f, test_f = (_unit(backbone(x).numpy()) for x in (train_x, test_x))
    expected = 100 * np.mean(numpy_knn(train_f, train_y, test_f, 3, 0.1, 3) == test_y)
    assert rows[2]["knn_top1"] == pytest.approx(expected)


def test_knn_monitor_reads_the_runs_features_of_a_vit():
    from caco_tf.evaluation.features import pooled_backbone
    from caco_tf.nets import tokens, vit

    keras.utils.set_random_seed(0)
    backbone = vit.build_vit("vit_micro_patch4", (8, 8, 1))
    rng = np.random.default_rng(4)
    train_x, test_x = (rng.random((n, 8, 8, 1), dtype=np.float32) for n in (12, 6))
    train_y, test_y = rng.integers(0, 3, 12), rng.integers(0, 3, 6)
    monitor = KNNMonitor(*(tf.data.Dataset.from_tensor_slices(pair).batch(4) for pair in
                           ((train_x, train_y), (test_x, test_y))),
                         k=3, temperature=0.1, backbone=backbone, features="patch_mean")
    assert pooled_backbone(backbone, "patch_mean").output_shape == (None, 96)
    train_f, test_f = (_unit(tokens.encode(backbone, x).patches.numpy().mean(axis=(1, 2)))
                       for x in (train_x, test_x))  # the mean patch token, by hand
    expected = 100 * np.mean(numpy_knn(train_f, train_y, test_f, 3, 0.1, 3) == test_y)
    assert monitor.measure() == pytest.approx(expected)
    train_c, test_c = (_unit(backbone(x).numpy()) for x in (train_x, test_x))  # class token
    assert 100 * np.mean(numpy_knn(train_c, train_y, test_c, 3, 0.1, 3) == test_y) != expected


# ---------------------------------------------------------------------------- online probe
SIZE = 10


def tiny_caco(probe_classes=None, warmup_steps=0, learning_rate=0.1, batchnorm=True):
    keras.utils.set_random_seed(0)
    backbone = keras.Sequential([
        keras.Input((SIZE, SIZE, 1)),
        keras.layers.Conv2D(6, 3, strides=2, use_bias=False)]
        + ([BatchNormalization()] if batchnorm else [])
        + [keras.layers.ReLU(), keras.layers.GlobalAveragePooling2D()], name="backbone")
    projector = backbones.build_projector(6, hidden_dim=16, output_dim=8)
    model = CaCo(backbone, projector, bank_size=32, temperature=0.1, bank_temperature=0.2,
                 bank_learning_rate=0.5, key_momentum=0.9, warmup_steps=warmup_steps,
                 online_probe_classes=probe_classes)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate, momentum=0.9))
    return model


def labelled_batches(steps, batch=16, seed=0, labels=True):
    rng = np.random.default_rng(seed)
    view1 = rng.normal(size=(steps * batch, SIZE, SIZE, 1)).astype("float32")
    view2 = rng.normal(size=(steps * batch, SIZE, SIZE, 1)).astype("float32")
    y = rng.integers(0, 3, steps * batch)
    elements = ((view1, view2), y) if labels else (view1, view2)
    return tf.data.Dataset.from_tensor_slices(elements).batch(batch)


def encoder_state(model):
    return [w.numpy() for w in model.query_encoder.weights + model.key_encoder.weights
            + [model.memory_bank.rows, model.memory_bank.velocity, model.memory_bank.pointer]]


@pytest.mark.slow
def test_online_probe_never_changes_the_encoder():
    # Two warm-up steps then two CaCo steps, on labelled batches, with and without the probe.
    plain, probed = tiny_caco(None, warmup_steps=2), tiny_caco(3, warmup_steps=2)
    for before, after in zip(encoder_state(plain), encoder_state(probed)):
        np.testing.assert_array_equal(before, after)
    probe_before = [w.numpy() for w in probed.online_probe.trainable_weights]
    history_plain = plain.fit(labelled_batches(4), epochs=1, verbose=0)
    history_probed = probed.fit(labelled_batches(4), epochs=1, verbose=0)
    for without, with_probe in zip(encoder_state(plain), encoder_state(probed)):
        np.testing.assert_array_equal(without, with_probe)
    assert history_plain.history["loss"] == history_probed.history["loss"]
    assert "probe_top1" in history_probed.history and "probe_top1" not in history_plain.history
    for before, after in zip(probe_before, probed.online_probe.trainable_weights):
        assert np.abs(after.numpy() - before).max() > 1e-4  # the probe itself did train


def test_online_probe_trains_only_on_labelled_batches():
    model = tiny_caco(3)
    before = [w.numpy() for w in model.online_probe.weights]
    model.fit(labelled_batches(2, labels=False), epochs=1, verbose=0)
    for old, new in zip(before, model.online_probe.weights):
        np.testing.assert_array_equal(old, new.numpy())


@pytest.mark.slow
def test_online_probe_learns_a_linearly_decodable_label():
    # A fixed encoder (no step, no BatchNorm statistics to move): only the probe learns.
    model = tiny_caco(3, learning_rate=0.0, batchnorm=False)
    rng = np.random.default_rng(1)
    images = rng.normal(size=(64, SIZE, SIZE, 1)).astype("float32")
    features = model.backbone(images, training=False).numpy()
    labels = np.argmax(features[:, :3] - features[:, :3].mean(0), axis=1)
    dataset = tf.data.Dataset.from_tensor_slices(((images, images), labels)).batch(16)
    model.fit(dataset.repeat(100), epochs=1, verbose=0)
    result = model.evaluate(dataset, verbose=0, return_dict=True)  # test_step: no update
    assert result["probe_top1"] > 0.9


@pytest.fixture(scope="module")
def monitored_run(tmp_path_factory):
    """One tiny pre-training run (48 mock digits, batch 16, 3 epochs of which 1 of warm-up)
    with the kNN monitor every 2 epochs, precise BatchNorm over 24 images and the online probe:
    (its config, its run folder, its progress output)."""
    import contextlib
    import io

    import tensorflow_datasets as tfds

    from caco_tf import pretrain
    from caco_tf.config import load_config
    from tiny_run import OVERRIDES

    config = load_config(None, OVERRIDES + [
        "train.epochs=3", "evaluation.knn_monitor_every=2", "evaluation.knn_monitor_k=4",
        "train.precise_bn_images=24", "evaluation.online_probe=true"])
    run_dir = str(tmp_path_factory.mktemp("monitored") / "run")
    output = io.StringIO()
    with tfds.testing.mock_data(num_examples=48), contextlib.redirect_stdout(output):
        pretrain.run(config, run_dir, verbose=1)
    return config, run_dir, output.getvalue()


@pytest.mark.slow
def test_pretraining_logs_the_knn_monitor(monitored_run):
    import tensorflow_datasets as tfds

    from caco_tf import build

    config, run_dir, _ = monitored_run
    with tfds.testing.mock_data(num_examples=48):
        settings = RunSettings.of(config)
        monitor = knn_monitor(settings, build.run_views(config), *build.load_data(settings.data))
    assert (monitor.every, monitor.k, monitor.temperature) == (2, 4, 0.07)
    rows = json.load(open(os.path.join(run_dir, "history.json")))
    assert ["knn_top1" in row for row in rows] == [False, True, True]
    assert all(0.0 <= row["knn_top1"] <= 100.0 and row["knn_top1_seconds"] > 0
               for row in rows[1:])
    # The compute a learning curve is read against: 48 images at batch 16, 3 steps an epoch.
    assert [(row["steps"], row["images_seen"]) for row in rows] == [(3, 48), (6, 96), (9, 144)]
    assert all(row["train_seconds"] == pytest.approx(row["step_ms"] * 3 / 1000) for row in rows)
    off = dataclasses.replace(settings, evaluation=dataclasses.replace(
        settings.evaluation, knn_monitor_every=0))
    assert knn_monitor(off, None, None, None) is None


@pytest.mark.slow
def test_pretraining_saves_precise_batchnorm_statistics(monitored_run):
    import tensorflow_datasets as tfds

    from caco_tf import build
    from caco_tf.config import ConfigError, load_config
    from caco_tf.nets.layers import recalibrate_batchnorm

    _, run_dir, _ = monitored_run
    with tfds.testing.mock_data(num_examples=48):
        run = build.load_run(run_dir)
        train, _ = build.load_data(RunSettings.of(run.config).data)
        every_other = build.eval_dataset(RunSettings.of(run.config), run.views, train, every=2)
        assert sum(len(images) for images, _ in every_other) == 24
        norms = [layer for layer in run.model.backbone.layers
                 if isinstance(layer, keras.layers.BatchNormalization)]
        saved = [layer.moving_variance.numpy().copy() for layer in norms]
        # The checkpoint holds the re-estimated statistics: re-estimating again changes nothing
        # (training-mode forwards never read the moving statistics).
        assert recalibrate_batchnorm(run.model.backbone, every_other) == 24
    for layer, variance in zip(norms, saved):
        np.testing.assert_allclose(layer.moving_variance.numpy(), variance, rtol=1e-4)
    with pytest.raises(ConfigError,
                       match="train.precise_bn_images must be an integer >= 0, got -1"):
        load_config(None, ["train.precise_bn_images=-1"])


def test_monitor_settings_are_checked():
    from caco_tf.config import ConfigError, load_config

    with pytest.raises(ConfigError,
                       match="evaluation.knn_monitor_every must be an integer >= 0, got -1"):
        load_config(None, ["evaluation.knn_monitor_every=-1"])
    with pytest.raises(ConfigError,
                       match="evaluation.knn_monitor_k must be an integer >= 1, got 0"):
        load_config(None, ["evaluation.knn_monitor_k=0"])


@pytest.mark.slow
def test_pretraining_with_the_online_probe(monitored_run):
    import tensorflow_datasets as tfds

    from caco_tf import build, pretrain

    config, run_dir, output = monitored_run
    assert "probe_top1: " in output  # the progress bar shows it
    rows = json.load(open(os.path.join(run_dir, "history.json")))
    assert len(rows) == 3 and all(0.0 <= row["probe_top1"] <= 1.0 for row in rows)
    with tfds.testing.mock_data(num_examples=48):
        train, _ = build.load_data(RunSettings.of(config).data)
        assert build.online_probe_classes(RunSettings.of(config), train) == 10  # tfds:mnist's ClassLabel
        pretrain.run(config, run_dir, verbose=0)  # resumes from the backup: nothing left to do
    assert json.load(open(os.path.join(run_dir, "history.json"))) == rows

    # The run folder rebuilds without the probe (evaluate, export), its checkpoint loading
    # into it: the same encoder and bank as a rebuild with the probe, and trained ones.
    run = build.load_run(run_dir)
    assert run.model.online_probe is None
    probed = build.build_model(config, 1, num_classes=10)
    fresh = encoder_state(probed)
    probed.load_weights(os.path.join(run_dir, "checkpoints", "last.weights.h5"))
    for rebuilt, with_probe in zip(encoder_state(run.model), encoder_state(probed)):
        np.testing.assert_array_equal(rebuilt, with_probe)
    assert any(np.abs(a - b).max() > 0 for a, b in zip(encoder_state(probed), fresh))
    # The labels did reach the probe: one probe step per batch (48 images, batch 16, 3 epochs,
    # the warm-up's included), and its zero-initialized bias moved.
    assert int(probed.probe_optimizer.iterations.numpy()) == 9
    assert np.abs(probed.online_probe.layers[-1].bias.numpy()).max() > 0


def test_the_online_probe_needs_a_labelled_training_source(tmp_path):
    from caco_tf import build, pretrain
    from caco_tf.config import ConfigError, load_config
    from tiny_run import OVERRIDES

    images = np.random.default_rng(0).integers(0, 256, (48, 28, 28, 1), dtype=np.uint8)
    np.savez(tmp_path / "unlabelled.npz", images=images)
    config = load_config(None, OVERRIDES + [f"data.source=npz:{tmp_path / 'unlabelled.npz'}",
                                            "evaluation.online_probe=true"])
    with pytest.raises(ConfigError, match="online_probe needs a labelled training source") \
            as error:
        pretrain.run(config, str(tmp_path / "run"), verbose=0)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()  # refused before anything is written
    config["evaluation"]["online_probe"] = False
    settings = RunSettings.of(config)
    assert build.online_probe_classes(settings, build.load_data(settings.data)[0]) is None
