"""A built ViT backbone's tokens, and its encoder on the visible patches only.

``caco_tf.nets.vit.build_vit`` gives a model from images to the class token's features, which
every method and evaluation takes.  The methods that work on patches (MAE, iBOT, I-JEPA) need
more: every token after the final norm (``encode``: the class token, any register tokens, the
patch tokens on their grid), and the encoder run on a subset of the patches (``encode_visible``:
each patch embedded and given its position embedding, then only the kept ones gathered and
passed through the blocks and the final norm, so masking 75 % of the patches saves the blocks'
work on them: MAE's point).

Both run the backbone's own layers (``patch_embed``, the ``Tokens`` layer, ``blocks_i``,
``norm``), so they share its weights and train it.  The sequence is [class, registers...,
patches]; the register count is the ``Tokens`` layer's ``registers`` (0 when it has none).
"""

import collections

import tensorflow as tf

from caco_tf.nets import vit

# A backbone's tokens after the final norm: the class token [B, D], the register tokens
# [B, R, D] (R may be 0) and the patch tokens on their grid [B, rows, cols, D].
EncodedTokens = collections.namedtuple("EncodedTokens", "cls registers patches")


def has_tokens(backbone):
    """Whether ``backbone`` is a ViT whose tokens these functions can reach (built by
    ``build_vit``: its layers named patch_embed, tokens, blocks_i, norm)."""
    try:
        _, tokens_layer, blocks, _ = vit.vit_blocks(backbone)
    except (ValueError, AttributeError):
        return False
    return isinstance(tokens_layer, vit.Tokens) and bool(blocks)


def prefix_count(backbone):
    """The tokens before the patches: the class token and the registers."""
    return 1 + int(getattr(backbone.get_layer("tokens"), "registers", 0))


def patch_side(backbone):
    """The patch's side in pixels."""
    return int(backbone.get_layer("patch_embed").patch)


def embedded(backbone, images, masks=None):
    """(the token sequence with its position embeddings [B, prefix + rows·cols, D], rows,
    cols): the input of the first block.  ``masks``: ``[B, rows, cols]`` booleans, True where
    the ViT's mask token replaces the patch before its position (iBOT's student input)."""
    patch_embed, tokens_layer, _, _ = vit.vit_blocks(backbone)
    grid = patch_embed(images)
    rows, cols = (grid.shape[axis] if grid.shape[axis] is not None else tf.shape(grid)[axis]
                  for axis in (1, 2))  # static for fixed-size images (MAE's)
    if masks is None:
        return tokens_layer(grid), rows, cols
    flat = tf.reshape(masks, [tf.shape(masks)[0], -1])
    return tokens_layer(grid, flat), rows, cols


def has_mask_token(backbone):
    """Whether the ViT has a mask token (``build_vit(mask_token=True)``, DINOv2's)."""
    return bool(getattr(backbone.get_layer("tokens"), "has_mask_token", False))


def _blocks_and_norm(backbone, sequence, training):
    _, _, blocks, norm = vit.vit_blocks(backbone)
    for block in blocks:
        sequence = block(sequence, training=training)
    return norm(sequence)


def encode(backbone, images, training=False, masks=None):
    """Every token of ``images`` after the final norm (``EncodedTokens``); its class token is
    the backbone's features.  ``masks`` (``[B, rows, cols]``, True where masked): those patches
    enter as the ViT's mask token (``embedded``)."""
    sequence, rows, cols = embedded(backbone, images, masks)
    prefix = prefix_count(backbone)
    out = _blocks_and_norm(backbone, sequence, training)
    return EncodedTokens(out[:, 0], out[:, 1:prefix],
                         tf.reshape(out[:, prefix:], [-1, rows, cols, out.shape[-1]]))


def visible_indices(masks, kept):
    """``[B, kept]`` int32: the indices (row-major, ascending) of the patches ``masks`` leaves
    visible, ``masks`` ``[B, rows, cols]`` boolean True where masked, each image with exactly
    ``kept`` visible patches (``data.masks.RandomMasks``)."""
    flat = tf.cast(tf.reshape(masks, [tf.shape(masks)[0], -1]), tf.int32)
    # A stable sort on the mask puts the visible patches (0) first, in their order.
    return tf.argsort(flat, axis=1, stable=True)[:, :kept]


def encode_visible(backbone, images, visible, training=False):
    """``[B, prefix + K, D]``: the tokens after the final norm of the class token, the
    registers and the K patches ``visible`` (``[B, K]`` indices) only: each patch gets its
    position embedding before the gather, so the blocks see them where they are."""
    sequence, _, _ = embedded(backbone, images)
    prefix = prefix_count(backbone)
    kept = tf.gather(sequence[:, prefix:], visible, batch_dims=1)
    return _blocks_and_norm(backbone, tf.concat([sequence[:, :prefix], kept], axis=1), training)


def patchify(images, patch):
    """``[B, H, W, C]`` → ``[B, (H/p)·(W/p), p·p·C]``: each patch's pixels, row by row, in
    MAE's order (models_mae.py's ``patchify``: rows of the patch, then columns, then channels)."""
    _, height, width, channels = images.shape
    rows, cols = height // patch, width // patch
    x = tf.reshape(images[:, :rows * patch, :cols * patch],
                   [-1, rows, patch, cols, patch, channels])
    x = tf.transpose(x, [0, 1, 3, 2, 4, 5])
    return tf.reshape(x, [-1, rows * cols, patch * patch * channels])


def unpatchify(patches, patch, rows, cols, channels):
    """``patchify``'s inverse: ``[B, rows·cols, p·p·C]`` → ``[B, rows·p, cols·p, C]``."""
    x = tf.reshape(patches, [-1, rows, cols, patch, patch, channels])
    x = tf.transpose(x, [0, 1, 3, 2, 4, 5])
    return tf.reshape(x, [-1, rows * patch, cols * patch, channels])


def tokens_refusal(method, backbone_name):
    """The line refusing ``method``, which works on a ViT's tokens, on ``backbone_name``."""
    return (f"method {method} works on a Vision Transformer's patch tokens, and "
            f"model.backbone {backbone_name} gives none: use a ViT (model.backbone "
            f"vit_micro_patch4 on the digits, vit_base_patch16 on ImageNet; docs/vit.md)")


__all__ = ["EncodedTokens", "embedded", "encode", "encode_visible", "has_mask_token",
           "has_tokens", "patch_side", "patchify", "prefix_count", "tokens_refusal", "unpatchify",
           "visible_indices"]
