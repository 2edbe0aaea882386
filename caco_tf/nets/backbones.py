"""Backbone encoders and the projection MLP used by CaCo.

Every backbone maps float32 images ``[B, H, W, C]`` (already normalized) to
pooled features ``[B, F]``; the pooling is part of the backbone: global average
pooling (F = the last width), or with ``pool_grid=g`` the average over each cell
of a g×g grid of the last feature map, flattened (F = g²·width), which keeps the
coarse layout that global pooling discards.

Layout and layer names follow torchvision (``'.'`` replaced by ``'_'``), e.g.
``conv1``, ``bn1``, ``layer1_0_conv1``, ``layer1_0_downsample_0``. That lets a
PyTorch checkpoint importer map parameters one to one. Only the layers that
hold parameters need torch names; the parameter-free helper layers (padding,
ReLU, add) get derived names because Keras requires unique names.

Everything is plain ``keras.layers`` in the functional API, so the models
work under ``tf.distribute.MirroredStrategy`` and export to SavedModel.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence, Tuple

import keras
from keras import layers

from caco_tf.nets import vit
from caco_tf.nets.layers import BatchNormalization

__all__ = ["BACKBONE_NAMES", "build_backbone", "build_mlp", "build_projector"]

# torch's BatchNorm defaults: torch momentum 0.1 weights the *new* batch
# statistic, Keras momentum weights the *old* moving value, so 1 - 0.1 = 0.9.
_BN_MOMENTUM = 0.9
_BN_EPSILON = 1e-5


def _conv_init() -> keras.initializers.Initializer:
    """torch's ``kaiming_normal_(mode='fan_out', nonlinearity='relu')``.

    Keras' fan_out for a conv kernel (kh, kw, in, out) is kh*kw*out, the same
    as torch's; 'untruncated_normal' matches torch's plain normal draw.
    """
    return keras.initializers.VarianceScaling(
        scale=2.0, mode="fan_out", distribution="untruncated_normal"
    )


def _dense_init() -> keras.initializers.Initializer:
    """torch's default ``nn.Linear`` weight init: U(-1/sqrt(fan_in), +1/sqrt(fan_in)).

    VarianceScaling's uniform limit is sqrt(3 * scale / fan_in); scale=1/3
    gives exactly 1/sqrt(fan_in).
    """
    return keras.initializers.VarianceScaling(
        scale=1.0 / 3.0, mode="fan_in", distribution="uniform"
    )


def _batch_norm(name: str, sync: bool) -> layers.BatchNormalization:
    """BatchNorm with torch defaults; ``sync`` reduces statistics across replicas."""
    return BatchNormalization(
        momentum=_BN_MOMENTUM,
        epsilon=_BN_EPSILON,
        synchronized=sync,
        name=name,
    )


def _conv_bn(
    x,
    filters: int,
    kernel_size: int,
    stride: int,
    conv_name: str,
    bn_name: str,
    sync: bool,
    relu: bool = True,
):
    """Conv (no bias) -> BN -> optional ReLU with torch-style padding.

    torch pads ``kernel_size // 2`` on every side. Keras 'same' padding is
    asymmetric for stride 2 on even inputs (it pads bottom/right only), which
    would shift the sampling grid relative to torch; explicit ZeroPadding2D
    followed by a 'valid' conv reproduces torch's arithmetic exactly.
    """
    pad = kernel_size // 2
    if pad:
        x = layers.ZeroPadding2D(padding=pad, name=f"{conv_name}_pad")(x)
    x = layers.Conv2D(
        filters,
        kernel_size,
        strides=stride,
        padding="valid",
        use_bias=False,  # the following BN's beta makes a bias redundant
        kernel_initializer=_conv_init(),
        name=conv_name,
    )(x)
    x = _batch_norm(bn_name, sync)(x)
    if relu:
        x = layers.ReLU(name=f"{bn_name}_relu")(x)
    return x


def _downsample(x, filters: int, stride: int, prefix: str, sync: bool):
    """Projection shortcut: 1x1 conv (stride ``stride``) + BN, torch's ``downsample``."""
    return _conv_bn(
        x,
        filters,
        kernel_size=1,
        stride=stride,
        conv_name=f"{prefix}_downsample_0",
        bn_name=f"{prefix}_downsample_1",
        sync=sync,
        relu=False,
    )


def _basic_block(x, planes: int, stride: int, prefix: str, sync: bool):
    """torchvision ``BasicBlock`` (expansion 1): two 3x3 convs + shortcut."""
    in_channels = x.shape[-1]
    shortcut = x
    if stride != 1 or in_channels != planes:
        shortcut = _downsample(x, planes, stride, prefix, sync)

    y = _conv_bn(x, planes, 3, stride, f"{prefix}_conv1", f"{prefix}_bn1", sync)
    y = _conv_bn(
        y, planes, 3, 1, f"{prefix}_conv2", f"{prefix}_bn2", sync, relu=False
    )
    y = layers.Add(name=f"{prefix}_add")([y, shortcut])
    return layers.ReLU(name=f"{prefix}_out")(y)


def _bottleneck(x, planes: int, stride: int, prefix: str, sync: bool):
    """torchvision ``Bottleneck`` (expansion 4), ResNet "v1.5" layout.

    The stride sits in the 3x3 conv (conv2), not the first 1x1 conv, which is
    what torchvision does and what pretrained checkpoints expect.
    """
    expansion = 4
    out_channels = planes * expansion
    in_channels = x.shape[-1]
    shortcut = x
    if stride != 1 or in_channels != out_channels:
        shortcut = _downsample(x, out_channels, stride, prefix, sync)

    y = _conv_bn(x, planes, 1, 1, f"{prefix}_conv1", f"{prefix}_bn1", sync)
    y = _conv_bn(y, planes, 3, stride, f"{prefix}_conv2", f"{prefix}_bn2", sync)
    y = _conv_bn(
        y, out_channels, 1, 1, f"{prefix}_conv3", f"{prefix}_bn3", sync, relu=False
    )
    y = layers.Add(name=f"{prefix}_add")([y, shortcut])
    return layers.ReLU(name=f"{prefix}_out")(y)


def _resnet_stages(
    x,
    block: Callable,
    blocks_per_stage: Sequence[int],
    widths: Sequence[int],
    sync: bool,
):
    """Stack the four residual stages; stage 1 keeps resolution, 2-4 halve it."""
    for stage_idx, (num_blocks, width) in enumerate(zip(blocks_per_stage, widths)):
        first_stride = 1 if stage_idx == 0 else 2
        for block_idx in range(num_blocks):
            x = block(
                x,
                width,
                stride=first_stride if block_idx == 0 else 1,
                prefix=f"layer{stage_idx + 1}_{block_idx}",
                sync=sync,
            )
    return x


def _pool(x, grid=1):
    """[B, h, w, C] → [B, grid²·C]: the mean over each cell of a grid×grid partition of the
    map (torch's AdaptiveAvgPool2d(grid) cells), flattened; grid 1 is global average pooling."""
    if grid == 1:
        return layers.GlobalAveragePooling2D(name="avgpool")(x)
    x = layers.AdaptiveAveragePooling2D(grid, name="avgpool_grid")(x)
    return layers.Flatten(name="avgpool")(x)


def _input(input_shape: Tuple[int, int, int]):
    return keras.Input(shape=tuple(input_shape), dtype="float32", name="images")


def _imagenet_stem(inputs, sync: bool):
    """torchvision's ImageNet stem: 7x7/2 conv (pad 3) -> BN -> ReLU -> 3x3/2 max-pool (pad 1)."""
    x = _conv_bn(inputs, 64, 7, 2, "conv1", "bn1", sync)
    # torch pads the max-pool with -inf; after ReLU all values are >= 0, so
    # zero padding yields the same maxima.
    x = layers.ZeroPadding2D(padding=1, name="maxpool_pad")(x)
    return layers.MaxPooling2D(pool_size=3, strides=2, padding="valid", name="maxpool")(x)


def _build_resnet50(input_shape, sync: bool, pool_grid: int = 1) -> keras.Model:
    """torchvision ResNet-50 without ``fc``: 23,508,032 parameters, F = 2048."""
    inputs = _input(input_shape)
    x = _resnet_stages(_imagenet_stem(inputs, sync), _bottleneck, [3, 4, 6, 3],
                       [64, 128, 256, 512], sync)
    return keras.Model(inputs, _pool(x, pool_grid), name="resnet50")


def _build_resnet18(input_shape, sync: bool, pool_grid: int = 1) -> keras.Model:
    """torchvision ResNet-18 without ``fc`` (ImageNet stem: 7x7/2 conv, 3x3/2 max-pool),
    F = 512: for images of 64 px and more (a 96 px input ends at 3x3)."""
    inputs = _input(input_shape)
    x = _resnet_stages(_imagenet_stem(inputs, sync), _basic_block, [2, 2, 2, 2],
                       [64, 128, 256, 512], sync)
    return keras.Model(inputs, _pool(x, pool_grid), name="resnet18")


def _build_cifar_resnet18(input_shape, sync: bool, pool_grid: int = 1) -> keras.Model:
    """CIFAR ResNet-18: 3x3/1 stem and no max-pool keep 32 px inputs usable, F = 512."""
    inputs = _input(input_shape)
    x = _conv_bn(inputs, 64, 3, 1, "conv1", "bn1", sync)
    x = _resnet_stages(x, _basic_block, [2, 2, 2, 2], [64, 128, 256, 512], sync)
    return keras.Model(inputs, _pool(x, pool_grid), name="cifar_resnet18")


SMALL_CONVNET_WIDTHS = (32, 64, 128, 256)


def _build_small_convnet(input_shape, sync: bool, widths=None, pool_grid: int = 1
                         ) -> keras.Model:
    """Tiny 4-layer convnet (widths 32-64-128-256, strides 1-2-2-2) for fast CPU runs.

    F = pool_grid² × the last width (256 with global pooling; a 28 px input ends at 4×4).
    """
    widths = tuple(int(w) for w in (widths or SMALL_CONVNET_WIDTHS))
    if len(widths) != 4 or min(widths) < 1:
        raise ValueError(f"small_convnet takes 4 positive widths, got {list(widths)}")
    inputs = _input(input_shape)
    x = inputs
    for i, (filters, stride) in enumerate(zip(widths, [1, 2, 2, 2])):
        x = _conv_bn(x, filters, 3, stride, f"conv{i + 1}", f"bn{i + 1}", sync)
    return keras.Model(inputs, _pool(x, pool_grid), name="small_convnet")


# name -> (builder, default input shape)
_BACKBONES: Dict[str, Tuple[Callable[..., keras.Model], Tuple[int, int, int]]] = {
    "resnet50": (_build_resnet50, (224, 224, 3)),
    "resnet18": (_build_resnet18, (96, 96, 3)),
    "cifar_resnet18": (_build_cifar_resnet18, (32, 32, 3)),
    "small_convnet": (_build_small_convnet, (28, 28, 1)),
}

#: Names accepted by :func:`build_backbone`.
BACKBONE_NAMES: Tuple[str, ...] = tuple(_BACKBONES) + tuple(vit.VIT_PRESETS)


def build_backbone(
    name: str,
    input_shape: Optional[Tuple[int, int, int]] = None,
    sync_batchnorm: bool = False,
    widths: Optional[Sequence[int]] = None,
    pool_grid: int = 1,
    image_size: Optional[int] = None,
    drop_path: float = 0.0,
    position_embedding: str = "learned",
    frozen_patch_embedding: bool = False,
    hub_arguments: Optional[dict] = None,
    vit_options: Optional[dict] = None,
) -> keras.Model:
    """Build a backbone mapping images ``[B, H, W, C]`` to features ``[B, F]``.

    Args:
      name: one of :data:`BACKBONE_NAMES` (``"resnet50"`` F=2048, ``"resnet18"`` F=512,
        ``"cifar_resnet18"`` F=512, ``"small_convnet"`` F=256, times ``pool_grid²``).
      input_shape: ``(H, W, C)``; ``None`` uses the backbone's natural size
        (224x224x3, 32x32x3 and 28x28x1 respectively).
      sync_batchnorm: use ``BatchNormalization(synchronized=True)`` so batch
        statistics are computed over the global batch in multi-device runs.
      widths: ``small_convnet``'s four conv widths (F = the last); ``None``: its
        default.  The ResNets have fixed widths.
      pool_grid: 1 for global average pooling; g > 1 averages each cell of a g×g grid of the
        last feature map and flattens them (the map must be at least g×g).
      image_size, drop_path, position_embedding, frozen_patch_embedding: a ViT's
        (``vit.build_vit``: ``vit_*`` names give the class token's features, F = the width).
      hub_arguments: ``keras_hub:CLASS``'s arguments (``serving.hub``: a KerasHub backbone).
      vit_options: a ViT's DINOv2 options (``vit.build_vit``'s ``layer_scale``, ``registers``,
        ``mask_token``, ``interpolate_offset``, ``interpolate_antialias``); also a KerasHub
        ``DINOV2Backbone`` preset's, which becomes such a ViT (``hub.build_hub_backbone``).

    Raises:
      ValueError: if ``name`` is not a known backbone or ``pool_grid`` is not positive.
    """
    if isinstance(name, str) and name.startswith("keras_hub:"):
        from caco_tf.nets import hub  # the optional extra, only when asked for

        return hub.build_hub_backbone(name, input_shape or (224, 224, 3), hub_arguments,
                                      image_size=image_size, drop_path=drop_path,
                                      vit_options=vit_options)
    if vit.is_vit(name):
        if widths is not None or int(pool_grid) != 1:
            raise ValueError(f"{name} takes neither widths nor a pool_grid above 1")
        return vit.build_vit(name, input_shape or (224, 224, 3), image_size=image_size,
                             drop_path=drop_path, positions=position_embedding,
                             frozen_patch_embedding=frozen_patch_embedding,
                             **(vit_options or {}))
    if drop_path or position_embedding != "learned" or frozen_patch_embedding or vit_options:
        raise ValueError(f"drop_path, position_embedding, frozen_patch_embedding and the "
                         f"vit_options apply to the vit_* backbones, not {name!r}")
    if name not in _BACKBONES:
        raise ValueError(
            f"Unknown backbone {name!r}; known backbones: {', '.join(BACKBONE_NAMES)}"
        )
    builder, default_shape = _BACKBONES[name]
    options = {"pool_grid": int(pool_grid)}
    if options["pool_grid"] < 1:
        raise ValueError(f"pool_grid must be a positive integer, got {pool_grid}")
    if widths is not None:
        if name != "small_convnet":
            raise ValueError(f"widths apply to small_convnet only, not {name!r}")
        options["widths"] = widths
    return builder(input_shape or default_shape, sync=bool(sync_batchnorm), **options)


def build_projector(
    input_dim: int,
    hidden_dim: int = 2048,
    output_dim: int = 256,
    sync_batchnorm: bool = False,
    name: str = "projector",
) -> keras.Model:
    """CaCo's 3-layer projection MLP.

    Linear(no bias) -> BN -> ReLU -> Linear(no bias) -> BN -> ReLU ->
    Linear(no bias). The output has no BN and is not normalized; the caller
    L2-normalizes it. Layer names are the indices of the torch
    ``nn.Sequential`` (Linear at 0/3/6, BatchNorm1d at 1/4, ReLU at 2/5).
    """
    return build_mlp(input_dim, hidden_dim, output_dim, sync_batchnorm=sync_batchnorm,
                     name=name)


def build_mlp(
    input_dim: int,
    hidden_dim: int,
    output_dim: int,
    layers_count: int = 3,
    bias: bool = False,
    hidden_batchnorm: bool = True,
    last_batchnorm: Optional[str] = None,
    activation: str = "relu",
    sync_batchnorm: bool = False,
    name: str = "projector",
) -> keras.Model:
    """An MLP head, as the methods' references build their projectors and predictors.

    ``layers_count`` Linear layers; every hidden one followed by BatchNorm (unless
    ``hidden_batchnorm`` is False) and ``activation`` (relu or gelu); the last followed by
    BatchNorm when ``last_batchnorm`` is ``"affine"`` or ``"plain"`` (no scale or shift:
    PyTorch's ``affine=False``).  ``bias``: every Linear has one (a Linear followed by
    BatchNorm never does: BatchNorm's shift replaces it).  Layers are named by their index in
    the torch ``nn.Sequential`` (``fc_0``, ``fc_1``, ...), as ``build_projector``'s.
    """
    inputs = keras.Input(shape=(int(input_dim),), dtype="float32", name="features")
    x, index = inputs, 0

    def dense(width, followed_by_norm):
        nonlocal index
        layer = layers.Dense(width, use_bias=bias and not followed_by_norm,
                             kernel_initializer=_dense_init(), name=f"fc_{index}")
        index += 1
        return layer

    for _ in range(int(layers_count) - 1):
        x = dense(hidden_dim, hidden_batchnorm)(x)
        if hidden_batchnorm:
            x = _batch_norm(f"fc_{index}", sync_batchnorm)(x)
            index += 1
        x = layers.Activation(activation, name=f"fc_{index}")(x) if activation != "relu" \
            else layers.ReLU(name=f"fc_{index}")(x)
        index += 1
    x = dense(output_dim, last_batchnorm is not None)(x)
    if last_batchnorm is not None:
        plain = last_batchnorm == "plain"
        x = BatchNormalization(momentum=_BN_MOMENTUM, epsilon=_BN_EPSILON,
                               synchronized=sync_batchnorm, center=not plain, scale=not plain,
                               name=f"fc_{index}")(x)
    return keras.Model(inputs, x, name=name)
