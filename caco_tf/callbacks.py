"""Callbacks that make a pre-training run observable and resumable."""

import json
import os

import keras


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


def resumable(run_dir):
    """Keras' BackupAndRestore in ``run_dir/backup``: weights, optimizer, bank state and epoch.

    The backup is kept after the run ends, so re-running a finished command does not retrain.
    """
    return keras.callbacks.BackupAndRestore(os.path.join(run_dir, "backup"),
                                            save_freq="epoch", delete_checkpoint=False)
