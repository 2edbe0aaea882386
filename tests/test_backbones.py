"""Tests for caco_tf.backbones (CPU, small inputs, a few seconds each)."""

import numpy as np
import pytest

from caco_tf.nets.vit import VIT_PRESETS
import tensorflow as tf
import keras
from keras import layers

from caco_tf.nets import backbones
from caco_tf.nets.backbones import BACKBONE_NAMES, build_backbone, build_projector


@pytest.fixture(autouse=True)
def _seed():
    keras.utils.set_random_seed(0)


@pytest.fixture(scope="module")
def resnet50():
    keras.utils.set_random_seed(0)
    return build_backbone("resnet50", input_shape=(64, 64, 3))


def _num_params(weights):
    return sum(int(np.prod(w.shape)) for w in weights)


def _images(shape, batch=2):
    return np.random.default_rng(0).standard_normal((batch, *shape)).astype("float32")


def _bn_layers(model):
    return [layer for layer in model.layers if isinstance(layer, layers.BatchNormalization)]


# ----------------------------------------------------------------------------
# Output shapes
# ----------------------------------------------------------------------------


def test_resnet50_output_shape(resnet50):
    out = resnet50(_images((64, 64, 3)), training=False)
    assert tuple(out.shape) == (2, 2048)
    assert np.all(np.isfinite(np.asarray(out)))


@pytest.mark.parametrize(
    "name, shape, feat_dim",
    [("cifar_resnet18", (32, 32, 3), 512), ("small_convnet", (28, 28, 1), 256)],
)
def test_small_backbones_output_shape(name, shape, feat_dim):
    model = build_backbone(name, input_shape=shape)
    out = model(_images(shape), training=True)
    assert tuple(out.shape) == (2, feat_dim)
    assert model.name == name


def test_small_convnet_widths_set_the_feature_dim_and_are_checked():
    model = build_backbone("small_convnet", widths=[16, 32, 64, 96])
    assert tuple(model(_images((28, 28, 1)), training=False).shape) == (2, 96)
    assert model.get_layer("conv1").filters == 16
    with pytest.raises(ValueError, match="4 positive widths"):
        build_backbone("small_convnet", widths=[16, 32])
    with pytest.raises(ValueError, match="small_convnet only"):
        build_backbone("cifar_resnet18", widths=[16, 32, 64, 96])


def test_pool_grid_averages_each_cell_of_the_last_map():
    model = build_backbone("small_convnet", widths=[4, 4, 4, 3], pool_grid=2)
    images = _images((28, 28, 1))
    features = model(images, training=False).numpy()
    assert features.shape == (2, 12)  # 2 × 2 cells × 3 channels
    last = keras.Model(model.input, model.get_layer("bn4_relu").output)(images).numpy()
    assert last.shape[1:3] == (4, 4)
    cells = [last[:, r:r + 2, c:c + 2].mean(axis=(1, 2)) for r in (0, 2) for c in (0, 2)]
    np.testing.assert_allclose(features, np.concatenate(cells, axis=-1), rtol=1e-5, atol=1e-6)
    # Global pooling is the mean of the four cells: the grid features hold it linearly.
    gap = build_backbone("small_convnet", widths=[4, 4, 4, 3])
    gap.set_weights(model.get_weights())
    np.testing.assert_allclose(gap(images, training=False), np.mean(cells, axis=0), rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(ValueError, match="pool_grid must be a positive integer"):
        build_backbone("small_convnet", pool_grid=0)


def test_default_input_shapes():
    assert build_backbone("small_convnet").input_shape == (None, 28, 28, 1)
    assert build_backbone("cifar_resnet18").input_shape == (None, 32, 32, 3)


# ----------------------------------------------------------------------------
# ResNet-50 matches torchvision
# ----------------------------------------------------------------------------


def test_resnet50_param_count_matches_torchvision(resnet50):
    # torchvision resnet50 minus fc (2048*1000 + 1000) = 23,508,032.
    assert _num_params(resnet50.trainable_weights) == 23_508_032


def test_resnet50_stride_in_3x3_conv(resnet50):
    # v1.5: the first 1x1 conv keeps resolution, the 3x3 conv downsamples.
    assert resnet50.get_layer("layer2_0_conv1").strides == (1, 1)
    assert resnet50.get_layer("layer2_0_conv2").strides == (2, 2)
    assert resnet50.get_layer("layer2_0_conv2").kernel_size == (3, 3)
    assert resnet50.get_layer("layer2_0_downsample_0").strides == (2, 2)
    # Stage 1 keeps resolution (the max-pool already downsampled).
    assert resnet50.get_layer("layer1_0_conv2").strides == (1, 1)


def test_resnet50_layer_names_match_torchvision(resnet50):
    expected = {"conv1", "bn1"}
    for stage, num_blocks in enumerate([3, 4, 6, 3], start=1):
        for b in range(num_blocks):
            p = f"layer{stage}_{b}"
            expected |= {f"{p}_conv{i}" for i in (1, 2, 3)}
            expected |= {f"{p}_bn{i}" for i in (1, 2, 3)}
            if b == 0:
                expected |= {f"{p}_downsample_0", f"{p}_downsample_1"}
    with_params = {layer.name for layer in resnet50.layers if layer.weights}
    assert with_params == expected


def test_resnet50_torch_spatial_arithmetic():
    # Intermediate sizes at 224 px as in torch: 112 -> 56 -> 56/28/14/7.
    model = build_backbone("resnet50")
    sizes = {
        n: model.get_layer(n).output.shape[1:3]
        for n in ["conv1", "maxpool", "layer1_2_out", "layer2_3_out", "layer3_5_out",
                  "layer4_2_out"]
    }
    assert sizes == {
        "conv1": (112, 112),
        "maxpool": (56, 56),
        "layer1_2_out": (56, 56),
        "layer2_3_out": (28, 28),
        "layer3_5_out": (14, 14),
        "layer4_2_out": (7, 7),
    }


def test_conv_and_bn_hyperparameters(resnet50):
    for layer in resnet50.layers:
        if isinstance(layer, layers.Conv2D):
            assert layer.use_bias is False, layer.name
            assert layer.padding == "valid", layer.name
            init = layer.kernel_initializer
            assert isinstance(init, keras.initializers.VarianceScaling)
            assert (init.scale, init.mode, init.distribution) == (
                2.0,
                "fan_out",
                "untruncated_normal",
            )
    bns = _bn_layers(resnet50)
    assert len(bns) == 53  # 1 stem + 16 blocks * 3 + 4 downsample
    for bn in bns:
        assert bn.momentum == pytest.approx(0.9)
        assert bn.epsilon == pytest.approx(1e-5)
        assert bn.synchronized is False


def test_conv_bn_padding_is_torch_symmetric():
    # Keras 'same' with stride 2 on an even input pads only bottom/right;
    # torch pads 1 on every side. Compare against a symmetric-pad reference.
    x_in = keras.Input((6, 6, 1))
    y = backbones._conv_bn(x_in, 1, 3, 2, "c", "b", sync=False, relu=False)
    model = keras.Model(x_in, y)
    kernel = np.arange(9, dtype="float32").reshape(3, 3, 1, 1)
    model.get_layer("c").set_weights([kernel])
    x = np.arange(36, dtype="float32").reshape(1, 6, 6, 1)

    xp = np.pad(x[0, :, :, 0], 1)
    expected = np.array(
        [[np.sum(xp[2 * i:2 * i + 3, 2 * j:2 * j + 3] * kernel[..., 0, 0]) for j in range(3)]
         for i in range(3)]
    )
    # Fresh BN in inference mode only divides by sqrt(1 + eps).
    expected = expected / np.sqrt(1.0 + 1e-5)
    out = np.asarray(model(x, training=False))[0, :, :, 0]
    np.testing.assert_allclose(out, expected, rtol=1e-5)


# ----------------------------------------------------------------------------
# CIFAR ResNet-18 / small convnet
# ----------------------------------------------------------------------------


def test_cifar_resnet18_structure():
    model = build_backbone("cifar_resnet18")
    # torchvision resnet18 without fc (11,176,512) with a 3x3 instead of 7x7 stem.
    assert _num_params(model.trainable_weights) == 11_176_512 - 64 * 3 * (49 - 9)
    stem = model.get_layer("conv1")
    assert stem.kernel_size == (3, 3) and stem.strides == (1, 1)
    assert not any(isinstance(layer, layers.MaxPooling2D) for layer in model.layers)
    assert model.get_layer("layer1_0_conv1").strides == (1, 1)
    for stage in (2, 3, 4):
        assert model.get_layer(f"layer{stage}_0_conv1").strides == (2, 2)
        assert model.get_layer(f"layer{stage}_0_downsample_0").strides == (2, 2)
    # Stage 1 keeps 64 channels, so no projection shortcut there.
    assert "layer1_0_downsample_0" not in {layer.name for layer in model.layers}
    assert model.get_layer("layer4_1_out").output.shape[1:] == (4, 4, 512)


def test_small_convnet_structure():
    model = build_backbone("small_convnet")
    convs = [layer for layer in model.layers if isinstance(layer, layers.Conv2D)]
    assert [c.filters for c in convs] == [32, 64, 128, 256]
    assert [c.strides for c in convs] == [(1, 1), (2, 2), (2, 2), (2, 2)]
    assert all(c.kernel_size == (3, 3) and not c.use_bias for c in convs)
    assert len(_bn_layers(model)) == 4


# ----------------------------------------------------------------------------
# Projector
# ----------------------------------------------------------------------------


def test_projector_structure():
    proj = build_projector(64, hidden_dim=32, output_dim=16)
    dense = [layer for layer in proj.layers if isinstance(layer, layers.Dense)]
    assert [d.name for d in dense] == ["fc_0", "fc_3", "fc_6"]
    assert [d.units for d in dense] == [32, 32, 16]
    assert all(d.use_bias is False for d in dense)
    assert [b.name for b in _bn_layers(proj)] == ["fc_1", "fc_4"]
    # Nothing after the last Dense: no BN, no normalization.
    assert proj.layers[-1].name == "fc_6"
    out = proj(_images((64,), batch=4), training=True)
    assert tuple(out.shape) == (4, 16)
    # Parameters: 3 kernels + 2 BN (gamma, beta) of width 32.
    assert _num_params(proj.trainable_weights) == 64 * 32 + 32 * 32 + 32 * 16 + 2 * 2 * 32


def test_projector_defaults():
    proj = build_projector(512)
    assert proj.output_shape == (None, 256)
    assert proj.get_layer("fc_0").units == 2048
    assert proj.name == "projector"


# ----------------------------------------------------------------------------
# Errors and sync BN
# ----------------------------------------------------------------------------


def test_unknown_backbone_lists_known_names():
    with pytest.raises(ValueError) as err:
        build_backbone("resnet1000")
    msg = str(err.value)
    assert "resnet1000" in msg
    for name in ("resnet50", "resnet18", "cifar_resnet18", "small_convnet"):
        assert name in msg
    assert set(BACKBONE_NAMES) == {"resnet50", "resnet18", "cifar_resnet18", "small_convnet",
                                   *VIT_PRESETS}


@pytest.mark.parametrize("name, channels", [
    ("small_convnet", 1), pytest.param("cifar_resnet18", 3, marks=pytest.mark.slow),
    ("resnet18", 3), pytest.param("resnet50", 3, marks=pytest.mark.slow)])
def test_feature_map_sizes_are_the_built_backbones(name, channels):
    """nets.sizes, which checks a configuration before anything is built, agrees with the
    layers the backbones are built from."""
    from caco_tf.nets import sizes
    from caco_tf.config import BACKBONES

    assert set(BACKBONES) == set(sizes.DOWNSAMPLING) == set(BACKBONE_NAMES)
    for size in (9, 28, 33, 64):
        model = build_backbone(name, (size, size, channels))
        pooled = model.get_layer("avgpool").input.shape
        assert pooled[1] == sizes.feature_map_size(name, size), size


@pytest.mark.parametrize("name", ["small_convnet", "cifar_resnet18"])
def test_sync_batchnorm_flag(name):
    plain = _bn_layers(build_backbone(name))
    synced = _bn_layers(build_backbone(name, sync_batchnorm=True))
    assert plain and len(plain) == len(synced)
    assert all(not b.synchronized for b in plain)
    assert all(b.synchronized for b in synced)


def test_sync_batchnorm_projector_and_mirrored_strategy():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        model = build_backbone("small_convnet", sync_batchnorm=True)
        proj = build_projector(256, hidden_dim=16, output_dim=8, sync_batchnorm=True)
    assert all(b.synchronized for b in _bn_layers(proj))
    assert len(_bn_layers(proj)) == 2

    @tf.function
    def step(x):
        return proj(model(x, training=True), training=True)

    out = strategy.run(step, args=(tf.constant(_images((28, 28, 1), batch=4)),))
    out = strategy.experimental_local_results(out)[0]
    assert tuple(out.shape) == (4, 8)
    assert np.all(np.isfinite(out.numpy()))


def test_savedmodel_export_roundtrip(tmp_path):
    model = build_backbone("small_convnet", sync_batchnorm=True)
    x = _images((28, 28, 1))
    expected = np.asarray(model(x, training=False))
    path = str(tmp_path / "export")
    model.export(path, verbose=False)
    reloaded = tf.saved_model.load(path)
    np.testing.assert_allclose(reloaded.serve(x).numpy(), expected, rtol=1e-5, atol=1e-5)
