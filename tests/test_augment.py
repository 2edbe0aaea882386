"""The colour views (augment.AsymmetricViews, MultiCropViews): each op against a NumPy
reference, per-image parameters, reproducibility, the reference settings, one channel."""

import math

import numpy as np
import pytest
import tensorflow as tf

from caco_tf.data import augment

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
    mean_gray = (image.reshape(-1, channels).mean(0) @ (LUMA if channels == 3 else [1.0]))
    matrix, offset = augment.colour_affine(tf.constant(mean_gray, tf.float32), draws, amounts,
                                           tf.constant(jitter), tf.constant(gray), channels)
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


def hue_only(turns):
    """The colour map with only the hue jitter, at its largest draw: a rotation by ``turns``."""
    matrix, offset = augment.colour_affine(tf.constant(0.4), draws_with(hue=1.0),
                                           (0.0, 0.0, 0.0, turns), tf.constant(True),
                                           tf.constant(False), 3)
    assert offset.numpy() == 0.0
    return matrix.numpy()


def test_hue_rotation_keeps_luma_and_gray_and_moves_red_towards_yellow():
    rng = np.random.default_rng(1)
    pixels = rng.uniform(size=(20, 3))
    rotation = hue_only(0.07)
    np.testing.assert_allclose((pixels @ rotation.T) @ LUMA, pixels @ LUMA, atol=1e-5)
    np.testing.assert_allclose(rotation @ np.full(3, 0.4), np.full(3, 0.4), atol=1e-6)
    np.testing.assert_allclose(hue_only(0.0), np.eye(3), atol=1e-6)
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


def blur_up_to_6(image, sigma):
    return augment.gaussian_blur(image, sigma, max_radius=6)


# Plain TF, XLA, and sizes known only at run time; one trace (and compilation) per shape.
BLURS = [tf.function(blur_up_to_6), tf.function(blur_up_to_6, jit_compile=True),
         tf.function(blur_up_to_6, input_signature=[tf.TensorSpec([None, None, None]),
                                                    tf.TensorSpec([])])]


@pytest.mark.parametrize("sigma", [0.3, 1.0, 2.0])
@pytest.mark.parametrize("shape", [(16, 13, 3), (30, 40, 1), (9, 7, 3)])  # 9 × 7: < 2 radii
@pytest.mark.slow
def test_gaussian_blur_matches_a_separable_numpy_blur(sigma, shape):
    image = np.random.default_rng(4).uniform(size=shape).astype(np.float32)
    height, width, _ = shape
    radius = math.ceil(3 * sigma)
    taps = np.arange(-radius, radius + 1)
    weights = np.exp(-0.5 * (taps / sigma) ** 2)
    weights /= weights.sum()
    padded = np.pad(image, [(radius, radius), (radius, radius), (0, 0)], mode="symmetric")
    rows = sum(w * padded[radius + t:radius + t + height] for t, w in zip(taps, weights))
    expected = sum(w * rows[:, radius + t:radius + t + width] for t, w in zip(taps, weights))
    for blur in BLURS:
        np.testing.assert_allclose(blur(tf.constant(image), tf.constant(sigma)), expected,
                                   atol=1e-5)
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


@pytest.mark.slow
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


def test_crop_views_crop_and_flip_only():
    """MAE's and I-JEPA's views (data.views crop_flip and crop): no colour, no blur; with the
    whole image as the crop, the image itself normalized (mirrored when flipped)."""
    image = tf.constant(np.random.default_rng(8).integers(0, 256, (12, 12, 1)), tf.uint8)
    seed = tf.constant([1, 2], tf.int64)
    plain = augment.CropViews(12, 1, scale=(1.0, 1.0), flip_probability=0.0)
    (view,) = plain.augment_image(image, seed)
    expected = (image.numpy() / 255.0 - augment.IMAGENET_GRAY_MEAN) / augment.IMAGENET_GRAY_STD
    np.testing.assert_allclose(view, expected, atol=1e-5)
    (mirrored,) = augment.CropViews(12, 1, scale=(1.0, 1.0), flip_probability=1.0).augment_image(
        image, seed)
    np.testing.assert_allclose(mirrored, expected[:, ::-1], atol=1e-5)
    (recipe,) = augment.CropViews(224, scale=(0.3, 1.0), flip_probability=0.0).recipes
    assert recipe.scale == (0.3, 1.0) and recipe.ratio == pytest.approx((3 / 4, 4 / 3))
    assert recipe.jitter_probability == recipe.grayscale_probability == 0.0
    assert recipe.blur_probability == recipe.solarize_probability == 0.0


@pytest.mark.slow
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


@pytest.mark.slow
def test_single_channel_views_stay_single_channel():
    views = augment.AsymmetricViews(size=28, channels=1)
    assert views.mean == pytest.approx((0.4590,), abs=1e-3)  # ImageNet's through the luma
    digits = tf.constant(np.random.default_rng(8).integers(0, 256, (4, 28, 28, 1)), tf.uint8)
    view1, view2 = views(digits, tf.constant([5, 6], tf.int64))
    assert view1.shape == (4, 28, 28, 1) and np.isfinite(view2.numpy()).all()
    low, high = (0 - views.mean[0]) / views.std[0], (1 - views.mean[0]) / views.std[0]
    assert view1.numpy().min() >= low - 1e-5 and view1.numpy().max() <= high + 1e-5


# ------------------------------------------------------------------ the whole view vs NumPy
def reference_colour_view(pixels, draws, recipe, mean, std, unit):
    """A view after its crop, straightforwardly: torchvision's jitter (brightness, contrast,
    saturation, hue, in that order), grayscale, clip, blur, solarize in [0, 1], then the
    per-channel normalization; float64.  Returns (view, mask of pixels that solarization
    leaves ambiguous: within rounding of its threshold)."""
    u = np.asarray(draws, np.float64)
    x = np.asarray(pixels, np.float64) * unit
    channels = x.shape[-1]

    def gray(image):
        return (image @ LUMA)[..., None] if channels == 3 else image

    if u[augment._JITTER] < recipe.jitter_probability:
        brightness, contrast, saturation, hue = recipe.jitter
        x = (1 + brightness * (2 * u[augment._BRIGHT] - 1)) * x
        k = 1 + contrast * (2 * u[augment._CONTRAST] - 1)
        x = k * x + (1 - k) * gray(x).mean()
        if channels == 3:
            s = 1 + saturation * (2 * u[augment._SATURATE] - 1)
            x = s * x + (1 - s) * gray(x)
            x = yiq_hue(x, hue * (2 * u[augment._HUE] - 1))
    if channels == 3 and u[augment._GRAY] < recipe.grayscale_probability:
        x = np.repeat(gray(x), 3, axis=-1)
    x = np.clip(x, 0.0, 1.0)
    if u[augment._BLUR] < recipe.blur_probability:
        low, high = (np.float32(v) for v in recipe.blur_sigma)
        sigma = low + np.float32(u[augment._SIGMA]) * (high - low)  # as TF draws it: float32
        radius = min(math.ceil(np.float32(3) * sigma), x.shape[0])
        taps = np.arange(-radius, radius + 1)
        weights = np.exp(-0.5 * (taps / float(sigma)) ** 2)
        weights /= weights.sum()
        size = x.shape[0]
        padded = np.pad(x, [(radius, radius), (radius, radius), (0, 0)], mode="symmetric")
        rows = sum(w * padded[radius + t:radius + t + size] for t, w in zip(taps, weights))
        x = sum(w * rows[:, radius + t:radius + t + size] for t, w in zip(taps, weights))
    tie = np.zeros(x.shape, bool)
    if u[augment._SOLARIZE] < recipe.solarize_probability:
        tie = np.abs(x - 128 / 255) < 1e-5
        x = np.where(x >= 128 / 255, 1.0 - x, x)
    return (x - np.asarray(mean)) / np.asarray(std), tie


def assert_close_but_ties(got, expected, tie, atol=2e-5):
    got = np.asarray(got)
    assert got.shape == expected.shape and tie.mean() < 0.01
    np.testing.assert_allclose(np.where(tie, expected, got), expected, atol=atol)


DRAW_CASES = [  # (jitter, gray, blur, solarize) coins on and off, σ from small to large
    dict(jitter=0.1, gray=0.9, blur=0.0, sigma=0.95, solarize=0.9, bright=0.9, contrast=0.1,
         saturate=0.8, hue=0.3),
    dict(jitter=0.1, gray=0.1, blur=0.0, sigma=0.05, solarize=0.0, bright=0.2, contrast=0.95),
    dict(jitter=0.9, gray=0.1, blur=0.0, sigma=0.5, solarize=0.9),  # grayscale alone
    dict(jitter=0.9, gray=0.9, blur=0.9, solarize=0.9),  # nothing but the normalization
    dict(jitter=0.5, gray=0.9, blur=0.0, sigma=0.62, solarize=0.1, bright=1.0, contrast=0.0,
         saturate=0.0, hue=1.0),
]


@pytest.mark.parametrize("jit_compile", [pytest.param(True, marks=pytest.mark.slow), False])
@pytest.mark.parametrize("case", range(len(DRAW_CASES)))
def test_colour_view_matches_the_unfolded_numpy_view(jit_compile, case):
    """The fold (normalization in the colour map, clip per channel, blur and solarization in
    normalized units) changes nothing but rounding, with and without XLA."""
    recipe = augment.ViewRecipe(size=24, blur_probability=0.5, solarize_probability=0.5)
    mean, std = augment.IMAGENET_MEAN, augment.IMAGENET_STD
    rng = np.random.default_rng(10 + case)
    pixels = rng.uniform(0, 255, (24, 24, 3)).astype(np.float32)
    pixels[:6] = 0.6 * pixels[:6] + 90  # a duller band: the mean differs from 0.5
    draws = draws_with(**DRAW_CASES[case])
    function = augment._colour_view_function(recipe, 3, mean, std, 1 / 255, jit_compile)
    expected, tie = reference_colour_view(pixels, draws, recipe, mean, std, 1 / 255)
    assert_close_but_ties(function(tf.constant(pixels), draws), expected, tie)


@pytest.mark.parametrize("jit_compile", [pytest.param(True, marks=pytest.mark.slow), False])
def test_one_channel_and_float_views_match_numpy(jit_compile):
    recipe = augment.ViewRecipe(size=16, blur_probability=1.0, solarize_probability=1.0)
    mean, std = (augment.IMAGENET_GRAY_MEAN,), (augment.IMAGENET_GRAY_STD,)
    pixels = np.random.default_rng(11).uniform(0, 1, (16, 16, 1)).astype(np.float32)
    for draws in (draws_with(jitter=0.1, bright=0.8, contrast=0.3, sigma=0.7),
                  draws_with(jitter=0.9, sigma=0.2)):
        function = augment._colour_view_function(recipe, 1, mean, std, 1.0, jit_compile)
        expected, tie = reference_colour_view(pixels, draws, recipe, mean, std, 1.0)
        assert_close_but_ties(function(tf.constant(pixels), draws), expected, tie)


def reference_views(views, image, seed):
    """Every view of ``image`` through NumPy after TF's crop: the same draws, window, flip."""
    out = []
    for index, recipe in enumerate(views.recipes):
        view_seed = tf.random.experimental.stateless_fold_in(seed, index)
        draws = tf.random.stateless_uniform([augment._DRAWS], seed=view_seed)
        crop = augment.resized_crop(
            image, tf.random.experimental.stateless_fold_in(view_seed, augment._CROP_SEED),
            recipe.size, recipe.scale, recipe.ratio,
            flip=draws[augment._FLIP] < recipe.flip_probability)
        out.append(reference_colour_view(crop.numpy(), draws.numpy(), recipe, views.mean,
                                         views.std, 1 / 255 if image.dtype == tf.uint8 else 1.0))
    return out


@pytest.mark.parametrize("jit_compile", [pytest.param(True, marks=pytest.mark.slow), False])
def test_views_match_the_numpy_reference_for_several_images_and_seeds(jit_compile, monkeypatch):
    monkeypatch.setattr(augment, "JIT_COMPILE", jit_compile)
    rng = np.random.default_rng(12)
    asymmetric = augment.AsymmetricViews(size=32)
    multicrop = augment.MultiCropViews(size=32, local_size=12, local_crops=2)
    checked = set()
    for number in range(2):  # one image of each shape
        shape = (48, 40, 3) if number % 2 else (40, 56, 3)
        image = tf.constant(rng.integers(0, 256, shape), tf.uint8)
        for views in (asymmetric, multicrop):
            seed = tf.constant([7, number], tf.int64)
            got = views.augment_image(image, seed)
            for index, (view, (expected, tie)) in enumerate(
                    zip(got, reference_views(views, image, seed))):
                assert_close_but_ties(view, expected, tie)
                draws = tf.random.stateless_uniform(
                    [augment._DRAWS], seed=tf.random.experimental.stateless_fold_in(seed, index))
                checked.add(bool(draws[augment._BLUR] < views.recipes[index].blur_probability))
    assert checked == {True, False}  # blurred and unblurred views both compared


@pytest.mark.slow
def test_tiny_views_blur_within_their_size():
    """Mirrored padding needs the radius within the view: 4-pixel crops still blur (σ ≤ 2)."""
    views = augment.MultiCropViews(size=8, local_size=4, local_crops=4, blur_sigma=(1.9, 2.0))
    image = tf.constant(np.random.default_rng(13).integers(0, 256, (20, 20, 3)), tf.uint8)
    for number in range(3):
        crops = views.augment_image(image, tf.constant([1, number], tf.int64))
        assert all(np.isfinite(c.numpy()).all() for c in crops)
        assert [c.shape[0] for c in crops] == [8, 8, 4, 4, 4, 4]


@pytest.mark.slow
def test_a_keras_layer_appended_to_the_views_in_python_and_in_a_configuration():
    import keras

    from caco_tf import build
    from caco_tf.data import augment as views_lib
    from caco_tf.data import pipeline
    from caco_tf.config import ConfigError, load_config

    images = np.random.default_rng(0).integers(0, 256, (8, 20, 20, 3), dtype=np.uint8)
    plain = views_lib.AsymmetricViews(16, 3)
    # A layer that always acts, so its effect is certain: every view's pixels halved.
    halved = views_lib.WithLayers(plain, [keras.layers.Rescaling(0.5)])
    seed = tf.constant([1, 2], tf.int64)
    for ours, theirs in zip(halved.augment_image(images[0], seed),
                            plain.augment_image(images[0], seed)):
        mean, std = np.asarray(plain.mean), np.asarray(plain.std)
        np.testing.assert_allclose(ours.numpy() * std + mean,
                                   0.5 * (theirs.numpy() * std + mean), atol=1e-5)
    stream = pipeline.pretrain_dataset(images, 4, halved, steps_per_epoch=2)
    assert [tuple(v.shape) for v in next(iter(stream))] == [(4, 16, 16, 3)] * 2

    config = load_config(None, ["data.extra_layers=[{layer: RandomContrast, factor: 0.3, "
                                "value_range: [0, 1]}]"])
    digits = build.run_views(config)
    assert isinstance(digits.layers[0], keras.layers.RandomContrast)
    batch = tf.random.uniform([4, 28, 28, 1])
    assert [tuple(v.shape) for v in digits(batch, seed)] == [(4, 28, 28, 1)] * 2
    with pytest.raises(ConfigError, match="data.extra_layers: no layer RandomWobble"):
        build.run_views(load_config(None, ["data.extra_layers=[{layer: RandomWobble}]"]))
    with pytest.raises(ConfigError, match="data.extra_layers must be a list of"):
        load_config(None, ["data.extra_layers=[RandomContrast]"])
