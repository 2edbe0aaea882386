"""The size of the last feature map each backbone leaves of an S×S image, from the kernel,
stride and padding of its downsampling layers (``backbones`` builds exactly these; a test
checks the two agree).  Plain Python: a configuration is checked before anything is built."""

# (kernel, stride, padding) of every layer that changes the map's size, in order.
_RESNET_STEM = [(7, 2, 3), (3, 2, 1)]        # conv1, max-pool
_RESNET_STAGES = [(3, 2, 1)] * 3             # the first 3x3 conv of stages 2, 3 and 4
DOWNSAMPLING = {  # every backbone ``backbones`` builds (the configuration's choices)
    "small_convnet": [(3, 1, 1), (3, 2, 1), (3, 2, 1), (3, 2, 1)],
    "cifar_resnet18": [(3, 1, 1)] + _RESNET_STAGES,
    "resnet18": _RESNET_STEM + _RESNET_STAGES,
    "resnet50": _RESNET_STEM + _RESNET_STAGES,
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
