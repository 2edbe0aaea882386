"""``python -m caco_tf.figures``: kept for that documented form; the command is
``caco_tf/cli/figures.py`` (``caco-figures``)."""

import sys

from caco_tf.cli.figures import main

if __name__ == "__main__":
    sys.exit(main())
