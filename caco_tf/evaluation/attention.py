"""DINO's self-attention maps of a ViT run (``caco-figures attention``).

For each image: the class token's attention to every patch in each head of the last block
(``vit.class_attention``), upsampled over the image (nearest, one patch to p×p pixels, as
DINO's ``visualize_attention.py``), and the thresholded map DINO's paper shows: the smallest
set of patches that holds ``fraction`` (60 %) of each head's attention.  One PNG per image
(the image, then a row of heads' maps and a row of their masks over the image) and one contact
sheet of every image with its heads' mean map and the union of the heads' masks.
"""

import os

import numpy as np
import tensorflow as tf

from caco_tf.build import load_run
from caco_tf.data.images import resize_and_center_crop, to_unit_float
from caco_tf.errors import ConfigError
from caco_tf.evaluation import protocols
from caco_tf.nets import vit
from caco_tf.serving.extraction import read_image, list_image_files

__all__ = ["attention_figures", "attention_maps"]


def attention_maps(backbone, images, patch, fraction=0.6):
    """``images`` (normalized, [B, S, S, C]) → (maps [B, heads, S', S'] upsampled to the
    patches' pixels, masks of the same shape: 1 on the smallest patch sets holding
    ``fraction``)."""
    attention = np.asarray(vit.class_attention(backbone, tf.constant(images, tf.float32)))
    masks = vit.smallest_fraction_mask(attention, fraction)
    upsample = lambda a: np.repeat(np.repeat(a, patch, axis=-2), patch, axis=-1)  # noqa: E731
    return upsample(attention), upsample(masks)


def _image_files(path):
    if os.path.isfile(path):
        return [path]
    if os.path.isdir(path):
        return list_image_files(path)
    raise ConfigError(f"--images {path}: no such file or folder")


def attention_figures(run_dir, images_path, out_dir=None, fraction=0.6):
    """Write ``<image>_attention.png`` for each image under ``images_path`` (a file or a
    folder) and ``attention_sheet.png`` into ``out_dir`` (default RUN/figures/attention); the
    paths written."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"--fraction must be between 0 and 1, got {fraction}")
    run = load_run(run_dir)
    config = run.config
    backbone_name = config["model"]["backbone"]
    # A KerasHub DINOV2Backbone preset (keras_hub:DIR) trains as caco_tf's ViT too.
    if not vit.is_vit_backbone(run.model.backbone):
        raise ConfigError(f"attention maps need a ViT run (model.backbone vit_*), and "
                          f"{run_dir} trained {backbone_name}")
    files = _image_files(images_path)
    preprocessing = protocols.preprocessing_for(config, views=run.views)
    size, channels = preprocessing.image_size, preprocessing.channels
    patch = vit.vit_blocks(run.model.backbone)[0].patch
    out_dir = out_dir or os.path.join(run_dir, "figures", "attention")
    os.makedirs(out_dir, exist_ok=True)

    shown, paths = [], []
    for path in files:
        pixels = read_image(path)
        if pixels is None:
            print(f"warning: passed over {path}: not a readable image")
            continue
        image = resize_and_center_crop(to_unit_float(pixels)[None], size)
        if channels == 1:
            image = tf.image.rgb_to_grayscale(image)
        maps, masks = attention_maps(run.model.backbone, preprocessing.normalize(image), patch,
                                     fraction)
        picture = image[0].numpy()
        shown.append((os.path.basename(path), picture, maps[0], masks[0]))
        paths.append(_plot_heads(pyplot, picture, maps[0], masks[0], fraction, os.path.join(
            out_dir, os.path.splitext(os.path.basename(path))[0] + "_attention.png")))
    if not shown:
        raise ConfigError(f"--images {images_path}: none of the images could be read")
    paths.append(_plot_sheet(pyplot, shown, fraction, os.path.join(out_dir,
                                                                   "attention_sheet.png")))
    return paths


def _show(axis, picture):
    axis.imshow(picture.squeeze(-1) if picture.shape[-1] == 1 else picture,
                cmap="gray" if picture.shape[-1] == 1 else None, vmin=0, vmax=1)
    axis.set_axis_off()


def _overlay(axis, picture, mask):
    _show(axis, picture)
    axis.imshow(np.ma.masked_where(mask > 0, mask), cmap="gray", alpha=0.7, vmin=0, vmax=1)


def _plot_heads(pyplot, picture, maps, masks, fraction, path):
    heads = maps.shape[0]
    figure, axes = pyplot.subplots(2, heads + 1, figsize=(2 * (heads + 1), 4.2), squeeze=False)
    _show(axes[0, 0], picture)
    axes[0, 0].set_title("image", fontsize=8)
    axes[1, 0].set_axis_off()
    for head in range(heads):
        axes[0, head + 1].imshow(maps[head], cmap="viridis")
        axes[0, head + 1].set_axis_off()
        axes[0, head + 1].set_title(f"head {head}", fontsize=8)
        _overlay(axes[1, head + 1], picture, masks[head])
        axes[1, head + 1].set_title(f"{fraction:.0%} of its attention", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path


def _plot_sheet(pyplot, shown, fraction, path):
    rows = len(shown)
    figure, axes = pyplot.subplots(rows, 3, figsize=(6, 2 * rows), squeeze=False)
    for row, (name, picture, maps, masks) in enumerate(shown):
        _show(axes[row, 0], picture)
        axes[row, 0].set_title(name, fontsize=7)
        axes[row, 1].imshow(maps.mean(axis=0), cmap="viridis")
        axes[row, 1].set_axis_off()
        axes[row, 1].set_title("mean of the heads", fontsize=7)
        _overlay(axes[row, 2], picture, masks.max(axis=0))
        axes[row, 2].set_title(f"any head's {fraction:.0%}", fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path
