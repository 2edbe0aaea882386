"""Masks on the patch grid (caco_tf.data.masks): each against its definition in NumPy: the exact
count of a random mask, blocks that are rectangles inside the grid of the declared shapes, the
same masks from the same seed (and another from another), and the masks as part of the views
of the input pipeline, the same on a resume."""

import numpy as np
import pytest
import tensorflow as tf

from caco_tf.data import augment, masks, pipeline

SEED = tf.constant([3, 7], tf.int64)


@pytest.mark.parametrize("rows, cols, ratio", [(7, 7, 0.75), (14, 14, 0.75), (8, 6, 0.5),
                                               (7, 7, 0.0), (4, 4, 0.9)])
def test_a_random_mask_masks_exactly_mae_s_count(rows, cols, ratio):
    drawn = masks.random_masks(SEED, 16, rows, cols, ratio).numpy()
    patches = rows * cols
    expected = patches - int(patches * (1 - ratio))  # MAE: len_keep = int(L * (1 - ratio))
    assert drawn.shape == (16, rows, cols) and drawn.dtype == bool
    np.testing.assert_array_equal(drawn.reshape(16, -1).sum(1), expected)
    if 0 < expected < patches:  # the images of a batch are masked differently
        assert len({row.tobytes() for row in drawn}) > 1


def test_the_random_mask_keeps_the_patches_of_lowest_noise():
    """MAE's ranking: the kept patches are those the uniform noise puts first."""
    noise = tf.random.stateless_uniform([4, 49], seed=SEED).numpy()
    drawn = masks.random_masks(SEED, 4, 7, 7, 0.75).numpy().reshape(4, 49)
    kept = np.argsort(noise, axis=1, kind="stable")[:, :12]
    expected = np.ones((4, 49), bool)
    np.put_along_axis(expected, kept, False, axis=1)
    np.testing.assert_array_equal(drawn, expected)


@pytest.mark.parametrize("rows, cols, scale, aspect", [
    (14, 14, (0.15, 0.2), (0.75, 1.5)),   # I-JEPA's target blocks
    (14, 14, (0.85, 1.0), (1.0, 1.0)),    # I-JEPA's context block
    (7, 7, (0.1, 0.5), (0.3, 3.3)),       # iBOT-like
])
def test_blocks_are_rectangles_inside_the_grid_of_the_declared_shapes(rows, cols, scale,
                                                                       aspect):
    boxes = masks.block_boxes(SEED, 32, 4, rows, cols, scale, aspect).numpy()
    top, left, height, width = np.moveaxis(boxes, -1, 0)
    assert (top >= 0).all() and (left >= 0).all()
    assert (top + height <= rows).all() and (left + width <= cols).all()
    # Their sides as the definition rounds them from the declared ranges.
    area = np.array(scale) * rows * cols
    low_h = np.clip(np.round(np.sqrt(area[0] * aspect[0])), 1, rows)
    high_h = np.clip(np.round(np.sqrt(area[1] * aspect[1])), 1, rows)
    low_w = np.clip(np.round(np.sqrt(area[0] / aspect[1])), 1, cols)
    high_w = np.clip(np.round(np.sqrt(area[1] / aspect[0])), 1, cols)
    assert (height >= low_h).all() and (height <= high_h).all()
    assert (width >= low_w).all() and (width <= high_w).all()
    # Each mask is exactly its box.
    grid = masks.box_masks(tf.constant(boxes), rows, cols).numpy()
    for b in range(32):
        for k in range(4):
            expected = np.zeros((rows, cols), bool)
            expected[top[b, k]:top[b, k] + height[b, k], left[b, k]:left[b, k] + width[b, k]] = 1
            np.testing.assert_array_equal(grid[b, k], expected)


def test_the_block_sides_follow_their_draws():
    """Height round(√(s·L·a)), width round(√(s·L/a)), clipped, from the uniform draws."""
    draws = tf.random.stateless_uniform([8, 4, 4], seed=SEED).numpy()
    boxes = masks.block_boxes(SEED, 8, 4, 14, 14, (0.15, 0.2), (0.75, 1.5)).numpy()
    area = (0.15 + 0.05 * draws[..., 0]) * 196
    aspect = 0.75 + 0.75 * draws[..., 1]
    np.testing.assert_array_equal(boxes[..., 2], np.clip(np.round(np.sqrt(area * aspect)), 1, 14))
    np.testing.assert_array_equal(boxes[..., 3], np.clip(np.round(np.sqrt(area / aspect)), 1, 14))


@pytest.mark.parametrize("kind", [masks.RandomMasks(0.75), masks.BlockMasks()])
def test_the_same_seed_draws_the_same_masks_and_another_seed_others(kind):
    first = kind.draw(SEED, 8, 14, 14).numpy()
    np.testing.assert_array_equal(kind.draw(SEED, 8, 14, 14).numpy(), first)
    other = kind.draw(tf.constant([3, 8], tf.int64), 8, 14, 14).numpy()
    assert not np.array_equal(other, first)
    assert first.shape == (8, *kind.shape(14, 14))


def test_mask_settings_out_of_range_are_refused():
    with pytest.raises(ValueError, match="masking ratio"):
        masks.RandomMasks(1.0)
    with pytest.raises(ValueError, match="block masks"):
        masks.BlockMasks(count=0)


def _digits(count=32):
    rng = np.random.default_rng(0)
    return (rng.random((count, 28, 28, 1)) * 255).astype("uint8")


def test_the_masks_travel_with_the_views_and_resume_bit_for_bit():
    """Batch views (the digits) and per-image views: (view, mask) batches; a stream started
    at its second batch (a resume) gives the uninterrupted stream's second batch."""
    images = _digits()
    for views in (augment.DigitViews(num_views=1),
                  augment.SymmetricViews(28, 1, num_views=1)):
        masked = masks.MaskedViews(views, [masks.RandomMasks(0.75)], (7, 7))
        stream = pipeline.pretrain_dataset(images, 8, masked, seed=5, steps_per_epoch=4)
        first, second = [b for b in stream.take(2)]
        view, mask = first
        assert view.shape == (8, 28, 28, 1) and mask.shape == (8, 7, 7)
        np.testing.assert_array_equal(mask.numpy().reshape(8, -1).sum(1), 49 - 12)
        resumed = next(iter(pipeline.pretrain_dataset(images, 8, masked, seed=5,
                                                      steps_per_epoch=4, first_step=1)))
        for part, again in zip(second, resumed):
            np.testing.assert_array_equal(part.numpy(), again.numpy())
        assert not np.array_equal(first[1].numpy(), second[1].numpy())


def test_two_replicas_see_the_masks_one_device_sees():
    """Per-image views under MirroredStrategy: each image keeps its view and its masks (drawn
    from the image's own seed), whichever replica it goes to.  (Batch views, the digits', draw
    from each per-replica batch's seed: their views differ on R replicas, as before masks.)"""
    images = _digits(16)
    masked = masks.MaskedViews(augment.SymmetricViews(28, 1, num_views=1), [
        masks.RandomMasks(0.75),
                                                                 masks.BlockMasks(count=2)],
                               (7, 7))
    one = next(iter(pipeline.pretrain_dataset(images, 8, masked, seed=3)))
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    two = next(iter(pipeline.distribute(strategy, lambda context: pipeline.pretrain_dataset(
        images, 8, masked, seed=3, input_context=context))))
    for whole, shared in zip(one, two):
        local = strategy.experimental_local_results(shared)
        assert [part.shape[0] for part in local] == [4, 4]
        np.testing.assert_array_equal(np.concatenate([p.numpy() for p in local]),
                                      whole.numpy())
