"""Generated shapes: the offline comparison benchmark (``data.source: shapes``).

Each image is 32×32 grayscale (uint8, one channel): one of 10 shapes (circle, square,
triangle, star, cross, ring, diamond, hexagon, bar, chevron; the label is the shape's index in
``CLASSES``) at a random size (radius 18-32 % of the side), position (wholly inside the image)
and tilt (within ±10° of upright), in one flat shade on a flat background of the other shade
(a light shape, 160-255, on a dark background, 0-96, or the reverse, each half of the time),
under strong Gaussian pixel noise (sigma 40).  The shape is drawn as a mask at 2× and
box-filtered to 32 px (anti-aliased edges).  Only the shape tells the class; position, size,
shades, polarity and noise are nuisances.  Every nuisance is one the standard views vary
(crops: position and size; brightness and contrast jitter, solarization: shades and polarity;
blur: noise), none one they keep identical in both views (a full rotation or a background
gradient's direction, which the self-supervised methods then learned instead of the shape:
benchmarks/shapes_pilots.md).  The noise is what keeps the raw pixels' kNN low.

Splits (labels cycle 0-9, so every split is class-balanced; labels serve evaluation only):

- ``shapes``: ``TRAIN`` = 20,000 training images (seed ``TRAIN_SEED``) and ``TEST`` = 20,000
  held-out images (seed ``TEST_SEED``): one standard error of a held-out accuracy p,
  sqrt(p (1 - p) / 20,000), is at most 0.354 point (at 50 %; 0.33 at 67 %, 0.30 at 76 %),
  whatever accuracy a method lands at (50-76 % on the validation split);
- ``shapes_validation``: the tuning split, both carved from the 20,000 training images: the
  first ``VALIDATION_TRAIN`` = 15,000 for training, the last 5,000 for validation.  The
  held-out 20,000 choose nothing.

Image ``i`` of a split is drawn from its own random stream, ``numpy.random.default_rng([seed,
i])``: images are independent of each other and of their order, the first ``n`` images of a
split are the same whatever its length, and no held-out image is a re-placement of a training
image (the held-out split's streams are other streams).  Pure NumPy and Pillow; generating the
40,000 images takes about 7 s on 2 loaded cores (``load_shapes`` keeps them in memory per
process: ``functools.lru_cache``).
"""

import functools
import math

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ("circle", "square", "triangle", "star", "cross", "ring", "diamond", "hexagon", "bar",
           "chevron")
SIZE = 32               # the images' side
TRAIN, TEST = 20000, 20000  # held out: one standard error <= 0.354 point at any accuracy
VALIDATION_TRAIN = 15000  # shapes_validation: the first 15,000 training images train, the last
                          # 5,000 validate
TRAIN_SEED, TEST_SEED = 1, 2
SUPERSAMPLE = 2         # the shape's mask is drawn at 2× and box-filtered down
ROTATION = 10.0         # the shape's rotation: uniform within +-10 degrees of upright
RADIUS = (0.18, 0.32)   # the shape's radius (its outline's), a fraction of the side
NOISE = 40.0            # the pixel noise's standard deviation (of 255)
DARK, LIGHT = (0, 96), (160, 255)  # the two shades: a light shape on a dark background or
                                   # the reverse, each half of the time


def _regular(count, inner=None):
    points = []
    for k in range(count * (2 if inner else 1)):
        r = inner if inner and k % 2 else 1.0
        a = math.pi * 2 * k / (count * (2 if inner else 1))
        points.append((r * math.cos(a), r * math.sin(a)))
    return points


# Unit outlines (radius 1) of the polygonal shapes; circle and ring are ellipses.
OUTLINES = {
    "square": [(-0.75, -0.75), (0.75, -0.75), (0.75, 0.75), (-0.75, 0.75)],
    "triangle": _regular(3),
    "star": _regular(5, inner=0.4),
    "cross": [(-0.3, -1), (0.3, -1), (0.3, -0.3), (1, -0.3), (1, 0.3), (0.3, 0.3), (0.3, 1),
              (-0.3, 1), (-0.3, 0.3), (-1, 0.3), (-1, -0.3), (-0.3, -0.3)],
    "diamond": [(0, -1), (0.55, 0), (0, 1), (-0.55, 0)],
    "hexagon": _regular(6),
    "bar": [(-1, -0.28), (1, -0.28), (1, 0.28), (-1, 0.28)],
    "chevron": [(-1, -0.6), (0, 0.2), (1, -0.6), (1, 0.0), (0, 0.8), (-1, 0.0)],
}


def _mask(shape, size, rng):
    """The shape's coverage: size² bytes (0-255, row-major)."""
    big = size * SUPERSAMPLE
    radius = big * rng.uniform(*RADIUS)
    centre = rng.uniform(radius, big - radius, 2)
    angle = math.radians(rng.uniform(-ROTATION, ROTATION))
    mask = Image.new("L", (big, big), 0)
    pen = ImageDraw.Draw(mask)
    box = [centre[0] - radius, centre[1] - radius, centre[0] + radius, centre[1] + radius]
    if shape == "circle":
        pen.ellipse(box, fill=255)
    elif shape == "ring":
        pen.ellipse(box, fill=255)
        inner = radius * 0.6
        pen.ellipse([centre[0] - inner, centre[1] - inner, centre[0] + inner, centre[1] + inner],
                    fill=0)
    else:
        cos, sin = math.cos(angle), math.sin(angle)
        pen.polygon([(centre[0] + radius * (x * cos - y * sin),
                      centre[1] + radius * (x * sin + y * cos)) for x, y in OUTLINES[shape]],
                    fill=255)
    return mask.resize((size, size), Image.BOX).tobytes()


def _draws(label, size, rng):
    """Everything random about one image, drawn from its stream ``rng`` in a fixed order."""
    dark, light = rng.uniform(*DARK), rng.uniform(*LIGHT)
    shade, background = (light, dark) if rng.random() < 0.5 else (dark, light)
    alpha = _mask(CLASSES[label], size, rng)
    noise = rng.standard_normal((size, size), dtype=np.float32)
    return background, alpha, shade, noise


def _compose(draws, size):
    """uint8 [n, size, size, 1] from the ``_draws`` of n images, in one vectorized pass."""
    background, alpha, shade, noise = zip(*draws)
    alpha = np.frombuffer(b"".join(alpha), np.uint8).reshape(-1, size, size)
    background, shade, noise = (np.asarray(a, np.float32) for a in (background, shade, noise))
    alpha = alpha.astype(np.float32) / 255.0
    image = (background[:, None, None] * (1 - alpha) + shade[:, None, None] * alpha
             + NOISE * noise)
    return np.clip(np.round(image), 0, 255).astype(np.uint8)[..., None]


def draw(label, size=SIZE, rng=None):
    """One image of class ``label`` (an index into ``CLASSES``): uint8 [size, size, 1]."""
    rng = np.random.default_rng() if rng is None else rng
    return _compose([_draws(label, size, rng)], size)[0]


@functools.lru_cache(maxsize=8)
def generate(count, seed, size=SIZE):
    """``count`` images of the split seeded ``seed``: (images uint8 [count, size, size, 1],
    labels int64 [count]); image ``i`` has label ``i % 10`` and its own stream
    ``default_rng([seed, i])``.  Cached per process; the arrays are read-only."""
    labels = np.arange(count, dtype=np.int64) % len(CLASSES)
    images = np.empty((count, size, size, 1), np.uint8)
    chunk = 1000
    for first in range(0, count, chunk):
        images[first:first + chunk] = _compose(
            [_draws(int(labels[i]), size, np.random.default_rng([seed, i]))
             for i in range(first, min(first + chunk, count))], size)
    images.flags.writeable = False
    labels.flags.writeable = False
    return images, labels


def load_shapes():
    """The benchmark's splits: dict(train=(images, labels), test=(images, labels)), 20,000
    training and 20,000 held-out images uint8 [N, 32, 32, 1], labels int64 (evaluation only)."""
    return dict(train=generate(TRAIN, TRAIN_SEED), test=generate(TEST, TEST_SEED))


def load_shapes_validation():
    """The tuning split, carved out of the 20,000 training images: the first 15,000 train, the
    last 5,000 validate.  Hyper-parameters are chosen here; the held-out 20,000 stay untouched.
    """
    images, labels = load_shapes()["train"]
    return dict(train=(images[:VALIDATION_TRAIN], labels[:VALIDATION_TRAIN]),
                test=(images[VALIDATION_TRAIN:], labels[VALIDATION_TRAIN:]))
