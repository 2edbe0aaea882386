"""Masks on a ViT's patch grid, drawn per image from the views' stateless seed.

A mask is a boolean ``[rows, cols]`` grid, True where a patch is masked (hidden from the
encoder, or a block to predict).  Two kinds:

- ``RandomMasks`` (MAE, He et al. 2022): exactly ``L - int(L·(1 - ratio))`` of the L patches
  masked, uniformly at random (models_mae.py's ``random_masking``: the patches ranked by a
  uniform noise, the first ``int(L·(1 - ratio))`` kept);
- ``BlockMasks`` (I-JEPA's and iBOT's block-wise masks): ``count`` rectangles, each of
  ``scale`` × L patches in area and ``aspect`` (height / width) drawn uniformly in their
  ranges, its side rounded and clipped to the grid, placed uniformly where it fits (I-JEPA's
  ``MaskCollator._sample_block_size`` and placement).

``MaskedViews`` appends a run's masks to its views: a batch becomes (view 1, ..., view K,
mask 1, ...).  Each mask is a function of the seed the views already take (the image's, or the
batch's for batch views), folded with its own stream number, so a resumed run draws the masks
the uninterrupted one drew, and 1 and R replicas see the same masks as they see the same views.
"""

import dataclasses
from typing import Tuple

import tensorflow as tf

from caco_tf import tracing  # noqa: F401  (autograph leaves caco_tf alone)

# Folded into a view's seed before mask i is drawn (+ i): far from the view numbers 0..K-1
# that the views fold in, so a mask never reuses a view's draws.
MASK_STREAM = 1 << 20


def kept_count(patches, ratio):
    """The patches MAE keeps visible of ``patches`` at masking ``ratio``: int(L·(1 - ratio))."""
    return int(patches * (1.0 - float(ratio)))


def random_masks(seed, batch, rows, cols, ratio):
    """``[batch, rows, cols]`` boolean: per image, exactly L - int(L·(1 - ratio)) of the L
    patches masked, the kept ones those of the lowest uniform noise (MAE's ranking)."""
    patches = rows * cols
    noise = tf.random.stateless_uniform([batch, patches], seed=seed)
    # Each patch's rank in its image's noise order: rank < kept is visible.
    ranks = tf.argsort(tf.argsort(noise, axis=1, stable=True), axis=1, stable=True)
    masked = ranks >= kept_count(patches, ratio)
    return tf.reshape(masked, [batch, rows, cols])


def block_boxes(seed, batch, count, rows, cols, scale, aspect):
    """``[batch, count, 4]`` int32 boxes (top, left, height, width) on a rows × cols grid.

    A block's area is s·L patches, s uniform in ``scale``, its aspect a = height / width
    uniform in ``aspect``: height round(√(s·L·a)), width round(√(s·L / a)), each clipped to
    [1, the grid's side]; its top-left corner uniform over the places it fits."""
    draws = tf.random.stateless_uniform([batch, count, 4], seed=seed)
    area = (scale[0] + (scale[1] - scale[0]) * draws[..., 0]) * float(rows * cols)
    ratio = aspect[0] + (aspect[1] - aspect[0]) * draws[..., 1]
    height = tf.clip_by_value(tf.round(tf.sqrt(area * ratio)), 1.0, float(rows))
    width = tf.clip_by_value(tf.round(tf.sqrt(area / ratio)), 1.0, float(cols))
    # floor(u·(free + 1)) is uniform over 0..free; the min guards u's float rounding to 1.
    top = tf.minimum(tf.floor(draws[..., 2] * (rows - height + 1.0)), rows - height)
    left = tf.minimum(tf.floor(draws[..., 3] * (cols - width + 1.0)), cols - width)
    return tf.cast(tf.stack([top, left, height, width], axis=-1), tf.int32)


def box_masks(boxes, rows, cols):
    """``[..., rows, cols]`` boolean: True inside each box (top, left, height, width)."""
    row = tf.range(rows)[:, None]
    col = tf.range(cols)[None, :]

    def inside(index):
        return boxes[..., index][..., None, None]
    return ((row >= inside(0)) & (row < inside(0) + inside(2))
            & (col >= inside(1)) & (col < inside(1) + inside(3)))


@dataclasses.dataclass(frozen=True)
class RandomMasks:
    """MAE's random masking: ``ratio`` of the patches masked (``random_masks``)."""

    ratio: float = 0.75

    def __post_init__(self):
        if not 0.0 <= self.ratio < 1.0:
            raise ValueError(f"a masking ratio must be in [0, 1), got {self.ratio}")

    def shape(self, rows, cols):
        return [rows, cols]

    def draw(self, seed, batch, rows, cols):
        return random_masks(seed, batch, rows, cols, self.ratio)

    def wording(self):  # the recipes' table (docs/getting-started.md)
        return f"{self.ratio * 100:g} % of the patches masked"


@dataclasses.dataclass(frozen=True)
class BlockMasks:
    """``count`` rectangular blocks per image (``block_boxes``): ``[count, rows, cols]``.
    Defaults: I-JEPA's target blocks (4 of 15-20 % of the image, aspect 0.75-1.5)."""

    count: int = 4
    scale: Tuple[float, float] = (0.15, 0.2)
    aspect: Tuple[float, float] = (0.75, 1.5)

    def __post_init__(self):
        if self.count < 1 or not 0.0 < self.scale[0] <= self.scale[1] <= 1.0 or not (
                0.0 < self.aspect[0] <= self.aspect[1]):
            raise ValueError(f"block masks need count >= 1, 0 < scale <= 1 and aspect > 0 "
                             f"(low <= high), got {self}")

    def shape(self, rows, cols):
        return [self.count, rows, cols]

    def draw(self, seed, batch, rows, cols):
        boxes = block_boxes(seed, batch, self.count, rows, cols, self.scale, self.aspect)
        return box_masks(boxes, rows, cols)

    def wording(self):
        return f"{self.count} block{'s' * (self.count != 1)} masked"


class MaskedViews:
    """``views`` (``caco_tf.data.augment``'s) with ``masks`` (``RandomMasks``, ``BlockMasks``)
    on the ``grid`` (rows, cols) of their first view appended to every image's views."""

    def __init__(self, views, masks, grid):
        self.views, self.masks = views, tuple(masks)
        self.rows, self.cols = (int(side) for side in grid)
        self.mean, self.std = views.mean, views.std
        self.per_image = getattr(views, "per_image", False)
        for name in ("channels", "recipes", "size", "colour"):
            if hasattr(views, name):
                setattr(self, name, getattr(views, name))

    @property
    def num_views(self):
        return self.views.num_views

    def _seed(self, seed, index):
        return tf.random.experimental.stateless_fold_in(seed, MASK_STREAM + index)

    def augment_image(self, image, seed):
        """One image's views, then its masks (each ``[rows, cols]`` or ``[count, rows, cols]``)."""
        drawn = tuple(mask.draw(self._seed(seed, index), 1, self.rows, self.cols)[0]
                      for index, mask in enumerate(self.masks))
        return tuple(self.views.augment_image(image, seed)) + drawn

    def __call__(self, images, seed):
        """A batch's views, then its masks (``[B, ...]``), each image's its own draw."""
        batch = tf.shape(images)[0]
        drawn = tuple(mask.draw(self._seed(seed, index), batch, self.rows, self.cols)
                      for index, mask in enumerate(self.masks))
        return tuple(self.views(images, seed)) + drawn

    def empty(self, channels):
        """What the pipeline ships for an image it drops (a bad file): zeros everywhere."""
        views = (self.views.empty(channels) if hasattr(self.views, "empty") else tuple(
            tf.zeros([r.size, r.size, channels]) for r in self.views.recipes))
        return tuple(views) + tuple(tf.zeros(mask.shape(self.rows, self.cols), tf.bool)
                                    for mask in self.masks)

    def normalize(self, images):
        return self.views.normalize(images)


def grid_of(image_size, patch):
    """The (rows, cols) patch grid an ``image_size`` square leaves at ``patch`` pixels."""
    side = int(image_size) // int(patch)
    if side < 1:
        raise ValueError(f"a {patch} px patch is larger than the {image_size} px image")
    return side, side


__all__ = ["BlockMasks", "MASK_STREAM", "MaskedViews", "RandomMasks", "block_boxes",
           "box_masks", "grid_of", "kept_count", "random_masks"]
