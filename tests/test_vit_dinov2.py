"""DINOv2's additions to the ViT (nets.vit), each off by default: LayerScale, the register
tokens after the class token, the mask token, DINOv2's position resize (its offset and
antialias) and the patch-14 presets; on a ConvNet, its settings are one line.  (Against
dinov2's own code: tests/test_dinov2_import.py.)"""

import numpy as np
import pytest

from caco_tf.config import ConfigError, load_config
from caco_tf.nets import vit

TINY = vit.ViTShape(4, 8, 2, 2)


def _tokens(backbone, images, masks=None):
    patch_embed, tokens, _, _ = vit.vit_blocks(backbone)
    return np.asarray(tokens(patch_embed(images), masks=masks))


def test_registers_follow_the_class_token_without_positions():
    backbone = vit.build_vit(TINY, (12, 12, 3), registers=2)
    tokens = vit.vit_blocks(backbone)[1]
    tokens.register_tokens.assign(np.arange(16, dtype="float32").reshape(1, 2, 8))
    images = np.random.default_rng(0).normal(size=(2, 12, 12, 3)).astype("float32")
    sequence = _tokens(backbone, images)
    assert sequence.shape == (2, 1 + 2 + 9, 8) and tokens.registers == 2
    np.testing.assert_array_equal(sequence[:, 1:3], np.broadcast_to(
        np.asarray(tokens.register_tokens), (2, 2, 8)))  # as they are: no position added
    plain = vit.build_vit(TINY, (12, 12, 3))
    plain.set_weights([w for w in backbone.get_weights() if w.shape != (1, 2, 8)])
    np.testing.assert_allclose(sequence[:, [0, *range(3, 12)]], _tokens(plain, images), atol=1e-6)
    assert tuple(vit.class_attention(backbone, images).shape) == (2, 2, 3, 3)  # patches only


def test_the_mask_token_replaces_the_masked_patches_before_their_positions():
    backbone = vit.build_vit(TINY, (12, 12, 3), mask_token=True)
    tokens = vit.vit_blocks(backbone)[1]
    tokens.mask_token.assign(np.full((1, 8), 3.0, "float32"))
    images = np.random.default_rng(0).normal(size=(1, 12, 12, 3)).astype("float32")
    masks = np.zeros((1, 9), bool)
    masks[0, [0, 4]] = True
    masked, unmasked = _tokens(backbone, images, masks), _tokens(backbone, images)
    positions = np.asarray(tokens.pos_embed)[0, 1:]
    np.testing.assert_allclose(masked[0, 1 + np.array([0, 4])], 3.0 + positions[[0, 4]],
                               atol=1e-6)
    np.testing.assert_array_equal(masked[0, 1 + np.array([1, 2, 3, 5])],
                                  unmasked[0, 1 + np.array([1, 2, 3, 5])])
    with pytest.raises(ValueError, match="masks need a mask token"):
        _tokens(vit.build_vit(TINY, (12, 12, 3)), images, masks)


def test_layer_scale_scales_each_branch_from_its_start():
    images = np.random.default_rng(0).normal(size=(2, 12, 12, 3)).astype("float32")
    scaled = vit.build_vit(TINY, (12, 12, 3), layer_scale=1e-5)
    block = vit.vit_blocks(scaled)[2][0]
    np.testing.assert_array_equal(np.asarray(block.ls1.gamma), np.full(8, 1e-5, "float32"))
    # LayerScale of one is the block without it.
    for name in ("ls1", "ls2"):
        for block in vit.vit_blocks(scaled)[2]:
            getattr(block, name).gamma.assign(np.ones(8, "float32"))
    plain = vit.build_vit(TINY, (12, 12, 3))
    plain.set_weights([v.numpy() for v in scaled.weights
                       if not v.path.endswith(("ls1/gamma", "ls2/gamma"))])
    np.testing.assert_allclose(np.asarray(scaled(images)), np.asarray(plain(images)), atol=1e-6)


def test_the_defaults_save_the_configs_a_vit_always_saved():
    backbone = vit.build_vit(TINY, (12, 12, 3))
    _, tokens, blocks, _ = vit.vit_blocks(backbone)
    assert set(tokens.get_config()) >= {"grid", "width", "positions"}
    assert not {"registers", "mask_token", "interpolate_offset", "interpolate_antialias"} & set(
        tokens.get_config())
    assert "layer_scale" not in blocks[0].get_config()
    assert not [w.path for w in backbone.weights if "norm" not in w.path
                and w.path.endswith(("/gamma", "register_tokens", "mask_token"))]


@pytest.mark.parametrize("offset, antialias", [(0.1, False), (0.0, False), (0.0, True)])
def test_the_resized_table_is_a_resize_matrix_each_way(offset, antialias):
    backbone = vit.build_vit(TINY, (None, None, 3), image_size=12, interpolate_offset=offset,
                             interpolate_antialias=antialias)
    tokens = vit.vit_blocks(backbone)[1]
    resize = vit.antialiased_cubic_resize_matrix if antialias else vit.cubic_resize_matrix
    matrix = np.asarray(resize(3, 5, 3 / (5 + offset)))
    table = np.asarray(tokens.pos_embed)[0, 1:].reshape(3, 3, 8)
    expected = np.einsum("ri,ijd,cj->rcd", matrix, table, matrix).reshape(25, 8)
    np.testing.assert_allclose(np.asarray(tokens.patch_positions(5, 5)), expected, atol=1e-6)
    if antialias:  # PIL's edges: each output's weights sum to 1, shrinking too
        for size_out in (2, 5):
            np.testing.assert_allclose(np.asarray(resize(3, size_out, 3 / size_out)).sum(1), 1.0,
                                       atol=1e-6)


def test_the_patch14_presets_are_dinov2s():
    assert vit.VIT_PRESETS["vit_small_patch14"] == (14, 384, 12, 6)
    assert vit.VIT_PRESETS["vit_base_patch14"] == (14, 768, 12, 12)
    assert vit.VIT_PRESETS["vit_large_patch14"] == (14, 1024, 24, 16)
    # DINOv2's ViT-S/14 as released (518 px table, LayerScale, mask token): KerasHub's
    # dinov2_small counts 22,582,656, which holds a second 1,370 x 384 table (its resized one).
    small = vit.build_vit("vit_small_patch14", (224, 224, 3), image_size=518, layer_scale=1e-5,
                          mask_token=True)
    assert sum(int(np.prod(w.shape)) for w in small.trainable_weights) == 22_582_656 - 1370 * 384


def test_uniform_stochastic_depth_drops_every_block_at_the_rate():
    rising = vit.vit_blocks(vit.build_vit(TINY, (12, 12, 3), drop_path=0.2))[2]
    uniform = vit.vit_blocks(vit.build_vit(TINY, (12, 12, 3), drop_path=0.2,
                                           drop_path_uniform=True))[2]
    assert [b.drop_path for b in rising] == [0.0, 0.2]
    assert [b.drop_path for b in uniform] == [0.2, 0.2]


@pytest.mark.parametrize("setting", ["model.layer_scale=1e-5", "model.registers=4",
                                     "model.drop_path_uniform=true",
                                     "model.mask_token=true", "model.position_table_size=518",
                                     "model.interpolate_offset=0",
                                     "model.interpolate_antialias=true"])
def test_dinov2_settings_on_a_convnet_are_one_line(setting):
    key = setting.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{key} applies to the vit_\* backbones"):
        load_config(None, [setting])
    config = load_config(None, [setting, "model.backbone=vit_micro_patch4", "model.pool_grid=1",
                                "data.views=asymmetric"])
    value = setting.split("=")[1]
    assert config["model"][key.split(".")[1]] == {"true": True}.get(value, None) or \
        float(config["model"][key.split(".")[1]]) == float(value)
