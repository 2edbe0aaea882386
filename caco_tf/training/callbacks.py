"""Callbacks that make a pre-training run observable and resumable.

The kNN monitor is an evaluation, in ``caco_tf.evaluation.monitor``.
"""

import json
import os

import keras

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


class Resume(keras.callbacks.BackupAndRestore):
    """Keras' BackupAndRestore where only the writer (the chief) saves; every process restores.

    Under MultiWorkerMirroredStrategy every worker must restore the same state, so all read the
    chief's backup, and only the chief writes it: workers never collide on files.  The previous
    backup is kept beside the latest (``double_checkpoint``), so a kill in the middle of a write
    falls back to the epoch before instead of failing to resume.
    """

    def __init__(self, backup_dir, writer=True, changes=(), restored=None):
        super().__init__(backup_dir, save_freq="epoch", delete_checkpoint=False,
                         double_checkpoint=True)
        self.writer = writer
        self.changes = tuple(changes)  # settings changed since the backup, for the message
        self.restored = restored  # called once the backup, if any, is restored

    def on_train_begin(self, logs=None):
        try:
            super().on_train_begin(logs)
        except ValueError as error:
            # A backup of a model with other layers (online probe switched on, another
            # backbone, ...): Keras lists the layers; the user needs the settings.
            if not os.path.exists(self._weights_path):
                raise
            changed = (f"; settings changed since it was saved: {', '.join(self.changes)}"
                       if self.changes else "")
            raise ConfigError(
                f"cannot resume from {self.backup_dir}: it holds a model of another "
                f"shape{changed}. Re-run with the settings it was trained with, or pass "
                f"another --run-dir") from error
        if self.restored is not None:
            self.restored()

    def _save_model(self):
        if self.writer:
            super()._save_model()


def resumable(run_dir, writer=True, changes=(), restored=None):
    """Resume state in ``run_dir/backup``: weights, optimizer, bank state and epoch.

    The backup is kept after the run ends, so re-running a finished command does not retrain.
    ``changes``: the settings changed since the backup, named if it cannot be restored;
    ``restored``: called once the backup, if any, is restored.
    """
    return Resume(os.path.join(run_dir, "backup"), writer=writer, changes=changes,
                  restored=restored)


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
