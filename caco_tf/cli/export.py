"""Export a run's backbone for serving (``caco-export``, ``python export/export_saved_model.py``).

    caco-export --run runs/mnist [--out DIR] [--version N] [--crop-fraction 0.875]

Rebuilds the model from the run's resolved ``config.yaml``, loads its last checkpoint and writes
``DIR/backbone/N/`` (default DIR: the run's ``saved_model/``).  ``caco-train`` does the same at
the end of every run.  Signatures and preprocessing: ``caco_tf/serving/export.py``.
"""

import os
import sys

from caco_tf import cli


def parse_args(argv):
    parser = cli.ArgumentParser(prog="caco-export",
                                     description="Export a run's backbone as a SavedModel.")
    parser.add_argument("--run", required=True, help="run folder written by caco-train")
    parser.add_argument("--out", help="output folder (default: RUN/saved_model)")
    parser.add_argument("--version", type=int, default=1)
    parser.add_argument("--crop-fraction", type=float, default=0.875,
                        help="serving resize: shorter side to image_size / this, then centre "
                             "crop (default 0.875: 256 → 224)")
    cli.verbose_argument(parser)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    cli.start(["--verbose"] if args.verbose else [])

    def work():
        from caco_tf.build import load_run
        from caco_tf.errors import ConfigError
        from caco_tf.serving import export

        if args.version < 1:
            raise ConfigError(f"--version must be at least 1, got {args.version}")
        if not 0.0 < args.crop_fraction <= 1.0:
            raise ConfigError(f"--crop-fraction must be in (0, 1], got {args.crop_fraction}")
        run = load_run(args.run)
        config = run.config
        path = export.export_backbone(
            run.model.backbone, args.out or os.path.join(args.run, "saved_model"),
            config["data"]["image_size"], config["data"]["channels"], run.views.mean,
            run.views.std, embedder=run.model.query_encoder, version=args.version,
            crop_fraction=args.crop_fraction)
        print(f"saved model: {os.path.abspath(path)}")
        return 0

    return cli.guard(work)


if __name__ == "__main__":
    sys.exit(main())
