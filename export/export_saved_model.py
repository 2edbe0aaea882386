"""The same command as ``caco-export`` (``caco_tf/cli/export.py``), from a checkout.

    python export/export_saved_model.py --help
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caco_tf.cli.export import console, main  # noqa: E402, F401  (main: to call from Python)

if __name__ == "__main__":
    console()
