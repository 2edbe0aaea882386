"""Two-view augmentation, per image, on batches inside ``tf.data``.

Every random parameter is drawn per image from stateless RNG seeded by (seed, batch index), so a
run is reproducible for a given seed while every batch of every epoch sees fresh views.

``DigitViews`` is the offline default for 28×28 grayscale digits.  Colour ops make no sense on
one channel, so it uses what the prototype in ``shared/notes`` found useful for digits: one
per-image affine (crop-and-resize, rotation, shear, translation) applied with a *single* bilinear
resample (keras' RandomRotation/RandomZoom/RandomTranslation each resample, blurring thin strokes
three times over, and keras-cv has no per-image affine), stroke thickness, intensity gain and
Gaussian noise.
"""

import math

import tensorflow as tf

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
    """Two independently augmented views of a batch of [B, H, W, 1] images in [0, 1]."""

    def __init__(self, scale=(0.3, 1.0), ratio=(3 / 4, 4 / 3), rotation=15.0, shear=0.15,
                 translate=0.1, stroke_probability=0.15, gain=(0.6, 1.0), noise=0.05,
                 mean=MNIST_MEAN, std=MNIST_STD):
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
        return (tf.cast(images, tf.float32) - self.mean) / self.std

    def __call__(self, images, seed):
        seed1, seed2 = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        return self.view(images, seed1), self.view(images, seed2)
