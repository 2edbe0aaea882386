"""The tf.data pipelines that feed pre-training and evaluation from a source (``sources``).

Files and TFDS records stay encoded until the pipeline's parallel map decodes them, next to the
augmentation.  Every image is decoded to the configured channels: grayscale is replicated to
RGB, RGB goes to gray through the luma, an alpha channel is dropped
(``images.decode_file_image``: the decoding the exported model serves, and TIFF).

Bad input: a corrupt or truncated file is skipped, never crashes a run; ``SkippedFiles``
counts them and reports once per epoch (count and a few names).  A file is checked cheaply
before decoding (a known signature and an intact end: JPEG's EOI marker, PNG's IEND chunk,
GIF's trailer, BMP's and WebP's declared size); one that still fails to decode is skipped and
named too (``map_naming_failures``).  Only a record that does not parse is counted unnamed.

Distribution: ``distribute`` builds one pipeline per input pipeline (worker) with the
``tf.distribute.InputContext``; each reads its own shard of the images (``Dataset.shard``,
``tfds.even_splits``) and yields per-replica batches, so every image is seen once per epoch
across replicas and workers.
"""

import logging
import threading

import keras
import numpy as np
import tensorflow as tf

from caco_tf import tracing  # noqa: F401  (autograph leaves caco_tf alone)

from caco_tf.data import augment
from caco_tf.data.images import decode_file_image, resize_and_center_crop, to_unit_float
from caco_tf.data.sources import (UNREADABLE, ArraySource, DataError, Source, _labelled,
                                  count_gaps)

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- bad input
class SkippedFiles:
    """Undecodable images met by the pipelines; ``report`` logs one warning and resets.

    ``list_path``: a file (the run folder's ``skipped_files.txt``) to which each skipped
    file's name is appended once, after the reason ``unreadable`` and a tab."""

    def __init__(self, examples=3, list_path=None):
        self.examples, self.list_path = examples, list_path
        self.total = 0
        self._lock = threading.Lock()
        self._count, self._names, self._listed = 0, [], set()
        self._more = False  # files since the last report beyond the names shown, or unnamed

    def record(self, name):
        """Called from the pipeline (``tf.py_function``) for each skipped file."""
        name = name.numpy().decode("utf-8", "replace") if hasattr(name, "numpy") else str(name)
        with self._lock:
            self._count += 1
            self.total += 1
            if name not in self._names:
                if len(self._names) < self.examples:
                    self._names.append(name)
                else:
                    self._more = True
            if self.list_path and name not in self._listed:
                self._listed.add(name)
                with open(self.list_path, "a") as handle:
                    handle.write(f"{UNREADABLE}\t{name}\n")
        return np.int64(0)

    def relist(self, names):
        """List ``names`` again (a resumed run's earlier bad files, kept from the list that
        ``describe_inputs`` rewrote), without counting them."""
        with self._lock:
            fresh = [name for name in names if name not in self._listed]
            self._listed.update(fresh)
            if self.list_path and fresh:
                with open(self.list_path, "a") as handle:
                    handle.writelines(f"{UNREADABLE}\t{name}\n" for name in fresh)

    def record_unnamed(self, count):
        count = int(count.numpy()) if hasattr(count, "numpy") else int(count)
        with self._lock:
            self._count += count
            self.total += count
            self._more = True
        return np.int64(0)

    def report(self, when="this pass"):
        """Log the files skipped since the last report (if any); return their count."""
        with self._lock:
            count, names, more = self._count, self._names, self._more
            self._count, self._names, self._more = 0, [], False
        if count:
            shown = (", ".join(names) + (", ..." if more else "") if names
                     else "names unknown: records that do not parse")
            listed = f"; the list: {self.list_path}" if self.list_path else ""
            log.warning("%s: skipped %d unreadable image file%s (%s)%s", when, count,
                        "s" if count != 1 else "", shown, listed)
        return count

    def callback(self):
        """A Keras callback that reports at the end of every epoch."""
        return keras.callbacks.LambdaCallback(
            on_epoch_end=lambda epoch, logs=None: self.report(f"epoch {epoch + 1}"))


class StreamPosition:
    """Where this process's input pipeline stands in each epoch's order, batch by batch: how
    many items of the order it had consumed (bad ones included) when it yielded the epoch's
    batch ``k``, and the bad items among them (number, name).  Deterministic (a function of the
    data and the seeds, not of how far the pipeline read ahead), so a save after step ``k``
    records exactly where a resume starts reading (``pretrain_dataset(resume_at=...)``)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._ends, self._bad = {}, {}  # epoch -> {batch: items consumed}, {number: name}
        self.pipeline = (1, 0)  # (input pipelines, this one's index): set by the pipeline

    def batch_ended(self, epoch, batch, end):
        """Called from the pipeline (``tf.py_function``) for each batch it yields."""
        epoch, batch, end = (int(v.numpy()) if hasattr(v, "numpy") else int(v)
                             for v in (epoch, batch, end))
        with self._lock:
            self._ends.setdefault(epoch, {})[batch] = end
        return np.int64(0)

    def forget(self, before):
        """Drop the records of the epochs before ``before`` (training has left them)."""
        with self._lock:
            for epoch in [e for e in set(self._ends) | set(self._bad) if e < before]:
                self._ends.pop(epoch, None)
                self._bad.pop(epoch, None)

    def bad_item(self, epoch, number, name):
        """Called from the pipeline for each bad item of an epoch's order."""
        name = name.numpy().decode("utf-8", "replace") if hasattr(name, "numpy") else str(name)
        epoch, number = (int(v.numpy()) if hasattr(v, "numpy") else int(v)
                         for v in (epoch, number))
        with self._lock:
            self._bad.setdefault(epoch, {})[number] = name
        return np.int64(0)

    def at(self, epoch, steps):
        """{"items": consumed, "bad": [[number, name], ...]} after the epoch's first ``steps``
        batches, or None when this pipeline has not yielded them (or records nothing: arrays)."""
        with self._lock:
            end = self._ends.get(int(epoch), {}).get(int(steps) - 1)
            if end is None:
                return None
            bad = sorted((n, name) for n, name in self._bad.get(int(epoch), {}).items()
                         if n < end)
        return {"items": int(end), "bad": [[int(n), name] for n, name in bad]}


def listed_unreadable(path):
    """The files a ``skipped_files.txt`` lists as unreadable (met by the pipelines), in order."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return [line.rstrip("\n").split("\t", 1)[1] for line in handle
                    if line.startswith(f"{UNREADABLE}\t")]
    except OSError:
        return []


def looks_complete(contents):
    """Cheap check that encoded bytes are a whole JPEG, PNG, GIF, BMP, WebP or TIFF file.

    A known signature and an intact end: JPEG's EOI marker (FF D9) or PNG's IEND chunk among
    the last 256 bytes (some writers append a trailer), GIF's final ';', BMP's and WebP's
    declared size (TIFF has no end to check: a truncated one fails to decode, and is counted).
    A truncated file or a non-image fails it.
    """
    length = tf.strings.length(contents)
    head = tf.strings.substr(tf.strings.join([tf.strings.substr(contents, 0, 12), "\0" * 12]),
                             0, 12)
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
    riff = tf.reduce_sum(head[4:8] * tf.constant([1, 256, 65536, 2 ** 24], tf.int64)) + 8
    webp = tf.logical_and(starts(0x52, 0x49, 0x46, 0x46), tf.logical_and(  # "RIFF"
        tf.reduce_all(tf.equal(head[8:12], [0x57, 0x45, 0x42, 0x50])),     # "WEBP"
        tf.cast(length, tf.int64) >= riff))
    tiff = starts(0x49, 0x49, 0x2A, 0x00) | starts(0x4D, 0x4D, 0x00, 0x2A)  # no end marker
    return tf.logical_and(length > 8, jpeg | png | gif | bmp | webp | tiff)


def _recorded(skipped, name, value):
    """``value``, once ``skipped`` has recorded the bad file ``name`` (when counting)."""
    marks = [tf.py_function(skipped.record, [name], tf.int64)] if skipped is not None else []
    with tf.control_dependencies(marks):
        return tf.identity(value)


def _checker(source, skipped):
    """(element) → ok: read and check a file as ``_decoder`` does, without decoding it."""

    def check(item, name):
        ok = looks_complete(source.load(item))
        return tf.cond(ok, lambda: ok, lambda: _recorded(skipped, name, ok))

    return check


def _decoder(source, channels, skipped):
    """(element) → (uint8 image [H, W, channels], ok): read, check and decode, never raising for
    a bad file it can see (what the check misses raises: ``map_naming_failures``)."""

    def decode(item, name):
        contents = source.load(item)
        ok = looks_complete(contents)
        image = tf.cond(ok, lambda: decode_file_image(contents, channels),
                        lambda: _recorded(skipped, name, tf.zeros([1, 1, channels], tf.uint8)))
        return image, ok

    return decode


def map_naming_failures(dataset, function, failed):
    """``dataset.map(function)`` in parallel and in order, where an element whose
    ``function`` raises (a file that passed ``looks_complete`` and still fails to decode)
    becomes ``failed(element)``, which records it by name, instead of being dropped unnamed.

    Each element is tried in a dataset of its own (``ignore_errors`` drops it there), followed
    by its ``failed`` stand-in, of which ``take(1)`` keeps the first: ``failed`` runs only for
    an element that failed."""
    def one(*element):
        tried = tf.data.Dataset.from_tensors(element).map(function).ignore_errors()
        return tried.concatenate(tf.data.Dataset.from_tensors(element).map(failed)).take(1)

    return dataset.interleave(one, cycle_length=tf.data.AUTOTUNE, block_length=1,
                              num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


# ---------------------------------------------------------------------------- pipelines
def _as_source(images):
    if isinstance(images, Source):
        return images
    return ArraySource(images)


def _shards(input_context):
    if input_context is None:
        return 1, 0
    return input_context.num_input_pipelines, input_context.input_pipeline_id


LAST_EPOCH = 2 ** 40  # the pipeline's passes run until training stops reading


def _permutation(seed):
    """(number, block) → the block in the stateless random order seeded by (seed, number)."""
    seed = tf.cast(seed, tf.int64)

    def permute(number, elements):
        count = tf.shape(tf.nest.flatten(elements)[0], out_type=tf.int64)[0]
        order = tf.random.experimental.index_shuffle(
            tf.range(count), tf.stack([seed, number]), count - 1)
        return tf.nest.map_structure(lambda values: tf.gather(values, order), elements)

    return permute


def shuffled(dataset, block, seed):
    """``dataset`` shuffled block by block: each run of ``block`` elements in a stateless random
    order seeded by (``seed``, the block's number), so the order is a function of the seed
    alone (``Dataset.shuffle`` takes no tensor seed).  A block of a whole finite dataset's
    length, repeated, gives a uniform permutation per repetition."""
    return dataset.batch(block).enumerate().map(_permutation(seed)).unbatch()


def epoch_order(source, seed, epoch, shards=(1, 0), labels=False, skipped=None):
    """(root, items): epoch ``epoch``'s order of input pipeline ``shards`` = (count, index), a
    permutation of the shard seeded by (seed, epoch, index) followed by further ones (images
    that stand in for bad files), and the root of its images' view seeds.  No file is read.

    A source that holds its shard as arrays (``Source.shard_arrays``: file names) permutes it
    whole, as one tensor: the same order as block by block (``shuffled``), without passing its
    elements one by one (6 s for 100,000 names on 2 loaded cores, at every epoch's start and
    every resume; 0.5 s whole)."""
    seed = tf.cast(seed, tf.int64)
    root = tf.random.experimental.stateless_fold_in(
        tf.stack([seed, tf.cast(epoch, tf.int64)]), shards[1])
    order = tf.random.stateless_uniform([], root, maxval=tf.int64.max, dtype=tf.int64)
    buffer = source.shuffle_buffer(-(-len(source) // shards[0]))
    whole = source.shard_arrays(shards, labels)
    if whole is not None and len(tf.nest.flatten(whole)[0]) == buffer:
        items = tf.data.Dataset.from_tensors(whole).repeat().enumerate().map(
            _permutation(order)).unbatch()
    else:  # a block spans passes (shards of unequal sizes), or the source streams (records)
        items = shuffled(source.items(shards, labels=labels, seed=order, skipped=skipped)
                         .repeat(), buffer, order)
    return root, items


def pretrain_dataset(images, batch_size, views, seed=0, input_context=None, skipped=None,
                     image_size=None, channels=None, with_labels=False, first_epoch=0,
                     steps_per_epoch=None, first_step=0, resume_at=None, position=None):
    """An endless stream of view batches, epoch by epoch: epoch e is its own pass over the
    images, a permutation seeded by (seed, e), of ``steps_per_epoch`` full batches (the rest
    of the pass is dropped, as PyTorch's ``drop_last``).

    Everything is a function of (seed, epoch, position): image ``j`` of epoch ``e`` gets the
    augmentation seed (seed, e, j) (batch views: the batch's), so a run is reproducible, every
    epoch draws fresh views, and ``first_epoch`` starts the stream where an interrupted run
    stopped (a resume) with exactly the images, order and views it would have had, and
    ``first_step`` starts that epoch after its first ``first_step`` batches (a resume inside an
    epoch).  Bad files are skipped within their epoch and replaced by further images of the
    same epoch's order.

    A resume inside an epoch of files or records starts reading where the stopped stream
    stood: ``resume_at`` (one entry per input pipeline, ``StreamPosition.at`` as the checkpoint
    recorded it) says how many items of the epoch's order it had consumed, bad ones included,
    and which were bad; the stream starts at that item and no image before it is read (the
    bad ones are counted again in ``skipped``).  Without it (checkpoints of caco_tf 0.3.0
    and earlier, or another number of input pipelines) the files before the resume point are
    read and checked, not decoded, to count the bad ones among them.  ``position``: a
    ``StreamPosition`` that records where the stream stands after each batch.

    ``images``: a uint8 array [N, H, W, C] or a source (``load_source``).  ``views``: per-image
    views (``augment.ImageViews``: decoding and every view in one parallel map, then batches)
    or batch views (``augment.DigitViews``: batches of equal-size images; files are decoded and
    resized to ``image_size`` first).  ``augment.ColourOnDevice`` views: each view cropped and
    flipped, with its draws, for the model's step to finish (``data.views_on_device``).

    ``input_context`` (from ``distribute``): read this pipeline's shard and yield per-replica
    batches of ``batch_size`` divided among the replicas.  ``skipped`` counts bad files.
    ``steps_per_epoch``: batches per epoch and pipeline (default: the shard's full batches).

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
    steps = int(steps_per_epoch or available // batch)
    per_image = getattr(views, "per_image", isinstance(views, augment.ImageViews))
    if position is not None:
        position.pipeline = shards
    # Where this pipeline's stream stood when the resumed epoch was stopped, if recorded.
    start = (resume_at[shards[1]] if source.encoded and first_step and resume_at is not None
             and len(resume_at) == shards[0] else None)
    if start is not None:
        for number, name in start["bad"]:  # the epoch's bad files before it: counted as met
            if skipped is not None:
                skipped.record(name)
            if position is not None:
                position.bad_item(first_epoch, number, name)

    def carrying(function):
        """``function`` of (number, item) applied to (number, (item, label)) elements when the
        labels travel along: the label passes through untouched."""
        if not with_labels:
            return function
        return lambda number, element: (function(number, element[0]), element[1])

    channels = channels or (views.channels if per_image else 1)
    decode = _decoder(source, channels, skipped) if source.encoded else None
    check = _checker(source, skipped) if source.encoded else None
    if per_image and hasattr(views, "empty"):  # crops with draws (ColourOnDevice), masks
        empty = views.empty(channels)
    elif per_image:
        empty = tuple(tf.zeros([r.size, r.size, channels]) for r in views.recipes)
    else:
        size = image_size or 28
        empty = tf.zeros([size, size, channels])

    def one_epoch(epoch):
        # Batches of this epoch done before a resume: passed over, not prepared.
        resumed = epoch == int(first_epoch)
        skip_batches = tf.where(resumed, tf.constant(int(first_step), tf.int64), 0)
        # Items of its order passed over: read and checked (below) unless the position is known.
        first_item = tf.where(resumed, tf.constant(start["items"] if start else 0, tf.int64), 0)
        skip_images = skip_batches * batch if start is None else tf.constant(0, tf.int64)
        root, items = epoch_order(source, seed, epoch, shards, labels=with_labels,
                                  skipped=skipped)

        def number_seed(number):
            return tf.random.experimental.stateless_fold_in(root, number)

        if not per_image and not source.encoded:
            # Batch views of arrays: the path the offline default takes.
            dataset = items.batch(batch, drop_remainder=True).take(steps).enumerate()
            return dataset.skip(skip_batches).map(carrying(lambda number, images: views(
                to_unit_float(images), number_seed(number))), num_parallel_calls=tf.data.AUTOTUNE)

        if per_image:
            def prepare(number, image):
                return views.augment_image(image, number_seed(number))
        else:
            def prepare(number, image):  # batch views of files: decode and resize only
                return resize_and_center_crop(to_unit_float(image)[None], size)[0]

        if source.encoded:
            def prepare_encoded(number, element):
                item, label = element if with_labels else (element, None)

                def full():
                    image, ok = decode(*item)
                    return tf.cond(ok, lambda: prepare(number, image), lambda: empty), ok

                def check_only():  # an image a resume passes over: is it one of the epoch's?
                    return empty, check(*item)

                prepared, ok = tf.cond(number < skip_images, check_only, full)
                return number, ((prepared, label) if with_labels else prepared, ok, item[1])

            def failed(number, element):  # the decoding or the views raised
                item, label = element if with_labels else (element, None)
                bad = _recorded(skipped, item[1], tf.constant(False))
                return number, ((empty, label) if with_labels else empty, bad, item[1])

            def noted(number, element):  # a bad item: where it was, for the resume point
                prepared, ok, name = element
                if position is not None:
                    mark = tf.cond(ok, lambda: tf.constant(0, tf.int64), lambda: tf.py_function(
                        position.bad_item, [epoch, number, name], tf.int64))
                    with tf.control_dependencies([mark]):
                        ok = tf.identity(ok)
                return number, (prepared, ok)

            numbered = items.enumerate().skip(first_item)  # passed over unread
            dataset = map_naming_failures(numbered, prepare_encoded, failed)
            dataset = count_gaps(dataset, skipped, first=first_item, numbered=True).map(noted)
            dataset = dataset.filter(lambda number, element: element[1]).map(
                lambda number, element: (number, element[0])).skip(skip_images)
        else:
            dataset = items.enumerate().skip(skip_images).map(
                lambda number, element: (number, carrying(prepare)(number, element)),
                num_parallel_calls=tf.data.AUTOTUNE)
        dataset = dataset.batch(batch, drop_remainder=True).take(steps - skip_batches)

        def finish(number, element):  # the batch's number in the epoch, (item numbers, batch)
            numbers, images = element
            if position is not None:
                mark = tf.py_function(position.batch_ended, [epoch, number, numbers[-1] + 1],
                                      tf.int64)
                with tf.control_dependencies([mark]):
                    images = tf.nest.map_structure(tf.identity, images)
            if not per_image:
                images = carrying(lambda n, x: views(x, number_seed(n)))(number, images)
            return images

        return dataset.enumerate(start=skip_batches).map(finish,
                                                         num_parallel_calls=tf.data.AUTOTUNE)

    epochs = tf.data.Dataset.range(int(first_epoch), LAST_EPOCH)
    return epochs.flat_map(one_epoch).prefetch(tf.data.AUTOTUNE)


def eval_dataset(images, batch_size, normalize, labels=None, image_size=None, channels=None,
                 skipped=None, every=1, shards=(1, 0)):
    """Images (and labels) in order, normalized as for evaluation, no augmentation.

    ``images``: a uint8 array (used as it is) or a source, whose images are decoded (bad files
    skipped, with their labels), resized so the shorter side is ``image_size`` / 0.875 and
    centre-cropped to ``image_size`` — exactly the exported model's preprocessing.  A source
    yields its own labels when it has them.  ``every``: only every ``every``-th image (an even
    sample of a source stored class by class).  ``shards`` = (count, index): only the
    ``index``-th of every ``count`` images (one input pipeline's share).  Through tf.data
    service: ``service.eval_dataset``.
    """
    if isinstance(images, ArraySource) and image_size in (None, images.images.shape[1]):
        images, labels = images.images, images.labels  # already at size: the array path
    step, first = every * shards[0], every * shards[1]
    if not isinstance(images, Source):
        images = images[first::step]
        labels = None if labels is None else labels[first::step]
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
            image, ok = decode(*item)
        image = resize_and_center_crop(to_unit_float(image)[None], size)[0]
        return index, (image, label, ok)

    numbered = source.ordered().shard(step, first).enumerate()
    if source.encoded:
        def failed(index, element):  # the decoding raised
            (_, name), label = element
            bad = _recorded(skipped, name, tf.constant(False))
            return index, (tf.zeros([size, size, channels]), label, bad)

        dataset = map_naming_failures(numbered, prepare, failed)
        # A sentinel after the last image makes a dropped last file a gap too.
        count = len(range(first, len(source), step))
        end = tf.data.Dataset.from_tensors((tf.constant(count, tf.int64), (
            tf.zeros([size, size, channels]), tf.constant(-1, tf.int64), tf.constant(False))))
        dataset = count_gaps(dataset.concatenate(end), skipped)
    else:
        dataset = numbered.map(prepare, num_parallel_calls=tf.data.AUTOTUNE).map(
            lambda index, rest: rest)
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
