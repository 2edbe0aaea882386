"""A ViT's features for the probes (``evaluation.features``, ``caco-evaluate --features``): its
class token, the backbone's own output; the mean of its patch tokens after the final norm
(MAE's ``global_pool``: MAE trains no loss on the class token); or both concatenated (DINOv2's
linear evaluation).  ``pooled_backbone`` gives a model over the backbone's own layers."""

import keras

from caco_tf.errors import ConfigError
from caco_tf.evaluation import POOLINGS, pooling_name
from caco_tf.methods import ijepa
from caco_tf.nets import tokens, vit


class PooledTokens(keras.layers.Layer):
    """``[B, prefix + N, D]`` tokens after the final norm → the features ``pooling`` names:
    the mean of the N patch tokens, or the class token and that mean concatenated."""

    def __init__(self, prefix, pooling, **kwargs):
        super().__init__(**kwargs)
        self.prefix, self.pooling = int(prefix), pooling

    def call(self, sequence):
        patch_mean = keras.ops.mean(sequence[:, self.prefix:], axis=1)
        if self.pooling == "patch_mean":
            return patch_mean
        return keras.ops.concatenate([sequence[:, 0], patch_mean], axis=-1)

    def compute_output_shape(self, input_shape):
        width = input_shape[-1] * (1 if self.pooling == "patch_mean" else 2)
        return (input_shape[0], width)


def pooled_backbone(backbone, pooling):
    """``backbone`` with the features ``pooling`` (one of ``POOLINGS``) in place of its class
    token: a model over the same layers and weights; ``backbone`` itself for "class"."""
    if pooling not in POOLINGS:
        raise ConfigError(f"--features must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    if pooling == "class":
        return backbone
    if isinstance(backbone.layers[-1], ijepa.PatchMean):  # I-JEPA's ViT: no class token
        if pooling == "patch_mean":
            return backbone
        raise ConfigError(f"--features {pooling}: the backbone {backbone.name} (I-JEPA's) has "
                          f"no class token; its features are already patch_mean")
    if not (tokens.has_tokens(backbone) and isinstance(backbone.layers[-1], vit.ClassToken)):
        raise ConfigError(f"--features {pooling} pools a Vision Transformer's patch tokens and "
                          f"the backbone {backbone.name} has none: use --features class")
    pooled = PooledTokens(tokens.prefix_count(backbone), pooling,
                          name=pooling_name(pooling))
    return keras.Model(backbone.input, pooled(backbone.get_layer("norm").output),
                       name=f"{backbone.name}_{pooled.name}")
