"""Run ``train.py`` with its arguments, filling the file system of PATH right after a chosen
global step (or, with STEP ``export``, before the end-of-run export of the SavedModel):
``python tests/fill_disk_at_step.py STEP PATH TRAIN_ARGS...``.

PATH (a file on the run folder's file system) is written until the disk is full, with real
writes, so that the run's next write to that file system fails as on a full disk.
"""

import errno
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caco_tf import cli  # noqa: E402
from caco_tf.cli import train  # noqa: E402
from caco_tf.training import callbacks  # noqa: E402


def fill(path):
    with open(path, "wb", buffering=0) as handle:
        for chunk in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    handle.write(b"\0" * chunk)
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise


def main():
    step, path, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    if step == "export":  # once trained, before the SavedModel's export
        from caco_tf.serving import export

        export_backbone = export.export_backbone
        export.export_backbone = lambda *a, **k: (fill(path), export_backbone(*a, **k))[1]
        return train.main(argv)
    step = int(step)
    on_batch_end = callbacks.Throughput.on_train_batch_end

    def fill_after_step(self, batch, logs=None):
        on_batch_end(self, batch, logs)
        if int(self.model.optimizer.iterations.numpy()) == step and not os.path.exists(path):
            fill(path)

    callbacks.Throughput.on_train_batch_end = fill_after_step
    return train.main(argv)


if __name__ == "__main__":
    cli.exit_after(main)
