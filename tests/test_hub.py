"""KerasHub in and out (the hub extra): a KerasHub backbone built from its class pre-trains
with a method, a ViT with every optimizer; a trained backbone exported as a KerasHub preset
loads with ``Backbone.from_preset`` with the same features, fine-tunes in an
``ImageClassifier`` and pre-trains again through ``model.backbone: keras_hub:DIR``; without the
extra, a folder that is no preset and KerasHub's base class, one line each."""

import json
import os
import re
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
import caco_tf.serving.hub  # noqa: E402  (the presets' writer)


TINY_BYOL = ["method.name=byol", "data.views=asymmetric", "model.projector_hidden=16",
             "model.embedding_dim=8", "method.byol.predictor_hidden=16", "train.batch_size=8",
             "train.epochs=1", "train.lr_warmup_epochs=0"]
HUB_VIT = ["model.backbone=keras_hub:ViTBackbone", "model.pool_grid=1",
           "model.backbone_arguments={patch_size: 8, num_layers: 1, num_heads: 2, "
           "hidden_dim: 8, mlp_dim: 16}"]


def pre_train_two_steps(overrides, size=16, channels=3):
    """A model of ``overrides`` on ``size``×``size``×``channels`` images after two steps on
    random views: (the model, its backbone's trainable weights before them)."""
    config = load_config(None, TINY_BYOL + [f"data.image_size={size}",
                                            f"data.channels={channels}"] + overrides)
    keras.utils.set_random_seed(0)
    model = build.build_model(config, steps_per_epoch=2)
    before = [w.numpy() for w in model.backbone.trainable_weights]
    views = tuple(np.random.default_rng(i).normal(size=(8, size, size, channels))
                  .astype("float32") for i in range(2))
    history = model.fit(tf.data.Dataset.from_tensors(views).repeat(2), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    return model, before


def moved(model, before):
    """The paths of the backbone's weights that training changed."""
    return {w.path for a, w in zip(before, model.backbone.trainable_weights)
            if not np.array_equal(a, w.numpy())}


@pytest.mark.parametrize("method", ["byol", pytest.param("caco", marks=pytest.mark.slow)])
def test_a_keras_hub_backbone_pre_trains(method):
    model, before = pre_train_two_steps(HUB_RESNET + [
        f"method.name={method}", "method.caco.bank_size=16", "method.caco.warmup_epochs=0"])
    assert any("res_net_backbone" in layer.name or "ResNet" in type(layer).__name__
               for layer in model.backbone.layers)
    assert moved(model, before)


# AdamW in the fast tier (its sparse-gradient fix); SGD's and LARS's share its path.
@pytest.mark.parametrize("optimizer", [
    pytest.param(["train.optimizer=sgd"], marks=pytest.mark.slow),
    pytest.param(["train.optimizer=lars"], marks=pytest.mark.slow),
    ["train.optimizer=adamw", "train.clip_gradient_norm=1.0", "train.weight_decay_end=0.4"]],
    ids=["sgd", "lars", "adamw"])
def test_every_optimizer_trains_a_keras_hub_vit(optimizer):
    # Its position embedding is gathered, so that weight's gradient is sparse (IndexedSlices).
    model, before = pre_train_two_steps(HUB_VIT + optimizer)
    assert any(path.endswith("position_embedding/embeddings") for path in moved(model, before))


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
    classifier.compile(optimizer=keras.optimizers.SGD(0.1),  # its outputs are logits
                       loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    start = [w.numpy() for w in classifier.trainable_weights]
    classifier.fit(images, np.array([0, 1, 2, 0]), epochs=1, batch_size=4, verbose=0)
    assert any(not np.array_equal(a, b.numpy())
               for a, b in zip(start, classifier.trainable_weights))


@pytest.fixture(scope="module")
def exported_preset(tmp_path_factory):
    """A tiny run trained one step and exported by ``caco-export --format keras-hub``: (the
    preset directory, the trained model, what the command printed)."""
    import contextlib
    import io

    from caco_tf.cli import export
    from tiny_run import make_run

    run, model = make_run(tmp_path_factory.mktemp("hub") / "run", overrides=TINY_BYOL)
    views = tuple(np.random.default_rng(i).random((8, 28, 28, 1), dtype="float32")
                  for i in range(2))
    model.fit(tf.data.Dataset.from_tensors(views), epochs=1, verbose=0)
    model.save_weights(os.path.join(run, "checkpoints", "last.weights.h5"))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert export.main(["--run", run, "--format", "keras-hub"]) == 0
    return os.path.join(run, "keras_hub_preset"), model, printed.getvalue()


def test_the_export_command_writes_a_keras_hub_preset(exported_preset):
    directory, model, printed = exported_preset
    assert f"keras-hub: {os.path.abspath(directory)}" in printed
    with open(os.path.join(directory, "preprocessing.json")) as handle:
        assert json.load(handle)["image_size"] == 28
    loaded = keras_hub.models.Backbone.from_preset(directory)
    images = np.random.default_rng(0).normal(size=(2, 28, 28, 1)).astype("float32")
    np.testing.assert_allclose(np.asarray(loaded(images)).reshape(2, -1),
                               np.asarray(model.backbone(images)), atol=1e-5)


def test_a_preset_the_export_command_wrote_pre_trains_again(exported_preset):
    directory, trained, _ = exported_preset
    images = np.random.default_rng(0).random((2, 28, 28, 1), dtype="float32")
    loaded = backbones.build_backbone(f"keras_hub:{directory}", (28, 28, 1))
    np.testing.assert_allclose(np.asarray(loaded(images)), np.asarray(trained.backbone(images)),
                               atol=1e-5)  # the 1x1 map, pooled: the trained features
    model, before = pre_train_two_steps([f"model.backbone=keras_hub:{directory}",
                                         "model.pool_grid=1"], size=28, channels=1)
    assert moved(model, before)


@pytest.mark.slow
def test_a_fresh_process_loads_the_preset(exported_preset):
    # As caco-train's: a process that never imported caco_tf.serving.hub, the preset's writer.
    import launch

    script = ("import sys; from caco_tf.nets import backbones; "
              "print(backbones.build_backbone(sys.argv[1], (28, 28, 1)).output_shape)")
    result = launch.run([sys.executable, "-c", script, f"keras_hub:{exported_preset[0]}"],
                        env=dict(os.environ, PYTHONPATH=launch.ROOT, TF_CPP_MIN_LOG_LEVEL="3"),
                        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    features = exported_preset[1].backbone.output_shape[-1]
    assert result.stdout.strip().splitlines()[-1] == f"(None, {features})"


@pytest.mark.parametrize("files", [
    {}, {"notes.txt": "not a preset", "model.weights.h5": "no weights either"},
    {"config.json": '{"name": "another tool\'s settings", "version": 3}'},
    {"config.json": "{not json"},
    {"config.json": json.dumps(keras.saving.serialize_keras_object(keras.layers.Dense(3)))}],
    ids=["empty", "other files", "another config.json", "not json", "a layer's config"])
def test_a_folder_that_is_no_preset_is_one_line(files, tmp_path):
    for name, content in files.items():
        (tmp_path / name).write_text(content)
    folder = str(tmp_path)
    with pytest.raises(ConfigError, match=f"{re.escape(folder)}.* is not a KerasHub backbone "
                                          f"preset.*a preset directory holds config.json") \
            as error:
        backbones.build_backbone(f"keras_hub:{folder}", (16, 16, 3))
    assert "\n" not in str(error.value)


def test_a_preset_of_other_images_is_one_line(exported_preset):
    directory = exported_preset[0]
    with pytest.raises(ConfigError, match=rf"{re.escape(directory)} takes images of 28x28x1, "
                                          rf"not 16x16x3: set data.image_size and data.channels"):
        backbones.build_backbone(f"keras_hub:{directory}", (16, 16, 3))


def test_a_preset_of_no_image_backbone_is_one_line(tmp_path):
    keras_hub.models.BertBackbone(vocabulary_size=10, num_layers=1, num_heads=1, hidden_dim=4,
                                  intermediate_dim=8, max_sequence_length=4).save_to_preset(
        str(tmp_path))
    with pytest.raises(ConfigError, match=rf"keras_hub:{re.escape(str(tmp_path))} takes no "
                                          rf"images \(its inputs: .*\); an image backbone"):
        backbones.build_backbone(f"keras_hub:{tmp_path}", (16, 16, 3))


@pytest.mark.parametrize("base", ["Backbone", "FeaturePyramidBackbone"])
def test_keras_hubs_base_classes_are_one_line(base):
    with pytest.raises(ConfigError, match=rf"model.backbone keras_hub:{base} is KerasHub's "
                                          rf"base class.*e.g. keras_hub:ViTBackbone") as error:
        backbones.build_backbone(f"keras_hub:{base}", (16, 16, 3))
    assert "backbone_arguments" not in str(error.value)
