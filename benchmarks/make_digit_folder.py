"""Write the shipped MNIST digits as an image folder laid out as ImageNet's, for trying "train on
your own images" on images that a short CPU run can learn from:

    python benchmarks/make_digit_folder.py OUT [--split validation|heldout] [--tiny]

OUT/train/<digit>/*.png and OUT/val/<digit>/*.png, 28×28 grayscale PNGs (the folder source
decodes them to the run's channels and size).  ``validation`` (the default) is the
``mnist_validation`` split, 3,000 training and 1,000 validation digits, so that a folder run
makes no use of the held-out 1,000; ``heldout`` is the ``mnist`` split (4,000 and the held-out
1,000).  Labels are for evaluation only.  ``--tiny``: 20 digits a split (into a temporary folder
without OUT), a check that the script runs.
"""

import argparse
import os
import sys
import tempfile

from PIL import Image

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from caco_tf.data import sources  # noqa: E402


def make(out, split="validation", count=None):
    """The digits of ``split`` (the first ``count`` of each part) as PNGs under ``out``."""
    digits = (sources.load_offline_mnist_validation() if split == "validation"
              else sources.load_offline_mnist())
    for folder, (images, labels) in (("train", digits["train"]), ("val", digits["test"])):
        for index, (image, label) in enumerate(zip(images[:count], labels[:count])):
            directory = os.path.join(out, folder, str(int(label)))
            os.makedirs(directory, exist_ok=True)
            Image.fromarray(image[..., 0]).save(os.path.join(directory, f"{index:05d}.png"))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?")
    parser.add_argument("--split", choices=("validation", "heldout"), default="validation")
    parser.add_argument("--tiny", action="store_true", help="20 digits a split")
    args = parser.parse_args(argv)
    if not args.tiny and not args.out:
        parser.error("OUT is required (the folder to write)")
    with tempfile.TemporaryDirectory() as scratch:
        out = args.out or scratch
        make(out, args.split, 20 if args.tiny else None)
        print(f"images: {os.path.abspath(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
