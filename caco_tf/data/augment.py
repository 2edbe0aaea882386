"""Two-view augmentation, per image, on batches inside ``tf.data``.

Every random parameter is drawn per image from stateless RNG seeded by (seed, batch index), so a
run is reproducible for a given seed while every batch of every epoch sees fresh views.

``DigitViews`` is the offline default for 28×28 grayscale digits.  Colour ops make no sense on
one channel, so it uses what the prototype in ``shared/notes`` found useful for digits: one
per-image affine (crop-and-resize, rotation, shear, translation) applied with a *single* bilinear
resample (keras' RandomRotation/RandomZoom/RandomTranslation each resample, blurring thin strokes
three times over, and keras-cv has no per-image affine), stroke thickness, intensity gain and
Gaussian noise.

``AsymmetricViews`` (the paper's two views) and ``MultiCropViews`` (SwAV's multi-crop) are the
colour views: drawn per image, before batching, inside the pipeline's parallel map (see the
notes above ``IMAGENET_MEAN``).
"""

import dataclasses
import functools
import math
from typing import Tuple

import numpy as np
import tensorflow as tf

from caco_tf import tracing  # noqa: F401  (autograph leaves caco_tf alone)

from caco_tf.data.images import LUMA, normalize_pixels

MNIST_MEAN = 0.1307
MNIST_STD = 0.3081


def _uniform(seed, shape, low, high):
    return tf.random.stateless_uniform(shape, seed=seed, minval=low, maxval=high)


def _affine_transforms(seed, batch, height, width, scale, ratio, rotation, shear, translate):
    """Per-image output→input projective transforms [B, 8] for ImageProjectiveTransformV3."""
    seeds = tf.random.experimental.stateless_split(seed, 7)
    area = _uniform(seeds[0], [batch], scale[0], scale[1])
    log_ratio = _uniform(seeds[1], [batch], math.log(ratio[0]), math.log(ratio[1]))
    aspect = tf.exp(log_ratio)
    crop_w = tf.minimum(tf.sqrt(area * aspect), 1.0)  # crop size as a fraction of the image
    crop_h = tf.minimum(tf.sqrt(area / aspect), 1.0)
    # Crop centre anywhere the crop fits, then an extra translation.
    shift_x = (_uniform(seeds[2], [batch], -0.5, 0.5) * (1.0 - crop_w)
               + _uniform(seeds[3], [batch], -translate, translate)) * width
    shift_y = (_uniform(seeds[4], [batch], -0.5, 0.5) * (1.0 - crop_h)
               + _uniform(seeds[5], [batch], -translate, translate)) * height
    angle = _uniform(seeds[6], [batch], -rotation, rotation) * (math.pi / 180.0)
    shear_x = _uniform(tf.random.experimental.stateless_fold_in(seed, 11), [batch], -shear, shear)
    cos, sin = tf.cos(angle), tf.sin(angle)
    # input = centre + shift + R · Shear · S · (output - centre)
    a00 = (cos + sin * 0.0) * crop_w
    a01 = (cos * shear_x - sin) * crop_h
    a10 = sin * crop_w
    a11 = (sin * shear_x + cos) * crop_h
    cx, cy = (width - 1) / 2.0, (height - 1) / 2.0
    b0 = cx + shift_x - a00 * cx - a01 * cy
    b1 = cy + shift_y - a10 * cx - a11 * cy
    zeros = tf.zeros_like(a00)
    return tf.stack([a00, a01, b0, a10, a11, b1, zeros, zeros], axis=1)


def random_affine(images, seed, scale=(0.3, 1.0), ratio=(3 / 4, 4 / 3), rotation=15.0,
                  shear=0.15, translate=0.1):
    """Crop-resize, rotate, shear and translate each image with one bilinear resample."""
    shape = tf.shape(images)
    transforms = _affine_transforms(seed, shape[0], tf.cast(shape[1], tf.float32),
                                    tf.cast(shape[2], tf.float32), scale, ratio, rotation, shear,
                                    translate)
    return tf.raw_ops.ImageProjectiveTransformV3(
        images=images, transforms=transforms, output_shape=shape[1:3],
        fill_value=0.0, interpolation="BILINEAR", fill_mode="CONSTANT")


def random_stroke_width(images, seed, probability=0.15):
    """Thicken (3×3 dilation) or thin (2×2 erosion) the strokes, each with ``probability``."""
    draw = _uniform(seed, [tf.shape(images)[0], 1, 1, 1], 0.0, 1.0)
    dilated = tf.nn.max_pool2d(images, 3, 1, "SAME")
    eroded = -tf.nn.max_pool2d(-images, 2, 1, "SAME")
    images = tf.where(draw < probability, dilated, images)
    return tf.where(draw > 1.0 - probability, eroded, images)


class DigitViews:
    """``num_views`` independently augmented views (two by default) of a batch of
    [B, H, W, 1] images in [0, 1]."""

    per_image = False  # views of whole batches (the pipeline batches first)

    def __init__(self, scale=(0.3, 1.0), ratio=(3 / 4, 4 / 3), rotation=15.0, shear=0.15,
                 translate=0.1, stroke_probability=0.15, gain=(0.6, 1.0), noise=0.05,
                 mean=MNIST_MEAN, std=MNIST_STD, num_views=2):
        self.num_views = int(num_views)
        self.affine = dict(scale=tuple(scale), ratio=tuple(ratio), rotation=rotation,
                           shear=shear, translate=translate)
        self.stroke_probability = stroke_probability
        self.gain = tuple(gain)
        self.noise = noise
        self.mean, self.std = mean, std

    def view(self, images, seed):
        seeds = tf.random.experimental.stateless_split(seed, 4)
        images = random_affine(images, seeds[0], **self.affine)
        images = random_stroke_width(images, seeds[1], self.stroke_probability)
        images = images * _uniform(seeds[2], [tf.shape(images)[0], 1, 1, 1], *self.gain)
        images = images + self.noise * tf.random.stateless_normal(tf.shape(images), seeds[3])
        return self.normalize(tf.clip_by_value(images, 0.0, 1.0))

    def normalize(self, images):
        """The evaluation-time transform: the same normalization, nothing random."""
        return normalize_pixels(tf.cast(images, tf.float32), self.mean, self.std)

    def __call__(self, images, seed):
        seeds = tf.unstack(tf.random.experimental.stateless_split(seed, self.num_views))
        return tuple(self.view(images, view_seed) for view_seed in seeds)


# ---------------------------------------------------------------------------------------------
# Colour views, per image: the paper's asymmetric two views and SwAV-style multi-crop.
#
# These run per image inside one parallel ``tf.data`` map (decode → every view), so an op
# applied with probability p costs only for the images that get it (``tf.cond``), and each view
# is processed while it sits in cache.  Every random parameter comes from a stateless RNG seeded
# by (data seed, image number, view number): a seed reproduces every view, whatever the map's
# parallelism.  Keras' preprocessing layers draw from a stateful SeedGenerator instead, whose
# draws a parallel map hands out in no fixed order.
#
# Which op does what, and why not a Keras / keras-cv layer.  Figures: ms per 224² view, ours
# vs the layer, from `python benchmarks/input_pipeline.py --ops` on the shared 2-core
# development machine (BENCHMARKS.md has the table; with other jobs' load they move by up to
# half between runs, the ratios within a run much less):
# - crop (1.44 vs keras-cv RandomCropAndResize 2.67): TF's RandomResizedCrop sampler
#   ``tf.image.stateless_sample_distorted_bounding_box`` (area fraction and pixel aspect
#   ratio, 10 tries, else the whole image) and ``tf.image.resize(antialias=True)`` (bilinear,
#   as PIL).  The keras-cv layer takes its aspect ratio relative to the image's own, clips the
#   window (skewing the area distribution), resizes without antialiasing and draws statefully.
# - flip (0.27 vs keras RandomFlip 1.08): ``tf.reverse`` of the uint8 crop under ``tf.cond``;
#   the layer flips every image and then selects.
# - everything after the crop is one function per view recipe, ``colour_view``, compiled with
#   XLA (``JIT_COMPILE``; view 1 after its crop 0.70, as TF kernels 3.63): as TF kernels,
#   every op is one more pass over the view's memory and per-channel broadcasts are slow
#   kernels; XLA fuses the elementwise ops into a few loops.  Compiling costs a few seconds
#   per recipe when a pipeline first runs.
# - colour jitter + grayscale + normalization (0.41; the same function as TF kernels 1.52;
#   keras RandomColorJitter + RandomGrayscale 8.01, without normalization): one 3×3 matrix
#   and offset per view (``colour_affine``), with the mean/std normalization folded in
#   (``normalized_colour_affine``): one fused multiply-add and per-channel clip.  The keras
#   jitter also differs from torchvision's: it adds its brightness (torchvision multiplies),
#   takes the contrast mean per channel (torchvision: of the grayscale image) and scales
#   saturation in HSV (torchvision blends with the grayscale image).  Hue alone, in HSV,
#   costs several times our whole colour step (tf.image.adjust_hue 1.48, keras RandomHue
#   2.84), so our hue is a rotation of the YIQ chroma plane (it keeps the luma; HSV's hue
#   shift keeps max and min of RGB), and values are clipped once, after the jitter, not
#   after each of its four ops.
# - blur (0.79; as TF kernels 2.91; keras RandomGaussianBlur 54.00): separable Gaussian,
#   σ per image, radius ⌈3σ⌉, mirrored edges (``gaussian_blur``), on normalized values (it
#   commutes with the normalization).  The layer draws one σ per batch and runs a dense 2-D
#   kernel.  TF's conv2d, depthwise_conv2d, FFT and banded-matmul blurs were no faster here;
#   with XLA, the flat [H, W·C] layout and summing the interior straight from the view (no
#   padded copy, ``_blur_pass``) each took about a third off, while gathers or concatenated
#   shifts instead of slices, a fixed 13-tap kernel and the colour map applied to a padded
#   view were slower.
# - solarize: ``tf.where`` at PIL's threshold 128 (in normalized units), 20 % of second views
#   (keras Solarization works the same; ours skips its value-range conversions).
# ---------------------------------------------------------------------------------------------

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# ImageNet's statistics through the luma weights, for single-channel colour views.
IMAGENET_GRAY_MEAN = sum(w * m for w, m in zip(LUMA, IMAGENET_MEAN))
IMAGENET_GRAY_STD = sum(w * s for w, s in zip(LUMA, IMAGENET_STD))

_RGB_TO_YIQ = np.array([LUMA, [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]], np.float64)
_GRAY_MATRIX = np.outer(np.ones(3), LUMA).astype(np.float32)  # G = 1 wᵀ: the luma on every channel
# Rotating YIQ's (I, Q) by θ is G + cos θ (I - G) + sin θ Q in RGB, with this Q; the sign
# turns red towards yellow for θ > 0, as an HSV hue increase does.
_HUE_SINE = (np.linalg.inv(_RGB_TO_YIQ) @ np.array([[0, 0, 0], [0, 0, 1], [0, -1, 0]])
             @ _RGB_TO_YIQ).astype(np.float32)
_SOLARIZE_THRESHOLD = 128.0 / 255.0  # PIL's ImageOps.solarize default: v ≥ 128 → 255 - v


@dataclasses.dataclass(frozen=True)
class ViewRecipe:
    """How one view is drawn; defaults are the reference's (torchvision) settings."""

    size: int = 224
    scale: Tuple[float, float] = (0.2, 1.0)        # RandomResizedCrop area fraction
    ratio: Tuple[float, float] = (3 / 4, 4 / 3)    # and aspect ratio (width / height)
    flip_probability: float = 0.5
    jitter: Tuple[float, float, float, float] = (0.4, 0.4, 0.2, 0.1)  # bright., contr., sat., hue
    jitter_probability: float = 0.8
    grayscale_probability: float = 0.2
    blur_probability: float = 0.5
    blur_sigma: Tuple[float, float] = (0.1, 2.0)   # in pixels of the view (PIL's radius)
    solarize_probability: float = 0.0


# Indices into a view's vector of uniform draws.
_CROP_SEED, _FLIP, _JITTER, _BRIGHT, _CONTRAST, _SATURATE, _HUE, _GRAY, _BLUR, _SIGMA, \
    _SOLARIZE = range(11)
_DRAWS = 11


def crop_window(shape, seed, scale, ratio):
    """RandomResizedCrop's window: (begin, size) of a crop of ``scale`` area and ``ratio`` aspect.

    TF's sampler tries 10 times, then falls back to the whole image (torchvision: a centre
    crop of the clamped aspect ratio).
    """
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape, tf.zeros([1, 0, 4]), seed=seed, min_object_covered=0.0,
        aspect_ratio_range=ratio, area_range=scale, max_attempts=10,
        use_image_if_no_bounding_boxes=True)
    return begin, size


def resized_crop(image, seed, size, scale, ratio, flip=False):
    """A random crop of ``image`` [H, W, C], optionally mirrored, resized to [size, size, C].

    Float32 in the input's pixel units; bilinear with antialiasing, as PIL resizes.
    """
    begin, window = crop_window(tf.shape(image), seed, scale, ratio)
    crop = tf.slice(image, begin, window)
    if flip is not False:  # a boolean tensor: the flip's coin
        crop = tf.cond(flip, lambda: tf.reverse(crop, [1]), lambda: crop)
    return tf.image.resize(crop, [size, size], method="bilinear", antialias=True)


def colour_affine(mean_gray, draws, amounts, jitter, grayscale, channels):
    """The per-image colour jitter then grayscale, as ``x ↦ A x + c 1``; returns (A, c).

    ``amounts`` are the jitter's (brightness, contrast, saturation, hue); ``jitter`` and
    ``grayscale`` the two ops' coin flips (boolean tensors); ``draws`` the view's uniform draws;
    ``mean_gray`` the view's mean gray m = wᵀμ (μ its mean colour; one channel: its mean).
    As torchvision: brightness b blends with black (x ↦ b x), contrast k with the mean gray
    of the image (x ↦ k x + (1 - k) m 1),
    saturation s with the grayscale image (x ↦ s x + (1 - s) G x, G = 1 wᵀ the luma on every
    channel); hue rotates the chroma by θ.  Without clipping in between, the four commute:
    saturation and hue fix gray and keep the luma (G S = S G = G, same for the hue), and
    brightness and contrast are scalings, so torchvision's random order changes nothing and

        A = b k (G + s (cos θ (I - G) + sin θ Q)),   c = (1 - k) b m,

    with Q the rotation's generator; grayscale replaces A by b k G.  The offset is one number
    for all channels.  One channel: A = b k, same c.
    """
    brightness, contrast, saturation, hue = (float(v) for v in _jitter_amounts(amounts))

    def factor(index, amount):
        return 1.0 + amount * (2.0 * draws[index] - 1.0)

    bright, contr = factor(_BRIGHT, brightness), factor(_CONTRAST, contrast)
    scale = tf.where(jitter, bright * contr, 1.0)
    offset = tf.where(jitter, (1.0 - contr) * bright * mean_gray, 0.0)
    if channels == 1:
        return tf.reshape(scale, [1, 1]), offset
    angle = 2.0 * math.pi * hue * (2.0 * draws[_HUE] - 1.0)
    chroma = tf.where(jitter, factor(_SATURATE, saturation), 1.0) * tf.where(
        grayscale, 0.0, 1.0)
    angle = tf.where(jitter, angle, 0.0)
    chroma_map = (tf.cos(angle) * (np.eye(3, dtype=np.float32) - _GRAY_MATRIX)
                  + tf.sin(angle) * _HUE_SINE)
    return scale * (_GRAY_MATRIX + chroma * chroma_map), offset


def _jitter_amounts(jitter):
    if len(jitter) != 4:
        raise ValueError(f"jitter must be (brightness, contrast, saturation, hue), got {jitter}")
    return jitter


def _blur_pass(image, weights, radius, axis):
    """One 1-D pass of the separable blur along ``axis`` (0: down, 1: across) of [H, W, C].

    On the flat [H, W·C] layout a tap is a shift by one row (axis 0) or by C values (axis 1),
    so XLA runs each pass as one loop over contiguous memory.  Mirrored taps share their
    weight: r + 1 products instead of 2r + 1.  Edges are mirrored: the lines at least r from
    an edge are summed straight from the image, the r lines at each edge from a small strip
    of 3r mirrored lines, so that no padded copy of the whole image is made (a third less
    time than padding it first, with XLA); small (or unknown) sizes pad the whole image.
    """
    size = image.shape[axis]
    unit = 1 if axis == 0 else image.shape[-1] or tf.shape(image)[-1]

    def flat(x):
        return tf.reshape(x, [x.shape[0] if x.shape[0] is not None else tf.shape(x)[0], -1])

    def mirrored(x, before, after):
        return flat(tf.pad(x, [[before, after], [0, 0], [0, 0]] if axis == 0
                           else [[0, 0], [before, after], [0, 0]], mode="SYMMETRIC"))

    # Tracing cost: a tap is one tf.slice and a weight one of the unstacked scalars, where
    # indexing adds several ops each (a blur's graph 2,697 -> 1,557 nodes, about half the
    # time to trace; the same values, bit for bit).
    weight = tf.unstack(weights, 2 * radius + 1)

    def taps(x, start, length):
        """Σ_j w_j (line start + i + j): output lines start .. start + length - 1 of ``x``."""
        def lines(shift):
            begin = (start + shift) * unit
            return (tf.slice(x, [begin, 0], [length * unit, -1]) if axis == 0
                    else tf.slice(x, [0, begin], [-1, length * unit]))
        return tf.add_n([lines(0) * weight[radius]] + [
            (lines(j) + lines(-j)) * weight[radius + j] for j in range(1, radius + 1)])

    if size is None or size < 2 * radius:
        blurred = taps(mirrored(image, radius, radius), radius, tf.shape(image)[axis])
    else:
        r = radius
        edge = (slice(None),) * axis  # index prefix selecting along ``axis``
        head = mirrored(image[edge + (slice(0, 2 * r),)], r, 0)  # lines -r .. 2r - 1
        tail = mirrored(image[edge + (slice(size - 2 * r, size),)], 0, r)  # n - 2r .. n + r - 1
        blurred = tf.concat([taps(head, r, r), taps(flat(image), r, size - 2 * r),
                             taps(tail, r, r)], axis)
    return tf.reshape(blurred, tf.shape(image))


def gaussian_blur(image, sigma, max_radius):
    """Separable Gaussian blur of [H, W, C] with standard deviation ``sigma`` (pixels).

    The radius ⌈3σ⌉ (at most ``max_radius``, which must not exceed H or W) picks one of a few
    static branches: σ = 0.3 costs 3 taps a direction, σ = 2 costs 13.  Edges are mirrored
    (``_blur_pass``).
    """
    radius = tf.clip_by_value(tf.cast(tf.math.ceil(3.0 * sigma), tf.int32), 1, max_radius)

    def blur_with(r):
        def run():
            taps = tf.range(-r, r + 1, dtype=tf.float32)
            weights = tf.exp(-0.5 * tf.square(taps / sigma))
            weights = weights / tf.reduce_sum(weights)
            return _blur_pass(_blur_pass(image, weights, r, 0), weights, r, 1)
        return run

    return tf.switch_case(radius - 1, [blur_with(r) for r in range(1, max_radius + 1)])


def normalized_colour_affine(mean_gray, draws, recipe, channels, unit, mean, std):
    """The view's colour map and normalization as one per-channel affine map and clip.

    ``colour_affine`` gives the jitter and grayscale as v = clip(A·x·unit + c, 0, 1) (the
    identity when neither op is drawn); the normalization n = (v - μ) / σ is per channel, so

        n = clip(M x + b, low, high),  M = diag(1/σ) A·unit,  b = (c - μ) / σ,
        low = -μ / σ,  high = (1 - μ) / σ.

    Returns (M [C, C], b, low, high): per channel ([C]), or scalars where ``mean`` and ``std``
    are (0 and 1: the map into [0, 1] units, unnormalized).
    """
    jitter = draws[_JITTER] < recipe.jitter_probability
    grayscale = draws[_GRAY] < recipe.grayscale_probability
    recolour = tf.logical_or(jitter, grayscale) if channels == 3 else jitter
    matrix, offset = colour_affine(mean_gray, draws, recipe.jitter, jitter, grayscale, channels)
    matrix = tf.where(recolour, matrix, tf.eye(channels))  # exactly the identity, unrounded
    mean, inverse = np.asarray(mean, np.float32), 1.0 / np.asarray(std, np.float32)
    return (matrix * np.reshape(unit * inverse, [-1, 1]), (offset - mean) * inverse,
            -mean * inverse, (1.0 - mean) * inverse)


def colour_view(view, draws, recipe, mean, std, unit=1.0, xla=True):
    """Everything a view gets after its crop: colour, clip, blur, solarize, normalization.

    ``view`` is [S, S, C] float32 in pixel units (``unit`` turns them into [0, 1]); ``draws``
    the view's uniform draws.  The result is normalized, as ``augment_view`` returns it.

    ``xla`` (the function is compiled with XLA): the normalization is folded into the colour
    map (``normalized_colour_affine``) and the rest works on normalized values: the Gaussian
    blur is linear with weights summing to 1, so it commutes with the per-channel affine
    normalization, and solarization (v ≥ t ↦ 1 - v in [0, 1] units) becomes
    n ≥ (t - μ) / σ ↦ (1 - 2μ) / σ - n.  XLA fuses the map, its per-channel clip and the
    normalization into one loop.  Without XLA, per-channel broadcasts are slow TF kernels
    (a per-channel clip costs 20 times a scalar one here), so the view stays in [0, 1] units
    (one matmul, scalar offset and clip) and is normalized last (a matmul by diag(1/σ) and a
    bias-add).  Both give the same values up to rounding.
    """
    size, channels = view.shape[0], view.shape[-1]
    flat = tf.reshape(view, [-1, channels])
    # The mean gray as the mean of the luma image: XLA reduces a flat vector several times
    # faster than [S, S, C] to [C].
    luma = tf.matmul(flat, tf.constant(LUMA if channels == 3 else (1.0,), shape=[channels, 1]))
    mean_gray = tf.reduce_mean(luma) * unit
    space_mean, space_std = (mean, std) if xla else (0.0, 1.0)
    matrix, bias, low, high = normalized_colour_affine(mean_gray, draws, recipe, channels, unit,
                                                       space_mean, space_std)
    if xla:  # broadcast products: fused with the bias and the clip into one loop
        view = tf.add_n([view[..., k:k + 1] * matrix[:, k] for k in range(channels)]) + bias
    else:
        view = tf.reshape(tf.matmul(flat, matrix, transpose_b=True), tf.shape(view)) + bias
    view = tf.minimum(tf.maximum(view, low), high)

    if recipe.blur_probability > 0:
        sigma = (recipe.blur_sigma[0]
                 + draws[_SIGMA] * (recipe.blur_sigma[1] - recipe.blur_sigma[0]))
        # Mirrored padding needs the radius within the view (only tiny test views reach it).
        max_radius = max(1, min(math.ceil(3.0 * recipe.blur_sigma[1]), size))
        view = tf.cond(draws[_BLUR] < recipe.blur_probability,
                       lambda: gaussian_blur(view, sigma, max_radius), lambda: view)
    if recipe.solarize_probability > 0:
        shift, scale = np.asarray(space_mean, np.float64), 1.0 / np.asarray(space_std, np.float64)
        threshold = ((_SOLARIZE_THRESHOLD - shift) * scale).astype(np.float32)
        reflection = ((1.0 - 2.0 * shift) * scale).astype(np.float32)
        view = tf.cond(draws[_SOLARIZE] < recipe.solarize_probability,
                       lambda: tf.where(view >= threshold, reflection - view, view),
                       lambda: view)
    if not xla:
        inverse = np.array([1.0 / s for s in std], np.float32)
        flat = tf.matmul(tf.reshape(view, [-1, channels]), np.diag(inverse))
        view = tf.reshape(tf.nn.bias_add(flat, -np.asarray(mean, np.float32) * inverse),
                          tf.shape(view))
    return view


# Compile ``colour_view`` with XLA (see the notes above IMAGENET_MEAN; BENCHMARKS.md: view 1
# after its crop several times faster than as TF kernels).  False runs it as plain TF kernels
# (about as fast as this module was before XLA), e.g. where XLA's CPU compiler is unavailable;
# it is read when a pipeline (or a view function) is traced.
JIT_COMPILE = True


@functools.lru_cache(maxsize=None)
def _colour_view_function(recipe, channels, mean, std, unit, jit_compile):
    """``colour_view`` for one recipe as a ``tf.function`` of static shapes (one compilation)."""
    return tf.function(
        functools.partial(colour_view, recipe=recipe, mean=mean, std=std, unit=unit,
                          xla=jit_compile),
        input_signature=[tf.TensorSpec([recipe.size, recipe.size, channels], tf.float32),
                         tf.TensorSpec([_DRAWS], tf.float32)],
        jit_compile=jit_compile, autograph=False)


def cropped_view(image, seed, recipe):
    """A view's crop (+flip), float32 [S, S, C] in the image's pixel units, and its uniform
    draws [11] (``colour_view`` reads the rest of them): everything ``seed`` decides."""
    draws = tf.random.stateless_uniform([_DRAWS], seed=seed)
    crop_seed = tf.random.experimental.stateless_fold_in(seed, _CROP_SEED)
    view = resized_crop(image, crop_seed, recipe.size, recipe.scale, recipe.ratio,
                        flip=draws[_FLIP] < recipe.flip_probability)
    return view, draws


def augment_view(image, seed, recipe, mean, std):
    """One view of ``image`` (uint8 or [0, 1] float, [H, W, C]): normalized float32 [S, S, C]."""
    channels = image.shape[-1]
    unit = 1.0 / 255.0 if image.dtype == tf.uint8 else 1.0
    view, draws = cropped_view(image, seed, recipe)
    finish = _colour_view_function(recipe, channels, tuple(mean), tuple(std), unit,
                                   bool(JIT_COMPILE))
    return finish(view, draws)


class ImageViews:
    """Views drawn per image (see the notes above); subclasses give the recipes.

    ``augment_image(image, seed)`` maps one image (uint8 or [0, 1] float, any size) to a tuple
    of normalized views; ``__call__(images, seed)`` does the same to a batch of equal-size
    images (the interface ``DigitViews`` has); ``normalize`` is the evaluation transform of
    images already at ``size``.
    """

    recipes: Tuple[ViewRecipe, ...] = ()
    per_image = True  # the pipeline draws them image by image

    def __init__(self, size, channels, mean, std):
        if channels not in (1, 3):
            raise ValueError(f"channels must be 1 or 3, got {channels}")
        self.size, self.channels = int(size), int(channels)
        if mean is None:
            mean = IMAGENET_MEAN if channels == 3 else (IMAGENET_GRAY_MEAN,)
        if std is None:
            std = IMAGENET_STD if channels == 3 else (IMAGENET_GRAY_STD,)
        self.mean, self.std = tuple(float(m) for m in mean), tuple(float(s) for s in std)

    @property
    def num_views(self):
        return len(self.recipes)

    def augment_image(self, image, seed):
        """Every view of one image; view i uses the seed folded with i."""
        return tuple(
            augment_view(image, tf.random.experimental.stateless_fold_in(seed, index), recipe,
                         self.mean, self.std)
            for index, recipe in enumerate(self.recipes))

    def __call__(self, images, seed):
        """Views of a batch [B, H, W, C]; image b uses the seed (seed, b) folded."""
        seeds = tf.random.experimental.stateless_split(seed, tf.shape(images)[0])
        signature = tuple(tf.TensorSpec([r.size, r.size, self.channels], tf.float32)
                          for r in self.recipes)
        return tf.map_fn(lambda args: self.augment_image(*args), (images, seeds),
                         fn_output_signature=signature)

    def normalize(self, images):
        """The evaluation-time transform: the same normalization, nothing random."""
        mean, std = tf.constant(self.mean, tf.float32), tf.constant(self.std, tf.float32)
        return normalize_pixels(tf.cast(images, tf.float32), mean, std)


class AsymmetricViews(ImageViews):
    """The paper's two views (BYOL's asymmetric recipe, as the reference uses).

    Both: RandomResizedCrop (``scale``, aspect 3/4-4/3) to ``size``, horizontal flip, colour
    jitter (0.4, 0.4, 0.2, 0.1) with p = 0.8, grayscale p = 0.2; Gaussian blur (σ in
    ``blur_sigma`` pixels) with p = 1.0 on view 1 and 0.1 on view 2; solarize p = 0.2 on view 2
    only; ImageNet mean/std normalization.  On one channel, saturation, hue and grayscale are
    skipped (they are identities on gray) and the statistics are ImageNet's through the luma.
    ``num_views`` K > 2 (a method of K equal views): the two recipes in turn.
    """

    def __init__(self, size=224, channels=3, scale=(0.2, 1.0), blur_sigma=(0.1, 2.0),
                 mean=None, std=None, num_views=2):
        super().__init__(size, channels, mean, std)
        common = dict(size=self.size, scale=tuple(scale), blur_sigma=tuple(blur_sigma))
        pair = (ViewRecipe(**common, blur_probability=1.0),
                ViewRecipe(**common, blur_probability=0.1, solarize_probability=0.2))
        self.recipes = tuple(pair[i % 2] for i in range(num_views))  # K views: the two in turn


class SymmetricViews(ImageViews):
    """MoCo v2's two views, drawn alike (SimSiam's recipe, main_simsiam.py:229-238):
    RandomResizedCrop (``scale``), flip, colour jitter (0.4, 0.4, 0.4, 0.1) with p = 0.8,
    grayscale p = 0.2, Gaussian blur p = 0.5, no solarization; ImageNet mean/std; ``num_views``
    of them (a method of K equal views)."""

    def __init__(self, size=224, channels=3, scale=(0.2, 1.0), blur_sigma=(0.1, 2.0),
                 mean=None, std=None, num_views=2):
        super().__init__(size, channels, mean, std)
        self.recipes = (ViewRecipe(size=self.size, scale=tuple(scale), jitter=(0.4, 0.4, 0.4, 0.1),
                                   blur_probability=0.5, blur_sigma=tuple(blur_sigma)),
                        ) * int(num_views)


class CropViews(ImageViews):
    """The masked-image methods' views: RandomResizedCrop (``scale``) and a horizontal flip
    with ``flip_probability``, no colour, no blur.  MAE's (main_pretrain.py: scale 0.2-1, a
    flip) and I-JEPA's (make_transforms: scale 0.3-1, no flip): their losses predict pixels or
    tokens, so colour noise in the view would only be more to predict."""

    def __init__(self, size=224, channels=3, scale=(0.2, 1.0), flip_probability=0.5, mean=None,
                 std=None, num_views=1):
        super().__init__(size, channels, mean, std)
        self.recipes = (ViewRecipe(size=self.size, scale=tuple(scale),
                                   flip_probability=float(flip_probability),
                                   jitter_probability=0.0, grayscale_probability=0.0,
                                   blur_probability=0.0),) * int(num_views)


class MultiCropViews(ImageViews):
    """SwAV's multi-crop as the reference's multi-crop transform draws it.

    ``global_crops`` crops at ``size`` (scale ``global_scale``) then ``local_crops`` at
    ``local_size`` (scale ``local_scale``); each: flip, colour jitter (0.4, 0.4, 0.4, 0.1) with
    p = 0.8, grayscale p = 0.2, Gaussian blur p = 0.5, no solarization.  The model treats the
    first two views as the global crops (``caco_tf.methods.base.Crops``).
    """

    def __init__(self, size=224, local_size=96, local_crops=6, global_scale=(0.14, 1.0),
                 local_scale=(0.05, 0.14), channels=3, blur_sigma=(0.1, 2.0), mean=None,
                 std=None):
        super().__init__(size, channels, mean, std)
        common = dict(jitter=(0.4, 0.4, 0.4, 0.1), blur_probability=0.5,
                      blur_sigma=tuple(blur_sigma))
        self.local_size = int(local_size)
        self.recipes = (
            (ViewRecipe(size=self.size, scale=tuple(global_scale), **common),) * 2
            + (ViewRecipe(size=self.local_size, scale=tuple(local_scale), **common),)
            * int(local_crops))


class ColourOnDevice:
    """Colour ``views`` split between the input pipeline and the train step
    (``data.views_on_device``).

    The pipeline decodes, crops and flips each view (``augment_image``) and ships it with its
    draws, ``{"pixels": [S, S, C] float32 in 0-255 units, "draws": [11]}``; the model's step
    runs each view's ``colour_view`` on the batch (``colour``).  The seeds and draws are the
    CPU path's, so the views are the same up to float32 rounding.
    """

    per_image = True

    def __init__(self, views):
        if not isinstance(views, ImageViews):
            raise TypeError(f"ColourOnDevice takes colour views (ImageViews), got "
                            f"{type(views).__name__}")
        self.views = views
        self.recipes, self.channels, self.size = views.recipes, views.channels, views.size
        self.mean, self.std = views.mean, views.std

    @property
    def num_views(self):
        return self.views.num_views

    def augment_image(self, image, seed):
        """Every view of one image, cropped and flipped, with its draws (``ImageViews``'s seeds)."""
        if image.dtype != tf.uint8:  # [0, 1] floats: shipped in pixel units, as decoded images
            image = tf.cast(image, tf.float32) * 255.0
        return tuple(self._shipped(*cropped_view(
            image, tf.random.experimental.stateless_fold_in(seed, index), recipe))
            for index, recipe in enumerate(self.recipes))

    def empty(self, channels):
        """What the pipeline ships for an image it drops (a bad file): zeros of every view."""
        return tuple(self._shipped(tf.zeros([r.size, r.size, channels]), tf.zeros([_DRAWS]))
                     for r in self.recipes)

    @staticmethod
    def _shipped(pixels, draws):
        return {"pixels": pixels, "draws": draws}

    def colour(self, crops):
        """The views' colour work on a batch of shipped views: normalized float32 [B, S, S, C]
        per view.  Image by image (``tf.map_fn``): the blur's mirrored padding has no
        vectorized form (``tf.vectorized_map``)."""
        views = []
        for crop, recipe in zip(crops, self.recipes):
            finish = _colour_view_function(recipe, self.channels, self.mean, self.std,
                                           1.0 / 255.0, bool(JIT_COMPILE))
            views.append(tf.map_fn(
                lambda args, finish=finish: finish(*args),
                (tf.cast(crop["pixels"], tf.float32), crop["draws"]),
                fn_output_signature=tf.TensorSpec([recipe.size, recipe.size, self.channels],
                                                  tf.float32)))
        return tuple(views)

    def normalize(self, images):
        return self.views.normalize(images)


# ---------------------------------------------------------------------------------------------
# Your own augmentations: any Keras preprocessing layer (Keras' own, keras-cv's, yours),
# appended to every view.
class WithLayers:
    """``views`` with ``layers`` applied to every view after its own augmentations, on its
    [0, 1] pixels (before the normalization): ``WithLayers(views, [keras.layers.RandomContrast(
    0.2, value_range=(0, 1))])``, or ``data.extra_layers`` in a configuration.

    The layers draw from their own Keras seed generators, so their part of a view is random but
    not reproduced by ``data.seed`` (the views' own part still is).
    """

    def __init__(self, views, layers):
        self.views, self.layers = views, list(layers)
        self.mean, self.std = views.mean, views.std
        self.per_image = getattr(views, "per_image", isinstance(views, ImageViews))
        for name in ("channels", "recipes", "size"):
            if hasattr(views, name):
                setattr(self, name, getattr(views, name))

    @property
    def num_views(self):
        return self.views.num_views

    def check_shapes(self, sizes, channels):
        """A ``ConfigError`` naming the first layer that changes the shape of a view of
        ``sizes`` × ``sizes`` × ``channels`` pixels (a resize, a dense layer): the encoder
        takes the views as they are.  Checked symbolically: no layer draws a random number."""
        import keras

        from caco_tf.errors import ConfigError

        for size in sizes:
            shape = (size, size, channels)
            view = keras.Input(shape)
            for layer in self.layers:
                try:
                    view = layer(view, training=True)
                except Exception:  # noqa: BLE001 — a layer that cannot run symbolically
                    return         # is checked by its first batch
                if tuple(view.shape[1:]) != shape:
                    raise ConfigError(
                        f"data.extra_layers: {type(layer).__name__} turns a view of "
                        f"{'x'.join(map(str, shape))} pixels into "
                        f"{'x'.join(map(str, view.shape[1:]))}; the encoder takes the views as "
                        f"they are: use layers that keep their shape (set the size with "
                        f"data.image_size)")

    def _extra(self, view):
        mean, std = tf.constant(self.mean, tf.float32), tf.constant(self.std, tf.float32)
        pixels = view * std + mean
        for layer in self.layers:
            pixels = tf.cast(layer(pixels, training=True), tf.float32)
        return normalize_pixels(tf.clip_by_value(pixels, 0.0, 1.0), mean, std)

    def augment_image(self, image, seed):
        return tuple(self._extra(view) for view in self.views.augment_image(image, seed))

    def __call__(self, images, seed):
        return tuple(self._extra(view) for view in self.views(images, seed))

    def normalize(self, images):
        return self.views.normalize(images)


def keras_layer(spec):
    """A layer from a configuration entry: ``{layer: NAME, ...its arguments}``, NAME a Keras
    layer (``RandomContrast``) or a dotted path (``keras_cv.layers.RandomHue``)."""
    import importlib

    import keras

    from caco_tf.errors import ConfigError

    arguments = dict(spec)
    name = arguments.pop("layer")
    module, _, attribute = name.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module) if module else keras.layers, attribute)
        return cls(**arguments)
    except (ImportError, AttributeError) as error:
        raise ConfigError(f"data.extra_layers: no layer {name} ({error}); give a Keras layer "
                          f"name (RandomContrast) or a dotted path") from None
    except (TypeError, ValueError) as error:
        raise ConfigError(f"data.extra_layers: {name}({arguments}) failed: {error}") from None
