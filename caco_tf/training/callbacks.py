"""Callbacks that make a pre-training run observable and resumable.

The kNN monitor is an evaluation, in ``caco_tf.evaluation.monitor``.
"""

import collections
import json
import logging
import os
import time

import keras
import numpy as np
import tensorflow as tf

from caco_tf import health
from caco_tf.nets import layers
from caco_tf.training.config import ConfigError


class HistoryJSON(keras.callbacks.Callback):
    """Writes every finished epoch's logs to a JSON list, surviving resumes.

    Keyed by epoch, so an epoch redone after a kill replaces its earlier partial record.
    """

    def __init__(self, path):
        super().__init__()
        self.path = path

    def _load(self):
        if not os.path.exists(self.path):
            return {}
        with open(self.path) as handle:
            return {row["epoch"]: row for row in json.load(handle)}

    def on_epoch_end(self, epoch, logs=None):
        history = self._load()
        history[epoch + 1] = {"epoch": epoch + 1, **{k: float(v) for k, v in (logs or {}).items()}}
        temporary = self.path + ".tmp"
        with open(temporary, "w") as handle:
            json.dump([history[key] for key in sorted(history)], handle, indent=1)
        os.replace(temporary, self.path)  # never leave a half-written file behind a kill


Backup = collections.namedtuple("Backup", "epoch weights steps_per_epoch")


def read_backup(run_dir):
    """The resume state in ``run_dir/backup``: ``Backup(epoch, weights path, steps per epoch or
    None)``, or None when there is none.  Also reads Keras' own ``BackupAndRestore`` layout
    (``latest.weights.h5``), which the PyTorch import writes."""
    folder = os.path.join(run_dir, "backup")
    path = os.path.join(folder, "training_metadata.json")
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        metadata = json.load(handle)
    weights = os.path.join(folder, metadata.get("weights", "latest.weights.h5"))
    if not os.path.exists(weights):
        return None
    return Backup(int(metadata["epoch"]), weights, metadata.get("steps_per_epoch"))


class Resume(keras.callbacks.Callback):
    """Resume state in ``backup/``, saved after every epoch and restored when training starts:
    the weights (encoders, key encoder, bank, bank momentum, FIFO pointer, optimizer state and
    step counter) and the number of finished epochs.

    Each save writes ``epoch-NNNN.weights.h5`` in full, then points ``training_metadata.json``
    at it with one atomic rename, then removes the older file: a kill at any moment leaves a
    consistent backup.  Only the writer (the chief) saves; every process restores the same
    state (under MultiWorkerMirroredStrategy all read the chief's).  Nothing is saved after an
    epoch that ``HealthMonitor`` marked unhealthy (``model.unhealthy``): the last good state
    stays.  The input pipeline must start at the restored epoch (``read_backup`` tells it).

    Args:
      run_dir: the run folder.
      writer: whether this process saves.
      changes: the settings changed since the backup, named if it cannot be restored.
      restored: called once the backup, if any, is restored.
      steps_per_epoch: recorded with every save (a resume checks the plan did not change).
    """

    def __init__(self, run_dir, writer=True, changes=(), restored=None, steps_per_epoch=None):
        super().__init__()
        self.run_dir, self.folder = run_dir, os.path.join(run_dir, "backup")
        self.writer, self.changes, self.restored = writer, tuple(changes), restored
        self.steps_per_epoch = steps_per_epoch

    def on_train_begin(self, logs=None):
        backup = read_backup(self.run_dir)
        if backup is not None:
            try:
                self.model.load_weights(backup.weights)
            except ValueError as error:
                # A backup of a model with other layers (online probe switched on, another
                # backbone, ...): Keras lists the layers; the user needs the settings.
                changed = (f"; settings changed since it was saved: {', '.join(self.changes)}"
                           if self.changes else "")
                raise ConfigError(
                    f"cannot resume from {self.folder}: it holds a model of another "
                    f"shape{changed}. Re-run with the settings it was trained with, or pass "
                    f"another --run-dir") from error
            self.model._initial_epoch = backup.epoch
        if self.restored is not None:
            self.restored()

    def on_epoch_end(self, epoch, logs=None):
        if not self.writer or getattr(self.model, "unhealthy", None):
            return
        os.makedirs(self.folder, exist_ok=True)
        name = f"epoch-{epoch + 1:04d}.weights.h5"
        self.model.save_weights(os.path.join(self.folder, name), overwrite=True)
        metadata = {"epoch": epoch + 1, "weights": name, "steps_per_epoch": self.steps_per_epoch}
        path = os.path.join(self.folder, "training_metadata.json")
        with open(path + ".tmp", "w") as handle:
            json.dump(metadata, handle)
        os.replace(path + ".tmp", path)
        for old in os.listdir(self.folder):  # earlier saves, and Keras' own layout
            if old.endswith(".weights.h5") and old != name or old.endswith(".bkp"):
                os.remove(os.path.join(self.folder, old))


def resumable(run_dir, writer=True, changes=(), restored=None, steps_per_epoch=None):
    """The ``Resume`` callback of ``run_dir`` (kept for the name the library has always used).

    The backup is kept after the run ends, so re-running a finished command does not retrain.
    """
    return Resume(run_dir, writer=writer, changes=changes, restored=restored,
                  steps_per_epoch=steps_per_epoch)


class Checkpoint(keras.callbacks.ModelCheckpoint):
    """``ModelCheckpoint`` of the weights after every epoch, except after an unhealthy one."""

    def on_epoch_end(self, epoch, logs=None):
        if not getattr(self.model, "unhealthy", None):
            super().on_epoch_end(epoch, logs)


class ProgressBar(keras.callbacks.ProgbarLogger):
    """Keras' progress bar, showing only the short list of what a run is judged by (every
    metric still reaches History, ``history.json`` and TensorBoard)."""

    SHOWN = ("loss", "mpp_prob", "mpp_usage", "probe_top1", "knn_top1", "rank_embedding",
             "images_per_s", "data_wait")

    def _update_progbar(self, batch, logs=None):
        super()._update_progbar(batch, self._shown(logs))

    def _finalize_progbar(self, logs):
        super()._finalize_progbar(self._shown(logs))

    def _shown(self, logs):
        return {key: logs[key] for key in self.SHOWN if key in (logs or {})}


class Throughput(keras.callbacks.Callback):
    """Per epoch, into the logs: ``step_ms`` (mean wall time of a step), ``images_per_s``
    (global batch × steps / time) and ``data_wait``, the share of that time the steps waited
    for their batches (``MomentumEncoderMethod.input_wait``): near 0 when the input pipeline
    keeps up, towards 1 when it stalls training.  The first epoch includes compiling."""

    def __init__(self, global_batch):
        super().__init__()
        self.global_batch = int(global_batch)
        self._start = self._last = None
        self._steps = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._start, self._steps = time.perf_counter(), 0
        self.model.input_wait = 0.0

    def on_train_batch_end(self, batch, logs=None):
        self._last, self._steps = time.perf_counter(), self._steps + 1

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or not self._steps:
            return
        elapsed = max(self._last - self._start, 1e-9)
        logs["step_ms"] = 1000.0 * elapsed / self._steps
        logs["images_per_s"] = self.global_batch * self._steps / elapsed
        logs["data_wait"] = min(1.0, getattr(self.model, "input_wait", 0.0) / elapsed)


# Collapse thresholds (documented in docs/health.md), measured on the
# offline digits (validation split): healthy runs kept uniformity at -0.44 or below, a run whose
# warm-up was too short bunched its embeddings to -0.02...-0.08 within an epoch of the resync.
COLLAPSE_USAGE = 0.02        # distinct MPP rows / min(K, MPP assignments of the epoch)
COLLAPSE_UNIFORMITY = -0.2   # the views' embeddings all near one point (0: a single point)
COLLAPSE_RANK = 2.0          # RankMe of the embeddings
COLLAPSE_ADVICE = ("lengthen the warm-up (caco.warmup_epochs, caco.warmup_min_steps) so that "
                   "the key encoder follows before the resync, raise caco.bank_lr if it is "
                   "far below 0.3, or raise caco.temperature")


def is_collapsed(logs, bank_size, assignments):
    """Why an epoch's ``logs`` show a collapse, or None: the MPP rows used are under
    ``COLLAPSE_USAGE`` of what the epoch could use (min(K, its MPP assignments)), the
    embeddings' uniformity is above ``COLLAPSE_UNIFORMITY``, or their effective rank is under
    ``COLLAPSE_RANK``."""
    if "mpp_usage" in logs and bank_size and assignments:
        rows = float(logs["mpp_usage"]) * bank_size
        usable = min(bank_size, assignments)
        if rows < COLLAPSE_USAGE * usable:
            return f"the positives use {rows:.0f} of {usable} bank rows"
    if "uniformity" in logs and float(logs["uniformity"]) > COLLAPSE_UNIFORMITY:
        return (f"the embeddings bunch together (uniformity {float(logs['uniformity']):.3f}, "
                f"above {COLLAPSE_UNIFORMITY})")
    if "rank_embedding" in logs and float(logs["rank_embedding"]) < COLLAPSE_RANK:
        return f"the embeddings' effective rank is {float(logs['rank_embedding']):.2f}"
    return None


class HealthMonitor(keras.callbacks.Callback):
    """Health without labels, every epoch, into the logs (and so History, ``history.json`` and
    TensorBoard): ``rank_embedding`` and ``rank_features``, the effective rank (RankMe) of the
    embeddings and of the backbone features of a fixed sample of un-augmented training images
    (``caco_tf.health``); beside the step's own ``alignment``, ``uniformity``, ``mpp_usage``
    and ``mpp_entropy``.

    A collapse (``is_collapsed``, judged from the first epoch that ends after the warm-up)
    prints one warning line saying what to change, once;
    ``stop_on_collapse`` also stops the run, keeping the last good checkpoint.  A NaN or Inf
    loss always stops the run at once, keeps the last good checkpoint and says at which step:
    ``model.unhealthy`` then holds the reason (``Resume`` and ``Checkpoint`` save nothing more).

    Args:
      sample: batches of normalized images (or (images, labels)), the same every epoch.
      bank_size, assignments_per_epoch: K, and the MPP assignments an epoch makes (2 × images).
      stop_on_collapse: stop the run when a collapse shows.
    """

    def __init__(self, sample=None, bank_size=0, assignments_per_epoch=0,
                 stop_on_collapse=False):
        super().__init__()
        self.sample, self.bank_size = sample, int(bank_size)
        self.assignments = int(assignments_per_epoch)
        self.stop_on_collapse = bool(stop_on_collapse)
        self.warned = False

    def on_train_begin(self, logs=None):
        self.model.unhealthy = None

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is None or self.model.unhealthy:
            return
        value = float(np.asarray(loss).reshape(-1)[0])
        if not np.isfinite(value):
            step = int(self.model.optimizer.iterations.numpy())
            self.model.unhealthy = (f"the loss became {value} at step {step} (epoch "
                                    f"{self._epoch + 1}, batch {batch + 1})")
            self.model.stop_training = True

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or self.model.unhealthy:
            return
        if self.sample is not None:
            logs.update(self.ranks())
        if self.in_warmup():
            return  # recorded, not judged: early training bunches and spreads again (below)
        reason = is_collapsed(logs, self.bank_size, self.assignments)
        if reason and not self.warned:
            self.warned = True
            logging.getLogger("caco_tf").warning(
                "warning: collapse after epoch %d: %s; %s", epoch + 1, reason, COLLAPSE_ADVICE)
        if reason and self.stop_on_collapse:
            self.model.unhealthy = f"a collapse after epoch {epoch + 1} ({reason})"
            self.model.stop_training = True

    def in_warmup(self):
        """Whether every step so far was a warm-up step.  The collapse rule judges the epochs
        after it: the collapse it measures follows the resync, and a warm-up's early epochs can
        bunch the embeddings for an epoch and spread them again (a ResNet-18 on the digit
        folder: uniformity −0.09 in its second epoch, −0.54 two epochs later; kNN rising)."""
        warmup = getattr(self.model, "warmup_steps", 0)
        return warmup > 0 and int(self.model.optimizer.iterations.numpy()) <= warmup

    def ranks(self):
        """{'rank_embedding': ..., 'rank_features': ...} of the current encoders on the sample."""
        features, embeddings = [], []
        for batch in self.sample:
            images = batch[0] if isinstance(batch, tuple) else batch
            batch_features = self.model.backbone(images, training=False)
            features.append(tf.cast(batch_features, tf.float32))
            embeddings.append(tf.cast(self.model.query_encoder(images, training=False),
                                      tf.float32))
        return {"rank_embedding": float(health.effective_rank(tf.concat(embeddings, 0))),
                "rank_features": float(health.effective_rank(tf.concat(features, 0)))}


class PreciseBatchNorm(keras.callbacks.Callback):
    """After the last epoch, re-estimate the backbone's BatchNorm moving statistics on
    un-augmented training images (``layers.recalibrate_batchnorm``).

    Place it before the checkpoint callback, so that the saved weights (and the evaluation and
    export that follow ``fit``) carry the new statistics; after the kNN monitor, so that its
    curve compares like with like.  Training is unaffected: the query encoder normalizes with
    batch statistics, and the key encoder keeps its own moving statistics.

    Args:
      data: batched dataset of normalized images, or of (images, labels) pairs (labels unused).
      backbone: the model to recalibrate (default: ``self.model.backbone``).
    """

    def __init__(self, data, backbone=None):
        super().__init__()
        self.data, self.backbone = data, backbone

    def on_epoch_end(self, epoch, logs=None):
        if self.params and epoch + 1 == self.params.get("epochs"):
            layers.recalibrate_batchnorm(self.backbone or self.model.backbone, self.data)
