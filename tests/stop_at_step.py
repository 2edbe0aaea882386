"""Run ``train.py`` with its arguments, sending this process a real signal right after a chosen
global step: ``python tests/stop_at_step.py STEP SIGNAL TRAIN_ARGS...`` (SIGNAL: TERM, INT).

A signal from outside lands at a random step; this one lands after step STEP exactly, so a
test can stop a run inside an epoch every time.
"""

import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caco_tf import cli  # noqa: E402
from caco_tf.cli import train  # noqa: E402
from caco_tf.training import callbacks  # noqa: E402


def main():
    step, name, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    on_batch_end = callbacks.Throughput.on_train_batch_end

    def signal_after_step(self, batch, logs=None):
        on_batch_end(self, batch, logs)
        if int(self.model.optimizer.iterations.numpy()) == step:
            os.kill(os.getpid(), getattr(signal, "SIG" + name))

    callbacks.Throughput.on_train_batch_end = signal_after_step
    return train.main(argv)


if __name__ == "__main__":
    cli.exit_after(main)
