"""The same command as ``caco-import-torch`` (``caco_tf/cli/import_torch.py``), from a checkout.

    python export/import_torch.py --help
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from caco_tf.cli.import_torch import console, main  # noqa: E402, F401  (main: to call from Python)

if __name__ == "__main__":
    console()
