"""From a configuration to a trained run folder: what ``train.py`` does, as a library call.

A run folder holds ``config.yaml`` (resolved), ``tensorboard/``, ``backup/`` (resume state),
``checkpoints/``, ``history.json``, ``saved_model/`` (the backbone, TF Serving layout) and
``results.json``.
"""

import contextlib
import json
import os

import keras
import tensorflow as tf
import yaml

from caco_tf import data
from caco_tf.build import build_model, build_views, load_data
from caco_tf.evaluation import knn
from caco_tf.evaluation.monitor import KNNMonitor
from caco_tf.serving import export
from caco_tf.training import callbacks, distribute
from caco_tf.training.config import ConfigError, changed_settings


def check_sizes(config, num_images):
    batch, bank = config["train"]["batch_size"], config["caco"]["bank_size"]
    if batch > num_images:
        raise data.DataError(f"train.batch_size {batch} is larger than the data set "
                             f"({num_images} images)")
    # One pass writes one key per image of its full batches: the bank holds distinct images
    # only if it is no larger than that (later warm-up epochs overwrite rows, FIFO).
    filled = (num_images // batch) * batch
    if config["caco"]["warmup_epochs"] > 0 and bank > filled:
        raise data.DataError(
            f"caco.bank_size {bank} is larger than the data set at initialization: one pass "
            f"fills {filled} rows from {num_images} images in batches of {batch}")


def run(config, run_dir, verbose=1):
    """Pre-train (resuming if ``run_dir`` holds a backup), evaluate and export. Returns results.

    Under MultiWorkerMirroredStrategy every worker runs this with the same config; only the
    chief writes the run folder, evaluates and exports (the others return an empty dict).
    """
    # First: a multi-worker strategy must be created before TensorFlow runs any op.
    strategy = distribute.make_strategy(config["distribute"]["strategy"])
    keras.utils.set_random_seed(config["train"]["seed"])
    train, held_out = load_data(config)
    check_sizes(config, len(train))
    probe_classes = online_probe_classes(config, train)
    chief = distribute.is_chief(strategy)
    changes = changes_since_backup(run_dir, config)

    def write_config():
        with open(os.path.join(run_dir, "config.yaml"), "w") as handle:
            yaml.safe_dump(config, handle, sort_keys=False)

    if chief:
        os.makedirs(run_dir, exist_ok=True)
        if not changes:
            write_config()
        # else: once the backup is restored; a refused resume keeps the backup's config.yaml

    batch = config["train"]["batch_size"]
    steps_per_epoch = len(train) // batch
    views = build_views(config)
    with _dtype_policy(config["train"]["precision"]), strategy.scope():
        model = build_model(config, steps_per_epoch, strategy.num_replicas_in_sync,
                            num_classes=probe_classes)
    skipped = data.SkippedFiles()  # unreadable images: skipped, reported once per epoch
    # With the online probe the batches carry the labels, which only the probe reads; the
    # views are the same either way.
    dataset = data.distribute(strategy, lambda context: data.pretrain_dataset(
        train, batch, views, seed=config["data"]["seed"], input_context=context,
        skipped=skipped, image_size=config["data"]["image_size"],
        channels=config["data"]["channels"], with_labels=probe_classes is not None))
    monitor = knn_monitor(config, views, train, held_out)
    model.fit(dataset, epochs=config["train"]["epochs"], steps_per_epoch=steps_per_epoch,
              shuffle=False,  # the dataset shuffles itself, once per epoch
              verbose=verbose if chief else 0,
              callbacks=_callbacks(run_dir, chief, monitor, precise_bn(config, views, train),
                                   changes, write_config if chief and changes else None)
              + [skipped.callback()])
    if not chief:
        return {}

    backbone, query_encoder = _local_copy(model.backbone), _local_copy(model.query_encoder)
    results = {"epochs": config["train"]["epochs"],
               "replicas": int(strategy.num_replicas_in_sync)}
    if held_out is not None and train.has_labels:
        results["knn_top1"] = knn_top1(backbone, views, config, train, held_out)
    results["saved_model"] = export.export_backbone(
        backbone, os.path.join(run_dir, "saved_model"), config["data"]["image_size"],
        config["data"]["channels"], views.mean, views.std, embedder=query_encoder)
    with open(os.path.join(run_dir, "results.json"), "w") as handle:
        json.dump(results, handle, indent=1)
    return results


def changes_since_backup(run_dir, config):
    """The settings that differ from the run folder's ``config.yaml`` when it holds a backup
    (a run to resume), as ``config.changed_settings`` lists them; else []."""
    previous = os.path.join(run_dir, "config.yaml")
    if not (os.path.isdir(os.path.join(run_dir, "backup")) and os.path.exists(previous)):
        return []
    with open(previous) as handle:
        return changed_settings(yaml.safe_load(handle) or {}, config)


def online_probe_classes(config, train):
    """The online probe's class count when ``evaluation.online_probe`` is on, else None.

    The probe trains on the training images' labels: an unlabelled source is a ``ConfigError``.
    """
    if not config["evaluation"]["online_probe"]:
        return None
    if not train.has_labels:
        raise ConfigError(f"evaluation.online_probe needs a labelled training source; "
                          f"{config['data']['source']} has no labels")
    classes = data.num_classes(train)
    if classes < 2:
        raise ConfigError(f"evaluation.online_probe needs at least 2 classes in the training "
                          f"labels of {config['data']['source']}, found {classes}")
    return classes


def knn_monitor(config, views, train, held_out):
    """The kNN monitor callback (training labels against the held-out split), or None.

    None when ``evaluation.knn_monitor_every`` is 0 or the data has no labelled held-out split.
    """
    every = config["evaluation"]["knn_monitor_every"]
    if not every or held_out is None or not train.has_labels:
        return None
    return KNNMonitor(
        eval_dataset(config, views, train), eval_dataset(config, views, held_out), every=every,
        k=config["evaluation"]["knn_monitor_k"],
        temperature=config["evaluation"]["knn_monitor_temperature"])


def precise_bn(config, views, train):
    """The ``PreciseBatchNorm`` callback of ``train.precise_bn_images``, or None (0: off)."""
    count = config["train"]["precise_bn_images"]
    if not count:
        return None
    every = max(1, len(train) // count)
    return callbacks.PreciseBatchNorm(eval_dataset(config, views, train, every=every))


def _callbacks(run_dir, chief, monitor=None, precise=None, changes=(), restored=None):
    """Resume state for every process; monitor, BatchNorm re-estimation, logs, TensorBoard,
    checkpoints: chief only (only the chief evaluates and exports).

    The monitor comes before the loggers: they record what it adds to the epoch's logs; the
    re-estimation after the monitor (its curve compares like with like) and before the
    checkpoint (which saves the new statistics).  ``changes``, ``restored``: see
    ``callbacks.resumable``.
    """
    resume = callbacks.resumable(run_dir, writer=chief, changes=changes, restored=restored)
    if not chief:
        return [resume]
    loggers = [callbacks.HistoryJSON(os.path.join(run_dir, "history.json")),
               keras.callbacks.TensorBoard(os.path.join(run_dir, "tensorboard")),
               keras.callbacks.ModelCheckpoint(
                   os.path.join(run_dir, "checkpoints", "last.weights.h5"),
                   save_weights_only=True)]
    return [resume] + [callback for callback in (monitor, precise) if callback] + loggers


@contextlib.contextmanager
def _dtype_policy(name):
    """Build the model under a keras dtype policy without leaking it to later code."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def _local_copy(model):
    """A single-device copy of a (possibly mirrored) model, for evaluation and export."""
    if not _is_distributed(model):
        return model
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    return copy


def _is_distributed(model):
    return any(isinstance(getattr(v, "value", v), tf.distribute.DistributedValues)
               for v in model.weights)


def eval_dataset(config, views, source, skipped=None, every=1):
    """Normalized image batches of a source (with its labels if any), as evaluation sees
    them; ``every``: every ``every``-th image only."""
    return data.eval_dataset(source, config["evaluation"]["batch_size"], views.normalize,
                             image_size=config["data"]["image_size"],
                             channels=config["data"]["channels"], skipped=skipped, every=every)


def knn_top1(backbone, views, config, train, held_out):
    """Held-out weighted kNN top-1 (%) against the training images, per the config."""
    skipped = data.SkippedFiles()
    train_features, train_labels = knn.extract_features(
        backbone, eval_dataset(config, views, train, skipped))
    test_features, test_labels = knn.extract_features(
        backbone, eval_dataset(config, views, held_out, skipped))
    skipped.report("kNN evaluation")
    accuracy = knn.knn_accuracy(
        train_features, train_labels, test_features, test_labels,
        k=config["evaluation"]["knn_k"], temperature=config["evaluation"]["knn_temperature"])
    return 100.0 * accuracy
