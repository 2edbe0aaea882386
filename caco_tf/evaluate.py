"""``python -m caco_tf.evaluate``: kept for that documented form; the command is
``caco_tf/cli/evaluate.py`` (``caco-evaluate``)."""

import sys

from caco_tf.cli.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
