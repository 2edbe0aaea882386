"""FLOP counts against the closed form, on a tiny conv net checked numerically in NumPy."""

import keras
import numpy as np
import pytest

from caco_tf.nets import backbones, profiling


def _conv_numpy(x, kernel, stride, pad, groups):
    """Direct convolution (NHWC, kernel (kh, kw, cin/groups, cout)); returns (y, multiply-adds).

    The multiply-adds are counted from the products actually formed, not from a formula.
    """
    x = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    kh, kw, cin_group, cout = kernel.shape
    out_h = (x.shape[1] - kh) // stride + 1
    out_w = (x.shape[2] - kw) // stride + 1
    y = np.zeros((x.shape[0], out_h, out_w, cout))
    cout_group, macs = cout // groups, 0
    for i in range(out_h):
        for j in range(out_w):
            patch = x[:, i * stride:i * stride + kh, j * stride:j * stride + kw, :]
            for g in range(groups):
                inputs = patch[..., g * cin_group:(g + 1) * cin_group]
                weights = kernel[..., g * cout_group:(g + 1) * cout_group]
                y[:, i, j, g * cout_group:(g + 1) * cout_group] = np.einsum(
                    "nhwc,hwco->no", inputs, weights)
                macs += inputs[0].size * cout_group  # one image's products for this group
    return y, macs


def _tiny_net():
    inputs = keras.Input((9, 9, 4))
    x = keras.layers.Conv2D(6, 3, strides=2, use_bias=False, name="a")(inputs)  # 4×4×6
    x = keras.layers.Conv2D(4, 3, padding="same", groups=2, use_bias=False, name="b")(x)
    inner = keras.Model(inputs, x, name="inner")
    outer_inputs = keras.Input((9, 9, 4))
    pooled = keras.layers.GlobalAveragePooling2D()(inner(outer_inputs))
    outputs = keras.layers.Dense(5, use_bias=False, name="c")(pooled)
    return keras.Model(outer_inputs, outputs)


def test_conv_net_count_matches_numpy_convolution():
    model = _tiny_net()
    inner = model.get_layer("inner")
    x = np.random.default_rng(0).normal(size=(1, 9, 9, 4))
    a, b = inner.get_layer("a").kernel.numpy(), inner.get_layer("b").kernel.numpy()
    first, first_macs = _conv_numpy(x, a, stride=2, pad=0, groups=1)
    second, second_macs = _conv_numpy(first, b, stride=1, pad=1, groups=2)
    # The reference reproduces the layers, so its shapes (and products) are theirs.
    np.testing.assert_allclose(second, inner(x.astype(np.float32)).numpy(), atol=1e-4)
    # Closed form: 2 · output positions · kh · kw · cin/groups · cout, and 2 · in · out.
    assert first_macs == 4 * 4 * 3 * 3 * 4 * 6
    assert second_macs == 4 * 4 * 3 * 3 * 3 * 4
    expected = 2 * (first_macs + second_macs) + 2 * 4 * 5
    assert profiling.forward_flops(model) == expected
    assert profiling.layer_forward_flops(inner) == 2 * (first_macs + second_macs)


def test_train_step_counts_eight_encoder_passes_and_bank_products():
    assert profiling.train_step_flops(100, batch=3) == 8 * 100 * 3
    assert profiling.train_step_flops(100, 3, bank_size=50, dim=4, bank_matmuls=10) == (
        2400 + 10 * 2 * 3 * 50 * 4)


def test_small_convnet_count():
    backbone = backbones.build_backbone("small_convnet", (8, 8, 1))
    # 3×3 convs 1→32 (stride 1, 8×8), 32→64 (4×4), 64→128 (2×2), 128→256 (1×1).
    expected = 2 * 9 * (64 * 1 * 32 + 16 * 32 * 64 + 4 * 64 * 128 + 1 * 128 * 256)
    assert profiling.forward_flops(backbone) == expected


def test_unknown_sizes_and_uncounted_kernels_raise():
    with pytest.raises(ValueError, match="unknown output size"):
        profiling.forward_flops(backbones.build_backbone("small_convnet", (None, None, 1)))
    inputs = keras.Input((5, 5, 2))
    model = keras.Model(inputs, keras.layers.DepthwiseConv2D(3)(inputs))
    with pytest.raises(NotImplementedError):
        profiling.forward_flops(model)
