"""The colour views (augment.AsymmetricViews, MultiCropViews): each op against a NumPy
reference, per-image parameters, reproducibility, the reference settings, one channel."""

import math

import numpy as np
import pytest
import tensorflow as tf

from caco_tf import augment

LUMA = np.asarray(augment.LUMA)


def draws_with(**values):
    """A view's uniform draws, all 0.5 (no-op factors) except those named."""
    draws = np.full(augment._DRAWS, 0.5, np.float32)
    for name, value in values.items():
        draws[getattr(augment, "_" + name.upper())] = value
    return tf.constant(draws)


def apply_affine(image, matrix, offset):
    return image @ np.asarray(matrix).T + np.asarray(offset)


def yiq_hue(image, turns):
    """Reference hue rotation: to YIQ, rotate (I, Q) by 2π·turns (I towards -Q), back."""
    to_yiq = np.array([LUMA, [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
    angle = 2 * math.pi * turns
    rotation = np.array([[1, 0, 0], [0, math.cos(angle), math.sin(angle)],
                         [0, -math.sin(angle), math.cos(angle)]])
    return image @ (np.linalg.inv(to_yiq) @ rotation @ to_yiq).T


def colour(image, draws, amounts=(0.4, 0.4, 0.2, 0.1), jitter=True, gray=False, channels=3):
    mean_rgb = tf.constant(image.reshape(-1, channels).mean(0), tf.float32)
    matrix, offset = augment.colour_affine(mean_rgb, draws, amounts, tf.constant(jitter),
                                           tf.constant(gray), channels)
    return apply_affine(image, matrix.numpy(), offset.numpy())


def test_jitter_is_torchvisions_four_blends_in_any_order():
    rng = np.random.default_rng(0)
    image = rng.uniform(size=(6, 5, 3))
    b, c, s, h = 0.9, 0.2, 0.7, 0.35  # uniform draws → factors 1 + amount·(2u - 1)
    bright, contrast, saturation = 1 + 0.4 * (2 * b - 1), 1 + 0.4 * (2 * c - 1), 1 + 0.2 * (
        2 * s - 1)
    hue = 0.1 * (2 * h - 1)

    def gray(x):
        return (x @ LUMA)[..., None]

    ops = {
        0: lambda x: bright * x,
        1: lambda x: contrast * x + (1 - contrast) * gray(x).mean(),
        2: lambda x: saturation * x + (1 - saturation) * gray(x),
        3: lambda x: yiq_hue(x, hue),
    }
    got = colour(image, draws_with(bright=b, contrast=c, saturate=s, hue=h))
    # Unclipped, the four commute: torchvision's random order gives the same map.
    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [1, 3, 0, 2], [2, 0, 3, 1]):
        expected = image
        for op in order:
            expected = ops[op](expected)
        np.testing.assert_allclose(got, expected, atol=1e-5)


def test_hue_rotation_keeps_luma_and_gray_and_moves_red_towards_yellow():
    rng = np.random.default_rng(1)
    pixels = rng.uniform(size=(20, 3))
    rotation = augment._hue_rotation(tf.constant(0.07)).numpy()
    np.testing.assert_allclose((pixels @ rotation.T) @ LUMA, pixels @ LUMA, atol=1e-5)
    np.testing.assert_allclose(rotation @ np.full(3, 0.4), np.full(3, 0.4), atol=1e-6)
    np.testing.assert_allclose(augment._hue_rotation(tf.constant(0.0)).numpy(), np.eye(3),
                               atol=1e-6)
    red = rotation @ np.array([1.0, 0.0, 0.0])
    assert red[1] > 0.05 > red[2]  # +hue: red gains green (HSV: red → yellow)


def test_no_jitter_is_identity_and_grayscale_gives_the_luma_on_every_channel():
    image = np.random.default_rng(2).uniform(size=(4, 4, 3))
    np.testing.assert_allclose(colour(image, draws_with(bright=0.9), jitter=False), image,
                               atol=1e-6)
    grayed = colour(image, draws_with(), jitter=False, gray=True)
    np.testing.assert_allclose(grayed, np.repeat((image @ LUMA)[..., None], 3, -1), atol=1e-6)


def test_one_channel_gets_brightness_and_contrast_only():
    image = np.random.default_rng(3).uniform(size=(5, 5, 1))
    got = colour(image, draws_with(bright=1.0, contrast=0.0, saturate=1.0, hue=1.0),
                 channels=1)
    expected = 0.6 * (1.4 * image) + 0.4 * (1.4 * image).mean()  # order: brightness, contrast
    np.testing.assert_allclose(got, expected, atol=1e-6)


@pytest.mark.parametrize("sigma", [0.3, 1.0, 2.0])
def test_gaussian_blur_matches_a_separable_numpy_blur(sigma):
    image = np.random.default_rng(4).uniform(size=(16, 13, 3)).astype(np.float32)
    radius = math.ceil(3 * sigma)
    taps = np.arange(-radius, radius + 1)
    weights = np.exp(-0.5 * (taps / sigma) ** 2)
    weights /= weights.sum()
    padded = np.pad(image, [(radius, radius), (radius, radius), (0, 0)], mode="symmetric")
    rows = sum(w * padded[radius + t:radius + t + 16] for t, w in zip(taps, weights))
    expected = sum(w * rows[:, radius + t:radius + t + 13] for t, w in zip(taps, weights))
    got = augment.gaussian_blur(tf.constant(image), tf.constant(sigma), max_radius=6)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    flat = augment.gaussian_blur(tf.fill([9, 9, 1], 0.3), tf.constant(sigma), max_radius=6)
    np.testing.assert_allclose(flat, 0.3, atol=1e-6)  # mirrored edges: no dark border


def plain_recipe(**overrides):
    settings = dict(size=8, scale=(1.0, 1.0), ratio=(1.0, 1.0), flip_probability=0.0,
                    jitter_probability=0.0, grayscale_probability=0.0, blur_probability=0.0)
    settings.update(overrides)
    return augment.ViewRecipe(**settings)


def test_a_view_without_random_ops_is_the_resized_image_normalized():
    image = tf.constant(np.random.default_rng(5).integers(0, 256, (16, 16, 3)), tf.uint8)
    mean, std = augment.IMAGENET_MEAN, augment.IMAGENET_STD
    view = augment.augment_view(image, tf.constant([1, 2], tf.int64), plain_recipe(), mean, std)
    resized = tf.image.resize(image, [8, 8], antialias=True).numpy() / 255.0
    np.testing.assert_allclose(view, (resized - mean) / np.asarray(std), atol=1e-5)
    flipped = augment.augment_view(image, tf.constant([1, 2], tf.int64),
                                   plain_recipe(flip_probability=1.0), mean, std)
    np.testing.assert_allclose(flipped, view.numpy()[:, ::-1], atol=1e-5)
    solarized = augment.augment_view(image, tf.constant([1, 2], tf.int64),
                                     plain_recipe(solarize_probability=1.0), mean, std)
    expected = np.where(resized >= 128 / 255, 1.0 - resized, resized)  # PIL: v ≥ 128 inverted
    np.testing.assert_allclose(solarized * np.asarray(std) + mean, expected, atol=1e-5)


def test_crop_windows_follow_the_area_and_aspect_ranges():
    areas, ratios = [], []
    for index in range(200):
        begin, size = augment.crop_window(tf.constant([375, 500, 3]),
                                          tf.constant([0, index], tf.int64), (0.2, 1.0),
                                          (3 / 4, 4 / 3))
        height, width = int(size[0]), int(size[1])
        areas.append(height * width / (375 * 500))
        ratios.append(width / height)
        assert 0 <= int(begin[0]) <= 375 - height and 0 <= int(begin[1]) <= 500 - width
    assert 0.19 < min(areas) and max(areas) <= 1.0 and np.std(areas) > 0.1
    assert min(ratios) > 0.74 and max(ratios) < 1.35  # pixel aspect, not relative to 4:3


def test_views_are_drawn_per_image_and_reproducible():
    views = augment.AsymmetricViews(size=24)
    image = np.random.default_rng(6).integers(0, 256, (40, 48, 3), dtype=np.uint8)
    batch = tf.constant(np.repeat(image[None], 6, axis=0))
    view1, view2 = views(batch, tf.constant([0, 0], tf.int64))
    assert view1.shape == (6, 24, 24, 3) and view2.shape == (6, 24, 24, 3)
    differences = [np.abs(view1[0] - view1[i]).max() for i in range(1, 6)]
    assert min(differences) > 0.1  # copies of one image: each its own crop, colour, blur
    assert np.abs(view1[0] - view2[0]).max() > 0.1
    again1, again2 = views(batch, tf.constant([0, 0], tf.int64))
    np.testing.assert_array_equal(view1, again1)
    np.testing.assert_array_equal(view2, again2)
    other1, _ = views(batch, tf.constant([0, 1], tf.int64))
    assert np.abs(view1 - other1).max() > 0.1


def test_asymmetric_views_carry_the_reference_settings():
    first, second = augment.AsymmetricViews().recipes
    for recipe in (first, second):
        assert recipe.size == 224 and recipe.scale == (0.2, 1.0)
        assert recipe.ratio == pytest.approx((3 / 4, 4 / 3))
        assert recipe.jitter == (0.4, 0.4, 0.2, 0.1) and recipe.jitter_probability == 0.8
        assert recipe.grayscale_probability == 0.2 and recipe.flip_probability == 0.5
        assert recipe.blur_sigma == (0.1, 2.0)
    assert (first.blur_probability, second.blur_probability) == (1.0, 0.1)
    assert (first.solarize_probability, second.solarize_probability) == (0.0, 0.2)
    views = augment.AsymmetricViews(size=32)
    assert views.mean == augment.IMAGENET_MEAN and views.std == augment.IMAGENET_STD


def test_multicrop_recipes_and_shapes():
    recipes = augment.MultiCropViews().recipes
    assert [r.size for r in recipes] == [224] * 2 + [96] * 6
    assert [r.scale for r in recipes] == [(0.14, 1.0)] * 2 + [(0.05, 0.14)] * 6
    assert all(r.jitter == (0.4, 0.4, 0.4, 0.1) and r.blur_probability == 0.5
               and r.solarize_probability == 0.0 for r in recipes)
    small = augment.MultiCropViews(size=20, local_size=8, local_crops=3)
    image = tf.constant(np.random.default_rng(7).integers(0, 256, (30, 36, 3)), tf.uint8)
    crops = small.augment_image(image, tf.constant([3, 4], tf.int64))
    assert [tuple(c.shape) for c in crops] == [(20, 20, 3)] * 2 + [(8, 8, 3)] * 3


def test_single_channel_views_stay_single_channel():
    views = augment.AsymmetricViews(size=28, channels=1)
    assert views.mean == pytest.approx((0.4590,), abs=1e-3)  # ImageNet's through the luma
    digits = tf.constant(np.random.default_rng(8).integers(0, 256, (4, 28, 28, 1)), tf.uint8)
    view1, view2 = views(digits, tf.constant([5, 6], tf.int64))
    assert view1.shape == (4, 28, 28, 1) and np.isfinite(view2.numpy()).all()
    low, high = (0 - views.mean[0]) / views.std[0], (1 - views.mean[0]) / views.std[0]
    assert view1.numpy().min() >= low - 1e-5 and view1.numpy().max() <= high + 1e-5
