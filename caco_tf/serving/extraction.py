"""Batch feature extraction through an exported SavedModel, streamed to disk.

``extract(model, source, out_dir)`` runs a uint8 signature (``serving_default`` → features,
``embed`` → embeddings) over every image of a source and writes to ``out_dir``:

- ``features.npy``: float32 [N, F], one row per readable image, in source order;
- ``labels.npy``: int64 [N], the class index, -1 when unlabelled;
- ``classes.json``: the class names the indices refer to (``[]`` when unknown);
- ``paths.txt``: one name per row (a file path, ``FILE#i`` or ``NAME:SPLIT#i``).

Sources: an image folder (``FOLDER/<class>/...``; files directly in FOLDER are unlabelled), an
``.npz`` with uint8 ``images`` [N, H, W(, C)] and optional ``labels`` (or an ``.npy``), or a
TFDS split.  Memory is constant in the number of images (a folder's list of file names aside):
the images are counted first, read one by one, and each batch goes straight into ``.npy``
memory maps of that size.  Image files
that cannot be read or decoded are skipped and reported.  Files are decoded and converted to the
model's channel count (RGB ↔ grayscale, alpha dropped) exactly as its ``serve_bytes`` does;
resizing and normalization happen inside the model.

Only TensorFlow and NumPy are needed (tensorflow_datasets for TFDS): no keras, no training code.
"""

import collections
import errno
import json
import os
import sys
import time
import zipfile

import numpy as np
import tensorflow as tf
from numpy.lib.format import open_memmap

from caco_tf.data import images as image_ops
from caco_tf.data.sources import IMAGE_EXTENSIONS, NOT_REGULAR, UNSUPPORTED, images_under
from caco_tf.errors import ExtractionError


# records: an iterator of (uint8 image [H, W, c] or None when unreadable, label, name).
Source = collections.namedtuple("Source", "count classes records")
Signature = collections.namedtuple("Signature", "function channels output dim model")
Result = collections.namedtuple("Result", "count dim skipped")


# --- the model -----------------------------------------------------------------------------------

def find_saved_model(path):
    """``path`` itself, or its highest numbered version folder (TF Serving's base path)."""
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        return path
    if not os.path.isdir(path):
        raise ExtractionError(f"no SavedModel at {path}")
    versions = [int(name) for name in os.listdir(path) if name.isdigit()
                and os.path.exists(os.path.join(path, name, "saved_model.pb"))]
    if not versions:
        raise ExtractionError(f"no saved_model.pb in {path} nor in a numbered version folder")
    return os.path.join(path, str(max(versions)))


def load_signature(path, name="serving_default"):
    """One uint8-image signature of a SavedModel, with its channel count and output size."""
    path = find_saved_model(path)
    try:
        model = tf.saved_model.load(path)
    except (OSError, ValueError, tf.errors.OpError) as error:
        raise ExtractionError(f"cannot load the SavedModel at {path}: {error}") from None
    if name not in model.signatures:
        raise ExtractionError(f"the SavedModel at {path} has no signature {name!r} "
                              f"(it has: {', '.join(sorted(model.signatures))})")
    function = model.signatures[name]
    inputs = function.structured_input_signature[1]
    if set(inputs) != {"images"} or inputs["images"].dtype != tf.uint8:
        raise ExtractionError(f"signature {name!r} does not take uint8 images")
    (output, spec), = function.structured_outputs.items()
    return Signature(function, inputs["images"].shape[-1], output, spec.shape[-1], model)


# --- sources -------------------------------------------------------------------------------------

def list_image_files(folder):
    """Image files under ``folder``, in a stable order: its own files, then sub-folders sorted."""
    if not os.path.isdir(folder):
        raise ExtractionError(f"not a readable folder: {folder}")

    def fail(error):
        raise ExtractionError(f"cannot read {error.filename}: {error.strerror}")

    passed_over = []
    files = images_under(folder, passed_over, on_error=fail)
    if not files:
        others = (f" ({len(passed_over)} file{'s' * (len(passed_over) > 1)} of another type)"
                  if passed_over else "")
        raise ExtractionError(f"no images ({' '.join(IMAGE_EXTENSIONS)}) under {folder}{others}")
    for reason, what in ((UNSUPPORTED, f"of another type than {' '.join(IMAGE_EXTENSIONS)}"),
                         (NOT_REGULAR, "named as images but not regular files (named pipes, "
                                       "devices, broken links)")):
        paths = [path for path, why in passed_over if why == reason]
        if paths:
            print(f"warning: passed over {len(paths)} file{'s' * (len(paths) > 1)} {what} "
                  f"under {folder} ({', '.join(paths[:3])}{', ...' if len(paths) > 3 else ''})",
                  file=sys.stderr)
    return files


def read_image(path):
    """uint8 RGB [H, W, 3], or None when the file cannot be read or decoded."""
    try:
        with open(path, "rb") as handle:
            return image_ops.decode_file_rgb(handle.read()).numpy()
    except (OSError, tf.errors.OpError):
        return None


def folder_source(folder):
    """Every image under ``folder``; the first sub-folder level names the class."""
    files = list_image_files(folder)
    parts = [os.path.relpath(path, folder).split(os.sep) for path in files]
    class_names = [part[0] if len(part) > 1 else None for part in parts]
    classes = sorted({name for name in class_names if name is not None})
    index = {name: i for i, name in enumerate(classes)}
    labels = [index.get(name, -1) for name in class_names]
    records = ((read_image(path), label, path) for path, label in zip(files, labels))
    return Source(len(files), classes, records)


def _read_npy_header(stream):
    """(shape, dtype) from the header of a .npy stream, which is left at the first row."""
    readers = {(1, 0): np.lib.format.read_array_header_1_0,
               (2, 0): np.lib.format.read_array_header_2_0}
    version = np.lib.format.read_magic(stream)
    if version not in readers:
        raise ValueError(f"unsupported .npy format version {version} for 'images'")
    shape, fortran_order, dtype = readers[version](stream)
    if fortran_order:
        raise ValueError("'images' is in Fortran order; save it C-ordered")
    return shape, dtype


def _npz_image_rows(path, chunk=256):
    """Rows of ``images`` inside an .npz, decompressed a chunk at a time (an .npz cannot map)."""
    with zipfile.ZipFile(path) as archive, archive.open("images.npy") as stream:
        shape, dtype = _read_npy_header(stream)
        row_bytes = int(np.prod(shape[1:])) * dtype.itemsize
        for start in range(0, shape[0], chunk):
            rows = min(chunk, shape[0] - start)
            yield from np.frombuffer(stream.read(rows * row_bytes), dtype).reshape(
                (rows,) + tuple(shape[1:]))


def _open_numpy(path):
    """(shape, dtype, row iterator, labels or None) of the images of an .npy or an .npz."""
    data = np.load(path, mmap_mode="r")  # an .npy maps; an .npz opens lazily
    if isinstance(data, np.ndarray):
        return data.shape, data.dtype, iter(data), None
    with data:
        if "images" not in data.files:
            raise ValueError(f"no 'images' array (found: {', '.join(data.files)})")
        labels = data["labels"] if "labels" in data.files else None
    with zipfile.ZipFile(path) as archive, archive.open("images.npy") as stream:
        shape, dtype = _read_npy_header(stream)
    return shape, dtype, _npz_image_rows(path), labels


def npz_source(path):
    """uint8 ``images`` [N, H, W(, C)] and optional ``labels`` from an .npz (or an .npy)."""
    try:
        shape, dtype, rows, labels = _open_numpy(path)
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise ExtractionError(f"cannot read NumPy data at {path}: {error}") from None
    if dtype != np.uint8 or len(shape) not in (3, 4) or (len(shape) == 4 and shape[-1] > 4):
        raise ExtractionError(f"images in {path} are {dtype} {list(shape)}; expected uint8 "
                              "[N, height, width] or [N, height, width, channels]")
    if labels is not None and len(labels) != shape[0]:
        raise ExtractionError(f"{path} has {len(labels)} labels for {shape[0]} images")
    labels = np.full(shape[0], -1) if labels is None else np.asarray(labels, np.int64)
    records = ((row if row.ndim == 3 else row[..., np.newaxis], int(label), f"{path}#{i}")
               for i, (row, label) in enumerate(zip(rows, labels)))
    return Source(shape[0], [], records)


def tfds_source(spec):
    """A TFDS split, ``NAME:SPLIT`` (e.g. ``cifar10:test``), prepared first if needed."""
    name, _, split = spec.partition(":")
    if not name or not split:
        raise ExtractionError(f"--tfds takes NAME:SPLIT (e.g. cifar10:test), got {spec!r}")
    import tensorflow_datasets as tfds

    from caco_tf.data.sources import prepare_tfds

    try:
        builder = tfds.builder(name)
    except Exception as error:  # TFDS raises many kinds: unknown name, bad version...
        first_line = (str(error).splitlines() or [type(error).__name__])[0]  # not its catalogue
        raise ExtractionError(f"cannot load TFDS {spec}: {first_line}") from None
    if not builder.is_prepared():
        prepare_tfds(builder, name)  # a one-line DataError when it cannot be
    try:
        dataset = builder.as_dataset(split=split, shuffle_files=False)
        info = builder.info
        count = info.splits[split].num_examples
    except Exception as error:  # a bad split
        first_line = (str(error).splitlines() or [type(error).__name__])[0]  # not its catalogue
        raise ExtractionError(f"cannot load TFDS {spec}: {first_line}") from None
    label = info.features["label"] if "label" in info.features.keys() else None
    classes = list(getattr(label, "names", None) or [])
    records = ((example["image"], int(example["label"]) if label is not None else -1,
                f"{spec}#{i}") for i, example in enumerate(tfds.as_numpy(dataset)))
    return Source(count, classes, records)


# --- extraction ----------------------------------------------------------------------------------

class Progress:
    """A one-line text progress bar (no tqdm, no keras), redrawn at most 5 times a second."""

    def __init__(self, total, stream=sys.stderr, width=30):
        self.total, self.stream, self.width = total, stream, width
        self.start = self.drawn = time.monotonic()

    def update(self, done):
        now = time.monotonic()
        if now - self.drawn < 0.2 and done < self.total:
            return
        self.drawn = now
        filled = self.width * done // max(self.total, 1)
        rate = done / max(now - self.start, 1e-9)
        self.stream.write(f"\r{done}/{self.total} [{'=' * filled}{'.' * (self.width - filled)}]"
                          f" {rate:.0f} images/s")
        self.stream.flush()

    def close(self):
        self.stream.write("\n")


def _batches(records, batch_size):
    batch = []
    for record in records:
        batch.append(record)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


def _run(signature, images):
    """Outputs [len(images), dim]: one model call per distinct image shape in the batch."""
    outputs = np.empty((len(images), signature.dim), np.float32)
    groups = collections.defaultdict(list)
    for i, image in enumerate(images):
        groups[image.shape].append(i)
    for rows in groups.values():
        batch = image_ops.convert_channels(np.stack([images[i] for i in rows]), signature.channels)
        outputs[rows] = signature.function(images=tf.constant(batch))[signature.output].numpy()
    return outputs


def _shrink(path, rows, chunk=65536):
    """Rewrite an .npy keeping its first ``rows`` rows, a chunk at a time."""
    old = np.load(path, mmap_mode="r")
    new = open_memmap(path + ".part", "w+", old.dtype, (rows,) + old.shape[1:])
    for start in range(0, rows, chunk):
        stop = min(start + chunk, rows)
        new[start:stop] = old[start:stop]
    new.flush()
    del new, old
    os.replace(path + ".part", path)


def _stream(model, source, batch_size, features, labels, paths, bar):
    """Run every readable image of ``source`` into the maps; return (rows written, skipped)."""
    written, seen, skipped = 0, 0, []
    for batch in _batches(source.records, batch_size):
        seen += len(batch)
        if seen > source.count:
            raise ExtractionError(f"the source holds more than the {source.count} images "
                                  "it announced")
        skipped += [name for image, _, name in batch if image is None]
        batch = [record for record in batch if record[0] is not None]
        end = written + len(batch)
        if batch:
            features[written:end] = _run(model, [image for image, _, _ in batch])
            labels[written:end] = [label for _, label, _ in batch]
            paths.writelines(f"{name}\n" for _, _, name in batch)
        written = end
        if bar:
            bar.update(seen)
    if bar:
        bar.close()
    return written, skipped


def _reserve(path):
    """Take the disk blocks of a memory-mapped file now: a full disk is then an ``OSError``
    here, not a SIGBUS when a page of the map is first written."""
    handle = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(handle, 0, os.fstat(handle).st_size)
    except OSError as error:
        if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without it
            raise
    finally:
        os.close(handle)


def extract(model, source, out_dir, signature="serving_default", batch_size=256,
            progress=True):
    """Write features, labels, classes and paths of ``source`` to ``out_dir``; see the module.

    ``model`` is a SavedModel path or a ``Signature`` from ``load_signature``.
    """
    if not isinstance(model, Signature):
        model = load_signature(model, signature)
    os.makedirs(out_dir, exist_ok=True)
    features_path = os.path.join(out_dir, "features.npy")
    labels_path = os.path.join(out_dir, "labels.npy")
    # Sized for every counted image; the rows of skipped files are cut off at the end.
    features = open_memmap(features_path, "w+", np.float32, (source.count, model.dim))
    labels = open_memmap(labels_path, "w+", np.int64, (source.count,))
    _reserve(features_path)
    _reserve(labels_path)
    with open(os.path.join(out_dir, "paths.txt"), "w") as paths:
        written, skipped = _stream(model, source, batch_size, features, labels, paths,
                                   Progress(source.count) if progress else None)
    features.flush()
    labels.flush()
    del features, labels  # close the maps before any rewrite
    if written == 0:
        raise ExtractionError(f"none of the {source.count} images could be read")
    if written < source.count:
        _shrink(features_path, written)
        _shrink(labels_path, written)
    with open(os.path.join(out_dir, "classes.json"), "w") as handle:
        json.dump(source.classes, handle, indent=1)
    return Result(written, model.dim, skipped)
