"""Batch feature extraction with an exported SavedModel (``caco-extract``,
``python export/extract_features.py``).

    caco-extract --model runs/mnist/saved_model/backbone/1 \\
        (--images FOLDER | --npz FILE | --tfds NAME:SPLIT) --out DIR \\
        [--batch-size 256] [--signature serving_default|embed]

Writes DIR/features.npy, DIR/labels.npy (class index, -1 when unlabelled), DIR/classes.json
and DIR/paths.txt (one name per row); DIR must be new or empty (an earlier extraction is
refused, not replaced).  ``--model`` may also be the folder holding numbered
versions (the newest is used).  Image files that cannot be decoded are skipped with a warning.
No keras and no training code are loaded: ``caco_tf/serving/extraction.py``.
"""

import os
import sys

from caco_tf import cli


def parse_args(argv):
    parser = cli.ArgumentParser(prog="caco-extract",
                                     description="Extract features with an exported SavedModel.")
    parser.add_argument("--model", required=True, help="SavedModel folder (or its base path)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--images", metavar="FOLDER",
                        help="image folder (jpg/jpeg/png/bmp/gif); sub-folders name classes")
    source.add_argument("--npz", metavar="FILE", help=".npz with uint8 images (and labels)")
    source.add_argument("--tfds", metavar="NAME:SPLIT", help="a TFDS split, e.g. cifar10:test")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--signature", default="serving_default",
                        choices=["serving_default", "embed"])
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    cli.verbose_argument(parser)
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        parser.error("--batch-size must be at least 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    cli.start(["--verbose"] if args.verbose else [])

    def work():
        from caco_tf.serving import export, extraction

        if args.images:
            data = extraction.folder_source(args.images)
        elif args.npz:
            data = extraction.npz_source(args.npz)
        else:
            data = extraction.tfds_source(args.tfds)
        export.check_output(args.out, "folder")  # before the model loads
        signature = extraction.load_signature(args.model, args.signature)
        with export.writing_output(args.out):
            result = extraction.extract(signature, data, args.out, batch_size=args.batch_size,
                                        progress=not args.quiet)
        if result.skipped:
            names = ", ".join(result.skipped[:3]) + (", ..." if len(result.skipped) > 3 else "")
            print(f"warning: skipped {len(result.skipped)} unreadable image file(s): {names}",
                  file=sys.stderr)
        print(f"features: {os.path.abspath(os.path.join(args.out, 'features.npy'))} "
              f"[{result.count}, {result.dim}]")
        return 0

    return cli.guard(work)


def console():
    """``caco-extract``: ``main()``, then the process ends at once (``cli.exit_after``)."""
    cli.exit_after(main)


if __name__ == "__main__":
    console()
