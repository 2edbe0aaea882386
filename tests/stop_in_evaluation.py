"""Run ``train.py`` with its arguments, pausing this process (a real SIGSTOP to itself) when
the kNN monitor starts its first pass, at an epoch's end: a worker lost during the epoch-end
evaluation, every time (``python tests/stop_in_evaluation.py NOTE TRAIN_ARGS...``; the time of
the pause is written to the file NOTE first)."""

import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caco_tf import cli  # noqa: E402
from caco_tf.cli import train  # noqa: E402
from caco_tf.evaluation import monitor  # noqa: E402


def main():
    note, argv = sys.argv[1], sys.argv[2:]
    measure = monitor.KNNMonitor.measure

    def stopping(self):
        with open(note, "w") as handle:
            handle.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGSTOP)
        return measure(self)

    monitor.KNNMonitor.measure = stopping
    return train.main(argv)


if __name__ == "__main__":
    cli.exit_after(main)
