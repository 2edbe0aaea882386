"""Evaluate a run's frozen backbone: weighted kNN or the linear protocol, on its data or others.

    python -m caco_tf.evaluate knn    --run RUN_DIR [--data SOURCE] [--json OUT]
    python -m caco_tf.evaluate linear --run RUN_DIR [--data SOURCE] [--json OUT]
                                      [--epochs 100] [--lr 0.03] [--l2 auto|λ]
                                      [--augment none|imagenet|digits] ...
    python -m caco_tf.evaluate linear --pixels [--data mnist]      # raw-pixel baseline

SOURCE: nothing (the run's own training images against its held-out split, from its
``config.yaml``) or any labelled ``caco_tf.data`` source with a held-out split: ``mnist`` /
``mnist_validation`` (the offline splits) or ``tfds:NAME[:SPLIT]``, any TFDS classification
data set by name (training split ``train`` unless named, tested on ``test``, else
``validation``), its images converted to the backbone's channels and size (transfer).

Prints a table and writes the numbers as JSON into the run folder (``eval_<protocol>[_pixels]
[_<data>].json``) or to ``--json``.  The linear protocol ends with ``linear top-1: NN.N%``.
"""

import argparse
import collections
import json
import os
import re
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported

from caco_tf import data, evaluation, linear, pretrain  # noqa: E402
from caco_tf.config import DEFAULTS, ConfigError, load_config  # noqa: E402

Run = collections.namedtuple("Run", "directory config model views")
# train, test: labelled caco_tf.data sources.
LabelledData = collections.namedtuple("LabelledData", "name train test num_classes")


def load_run(run_dir):
    """The CaCo model of a run folder, rebuilt from its ``config.yaml`` and last checkpoint."""
    config_path = os.path.join(run_dir, "config.yaml")
    weights = os.path.join(run_dir, "checkpoints", "last.weights.h5")
    if not os.path.exists(config_path):
        raise ConfigError(f"no config.yaml in {run_dir}: not a run folder")
    config = load_config(config_path)
    if not os.path.exists(weights):
        raise ConfigError(f"no checkpoint at {weights}: has the run finished an epoch?")
    model = pretrain.build_model(config, steps_per_epoch=1)
    model.load_weights(weights)
    return Run(run_dir, config, model, pretrain.build_views(config))


def load_labelled_data(spec, config):
    """A :class:`LabelledData` for the source ``spec`` (None: the run's own data).

    The training split's labels and a labelled held-out split are required.
    """
    settings = config["data"]
    if spec is None:
        train, held_out = pretrain.load_data(config)
        spec = settings["source"]
    else:
        train, held_out = data.load_source(spec, channels=settings["channels"],
                                           data_dir=settings["data_dir"],
                                           manual_dir=settings["manual_dir"])
    if held_out is None or not train.has_labels or not held_out.has_labels:
        raise data.DataError(f"{spec} has no labelled training and held-out splits; pass "
                             f"--data mnist or --data tfds:NAME")
    train, held_out = (_with_channels(source, settings["channels"])
                       for source in (train, held_out))
    return LabelledData(spec, train, held_out, data.num_classes(train, held_out))


def _with_channels(source, channels):
    """Array sources converted to the backbone's channel count (files convert when decoded)."""
    if isinstance(source, data.ArraySource) and source.images.shape[-1] != channels:
        return data.ArraySource(data.convert_array_channels(source.images, channels),
                                source.labels, name=source.name)
    return source


def preprocessing_for(config, pixels=False):
    """The backbone's input transform; raw pixels are only scaled to [0, 1] (no mean, std)."""
    size, channels = config["data"]["image_size"], config["data"]["channels"]
    if pixels:
        return linear.Preprocessing(size, channels, 0.0, 1.0)
    views = pretrain.build_views(config)
    return linear.Preprocessing(size, channels, views.mean, views.std)


def knn(backbone, labelled, preprocessing, k, temperature, batch_size=500):
    """Weighted kNN top-1 and top-5 (%) of ``labelled.test`` against ``labelled.train``."""
    (train_features, train_labels), (test_features, test_labels) = (
        evaluation.extract_features(backbone, linear.eval_batches(source, preprocessing,
                                                                  batch_size))
        for source in (labelled.train, labelled.test))
    votes = evaluation.knn_votes(train_features, train_labels, test_features, k, temperature,
                                 num_classes=labelled.num_classes)
    return {"top1": 100.0 * evaluation.top_k_accuracy(votes, test_labels, 1),
            "top5": 100.0 * evaluation.top_k_accuracy(votes, test_labels, 5),
            "train_images": len(train_labels), "test_images": len(test_labels),
            "k": int(k), "temperature": float(temperature)}


def default_json_path(run_dir, protocol, spec, pixels):
    """RUN/eval_<protocol>[_pixels][_<data>].json, or None without a run folder."""
    if run_dir is None:
        return None
    suffix = "" if spec is None else "_" + re.sub(r"[^A-Za-z0-9.-]+", "_", spec)
    return os.path.join(run_dir, f"eval_{protocol}{'_pixels' if pixels else ''}{suffix}.json")


def format_table(result):
    """One Markdown table row (with its header) for a result dict."""
    if result["protocol"] == "knn":
        setting = f"k={result['k']}, T={result['temperature']:g}"
    else:
        chosen = f" ({result['l2_folds']}-fold CV)" if "l2_scores" in result else ""
        setting = (f"{result['epochs']} epochs, lr {result['learning_rate']:g}, "
                   f"L2 {result['l2']:g}{chosen}, augment {result['augment']}")
    return "\n".join([
        "| protocol | encoder | data | train / test images | top-1 | top-5 |",
        "|---|---|---|---|---|---|",
        f"| {result['protocol']} ({setting}) | {result['encoder']} | {result['data']} | "
        f"{result['train_images']} / {result['test_images']} | {result['top1']:.1f} % | "
        f"{result['top5']:.1f} % |"])


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Evaluate a run's frozen backbone (weighted kNN or linear protocol).")
    parser.add_argument("protocol", choices=("knn", "linear"))
    parser.add_argument("--run", help="run folder written by train.py")
    parser.add_argument("--data", help="a labelled source with a held-out split: mnist, "
                                       "mnist_validation, tfds:NAME[:SPLIT] (default: the run's "
                                       "own data)")
    parser.add_argument("--json", help="output JSON (default: RUN/eval_<protocol>[...].json)")
    parser.add_argument("--pixels", action="store_true",
                        help="raw pixels instead of the backbone (baseline; --run optional)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", action="store_true", help="one line per training epoch")
    knn_group = parser.add_argument_group("knn")
    knn_group.add_argument("--k", type=int,
                           help="neighbours (default: the run's evaluation.knn_k)")
    knn_group.add_argument("--temperature", type=float,
                           help="vote temperature (default: evaluation.knn_temperature)")
    linear_group = parser.add_argument_group("linear")
    linear_group.add_argument("--epochs", type=int, default=100)
    linear_group.add_argument("--batch-size", type=int, default=256)
    linear_group.add_argument("--lr", type=float, default=0.03,
                              help="SGD learning rate, cosine-decayed to 0 (default 0.03, "
                                   "chosen on the validation split)")
    linear_group.add_argument("--momentum", type=float, default=0.9)
    linear_group.add_argument("--weight-decay", type=float, default=0.0,
                              help="the optimizer's decoupled weight decay (default 0)")
    linear_group.add_argument("--l2", default=None, metavar="auto|λ",
                              help="L2 penalty λ‖W‖² on the Dense kernel; auto: the best of "
                                   f"{', '.join(f'{v:g}' for v in linear.L2_GRID)} by k-fold "
                                   "cross-validation on the training split (default: auto "
                                   "with cached features, 0 with --augment)")
    linear_group.add_argument("--l2-folds", type=int, default=linear.L2_FOLDS,
                              help=f"folds of --l2 auto (default {linear.L2_FOLDS})")
    linear_group.add_argument("--augment", choices=linear.AUGMENTATIONS, default="none",
                              help="training views: none (features cached once), imagenet "
                                   "(RandomResizedCrop + flip) or digits (a mild random affine, "
                                   "no flip)")
    linear_group.add_argument("--no-standardize", action="store_true",
                              help="no BatchNormalization (without scale/offset) before Dense")
    return parser.parse_args(argv)


def l2_setting(text, augment):
    """``--l2``: "auto", λ ≥ 0, or None (unset: auto where features are cached, else 0)."""
    if text is None:
        return None
    if text == "auto":
        if augment != "none":
            raise ConfigError("--l2 auto chooses λ on cached features: pass a number with "
                              f"--augment {augment}")
        return text
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ConfigError(f"--l2 must be auto or a number >= 0, got {text}")
    return value


def evaluate(args):
    """Run the protocol ``args`` ask for; returns the result dict (also what the JSON holds)."""
    if args.run is None and not args.pixels:
        raise ConfigError("--run RUN_DIR is required (or --pixels for the raw-pixel baseline)")
    for name in ("epochs", "batch_size", "k", "temperature", "lr"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be positive, got {value}")
    if args.l2_folds < 2:
        raise ConfigError(f"--l2-folds must be at least 2, got {args.l2_folds}")
    l2 = l2_setting(args.l2, args.augment)
    run = load_run(args.run) if args.run else None
    config = run.config if run else DEFAULTS
    labelled = load_labelled_data(args.data, config)
    preprocessing = preprocessing_for(config, pixels=args.pixels)
    backbone = linear.pixels_backbone(preprocessing) if args.pixels else run.model.backbone
    if args.protocol == "knn":
        result = knn(backbone, labelled, preprocessing,
                     args.k or config["evaluation"]["knn_k"],
                     args.temperature or config["evaluation"]["knn_temperature"],
                     config["evaluation"]["batch_size"])
    else:
        result = linear.linear_evaluation(
            backbone, labelled.train, labelled.test, labelled.num_classes, preprocessing,
            epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.lr,
            momentum=args.momentum, weight_decay=args.weight_decay, augment=args.augment,
            batchnorm=not args.no_standardize, seed=args.seed,
            verbose=2 if args.verbose else 0, l2=l2, l2_folds=args.l2_folds)
    encoder = "raw pixels" if args.pixels else os.path.abspath(args.run)
    return {"protocol": args.protocol, "encoder": encoder, "data": labelled.name,
            "classes": labelled.num_classes, **result}


def main(argv=None):
    args = parse_args(argv)
    try:
        result = evaluate(args)
    except (ConfigError, data.DataError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(format_table(result))
    path = args.json or default_json_path(args.run, args.protocol, args.data, args.pixels)
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as handle:
            json.dump(result, handle, indent=1)
        print(f"results: {os.path.abspath(path)}")
    name = "linear" if args.protocol == "linear" else "kNN"
    print(f"{name} top-1: {result['top1']:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
