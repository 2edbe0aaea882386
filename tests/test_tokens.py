"""A ViT backbone's tokens (caco_tf.nets.tokens): the class token is the backbone's features, the
encoder on every patch given as visible is the full encoder, one on a subset sees each kept
patch at its own position, patchify and unpatchify invert each other in MAE's order, and a
ConvNet has no tokens."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from caco_tf.data import masks
from caco_tf.nets import tokens, vit


@pytest.fixture(scope="module")
def micro_vit():
    keras.utils.set_random_seed(0)
    return vit.build_vit("vit_micro_patch4", (28, 28, 1))


@pytest.fixture(scope="module")
def images():
    return tf.constant(np.random.default_rng(0).normal(size=(3, 28, 28, 1)), tf.float32)


def test_the_class_token_is_the_features_and_the_patches_lie_on_their_grid(micro_vit, images):
    encoded = tokens.encode(micro_vit, images)
    np.testing.assert_allclose(encoded.cls, micro_vit(images), atol=1e-5)
    assert encoded.patches.shape == (3, 7, 7, 96) and encoded.registers.shape == (3, 0, 96)
    assert tokens.has_tokens(micro_vit) and tokens.prefix_count(micro_vit) == 1
    assert tokens.patch_side(micro_vit) == 4


def test_with_nothing_masked_the_visible_encoder_is_the_full_encoder(micro_vit, images):
    nothing = masks.random_masks(tf.constant([1, 2], tf.int64), 3, 7, 7, 0.0)
    visible = tokens.visible_indices(nothing, 49)
    np.testing.assert_array_equal(visible, np.tile(np.arange(49), (3, 1)))
    out = tokens.encode_visible(micro_vit, images, visible)
    full = tokens.encode(micro_vit, images)
    np.testing.assert_allclose(out[:, 0], full.cls, atol=1e-5)
    np.testing.assert_allclose(tf.reshape(out[:, 1:], [3, 7, 7, 96]), full.patches, atol=1e-5)


def test_the_visible_encoder_sees_the_kept_patches_at_their_positions(micro_vit, images):
    """Masking 75 %: the 12 kept patches are those the mask leaves, in order; the encoder's
    input is the full sequence's rows at them (their position embeddings added before the
    gather), so moving a masked patch's pixels changes nothing."""
    mask = masks.random_masks(tf.constant([4, 5], tf.int64), 3, 7, 7, 0.75)
    visible = tokens.visible_indices(mask, 12).numpy()
    for b in range(3):
        np.testing.assert_array_equal(visible[b], np.flatnonzero(~mask.numpy()[b].ravel()))
    out = tokens.encode_visible(micro_vit, images, visible)
    assert out.shape == (3, 13, 96)
    hidden = np.repeat(np.repeat(mask.numpy(), 4, 1), 4, 2)[..., None]
    scrambled = tf.where(hidden, tf.random.normal(images.shape, seed=1), images)
    np.testing.assert_allclose(tokens.encode_visible(micro_vit, scrambled, visible), out,
                               atol=1e-5)
    sequence, _, _ = tokens.embedded(micro_vit, images)
    by_hand = tf.concat([sequence[:, :1], tf.gather(sequence[:, 1:], visible, batch_dims=1)], 1)
    _, _, blocks, norm = vit.vit_blocks(micro_vit)
    for block in blocks:
        by_hand = block(by_hand)
    np.testing.assert_allclose(norm(by_hand), out, atol=1e-5)


def test_patchify_and_unpatchify_invert_each_other_in_maes_order():
    x = np.random.default_rng(1).normal(size=(2, 8, 12, 3)).astype("float32")
    patches = tokens.patchify(tf.constant(x), 4).numpy()
    assert patches.shape == (2, 6, 48)
    # MAE's: patch (i, j) holds x[4i:4i+4, 4j:4j+4, :] flattened (rows, columns, channels).
    np.testing.assert_array_equal(patches[1, 1 * 3 + 2], x[1, 4:8, 8:12, :].ravel())
    np.testing.assert_array_equal(tokens.unpatchify(tf.constant(patches), 4, 2, 3, 3), x)


def test_a_convnet_has_no_tokens():
    convnet = keras.Sequential([keras.Input((12, 12, 1)), keras.layers.Conv2D(4, 3),
                                keras.layers.GlobalAveragePooling2D()])
    assert not tokens.has_tokens(convnet)
    line = tokens.tokens_refusal("mae", "small_convnet")
    assert "\n" not in line and "mae" in line and "vit_micro_patch4" in line
