"""The size of the last feature map each backbone leaves of an S×S image, from the kernel,
stride and padding of its downsampling layers (``backbones`` builds exactly these; a test
checks the two agree), and the class a KerasHub preset directory holds.  Plain Python: a
configuration is checked before anything is built."""

import json
import os

# (kernel, stride, padding) of every layer that changes the map's size, in order.
_RESNET_STEM = [(7, 2, 3), (3, 2, 1)]        # conv1, max-pool
_RESNET_STAGES = [(3, 2, 1)] * 3             # the first 3x3 conv of stages 2, 3 and 4

#: The Vision Transformers ``nets.vit`` builds: name -> (patch, width, blocks, heads).  tiny,
#: small and base as DeiT's and DINO's; the patch14 ones as DINOv2's ViT-S/14, B/14 and L/14
#: (its vision_transformer.py: vit_small, vit_base, vit_large), huge_patch14 as I-JEPA's
#: ViT-H/14 (facebookresearch/ijepa's vit_huge); micro_patch4 for 28-32 px images on a CPU
#: (7x7 or 8x8 patches, 4 blocks of width 96).
VIT_SHAPES = {
    "vit_tiny_patch16": (16, 192, 12, 3),
    "vit_small_patch16": (16, 384, 12, 6),
    "vit_small_patch8": (8, 384, 12, 6),
    "vit_base_patch16": (16, 768, 12, 12),
    "vit_base_patch8": (8, 768, 12, 12),
    "vit_small_patch14": (14, 384, 12, 6),
    "vit_base_patch14": (14, 768, 12, 12),
    "vit_large_patch14": (14, 1024, 24, 16),
    "vit_huge_patch14": (14, 1280, 32, 16),
    "vit_micro_patch4": (4, 96, 4, 3),
}

DOWNSAMPLING = {  # every backbone ``backbones`` builds (the configuration's choices)
    "small_convnet": [(3, 1, 1), (3, 2, 1), (3, 2, 1), (3, 2, 1)],
    "cifar_resnet18": [(3, 1, 1)] + _RESNET_STAGES,
    "resnet18": _RESNET_STEM + _RESNET_STAGES,
    "resnet50": _RESNET_STEM + _RESNET_STAGES,
    # A ViT's patch embedding: kernel = stride = the patch (the patch grid is its "map").
    **{name: [(shape[0], shape[0], 0)] for name, shape in VIT_SHAPES.items()},
}


def feature_map_size(backbone, image_size):
    """The last feature map's side for ``image_size``, or 0 when a layer gets too small an
    input for its kernel."""
    size = int(image_size)
    for kernel, stride, padding in DOWNSAMPLING[backbone]:
        if size + 2 * padding < kernel:
            return 0
        size = (size + 2 * padding - kernel) // stride + 1
    return size


def smallest_image(backbone, pool_grid=1):
    """The smallest image side whose last feature map holds a ``pool_grid``×``pool_grid``
    grid."""
    size = 1
    while feature_map_size(backbone, size) < pool_grid:
        size += 1
    return size


def preset_class(directory):
    """The class name a KerasHub preset directory's config.json names (a DINOV2Backbone preset
    becomes a ViT here), or None when it names none."""
    try:
        with open(os.path.join(directory, "config.json"), "rb") as handle:
            config = json.load(handle)
    except (OSError, ValueError):
        return None
    return config.get("class_name") if isinstance(config, dict) else None
