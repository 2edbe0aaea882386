"""KerasHub in and out (the hub extra): a KerasHub backbone built from its class pre-trains
with a method; a trained backbone exported as a KerasHub preset loads with
``Backbone.from_preset`` with the same features and fine-tunes in an ``ImageClassifier``;
without the extra, one line says how to get it."""

import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from caco_tf import build
from caco_tf.config import ConfigError, load_config
from caco_tf.nets import backbones, hub, vit

HUB_RESNET = ["model.backbone=keras_hub:ResNetBackbone", "model.pool_grid=1",
              "model.backbone_arguments={input_conv_filters: [64], input_conv_kernel_sizes: [3], "
              "stackwise_num_filters: [64, 64], stackwise_num_blocks: [1, 1], "
              "stackwise_num_strides: [1, 2], block_type: basic_block}"]


def test_without_the_extra_a_hub_backbone_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "keras_hub", None)  # import keras_hub fails
    with pytest.raises(ConfigError, match=r'KerasHub is not installed .*: pip install '
                                          r'"caco-tf\[hub\]"'):
        backbones.build_backbone("keras_hub:ResNetBackbone", (32, 32, 3))


def test_hub_settings_out_of_place_are_one_line():
    with pytest.raises(ConfigError, match="model.backbone_arguments apply to a keras_hub"):
        load_config(None, ["model.backbone_arguments={a: 1}"])
    with pytest.raises(ConfigError, match="model.backbone must be one of .* or keras_hub:"):
        load_config(None, ["model.backbone=resnet1000"])


keras_hub = pytest.importorskip("keras_hub", reason="the hub extra is absent: pip install -e "
                                                    "'.[hub]'")
import caco_tf.serving.hub  # noqa: E402  (registers the preset's backbone class)


@pytest.mark.parametrize("method", ["byol", pytest.param("caco", marks=pytest.mark.slow)])
def test_a_keras_hub_backbone_pre_trains(method):
    config = load_config(None, HUB_RESNET + [
        f"method.name={method}", "data.views=asymmetric", "data.image_size=16",
        "data.channels=3", "model.projector_hidden=16", "model.embedding_dim=8",
        "method.caco.bank_size=16", "method.caco.warmup_epochs=0", "train.batch_size=8",
        "train.epochs=1", "train.lr_warmup_epochs=0", "method.byol.predictor_hidden=16"])
    keras.utils.set_random_seed(0)
    model = build.build_model(config, steps_per_epoch=2)
    assert any("res_net_backbone" in layer.name or "ResNet" in type(layer).__name__
               for layer in model.backbone.layers)
    before = [w.numpy() for w in model.backbone.trainable_weights]
    views = tuple(np.random.default_rng(i).normal(size=(8, 16, 16, 3)).astype("float32")
                  for i in range(2))
    history = model.fit(tf.data.Dataset.from_tensors(views).repeat(2), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert any(not np.array_equal(a, b.numpy())
               for a, b in zip(before, model.backbone.trainable_weights))


@pytest.mark.parametrize("backbone", [
    lambda: backbones.build_backbone("small_convnet", (16, 16, 3), widths=[4, 4, 8, 8]),
    lambda: vit.build_vit(vit.ViTShape(4, 8, 2, 2), (16, 16, 3), drop_path=0.1)],
    ids=["small_convnet", "vit"])
def test_a_preset_loads_with_the_same_features_and_fine_tunes(backbone, tmp_path):
    keras.utils.set_random_seed(0)
    trained = backbone()
    directory = caco_tf.serving.hub.export_preset(
        trained, str(tmp_path / "preset"), {"image_size": 16, "channels": 3,
                                            "mean": (0.5,) * 3, "std": (0.25,) * 3})
    loaded = keras_hub.models.Backbone.from_preset(directory)
    images = np.random.default_rng(0).normal(size=(4, 16, 16, 3)).astype("float32")
    expected = np.asarray(trained(images))
    got = np.asarray(loaded(images)).reshape(4, -1)
    assert np.abs(got - expected).max() <= 1e-5 * max(1.0, np.abs(expected).max())
    classifier = keras_hub.models.ImageClassifier(backbone=loaded, num_classes=3)
    np.testing.assert_allclose(np.asarray(classifier.pooler(loaded(images))), expected,
                               atol=1e-5)  # the 1x1 map's average: the features
    classifier.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    start = [w.numpy() for w in classifier.trainable_weights]
    classifier.fit(images, np.array([0, 1, 2, 0]), epochs=1, batch_size=4, verbose=0)
    assert any(not np.array_equal(a, b.numpy())
               for a, b in zip(start, classifier.trainable_weights))


def test_the_export_command_writes_a_keras_hub_preset(tmp_path, capsys):
    import json
    import os

    from caco_tf.cli import export
    from tiny_run import make_run

    run, model = make_run(tmp_path / "run")
    assert export.main(["--run", run, "--format", "keras-hub"]) == 0
    directory = os.path.join(run, "keras_hub_preset")
    assert f"keras-hub: {os.path.abspath(directory)}" in capsys.readouterr().out
    with open(os.path.join(directory, "preprocessing.json")) as handle:
        assert json.load(handle)["image_size"] == 28
    loaded = keras_hub.models.Backbone.from_preset(directory)
    images = np.random.default_rng(0).normal(size=(2, 28, 28, 1)).astype("float32")
    np.testing.assert_allclose(np.asarray(loaded(images)).reshape(2, -1),
                               np.asarray(model.backbone(images)), atol=1e-5)
