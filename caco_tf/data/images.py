"""Image decoding and resizing shared by the input pipeline, evaluation and the exported model.

One definition of each step, so that training, evaluation and serving see an image the same way:

- ``decode_image``: encoded JPEG/PNG/GIF/BMP bytes → uint8 [H, W, C] for C = 1 or 3 (decoded to
  RGB, then grayscale through the luma ``LUMA``, alpha dropped);
- ``resize_and_center_crop``: the shorter side to round(S / crop_fraction), then an S×S centre
  crop (256 → 224 for ImageNet); images already S×S pass untouched;
- ``preprocess``: uint8 → [0, 1] → resized and cropped → ``(x - mean) / std``, what the
  exported signatures run in their graph.
"""

import tensorflow as tf

DEFAULT_CROP_FRACTION = 0.875
LUMA = (0.299, 0.587, 0.114)  # ITU-R 601, as torchvision's and TF's rgb_to_grayscale


def to_unit_float(images):
    """uint8 [0, 255] → float32 [0, 1]."""
    return tf.cast(images, tf.float32) / 255.0


def resize_and_center_crop(images, image_size, crop_fraction=DEFAULT_CROP_FRACTION):
    """float [B, H, W, C] → [B, S, S, C]: shorter side to round(S / crop_fraction), centre crop.

    Images already S×S pass through untouched, so a model's own-size inputs are not resampled.
    """
    resize_to = round(image_size / crop_fraction)
    shape = tf.shape(images)
    height, width = shape[1], shape[2]

    def resize_then_crop():
        short = tf.cast(tf.minimum(height, width), tf.float32)

        def scaled(side):  # truncated as torchvision's Resize does, never below resize_to
            return tf.maximum(resize_to, tf.cast(tf.cast(side, tf.float32) * resize_to / short,
                                                 tf.int32))

        new_height, new_width = scaled(height), scaled(width)
        resized = tf.image.resize(images, [new_height, new_width], method="bilinear",
                                  antialias=True)
        top, left = (new_height - image_size) // 2, (new_width - image_size) // 2
        return resized[:, top:top + image_size, left:left + image_size, :]

    at_size = tf.logical_and(tf.equal(height, image_size), tf.equal(width, image_size))
    images = tf.cond(at_size, lambda: images, resize_then_crop)
    return tf.ensure_shape(images, [None, image_size, image_size, images.shape[-1]])


def preprocess(images, image_size, mean, std, crop_fraction=DEFAULT_CROP_FRACTION):
    """uint8 [B, H, W, C] → the normalized float [B, S, S, C] the backbone was trained on."""
    images = resize_and_center_crop(to_unit_float(images), image_size, crop_fraction)
    return (images - tf.constant(mean, tf.float32)) / tf.constant(std, tf.float32)


def convert_channels(images, channels):
    """uint8 [..., c] with c in 1-4 (alpha last) → [..., channels] for channels 1 or 3."""
    have = images.shape[-1]
    if have in (2, 4):  # grayscale + alpha, RGBA: drop the alpha channel
        images = images[..., :have - 1]
        have -= 1
    if have == channels:
        return images
    if channels == 1:
        return tf.image.rgb_to_grayscale(images)
    return tf.image.grayscale_to_rgb(images)


def decode_rgb(contents):
    """Encoded JPEG/PNG/GIF/BMP bytes → uint8 RGB [H, W, 3] (GIF: first frame; alpha dropped).

    RGB is the one output every format decodes to (GIF and BMP cannot give one channel), and a
    grayscale file comes back unchanged through ``convert_channels(..., 1)``.
    """
    return tf.io.decode_image(contents, channels=3, expand_animations=False)


def decode_image(contents, channels):
    """Encoded image bytes → uint8 [H, W, channels], as ``serve_bytes`` decodes each file."""
    return convert_channels(decode_rgb(contents), channels)
