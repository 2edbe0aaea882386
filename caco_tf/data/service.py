"""Pre-training input on tf.data service: CPU machines of their own decode and augment.

A dispatcher and any number of workers (``caco-data-service``) run the pipeline; each trainer
(input pipeline) sends its pipeline's graph to the dispatcher, which hands its batches out to
the workers one at a time (``ShardingPolicy.DYNAMIC``), and reads the finished batches back.

So that any worker can make any batch, a batch is a function of (seed, epoch, its number)
alone: batch k of epoch e holds the images at places [kB, (k+1)B) of the epoch's order, the
same permutation and view seeds as ``pipeline.pretrain_dataset`` (the same images and views,
file for file, while no file is bad).  A bad file's place in its batch is taken by another
image of the same batch (its views again); without the service later images move up instead.
Workers finish batches in any order: the trainer puts them back in order (``in_order``) and
records the bad files there, so a run through the service is reproducible, and a resume starts
at the batch it stopped at without reading anything before it.

The evaluation passes of a run (the kNN monitor and the end-of-run kNN, the health and precise
BatchNorm samples) go through the service too when their images are files: the service's
workers decode, resize and crop chunks of ``CHUNK`` images, and the trainer puts the chunks
back in order, drops the bad files (naming them) and batches: ``pipeline.eval_dataset``'s
batches exactly.  Other sources are evaluated on the trainer's own cores.

Not through the service: arrays (the offline digits: nothing to decode), TFDS and TFRecord
sources (a record's place in the epoch is known only by reading up to it), TIFF files
(decoded by Pillow, which runs in the trainer's Python, not in a worker's graph), and the
batch views of ``data.views digits``.  Every worker must read the image files at the paths
the trainer lists (a shared file system, mounted at the same place).
"""

import queue
import socket
import threading
import time

import numpy as np
import tensorflow as tf

from caco_tf import tracing  # noqa: F401  (autograph leaves caco_tf alone)

from caco_tf.data import augment, pipeline
from caco_tf.data.images import resize_and_center_crop, to_unit_float
from caco_tf.data.pipeline import LAST_EPOCH, _decoder, map_naming_failures
from caco_tf.data.sources import DataError, FileSource
from caco_tf.settings import is_service_address

# The trainer takes a batch as lost (its worker stopped) once it has waited GRACE seconds with
# more than AHEAD later batches in hand: a worker that starts slowly (it builds the pipeline
# before its first batch) can be ~30 batches behind its peers on a loaded machine.
AHEAD, GRACE = 64, 60.0
# And the service as lost (its dispatcher, or every worker) after SILENCE seconds without any
# batch: TensorFlow's client waits for a lost dispatcher for ever.  Generous, as a job's first
# batch waits for the workers to build the pipeline from a graph holding every file name.
SILENCE = 600.0
# Images in one served element of an evaluation pass: enough to make a request's cost small
# beside decoding them.
CHUNK = 32


class BatchLost(DataError):
    """Batches the service never delivered (a worker, the dispatcher or every worker stopped):
    the run stops and resumes from its last save with the same command.  Exit status 75, as for
    a lost peer."""

    exit_status = 75


def batch_lost(error):
    """The ``BatchLost`` that ``error`` (raised by a step) carries from ``in_order``, or None."""
    message = " ".join(str(getattr(error, "message", error)).split())
    start = message.find(LOST)
    if start < 0:
        return None
    return BatchLost(message[start:message.find(RESUME, start) + len(RESUME)])


LOST, RESUME = "data.service: ", "to resume from the last save"


def service_address(address):
    """``host:port`` or ``grpc://host:port`` → ``grpc://host:port``; DataError otherwise."""
    if not address or not is_service_address(address):
        raise DataError(f"data.service must be a dispatcher's HOST:PORT, got {address!r}")
    return f"grpc://{str(address).removeprefix('grpc://')}"


def check_dispatcher(address, seconds=10.0):
    """DataError (one line naming ``address``) unless something listens there."""
    host, _, port = service_address(address).removeprefix("grpc://").rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=seconds).close()
    except OSError as error:
        raise DataError(f"data.service: no dispatcher answers at {host}:{port} "
                        f"({error.strerror or error}); start one with 'caco-data-service "
                        f"dispatcher' or leave data.service empty") from None


def servable_files(source):
    """Whether the service's workers can read ``source``: image files other than TIFF."""
    return isinstance(source, FileSource) and not _tiff(source)


def _tiff(source):
    return [path for path in source.paths if str(path).lower().endswith((".tif", ".tiff"))]


def check_servable(source, views):
    """DataError (one line) for what the service cannot run: see the module's docstring."""
    if not isinstance(source, FileSource):
        raise DataError(f"data.service reads image files (a folder or a list of files); "
                        f"{source.name} is not: train without data.service")
    if not getattr(views, "per_image", False):
        raise DataError("data.service runs the colour views (data.views asymmetric, symmetric "
                        "or multicrop), not data.views digits")
    tiff = _tiff(source)
    if tiff:
        raise DataError(f"data.service: {len(tiff)} TIFF files (e.g. {tiff[0]}) need Pillow, "
                        f"which a service worker cannot run; convert them (to PNG, say) or "
                        f"train without data.service")


def batch_stream(source, batch, views, seed, shards, channels, steps, first, with_labels=False):
    """(number, views, labels, bad names) of batches ``first``, ``first`` + 1, ... of the run,
    number g = epoch · ``steps`` + k; each a function of (seed, epoch, k) alone (module
    docstring).  ``views``: the tuple of view batches; labels: [B], -1 unless ``with_labels``;
    bad names: [B], "" for a good image."""
    whole = source.shard_arrays(shards, with_labels)
    count = len(tf.nest.flatten(whole)[0])
    decode = _decoder(source, channels, skipped=None)
    if isinstance(views, augment.ColourOnDevice):
        empty = views.empty(channels)
    else:
        empty = tuple(tf.zeros([r.size, r.size, channels]) for r in views.recipes)
    seed = tf.constant(seed, tf.int64)

    def places(number):  # the batch's images: [kB, (k+1)B) of its epoch's order
        epoch, k = number // steps, number % steps
        root = tf.random.experimental.stateless_fold_in(tf.stack([seed, epoch]), shards[1])
        order = tf.random.stateless_uniform([], root, maxval=tf.int64.max, dtype=tf.int64)
        index = k * batch + tf.range(batch, dtype=tf.int64)  # as ``epoch_order`` numbers them
        picks = tf.random.experimental.index_shuffle(index, tf.stack([order, 0]), count - 1)
        elements = tf.nest.map_structure(lambda values: tf.gather(values, picks), whole)
        return tf.data.Dataset.from_tensor_slices(
            (tf.fill([batch], number), index, tf.tile(root[None], [batch, 1]), elements))

    def prepare(number, index, root, element):
        item, label = element if with_labels else (element, tf.constant(-1, tf.int64))
        image, ok = decode(*item)
        views_of = tf.cond(ok, lambda: views.augment_image(
            image, tf.random.experimental.stateless_fold_in(root, index)), lambda: empty)
        return number, views_of, label, tf.where(ok, tf.constant(""), item[1])

    def failed(number, index, root, element):  # the decoding or the views raised
        item, label = element if with_labels else (element, tf.constant(-1, tf.int64))
        return number, empty, label, item[1]

    stream = tf.data.Dataset.range(first, LAST_EPOCH * steps).flat_map(places)
    return map_naming_failures(stream, prepare, failed).batch(batch).map(
        _stand_in, num_parallel_calls=tf.data.AUTOTUNE)


def _stand_in(numbers, views, labels, bad):
    """A bad image's rows become those of a good image of the same batch (in turn)."""
    good = tf.where(tf.equal(bad, ""))[:, 0]
    with tf.control_dependencies([tf.debugging.assert_positive(
            tf.size(good), "every image of a batch is unreadable")]):
        good = tf.identity(good)
    rows = tf.range(tf.size(bad, out_type=tf.int64))
    turn = tf.math.cumsum(tf.cast(tf.not_equal(bad, ""), tf.int64)) - 1
    source = tf.where(tf.equal(bad, ""), rows, tf.gather(good, turn % tf.size(good,
                                                                              out_type=tf.int64)))
    views = tf.nest.map_structure(lambda value: tf.gather(value, source), views)
    return numbers[0], views, tf.gather(labels, source), bad


def through_service(stream, address):
    """``stream`` run by the service's workers, batches handed out one at a time."""
    service = tf.data.experimental.service
    return stream.apply(service.distribute(processing_mode=service.ShardingPolicy.DYNAMIC,
                                           service=service_address(address)))


def _until_silent(served, seconds, address):
    """The elements of ``served``, read in a thread of their own; ``BatchLost`` when none has
    come for ``seconds`` (for the first: ``SILENCE`` at least).  The thread, stuck on a lost
    service, is left behind; the process ends at once after the error line."""
    handoff, end, closed = queue.Queue(maxsize=1), object(), threading.Event()

    def hand(element):  # False once the trainer has closed the stream
        while not closed.is_set():
            try:
                handoff.put(element, timeout=1.0)
                return True
            except queue.Full:
                pass
        return False

    def read():
        try:
            for element in served:
                if not hand(element):
                    return  # the iterator goes with this thread, the service still there
            hand(end)
        except Exception as error:  # noqa: BLE001  (raised again on the trainer's side)
            hand(error)

    threading.Thread(target=read, name="data-service-reader", daemon=True).start()
    wait = max(seconds, SILENCE)  # the first batch waits for the workers to build the pipeline
    try:
        while True:
            try:
                element = handoff.get(timeout=wait)
                wait = seconds
            except queue.Empty:
                raise BatchLost(f"{LOST}no batch came for {wait:.0f} s from the service at "
                                f"{address}: its dispatcher or every worker stopped; start "
                                f"them again and run the same command {RESUME}") from None
            if element is end:
                return
            if isinstance(element, Exception):
                raise element
            yield element
    finally:
        closed.set()


def _never_came(number, later):
    return BatchLost(f"{LOST}batch {number} never came ({later} later ones did): a service "
                     f"worker stopped; run the same command {RESUME}")


def in_order(served, first, skipped=None, with_labels=False, ahead=AHEAD, grace=GRACE,
             silence=SILENCE, address=None, end=None):
    """The served (number, views, labels, bad) batches in the order of their numbers from
    ``first``, as (views) or (views, labels), each batch's bad files recorded in ``skipped``
    as the trainer reaches it; ``BatchLost`` when a batch never comes (a worker stopped) or
    none comes for ``silence`` seconds (the dispatcher at ``address``, or every worker).
    ``end``: the number after the last batch of a finite stream (one that ends short of it
    lost a batch)."""
    spec = served.element_spec

    def ordered():
        waiting, expected, since = {}, int(first), None
        for number, views, labels, bad in _until_silent(served, silence, address):
            waiting[int(number)] = (views, labels, bad)
            while expected in waiting:
                views, labels, bad = waiting.pop(expected)
                if skipped is not None:
                    for name in bad.numpy():
                        if name:
                            skipped.record(name.decode("utf-8", "replace"))
                yield (views, labels) if with_labels else views
                expected += 1
            since = None if len(waiting) <= ahead else since or time.monotonic()
            if since is not None and time.monotonic() - since >= grace:
                raise _never_came(expected, len(waiting))
        if end is not None and expected < end:
            raise _never_came(expected, len(waiting))

    signature = (spec[1], spec[2]) if with_labels else spec[1]
    # No prefetch of its own: a prefetch thread left inside the generator (waiting on a lost
    # service) would block the iterator's deletion; the service's client reads ahead itself.
    return tf.data.Dataset.from_generator(ordered, output_signature=signature)


def served_pretrain_dataset(source, batch_size, views, address, seed=0, input_context=None,
                            skipped=None, channels=None, with_labels=False, first_epoch=0,
                            steps_per_epoch=None, first_step=0, ahead=AHEAD, grace=GRACE,
                            silence=SILENCE):
    """``pipeline.pretrain_dataset``'s stream of view batches, made by the service at
    ``address`` (module docstring: what differs, what cannot be served)."""
    check_servable(source, views)
    shards = ((input_context.num_input_pipelines, input_context.input_pipeline_id)
              if input_context is not None else (1, 0))
    batch = (input_context.get_per_replica_batch_size(batch_size) if input_context is not None
             else batch_size)
    available = len(source) // shards[0]
    if batch > available:
        raise DataError(f"batch size {batch} is larger than the data set ({available} images)")
    steps = int(steps_per_epoch or available // batch)
    first = int(first_epoch) * steps + int(first_step)
    stream = batch_stream(source, batch, views, seed, shards, channels or views.channels,
                          steps, first, with_labels)
    return in_order(through_service(stream, address), first, skipped, with_labels, ahead,
                    grace, silence, address)


def eval_dataset(source, batch_size, normalize, address, image_size, channels, skipped=None,
                 every=1, shards=(1, 0)):
    """``pipeline.eval_dataset``'s batches, made by the service at ``address`` when it is set
    and ``source`` is image files it can read (``served_eval_dataset``), else here."""
    if address and servable_files(source):
        return served_eval_dataset(source, batch_size, normalize, address, image_size,
                                   channels, skipped, every, shards)
    return pipeline.eval_dataset(source, batch_size, normalize, image_size=image_size,
                                 channels=channels, skipped=skipped, every=every,
                                 shards=shards)


def served_eval_dataset(source, batch_size, normalize, address, image_size, channels,
                        skipped=None, every=1, shards=(1, 0), chunk=CHUNK, grace=GRACE,
                        silence=SILENCE):
    """``pipeline.eval_dataset``'s batches of the image files of ``source`` (the same images,
    labels, order and bad files), each image decoded, resized and centre-cropped by the
    service at ``address``; the trainer normalizes the batches."""
    step, first = every * shards[0], every * shards[1]
    paths, _ = source.shard_arrays((step, first))
    labels = (np.asarray(source.labels, np.int64) if source.has_labels
              else np.full(len(source), -1, np.int64))[first::step]
    count = len(paths)
    chunks = -(-count // chunk)
    decode = _decoder(source, channels, skipped=None)
    empty = tf.zeros([image_size, image_size, channels])

    def images_of(number):  # chunk k: places [kC, (k+1)C), those past the end marked unused
        places = number * chunk + tf.range(chunk, dtype=tf.int64)
        used = places < count
        picks = tf.minimum(places, count - 1)
        return tf.data.Dataset.from_tensor_slices((
            tf.fill([chunk], number), used, tf.gather(paths, picks), tf.gather(labels, picks)))

    def prepare(number, used, path, label):
        image, ok = tf.cond(used, lambda: decode(path, path),
                            lambda: (tf.zeros([1, 1, channels], tf.uint8), tf.constant(False)))
        image = tf.cond(ok, lambda: resize_and_center_crop(to_unit_float(image)[None],
                                                           image_size)[0], lambda: empty)
        bad = tf.logical_and(used, tf.logical_not(ok))
        return number, (image, ok), label, tf.where(bad, path, tf.constant(""))

    def failed(number, used, path, label):  # the decoding raised
        return number, (empty, tf.constant(False)), label, path

    stream = tf.data.Dataset.range(chunks).flat_map(images_of)
    stream = map_naming_failures(stream, prepare, failed).batch(chunk).map(
        lambda numbers, *rest: (numbers[0], *rest))
    ordered = in_order(through_service(stream, address), 0, skipped, with_labels=True,
                       grace=grace, silence=silence, address=address, end=chunks)

    def finish(images, labels):
        return (normalize(images), labels) if source.has_labels else normalize(images)

    return (ordered.unbatch().filter(lambda image_ok, label: image_ok[1])
            .map(lambda image_ok, label: (image_ok[0], label)).batch(batch_size)
            .map(finish, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE))
