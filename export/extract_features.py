"""The same command as ``caco-extract`` (``caco_tf/cli/extract.py``), from a checkout.

    python export/extract_features.py --help
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caco_tf.cli.extract import console, main  # noqa: E402, F401  (main: to call from Python)

if __name__ == "__main__":
    console()
