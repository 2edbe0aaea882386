"""Pre-train a CaCo encoder (the same command as ``caco-train``).

    python train.py                                   # offline MNIST default, ~8 CPU minutes
    python train.py --config configs/NAME.yaml [--set key=value ...] [--run-dir DIR]

Re-running the same command resumes the run from its last finished epoch.
Code: ``caco_tf/cli/train.py`` (arguments), ``caco_tf/pretrain.py`` (the run).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # runs from a checkout, too

from caco_tf.cli.train import console, main  # noqa: E402, F401  (main: to call from Python)

if __name__ == "__main__":
    console()
