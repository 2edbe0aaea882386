"""KerasHub's DINOV2Backbone both ways (the hub extra): a trained ViT exported by
``caco-export --format keras-hub`` is a real ``DINOV2Backbone`` preset that a process which
never imports caco_tf loads with ``Backbone.from_preset``, its output's first token the ViT's
features to 1e-5; a ``DINOV2Backbone`` preset (random weights, ``save_to_preset``) is the
starting point of a run (``model.backbone: keras_hub:DIR``) as caco_tf's own ViT, the same
features to 1e-5, and pre-trains; what does not fit is one line."""

import contextlib
import io
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from caco_tf import build
from caco_tf.config import ConfigError, load_config
from caco_tf.nets import backbones, vit

keras_hub = pytest.importorskip("keras_hub", reason="the hub extra is absent: pip install -e "
                                                    "'.[hub]'")

TINY = ["method.name=byol", "data.views=asymmetric", "model.projector_hidden=16",
        "model.embedding_dim=8", "method.byol.predictor_hidden=16", "train.batch_size=8",
        "train.epochs=1", "train.lr_warmup_epochs=0", "model.pool_grid=1"]
MICRO = ["model.backbone=vit_micro_patch4"]
DINOV2_LAYOUT = MICRO + ["model.layer_scale=0.5", "model.registers=2", "model.mask_token=true"]
# sine-cosine positions, no LayerScale: DINOV2Backbone holds them too at the run's size
MOCO_V3_LAYOUT = MICRO + ["model.position_embedding=sincos"]
# The fresh process: KerasHub only, the preset's features (first token) into a .npy file.
LOAD_WITHOUT_CACO_TF = (
    "import sys, numpy as np, keras_hub; "
    "backbone = keras_hub.models.Backbone.from_preset(sys.argv[1]); "
    "images = np.load(sys.argv[2]); "
    "np.save(sys.argv[3], np.asarray(backbone({'images': images}))[:, 0]); "
    "print(type(backbone).__name__, 'caco_tf' in sys.modules)")


def _randomize(variables, seed=0):
    """Every variable moved off its initialization (LayerScale's, the registers' included)."""
    rng = np.random.default_rng(seed)
    for variable in variables:
        if variable.dtype.startswith("float"):
            variable.assign(np.asarray(variable) + rng.normal(size=variable.shape) * 0.1)


def _relative(got, expected):
    return float(np.abs(got - expected).max() / np.abs(expected).max())


def _exported_run(directory, overrides, *export_arguments):
    """A run of ``overrides`` (random weights) exported by caco-export --format keras-hub: (the
    export's exit status, the preset directory, the model, what the command printed)."""
    from caco_tf.cli import export
    from tiny_run import make_run

    run, model = make_run(directory, overrides=TINY + overrides)
    _randomize(model.backbone.weights)
    model.save_weights(os.path.join(run, "checkpoints", "last.weights.h5"))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = export.main(["--run", run, "--format", "keras-hub", *export_arguments])
    return status, os.path.join(run, "keras_hub_preset"), model, printed.getvalue()


def _images(size=28, channels=1, batch=3, seed=0):
    return np.random.default_rng(seed).random((batch, size, size, channels), dtype="float32")


@pytest.mark.slow  # a run built and exported, and a fresh process importing TensorFlow: ~25 s
@pytest.mark.parametrize("layout", [DINOV2_LAYOUT, MOCO_V3_LAYOUT],
                         ids=["layer scale, registers, mask token", "sine-cosine positions"])
def test_a_vit_exports_as_a_dinov2_backbone_that_loads_without_caco_tf(layout, tmp_path):
    status, preset, model, printed = _exported_run(tmp_path / "run", layout)
    assert status == 0 and f"keras-hub: {os.path.abspath(preset)}" in printed
    images = _images()
    np.save(tmp_path / "images.npy", images)
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", LOAD_WITHOUT_CACO_TF, preset, str(tmp_path / "images.npy"),
         str(tmp_path / "features.npy")], cwd=str(tmp_path), capture_output=True, text=True,
        timeout=300, env=dict(environment, TF_CPP_MIN_LOG_LEVEL="3"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "DINOV2Backbone False"
    expected = np.asarray(model.backbone(images))
    assert _relative(np.load(tmp_path / "features.npy"), expected) <= 1e-5


def test_the_exported_dinov2_preset_is_the_vit_again_as_a_starting_point(tmp_path):
    status, preset, model, _ = _exported_run(tmp_path / "run", DINOV2_LAYOUT)
    assert status == 0
    again = backbones.build_backbone(f"keras_hub:{preset}", (28, 28, 1), image_size=28)
    assert vit.vit_blocks(again)[1].registers == 2  # caco_tf's ViT, not a wrapped KerasHub one
    images = _images()
    assert _relative(np.asarray(again(images)), np.asarray(model.backbone(images))) <= 1e-5


def test_a_convnet_asked_for_a_dinov2_preset_is_one_line(tmp_path, capsys):
    status, preset, _, _ = _exported_run(tmp_path / "run", [], "--keras-hub-class", "dinov2")
    assert status == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and error.startswith("error: a DINOV2Backbone preset holds a "
                                                       "caco_tf ViT"), error
    assert "--keras-hub-class caco" in error and not os.listdir(os.path.dirname(preset)).count(
        "keras_hub_preset")


def _dinov2_preset(directory, table_side=28, antialias=False, registers=2):
    """A KerasHub DINOV2Backbone on 28 px gray images, random weights, saved as a preset."""
    keras.utils.set_random_seed(1)
    theirs = keras_hub.models.DINOV2Backbone(
        patch_size=4, num_layers=2, hidden_dim=16, num_heads=2, intermediate_dim=64,
        layer_scale_init_value=1e-5, num_register_tokens=registers, image_shape=(28, 28, 1),
        position_embedding_shape=(table_side, table_side, 1),
        antialias_in_interpolation=antialias)
    embeddings = theirs.embeddings
    _randomize([w for w in theirs.weights if w is not embeddings.interpolated_position_embeddings])
    embeddings.interpolated_position_embeddings.assign(embeddings._interpolate_position_embeddings(
        embeddings.position_embeddings, patch_size=4, source_shape=(table_side, table_side),
        target_shape=(28, 28), antialias=antialias))
    theirs.save_to_preset(str(directory))
    return str(directory)


@pytest.mark.parametrize("table_side, antialias", [(28, False), (40, True)],
                         ids=["its table at its size", "its table resized by KerasHub"])
def test_a_dinov2_backbone_preset_becomes_the_vit_a_run_starts_from(table_side, antialias,
                                                                    tmp_path):
    preset = _dinov2_preset(tmp_path / "preset", table_side, antialias)
    config = load_config(None, TINY + [f"model.backbone=keras_hub:{preset}", "data.image_size=28",
                                       "data.channels=1", "model.drop_path=0.1"])
    model = build.build_model(config, steps_per_epoch=2)
    _, tokens, blocks, _ = vit.vit_blocks(model.backbone)
    assert (tokens.registers, tokens.has_mask_token, blocks[0].layer_scale > 0,
            blocks[-1].drop_path) == (2, True, True, 0.1)
    images = _images()
    expected = np.asarray(keras_hub.models.Backbone.from_preset(preset)({"images": images}))[:, 0]
    assert _relative(np.asarray(model.backbone(images)), expected) <= 1e-5
    teacher = [layer for layer in model.key_encoder.layers if isinstance(layer, keras.Model)][0]
    assert _relative(np.asarray(teacher(images)), expected) <= 1e-5  # the teacher starts there too

    before = [w.numpy() for w in model.backbone.trainable_weights]
    views = tuple(_images(batch=8, seed=i) for i in range(2))
    model.fit(tf.data.Dataset.from_tensors(views).repeat(2), epochs=1, verbose=0)
    moved = {w.path for a, w in zip(before, model.backbone.trainable_weights)
             if not np.array_equal(a, w.numpy())}
    assert {"tokens/register_tokens", "blocks_1/ls2/gamma", "tokens/pos_embed"} <= moved


def test_a_dinov2_preset_takes_other_crop_sizes(tmp_path):
    preset = _dinov2_preset(tmp_path / "preset")
    backbone = backbones.build_backbone(f"keras_hub:{preset}", (None, None, 1))
    assert tuple(backbone(_images(size=16)).shape) == (3, 16)  # multi-crop's local crops


@pytest.mark.parametrize("overrides, message", [
    (["model.registers=4"], r"model.registers is the DINOV2Backbone preset's own"),
    (["model.position_embedding=sincos"], r"model.position_embedding applies to the vit_\*"),
    (["data.channels=3"], r"takes images of 1 channels, not 3: set data.channels")])
def test_dinov2_preset_settings_out_of_place_are_one_line(overrides, message, tmp_path):
    preset = _dinov2_preset(tmp_path / "preset")
    with pytest.raises(ConfigError, match=message) as error:
        config = load_config(None, TINY + [f"model.backbone=keras_hub:{preset}",
                                           "data.image_size=28", "data.channels=1", *overrides])
        build.build_model(config, steps_per_epoch=1)
    assert "\n" not in str(error.value)
    assert re.search(message, str(error.value))


def test_a_run_started_from_a_dinov2_preset_draws_its_attention_maps(tmp_path):
    from PIL import Image

    from caco_tf.evaluation.attention import attention_figures
    from tiny_run import make_run

    preset = _dinov2_preset(tmp_path / "preset")
    run, _ = make_run(tmp_path / "run", overrides=TINY + [f"model.backbone=keras_hub:{preset}",
                                                          "data.image_size=28"])
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 36, 3), np.uint8)).save(
        tmp_path / "image.png")
    written = attention_figures(run, str(tmp_path / "image.png"))
    assert sorted(os.path.basename(path) for path in written) == ["attention_sheet.png",
                                                                  "image_attention.png"]


def test_a_vit_asked_for_caco_tfs_own_preset_class_gets_it(tmp_path):
    status, preset, model, _ = _exported_run(tmp_path / "run", MICRO,
                                             "--keras-hub-class", "caco")
    assert status == 0
    loaded = keras_hub.models.Backbone.from_preset(preset)
    assert type(loaded).__name__ == "CacoBackbone"
    images = _images()
    np.testing.assert_allclose(np.asarray(loaded(images)).reshape(3, -1),
                               np.asarray(model.backbone(images)), atol=1e-5)


def test_a_dinov2_preset_whose_features_differ_is_not_written(tmp_path, capsys, monkeypatch):
    from caco_tf.nets import hub

    mapped = hub.dinov2_from_vit

    def off_by_a_bias(backbone, image_size, channels):  # a mapping that missed a weight
        theirs = mapped(backbone, image_size, channels)
        theirs.layernorm.beta.assign(np.asarray(theirs.layernorm.beta) + 1e-3)
        return theirs
    monkeypatch.setattr(hub, "dinov2_from_vit", off_by_a_bias)
    status, preset, _, _ = _exported_run(tmp_path / "run", MICRO)
    assert status != 0 and not os.path.exists(preset)
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and re.search(
        r"error: the DINOV2Backbone's features differ from the ViT's by \S+ \(relative\), above "
        r"1e-05: --keras-hub-class caco", error), error


def test_a_tokens_method_takes_a_dinov2_preset_and_refuses_another_hub_backbone(tmp_path):
    from types import SimpleNamespace

    from caco_tf.methods import METHODS

    preset = _dinov2_preset(tmp_path / "preset")
    plan = SimpleNamespace(method=METHODS["mae"])
    build.check_backbone(plan, SimpleNamespace(backbone=f"keras_hub:{preset}"))  # a ViT
    with pytest.raises(ConfigError, match="^method mae works on a Vision Transformer's patch "
                       "tokens, and model.backbone keras_hub:ResNetBackbone gives none"):
        build.check_backbone(plan, SimpleNamespace(backbone="keras_hub:ResNetBackbone"))
