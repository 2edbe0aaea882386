"""Export a run's backbone as a TF Serving SavedModel.

    python export/export_saved_model.py --run runs/mnist [--out DIR] [--version N]

Rebuilds the model from the run's resolved ``config.yaml``, loads its last checkpoint and writes
``DIR/backbone/N/`` (default DIR: the run's ``saved_model/``).  ``train.py`` does the same at the
end of every run.  Signatures and preprocessing: ``caco_tf/export.py``.
"""

import argparse
import os
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(description="Export a run's backbone as a SavedModel.")
    parser.add_argument("--run", required=True, help="run folder written by train.py")
    parser.add_argument("--out", help="output folder (default: RUN/saved_model)")
    parser.add_argument("--version", type=int, default=1)
    parser.add_argument("--crop-fraction", type=float, default=0.875,
                        help="serving resize: shorter side to image_size / this, then centre "
                             "crop (default 0.875: 256 → 224)")
    args = parser.parse_args(argv)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from caco_tf import export, pretrain
    from caco_tf.config import ConfigError, load_config

    weights = os.path.join(args.run, "checkpoints", "last.weights.h5")
    try:
        config = load_config(os.path.join(args.run, "config.yaml"))
        if not os.path.exists(weights):
            raise ConfigError(f"no checkpoint at {weights}: has the run finished an epoch?")
        views = pretrain.build_views(config)
        model = pretrain.build_model(config, steps_per_epoch=1)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    model.load_weights(weights)
    path = export.export_backbone(
        model.backbone, args.out or os.path.join(args.run, "saved_model"),
        config["data"]["image_size"], config["data"]["channels"], views.mean, views.std,
        embedder=model.query_encoder, version=args.version, crop_fraction=args.crop_fraction)
    print(f"saved model: {os.path.abspath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
