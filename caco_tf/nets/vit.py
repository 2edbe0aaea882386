"""Vision Transformers (Dosovitskiy et al. 2021) as DINO's and MoCo v3's code builds them.

A ViT maps float32 images ``[B, H, W, C]`` to the class token's features ``[B, D]``, as every
other backbone maps images to pooled features, so every method and evaluation takes it as it
is.  The layout is DINO's ``vision_transformer.py`` (itself timm's): a patch embedding (a
convolution with kernel = stride = the patch), a class token prepended, position embeddings
added, pre-norm blocks (``x + DropPath(Attention(LN(x)))``, ``x + DropPath(MLP(LN(x)))``,
LayerNorm ε 1e-6, GELU, MLP 4× wide), a final LayerNorm, the class token out.

Crops of another size than the one the backbone was built for (multi-crop's local crops) get
the position embeddings resized bicubically over the patch grid, with DINO's arithmetic
(``interpolate_pos_encoding``: PyTorch's bicubic, A = -0.75, at scale factor (g + 0.1) / g0);
MoCo v3's fixed 2-D sine-cosine embeddings are computed for whatever grid arrives.  DINOv2's
variants of that resize are settings: its ``interpolate_offset`` (0: resize to the grid's size)
and ``interpolate_antialias`` (PyTorch's antialiased bicubic, A = -0.5, the weights renormalized
at the edges, as DINOv2's checkpoints with registers use).

DINOv2's additions (Oquab et al. 2023, facebookresearch/dinov2 ``vision_transformer.py``), each
off by default so that every other ViT stays as it was: LayerScale (a learned per-channel scale
on each residual branch, ``ls1``/``ls2``, started at ``layer_scale``), register tokens (Darcet et
al. 2024: ``registers`` learned tokens after the class token, without positions, so the tokens
are [class, registers..., patches]) and the mask token iBOT puts in place of masked patches.

Layer names follow the PyTorch parameter names (``'.'`` → ``'_'``: ``patch_embed``,
``blocks_0`` with ``norm1``, ``attn_qkv``, ``attn_proj``, ``norm2``, ``mlp_fc1``, ``mlp_fc2``;
``norm``), so the authors' checkpoints map one to one.

Built from Keras layers rather than KerasHub's ``ViTBackbone``: KerasHub's (0.32) takes one
fixed image size (its position embedding is not interpolated, so multi-crop's 96 px crops
cannot pass), has no stochastic depth, and does not return the attention weights; and it is
an optional extra here, not a dependency of every install.
"""

from __future__ import annotations

from typing import Dict, NamedTuple, Optional, Tuple

import keras
import numpy as np
import tensorflow as tf
from keras import layers, ops

from caco_tf.nets.sizes import VIT_SHAPES

__all__ = ["VIT_PRESETS", "ViTShape", "antialiased_cubic_resize_matrix", "build_vit",
           "class_attention", "cubic_resize_matrix", "is_vit", "is_vit_backbone",
           "sincos_position_embedding", "vit_blocks"]


class ViTShape(NamedTuple):
    """A ViT's size: the patch side, the token width D, the blocks and the heads."""
    patch: int
    width: int
    depth: int
    heads: int


#: name -> shape (the table lives in ``nets.sizes``, which the configuration reads).
VIT_PRESETS: Dict[str, ViTShape] = {name: ViTShape(*shape) for name, shape in VIT_SHAPES.items()}

#: DINO's +0.1 on the target grid before it becomes a scale factor (vision_transformer.py,
#: "to avoid floating point error in the interpolation"): the source positions follow it.
DINO_SCALE_OFFSET = 0.1


def is_vit(name: str) -> bool:
    return name in VIT_PRESETS


def _truncated_normal():
    """timm's ``trunc_normal_(std=.02)`` (DINO's init of every Linear, the tokens and positions)."""
    return keras.initializers.TruncatedNormal(stddev=0.02)


# A ViT's initial weights (``build_vit``'s ``init``): "trunc_normal", timm's std 0.02 on every
# Linear and the patch embedding (DINO's Linears; I-JEPA's Linears and patch convolution);
# "xavier", MAE's ``initialize_weights`` (xavier-uniform on every Linear and on the patch
# convolution viewed as a Linear, ``[D, p·p·C]``).  The tokens keep std 0.02 in both.
VIT_INITS = ("trunc_normal", "xavier")


def _linear_initializer(init):
    return _truncated_normal() if init == "trunc_normal" else "glorot_uniform"


def _xavier_patch_initializer(fan_in, width):
    """MAE's patch convolution kernel: xavier-uniform as a Linear from its ``fan_in`` = p·p·C
    pixels to ``width`` (Keras' own glorot would count the kernel's p·p in its fan-out)."""
    limit = float(np.sqrt(6.0 / (fan_in + width)))
    return keras.initializers.RandomUniform(-limit, limit)


def _cubic_weight(distance, a=-0.75):
    """PyTorch's bicubic convolution kernel (Keys, A = -0.75; -0.5 when antialiased) at
    ``|distance|`` < 2."""
    d = ops.abs(distance)
    near = ((a + 2.0) * d - (a + 3.0)) * d * d + 1.0
    far = ((a * d - 5.0 * a) * d + 8.0 * a) * d - 4.0 * a
    return ops.where(d <= 1.0, near, far)


def cubic_resize_matrix(size_in, size_out, scale):
    """``[size_out, size_in]``: the linear map PyTorch's ``interpolate(mode='bicubic',
    align_corners=False)`` applies along one axis, at ``scale`` = input / output positions.

    Output i reads the source position (i + 0.5)·scale - 0.5 (not clamped, as PyTorch's cubic
    mode), from its four neighbours, indices clamped to the edge.  ``size_out`` and ``scale``
    may be tensors (a grid known only when the crop arrives).
    """
    position = (ops.cast(ops.arange(size_out), "float32") + 0.5) * scale - 0.5
    floor = ops.floor(position)
    fraction = position - floor
    matrix = 0.0
    for tap in (-1, 0, 1, 2):
        index = ops.clip(ops.cast(floor, "int32") + tap, 0, size_in - 1)
        weight = _cubic_weight(fraction - float(tap))
        matrix = matrix + weight[:, None] * ops.one_hot(index, size_in)
    return matrix


def antialiased_cubic_resize_matrix(size_in, size_out, scale):
    """``[size_out, size_in]``: PyTorch's ``interpolate(mode='bicubic', antialias=True)`` along
    one axis at ``scale`` = input / output positions (also TensorFlow's bicubic resize, KerasHub's).

    Output i centres on (i + 0.5)·scale; input j weighs cubic((j + 0.5 - centre) / max(scale, 1))
    with Keys' A = -0.5, the kernel widened when shrinking; the weights of the inputs that exist
    are renormalized to sum to 1 (PIL's edges, not clamped indices).
    """
    scale = ops.cast(scale, "float32")
    centre = (ops.cast(ops.arange(size_out), "float32") + 0.5) * scale
    stretch = ops.maximum(scale, 1.0)
    distance = (ops.cast(ops.arange(size_in), "float32")[None] + 0.5 - centre[:, None]) / stretch
    weights = ops.where(ops.abs(distance) < 2.0, _cubic_weight(distance, a=-0.5), 0.0)
    return weights / ops.sum(weights, axis=1, keepdims=True)


def sincos_position_embedding(rows, cols, width, temperature=10000.0):
    """``[rows·cols, width]``: MoCo v3's fixed 2-D sine-cosine embedding
    (``build_2d_sincos_position_embedding``): for the patch at (r, c), sin(r·ω), cos(r·ω),
    sin(c·ω), cos(c·ω) with ω_k = temperature^(-k / (width/4)), k < width/4."""
    quarter = width // 4
    omega = 1.0 / (temperature ** (ops.cast(ops.arange(quarter), "float32") / quarter))
    r = ops.repeat(ops.cast(ops.arange(rows), "float32"), cols)
    c = ops.tile(ops.cast(ops.arange(cols), "float32"), [rows])
    r, c = r[:, None] * omega[None], c[:, None] * omega[None]
    return ops.concatenate([ops.sin(r), ops.cos(r), ops.sin(c), ops.cos(c)], axis=1)


@keras.saving.register_keras_serializable(package="caco_tf")
class PatchEmbedding(layers.Layer):
    """Images ``[B, H, W, C]`` → the patch grid ``[B, H/p, W/p, D]`` (PyTorch's ``patch_embed``:
    a convolution of kernel and stride p, which drops a remainder of fewer than p pixels)."""

    def __init__(self, patch, width, init="trunc_normal", **kwargs):
        super().__init__(**kwargs)
        self.patch, self.width, self.init = int(patch), int(width), init
        # Made here, as ever, so that a seeded build draws the same weights; xavier's is
        # replaced in build, once the channels are known.
        self.proj = layers.Conv2D(
            self.width, self.patch, strides=self.patch, padding="valid", name="proj",
            kernel_initializer=_truncated_normal() if init == "trunc_normal" else "glorot_uniform")
        self.proj.trainable = self.trainable  # a copy of a frozen one (from_config) stays frozen

    def build(self, input_shape):
        if self.init != "trunc_normal":  # xavier's bound needs the channels, known here
            self.proj.kernel_initializer = _xavier_patch_initializer(
                self.patch * self.patch * int(input_shape[-1]), self.width)
        self.proj.build(input_shape)

    def call(self, images):
        return self.proj(images)

    def compute_output_shape(self, input_shape):
        return self.proj.compute_output_shape(input_shape)

    def get_config(self):
        config = dict(super().get_config(), patch=self.patch, width=self.width)
        if self.init != "trunc_normal":  # only when set: the config it always had otherwise
            config["init"] = self.init
        return config


@keras.saving.register_keras_serializable(package="caco_tf")
class Tokens(layers.Layer):
    """The patch grid ``[B, h, w, D]`` → the token sequence ``[B, 1 + R + h·w, D]``: the class
    token first, then the R register tokens, then the patches row by row; the class token and
    the patches each plus its position embedding (DINOv2's order: registers have none).

    ``positions``: ``"learned"`` (DINO: a table for the ``grid``×``grid`` patches of the size the
    backbone was built for, resized bicubically for other grids) or ``"sincos"`` (MoCo v3: fixed,
    computed for the grid that arrives; the class token's position is 0).
    ``registers``: DINOv2's ``num_register_tokens`` (0: none).  ``mask_token``: a learned token
    ``call(patches, masks)`` puts in place of the masked patches before their positions
    (DINOv2's, for iBOT).  ``interpolate_offset``, ``interpolate_antialias``: DINOv2's resize of
    the learned table (0.1 and False: DINO's).
    """

    def __init__(self, grid, width, positions="learned", registers=0, mask_token=False,
                 interpolate_offset=DINO_SCALE_OFFSET, interpolate_antialias=False, **kwargs):
        super().__init__(**kwargs)
        if positions not in ("learned", "sincos"):
            raise ValueError(f"positions must be learned or sincos, got {positions!r}")
        if positions == "sincos" and width % 4:
            raise ValueError(f"sine-cosine positions need a width divisible by 4, got {width}")
        if int(registers) < 0 or float(interpolate_offset) < 0:
            raise ValueError(f"registers and interpolate_offset must not be negative, got "
                             f"{registers} and {interpolate_offset}")
        self.grid, self.width, self.positions = int(grid), int(width), positions
        self.registers, self.has_mask_token = int(registers), bool(mask_token)
        self.interpolate_offset = float(interpolate_offset)
        self.interpolate_antialias = bool(interpolate_antialias)

    def build(self, input_shape):
        self.cls_token = self.add_weight(shape=(1, 1, self.width), name="cls_token",
                                         initializer=_truncated_normal())
        if self.positions == "learned":
            self.pos_embed = self.add_weight(
                shape=(1, 1 + self.grid * self.grid, self.width), name="pos_embed",
                initializer=_truncated_normal())
        if self.registers:  # DINOv2's init: normal, std 1e-6
            self.register_tokens = self.add_weight(
                shape=(1, self.registers, self.width), name="register_tokens",
                initializer=keras.initializers.RandomNormal(stddev=1e-6))
        if self.has_mask_token:
            self.mask_token = self.add_weight(shape=(1, self.width), name="mask_token",
                                              initializer="zeros")

    def patch_positions(self, rows, cols):
        """``[rows·cols, D]``: the patches' position embeddings for a rows×cols grid."""
        if self.positions == "sincos":
            return ops.cast(sincos_position_embedding(rows, cols, self.width), self.compute_dtype)
        table = ops.cast(self.pos_embed[0, 1:], "float32")
        if isinstance(rows, int) and isinstance(cols, int) and rows == cols == self.grid:
            return ops.cast(table, self.compute_dtype)  # the built size: the table itself
        table = ops.reshape(table, (self.grid, self.grid, self.width))
        resize = (antialiased_cubic_resize_matrix if self.interpolate_antialias
                  else cubic_resize_matrix)
        row_map = resize(self.grid, rows, self._scale(rows))
        col_map = resize(self.grid, cols, self._scale(cols))
        resized = ops.einsum("ri,ijd,cj->rcd", row_map, table, col_map)
        return ops.cast(ops.reshape(resized, (-1, self.width)), self.compute_dtype)

    def _scale(self, size):
        # DINO passes scale_factor (size + 0.1) / grid; PyTorch then reads 1 / scale_factor.
        # DINOv2 without the offset passes the size, and PyTorch reads grid / size.
        return self.grid / (ops.cast(size, "float32") + self.interpolate_offset)

    def class_position(self):
        if self.positions == "sincos":
            return ops.zeros((1, 1, self.width), self.compute_dtype)
        return ops.cast(self.pos_embed[:, :1], self.compute_dtype)

    def call(self, patches, masks=None):
        """``masks``: ``[B, h·w]`` booleans, True where the mask token replaces the patch."""
        shape = ops.shape(patches)
        batch, rows, cols = shape[0], shape[1], shape[2]
        tokens = ops.reshape(patches, (batch, -1, self.width))
        if masks is not None:
            if not self.has_mask_token:
                raise ValueError("masks need a mask token: build the ViT with mask_token=True")
            tokens = ops.where(ops.cast(masks, "bool")[..., None],
                               ops.cast(self.mask_token, tokens.dtype)[None], tokens)
        tokens = tokens + self.patch_positions(rows, cols)[None]
        cls = ops.cast(self.cls_token, tokens.dtype) + self.class_position()
        cls = ops.broadcast_to(cls, (batch, 1, self.width))
        if not self.registers:
            return ops.concatenate([cls, tokens], axis=1)
        registers = ops.broadcast_to(ops.cast(self.register_tokens, tokens.dtype),
                                     (batch, self.registers, self.width))
        return ops.concatenate([cls, registers, tokens], axis=1)

    def compute_output_shape(self, input_shape):
        batch, rows, cols, _ = input_shape
        count = None if rows is None or cols is None else 1 + self.registers + rows * cols
        return (batch, count, self.width)

    def get_config(self):
        config = dict(super().get_config(), grid=self.grid, width=self.width,
                      positions=self.positions)
        # DINOv2's settings only when set: a ViT without them saves the config it always had.
        for key, value, default in (
                ("registers", self.registers, 0), ("mask_token", self.has_mask_token, False),
                ("interpolate_offset", self.interpolate_offset, DINO_SCALE_OFFSET),
                ("interpolate_antialias", self.interpolate_antialias, False)):
            if value != default:
                config[key] = value
        return config


@keras.saving.register_keras_serializable(package="caco_tf")
class GELU(layers.Layer):
    """PyTorch's ``nn.GELU``, the exact one: x·Φ(x) = ½x(1 + erf(x/√2)), written with erf
    (TensorFlow's exact gelu uses erfc, which ONNX lacks)."""

    def call(self, x):
        return 0.5 * x * (1.0 + ops.erf(x * 0.7071067811865476))


@keras.saving.register_keras_serializable(package="caco_tf")
class DropPath(layers.Layer):
    """Stochastic depth: a sample's whole branch dropped with probability ``rate``, the kept
    ones scaled by 1/(1 - rate) (DINO's ``drop_path``).

    The masks come from a stateless generator keyed by ``seed``, a count of the draws and the
    replica: the count is a weight, so a resumed run draws the masks the uninterrupted run
    would have (Keras' Dropout keeps its generator's state outside the saved weights).
    """

    def __init__(self, rate=0.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.rate = float(rate)
        self.seed = int(np.random.randint(2 ** 31 - 1) if seed is None else seed)

    def build(self, input_shape):
        self.draws = self.add_weight(shape=(), dtype="int64", initializer="zeros",
                                     trainable=False, name="draws",
                                     aggregation="only_first_replica")

    def call(self, x, training=None):
        if not training or self.rate == 0.0:
            return x
        context = tf.distribute.get_replica_context()  # None across replicas: one draw
        replica = context.replica_id_in_sync_group if context is not None else 0
        key = tf.stack([tf.constant(self.seed, tf.int64),
                        self.draws * 4096 + tf.cast(replica, tf.int64)])
        self.draws.assign_add(1)
        draw = tf.random.stateless_uniform((tf.shape(x)[0], 1, 1), key, dtype=x.dtype)
        keep = tf.floor(1.0 - self.rate + draw)
        return x / (1.0 - self.rate) * keep

    def get_config(self):
        return dict(super().get_config(), rate=self.rate, seed=self.seed)


@keras.saving.register_keras_serializable(package="caco_tf")
class LayerScale(layers.Layer):
    """``x · γ``, a learned scale per channel started at ``init_value`` (CaiT's LayerScale,
    DINOv2's ``ls1``/``ls2``: 1e-5 to train from scratch; its hub models, for its released
    weights, 1)."""

    def __init__(self, width, init_value, **kwargs):
        super().__init__(**kwargs)
        self.width, self.init_value = int(width), float(init_value)

    def build(self, input_shape):
        self.gamma = self.add_weight(shape=(self.width,), name="gamma",
                                     initializer=keras.initializers.Constant(self.init_value))

    def call(self, x):
        return x * ops.cast(self.gamma, x.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return dict(super().get_config(), width=self.width, init_value=self.init_value)


@keras.saving.register_keras_serializable(package="caco_tf")
class TransformerBlock(layers.Layer):
    """A pre-norm block: ``x + DropPath(Attention(LN(x)))``, then ``x + DropPath(MLP(LN(x)))``.

    Attention: one Linear gives q, k, v for every head (``attn_qkv``), softmax(q·kᵀ/√d_head)
    weighs v, a Linear mixes the heads (``attn_proj``).  DropPath (stochastic depth) drops a
    sample's whole branch with probability ``drop_path``, the kept ones scaled by 1/(1 - p).
    ``layer_scale`` > 0: each branch scaled per channel before the sum (DINOv2's
    ``x + DropPath(ls1(Attention(LN(x))))``), the scales started at that value; 0: none.
    """

    def __init__(self, width, heads, mlp_ratio=4.0, drop_path=0.0, layer_scale=0.0,
                 init="trunc_normal", **kwargs):
        super().__init__(**kwargs)
        if width % heads:
            raise ValueError(f"the width {width} must be divisible by the heads {heads}")
        self.width, self.heads = int(width), int(heads)
        self.mlp_ratio, self.drop_path = float(mlp_ratio), float(drop_path)
        self.init = init
        dense = dict(kernel_initializer=_linear_initializer(init), bias_initializer="zeros")
        self.norm1 = layers.LayerNormalization(epsilon=1e-6, name="norm1")
        self.attn_qkv = layers.Dense(3 * self.width, name="attn_qkv", **dense)
        self.attn_proj = layers.Dense(self.width, name="attn_proj", **dense)
        self.norm2 = layers.LayerNormalization(epsilon=1e-6, name="norm2")
        self.mlp_fc1 = layers.Dense(int(self.width * self.mlp_ratio), name="mlp_fc1", **dense)
        self.mlp_act = GELU(name="mlp_act")
        self.mlp_fc2 = layers.Dense(self.width, name="mlp_fc2", **dense)
        self.drop = DropPath(self.drop_path, name="drop_path")
        self.layer_scale = float(layer_scale)
        if self.layer_scale:
            self.ls1 = LayerScale(self.width, self.layer_scale, name="ls1")
            self.ls2 = LayerScale(self.width, self.layer_scale, name="ls2")

    def build(self, input_shape):
        hidden = (input_shape[0], input_shape[1], int(self.width * self.mlp_ratio))
        self.norm1.build(input_shape)
        self.attn_qkv.build(input_shape)
        self.attn_proj.build(input_shape)
        self.norm2.build(input_shape)
        self.mlp_fc1.build(input_shape)
        self.mlp_fc2.build(hidden)
        self.drop.build(input_shape)
        if self.layer_scale:
            self.ls1.build(input_shape)
            self.ls2.build(input_shape)

    def attention(self, x):
        """The heads' attention weights ``[B, heads, N, N]`` and their mixed output ``[B, N, D]``."""
        batch, count = ops.shape(x)[0], ops.shape(x)[1]
        head_width = self.width // self.heads
        qkv = ops.reshape(self.attn_qkv(x), (batch, count, 3, self.heads, head_width))
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # [B, N, heads, d]
        logits = ops.einsum("bnhd,bmhd->bhnm", q, k) * (head_width ** -0.5)
        # The softmax in float32 under mixed precision: its exponentials overflow float16.
        weights = ops.cast(ops.softmax(ops.cast(logits, "float32"), axis=-1), v.dtype)
        mixed = ops.reshape(ops.einsum("bhnm,bmhd->bnhd", weights, v),
                            (batch, count, self.width))
        return weights, self.attn_proj(mixed)

    def call(self, x, training=None, return_attention=False):
        weights, attended = self.attention(self.norm1(x))
        if return_attention:
            return weights
        if self.layer_scale:
            attended = self.ls1(attended)
        x = x + self.drop(attended, training=training)
        hidden = self.mlp_fc2(self.mlp_act(self.mlp_fc1(self.norm2(x))))
        if self.layer_scale:
            hidden = self.ls2(hidden)
        return x + self.drop(hidden, training=training)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = dict(super().get_config(), width=self.width, heads=self.heads,
                      mlp_ratio=self.mlp_ratio, drop_path=self.drop_path)
        if self.layer_scale:  # only when set: a block without it saves the config it always had
            config["layer_scale"] = self.layer_scale
        if self.init != "trunc_normal":
            config["init"] = self.init
        return config


@keras.saving.register_keras_serializable(package="caco_tf")
class ClassToken(layers.Layer):
    """``[B, N, D]`` → the class token ``[B, D]`` (the features of a ViT)."""

    def call(self, tokens):
        return tokens[:, 0]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[2])


def build_vit(name, input_shape: Tuple[Optional[int], Optional[int], int],
              image_size: Optional[int] = None, drop_path: float = 0.0,
              positions: str = "learned", frozen_patch_embedding: bool = False,
              layer_scale: float = 0.0, registers: int = 0, mask_token: bool = False,
              interpolate_offset: float = DINO_SCALE_OFFSET,
              interpolate_antialias: bool = False,
              drop_path_uniform: bool = False, init: str = "trunc_normal") -> keras.Model:
    """The ViT ``name`` (``VIT_PRESETS``, or a ``ViTShape``) on images ``input_shape``, its
    features the class token's.

    ``image_size``: the side the learned position table is made for (the input's side when
    it is fixed; required when it is not, as with multi-crop).  ``drop_path``: the last block's
    stochastic-depth rate, the others' rising linearly from 0 (DINO: 0.1 for ViT-S).
    ``frozen_patch_embedding``: MoCo v3's random patch projection, never trained
    (``stop_grad_conv1``).  ``layer_scale``, ``registers``, ``mask_token``,
    ``interpolate_offset``, ``interpolate_antialias``: DINOv2's (``TransformerBlock``,
    ``Tokens``); ``drop_path_uniform``: every block at the ``drop_path`` rate (DINOv2's
    ``drop_path_uniform``); their defaults leave DINO's ViT.  ``init``: the initial weights
    (``VIT_INITS``: DINO's ``trunc_normal`` or MAE's ``xavier``).
    """
    if init not in VIT_INITS:
        raise ValueError(f"a ViT's init is one of {', '.join(VIT_INITS)}, got {init!r}")
    shape, name = (name, "vit") if isinstance(name, ViTShape) else (VIT_PRESETS[name], name)
    height, width, _ = input_shape
    size = image_size or height
    if size is None or (height is not None and width is not None and height != width):
        raise ValueError(f"{name} needs a square image size for its position table, got "
                         f"input_shape {tuple(input_shape)} and image_size {image_size}")
    grid = int(size) // shape.patch
    if grid < 1:
        raise ValueError(f"{name}'s patch {shape.patch} is larger than the image ({size} px)")
    inputs = keras.Input(shape=tuple(input_shape), dtype="float32", name="images")
    patch_embed = PatchEmbedding(shape.patch, shape.width, init=init, name="patch_embed")
    patch_embed.trainable = not frozen_patch_embedding
    x = Tokens(grid, shape.width, positions, registers=registers, mask_token=mask_token,
               interpolate_offset=interpolate_offset, interpolate_antialias=interpolate_antialias,
               name="tokens")(patch_embed(inputs))
    rates = np.linspace(0.0, float(drop_path), shape.depth)  # DINO's dpr
    if drop_path_uniform:  # DINOv2's drop_path_uniform
        rates = np.full(shape.depth, float(drop_path))
    for index in range(shape.depth):
        x = TransformerBlock(shape.width, shape.heads, drop_path=float(rates[index]),
                             layer_scale=layer_scale, init=init, name=f"blocks_{index}")(x)
    x = layers.LayerNormalization(epsilon=1e-6, name="norm")(x)
    return keras.Model(inputs, ClassToken(name="class_token")(x), name=name)


def is_vit_backbone(backbone):
    """Whether ``backbone`` (a Keras model) is a ViT ``build_vit`` built: by name (``vit_*``),
    or made from a KerasHub DINOV2Backbone preset."""
    names = {layer.name for layer in backbone.layers}
    return {"patch_embed", "tokens", "norm"} <= names and any(
        isinstance(layer, TransformerBlock) for layer in backbone.layers)


def vit_blocks(backbone):
    """A ViT backbone's parts in order: the patch embedding, the tokens, the blocks, the norm
    (found by name, as ``build_vit`` names them)."""
    blocks = [layer for layer in backbone.layers if isinstance(layer, TransformerBlock)]
    return (backbone.get_layer("patch_embed"), backbone.get_layer("tokens"), blocks,
            backbone.get_layer("norm"))


def class_attention(backbone, images):
    """``[B, heads, h, w]``: the last block's attention of the class token to every patch
    (inference mode), as DINO's ``get_last_selfattention(...)[:, :, 0, 1:]``."""
    patch_embed, tokens, blocks, _ = vit_blocks(backbone)
    grid = patch_embed(images)
    rows, cols = ops.shape(grid)[1], ops.shape(grid)[2]
    x = tokens(grid)
    for block in blocks[:-1]:
        x = block(x, training=False)
    weights = blocks[-1](x, training=False, return_attention=True)
    heads = ops.shape(weights)[1]
    # The patches follow the class token and the registers.
    return ops.reshape(weights[:, :, 0, 1 + tokens.registers:], (-1, heads, rows, cols))


def smallest_fraction_mask(attention, fraction=0.6):
    """Per map, the smallest set of patches holding ``fraction`` of the attention (DINO's
    thresholded maps, ``visualize_attention.py``): 1 where kept.  NumPy ``[..., h, w]``."""
    attention = np.asarray(attention, dtype=np.float64)
    flat = attention.reshape(-1, attention.shape[-2] * attention.shape[-1])
    flat = flat / flat.sum(axis=1, keepdims=True)
    order = np.argsort(-flat, axis=1, kind="stable")
    cumulative = np.cumsum(np.take_along_axis(flat, order, axis=1), axis=1)
    # A patch is kept while the mass before it is below the fraction (DINO: cumval > 1 - t on
    # the ascending sort, which keeps the same patches).
    keep_sorted = (cumulative - np.take_along_axis(flat, order, axis=1)) < fraction
    mask = np.zeros_like(flat)
    np.put_along_axis(mask, order, keep_sorted.astype(np.float64), axis=1)
    return mask.reshape(attention.shape)


def patch_count(name: str, image_size: int) -> int:
    """The side of the patch grid an ``image_size`` crop leaves (0 when the patch is larger)."""
    return int(image_size) // VIT_PRESETS[name].patch


def flops_per_image(name: str, image_size: int, channels: int = 3) -> int:
    """Multiply-adds ×2 of one image through the ViT (patch embedding, every block's matmuls
    and attention), the figure BENCHMARKS.md counts; norms and softmax left out."""
    shape = VIT_PRESETS[name]
    tokens = 1 + patch_count(name, image_size) ** 2
    patches = (tokens - 1) * shape.patch * shape.patch * channels * shape.width
    return 2 * (patches + shape.depth * sum(_block_multiply_adds(name, image_size)))


def _block_multiply_adds(name, image_size):
    """(attention, matmuls): one block's multiply-adds of q·kᵀ and weights × v, and of the
    q/k/v, output and MLP matmuls."""
    d, tokens = VIT_PRESETS[name].width, 1 + patch_count(name, image_size) ** 2
    return 2 * tokens * tokens * d, tokens * d * d * (3 + 1 + 8)


def attention_share(name, image_size):
    """The attention's share of one block's FLOPs at ``image_size``."""
    attention, matmuls = _block_multiply_adds(name, image_size)
    return attention / (attention + matmuls)

