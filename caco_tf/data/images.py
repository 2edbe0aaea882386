"""Image decoding and resizing shared by the input pipeline, evaluation and the exported model.

One definition of each step, so that training, evaluation and serving see an image the same way:

- ``decode_image``: encoded JPEG/PNG/GIF/BMP/WebP bytes → uint8 [H, W, C] for C = 1 or 3
  (decoded to RGB, turned upright by a JPEG's EXIF orientation, then grayscale through the luma
  ``LUMA``, alpha dropped), in the graph: what the exported ``serve_bytes`` accepts;
- ``decode_file_image``: the same, and TIFF too (through Pillow, outside the graph): what
  training, evaluation and feature extraction read from files;
- ``resize_and_center_crop``: the shorter side to round(S / crop_fraction), then an S×S centre
  crop (256 → 224 for ImageNet); images already S×S pass untouched;
- ``normalize_pixels``: [0, 1] pixels → ``(x - mean) / std``, the backbone's input: the one
  normalization of the views, evaluation and the exported models;
- ``preprocess``: uint8 → [0, 1] → resized and cropped → normalized, what the exported
  signatures run in their graph.
"""

import tensorflow as tf

from caco_tf.data import DEFAULT_CROP_FRACTION

LUMA = (0.299, 0.587, 0.114)  # ITU-R 601, as torchvision's and TF's rgb_to_grayscale


def to_unit_float(images):
    """uint8 [0, 255] → float32 [0, 1]."""
    return tf.cast(images, tf.float32) / 255.0


def normalize_pixels(pixels, mean, std):
    """``(pixels - mean) / std``: a subtraction, then a division, in the operands' own types
    (tensors and Python floats in a graph, NumPy arrays outside one)."""
    return (pixels - mean) / std


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
    return normalize_pixels(images, tf.constant(mean, tf.float32), tf.constant(std, tf.float32))


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
    """Encoded JPEG/PNG/GIF/BMP/WebP bytes → uint8 RGB [H, W, 3] (GIF: first frame; alpha
    dropped; 16-bit PNG scaled to 8 bits; CMYK JPEG converted), upright by a JPEG's EXIF
    orientation.

    RGB is the one output every format decodes to (GIF and BMP cannot give one channel), and a
    grayscale file comes back unchanged through ``convert_channels(..., 1)``.
    """
    image = tf.io.decode_image(contents, channels=3, expand_animations=False)
    return upright(image, exif_orientation(contents))


def decode_image(contents, channels):
    """Encoded image bytes → uint8 [H, W, channels], as ``serve_bytes`` decodes each file."""
    return convert_channels(decode_rgb(contents), channels)


def is_tiff(contents):
    """Whether encoded bytes start as a TIFF file (little- or big-endian)."""
    head = tf.strings.substr(contents, 0, 4)
    return tf.logical_or(tf.equal(head, b"II*\x00"), tf.equal(head, b"MM\x00*"))


def decode_file_rgb(contents):
    """``decode_rgb``, and TIFF through Pillow (TensorFlow has no TIFF decoder): for files read
    by the input pipelines, not for the exported graph (Pillow runs outside it)."""
    def pillow():
        image = tf.py_function(pillow_rgb, [contents], tf.uint8)
        image.set_shape([None, None, 3])
        return image

    return tf.cond(is_tiff(contents), pillow, lambda: decode_rgb(contents))


def decode_file_image(contents, channels):
    """``decode_file_rgb`` to ``channels`` (1 or 3)."""
    return convert_channels(decode_file_rgb(contents), channels)


def pillow_rgb(contents):
    """Encoded bytes → uint8 RGB [H, W, 3] through Pillow, upright by the EXIF orientation;
    16-bit images keep their 8 high bits."""
    import io

    import numpy as np
    from PIL import Image, ImageOps

    contents = contents.numpy() if hasattr(contents, "numpy") else contents
    with Image.open(io.BytesIO(contents)) as opened:
        image = ImageOps.exif_transpose(opened)
        if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
            pixels = np.asarray(image).astype(np.int64)
            pixels = (pixels >> 8) if pixels.max(initial=0) > 255 else pixels
            return np.repeat(pixels.clip(0, 255).astype(np.uint8)[..., None], 3, -1)
        if image.mode == "F":  # 32-bit float: Pillow's convert would clip [0, 1] to black
            return np.repeat(float_to_uint8(np.asarray(image, np.float32))[..., None], 3, -1)
        return np.asarray(image.convert("RGB"))


def float_to_uint8(pixels):
    """Float pixels → uint8: [0, 1] scaled to [0, 255], [0, 255] rounded; any other range (or a
    NaN) is a ``ValueError``, the file then counted as unreadable: its scale is unknown."""
    import numpy as np

    low, high = (float(pixels.min(initial=0.0)), float(pixels.max(initial=0.0)))
    if not (np.isfinite(low) and np.isfinite(high) and low >= 0.0 and high <= 255.0):
        raise ValueError(f"float pixels from {low} to {high}: not in [0, 1] or [0, 255]")
    scale = 255.0 if high <= 1.0 else 1.0
    return np.round(pixels * scale).astype(np.uint8)


# A JPEG's EXIF segment (APP1) follows its SOI marker, or JFIF's APP0 segment; its first
# directory, whose entries are sorted by tag (Orientation, 0x0112, comes third after Make and
# Model), lies within the file's first EXIF_READ bytes in every camera's layout.
EXIF_READ, EXIF_ENTRIES = 1024, 32
ORIENTATION_TAG = 0x0112
# Orientation o (1-8) → (transpose, then reverse the rows, then reverse the columns).
_TRANSPOSE = (False, False, False, False, True, True, True, True)
_FLIP_ROWS = (False, False, True, True, False, False, True, True)
_FLIP_COLUMNS = (False, True, True, False, False, True, True, False)


def exif_orientation(contents):
    """The EXIF orientation (1-8) of a JPEG's bytes, in the graph; 1 when it has none."""
    padded = tf.strings.join([tf.strings.substr(contents, 0, EXIF_READ), "\0" * EXIF_READ])
    head = tf.cast(tf.io.decode_raw(tf.strings.substr(padded, 0, EXIF_READ), tf.uint8), tf.int32)

    def bytes_at(offset, count):
        return tf.gather(head, tf.clip_by_value(offset + tf.range(count), 0, EXIF_READ - 1))

    def is_marker(offset, marker):  # FF marker
        return tf.reduce_all(tf.equal(bytes_at(offset, 2), [0xFF, marker]))

    # APP1 right after SOI, or after an APP0 segment (its length: the 2 bytes after it).
    app0 = is_marker(2, 0xE0)
    app1 = tf.where(app0, 4 + bytes_at(4, 2)[0] * 256 + bytes_at(4, 2)[1], 2)
    found = tf.reduce_all([is_marker(0, 0xD8), is_marker(app1, 0xE1),
                           tf.reduce_all(tf.equal(bytes_at(app1 + 4, 6), list(b"Exif\0\0")))])
    start = app1 + 10  # the TIFF header
    little = tf.equal(bytes_at(start, 1)[0], 0x49)  # "II"

    def number(offsets, size):  # unsigned integers of ``size`` bytes at ``offsets``
        offsets = tf.clip_by_value(offsets, 0, EXIF_READ - size)
        parts = [tf.gather(head, offsets + k) for k in range(size)]
        order = tf.where(little, tf.stack(parts), tf.stack(parts[::-1]))
        return sum(order[k] * 256 ** k for k in range(size))

    directory = start + number(start + 4, 4)
    count = tf.minimum(number(directory, 2), EXIF_ENTRIES)
    entries = directory + 2 + 12 * tf.range(EXIF_ENTRIES)
    hit = tf.logical_and(tf.equal(number(entries, 2), ORIENTATION_TAG),
                         tf.range(EXIF_ENTRIES) < count)
    value = tf.reduce_max(tf.where(hit, number(entries + 8, 2), 0))
    valid = tf.reduce_all([found, value >= 1, value <= 8])
    return tf.where(valid, value, 1)


def upright(image, orientation):
    """An [H, W, C] image as its EXIF ``orientation`` (1-8) says it should be seen: a
    transpose, then reversals, as data rather than branches (cheaper in a ``tf.data`` map)."""
    index, channels = orientation - 1, image.shape[-1]
    image = tf.transpose(image, tf.where(tf.gather(_TRANSPOSE, index), [1, 0, 2], [0, 1, 2]))
    axes = tf.boolean_mask([0, 1], tf.stack([tf.gather(_FLIP_ROWS, index),
                                             tf.gather(_FLIP_COLUMNS, index)]))
    return tf.ensure_shape(tf.reverse(image, axes), [None, None, channels])
