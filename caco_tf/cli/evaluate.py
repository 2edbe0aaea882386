"""Evaluate a run's frozen backbone (``caco-evaluate``, ``python -m caco_tf.cli.evaluate``).

    caco-evaluate knn    --run RUN_DIR [--data SOURCE] [--json OUT]
    caco-evaluate linear --run RUN_DIR [--data SOURCE] [--json OUT]
                         [--epochs 100] [--lr 0.03] [--l2 auto|λ]
                         [--augment none|imagenet|digits] ...
    caco-evaluate linear --pixels [--data mnist]      # raw-pixel baseline
    caco-evaluate knn    --run RUN_DIR --untrained    # the run's network, not trained
    caco-evaluate knn    --run RUN_DIR --teacher      # its momentum teacher (DINO, I-JEPA...)
    caco-evaluate linear --run RUN_DIR --features patch_mean   # a ViT's mean patch token

SOURCE: nothing (the run's own training images against its held-out split) or the user's own
labelled images (transfer), with ``--held-out SOURCE`` where ``--data`` has no held-out split of
its own (``caco_tf.evaluation.protocols``).  Prints a table and writes the numbers as JSON
into the run folder (``eval_<protocol>[_pixels|_untrained|_teacher][_<features>][_<data>].json``)
or to ``--json``.  The last line is ``kNN top-1: NN.N%`` or ``linear top-1: NN.N%``.
"""

import json
import os

from caco_tf import cli
# The linear protocol's choices, from a module without TensorFlow: --help stays quick.
from caco_tf.evaluation import AUGMENTATIONS, L2_FOLDS, L2_GRID, POOLINGS


def parse_args(argv):
    parser = cli.ArgumentParser(
        prog="caco-evaluate",
        description="Evaluate a run's frozen backbone (weighted kNN or linear protocol).")
    parser.add_argument("protocol", choices=("knn", "linear"))
    parser.add_argument("--run", help="run folder written by caco-train / train.py")
    parser.add_argument("--data", help="labelled training images for the protocol: mnist, "
                                       "mnist_validation, tfds:NAME[:SPLIT], folder:PATH, "
                                       "npz:PATH, tfrecord:GLOB (default: the run's own data)")
    parser.add_argument("--held-out", help="labelled held-out images (default: --data's own "
                                           "held-out split: MNIST's, a TFDS test split, a "
                                           "folder's val/): folder:PATH, npz:PATH, "
                                           "tfds:NAME:SPLIT, tfrecord:GLOB")
    parser.add_argument("--json", help="output JSON (default: RUN/eval_<protocol>[...].json)")
    parser.add_argument("--pixels", action="store_true",
                        help="raw pixels instead of the backbone (baseline; --run optional)")
    parser.add_argument("--untrained", action="store_true",
                        help="the run's backbone with fresh weights seeded by --seed, as "
                             "before its first step (baseline: what pre-training added)")
    parser.add_argument("--teacher", action="store_true",
                        help="the run's momentum teacher's backbone in place of the student's "
                             "(what DINO's, DINOv2's and I-JEPA's authors evaluate)")
    parser.add_argument("--features", choices=POOLINGS,
                        help="a ViT's features: its class token (the backbone's output), the "
                             "mean of its patch tokens (MAE's global pool) or both "
                             "concatenated (DINOv2's linear evaluation); default: the run's "
                             "evaluation.features")
    parser.add_argument("--seed", type=int, default=0)
    cli.verbose_argument(parser, "one line per training epoch, and TensorFlow's start-up lines")
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
                                   f"{', '.join(f'{v:g}' for v in L2_GRID)} by k-fold "
                                   "cross-validation on the training split (default: auto "
                                   "with cached features, 0 with --augment)")
    linear_group.add_argument("--l2-folds", type=int, default=L2_FOLDS,
                              help=f"folds of --l2 auto (default {L2_FOLDS})")
    linear_group.add_argument("--augment", choices=AUGMENTATIONS, default="none",
                              help="training views: none (features cached once), imagenet "
                                   "(RandomResizedCrop + flip) or digits (a mild random affine, "
                                   "no flip)")
    linear_group.add_argument("--no-standardize", action="store_true",
                              help="no BatchNormalization (without scale/offset) before Dense")
    return parser.parse_args(argv)


def checked_baseline(args):
    """The baseline the flags ask for ("", "pixels" or "untrained"), once the numbers are
    checked; a ``ConfigError`` line otherwise."""
    from caco_tf.errors import ConfigError

    if args.pixels and args.untrained:
        raise ConfigError("--pixels and --untrained are two baselines: choose one")
    for name in ("epochs", "batch_size", "k", "temperature", "lr"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be positive, got {value}")
    if args.l2_folds < 2:
        raise ConfigError(f"--l2-folds must be at least 2, got {args.l2_folds}")
    return "pixels" if args.pixels else "untrained" if args.untrained else ""


def main(argv=None):
    args = parse_args(argv)
    cli.start(["--verbose"] if args.verbose else [])

    def work():
        from caco_tf.evaluation import protocols

        baseline = checked_baseline(args)
        linear = {} if args.protocol == "knn" else dict(
            epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.lr,
            momentum=args.momentum, weight_decay=args.weight_decay, augment=args.augment,
            batchnorm=not args.no_standardize, verbose=2 if args.verbose else 0,
            l2=protocols.l2_setting(args.l2, args.augment), l2_folds=args.l2_folds)
        result = protocols.evaluate(args.protocol, run=args.run, data=args.data,
                                    held_out=args.held_out, baseline=baseline, seed=args.seed,
                                    k=args.k, temperature=args.temperature,
                                    teacher=args.teacher, features=args.features, **linear)
        print(protocols.format_table(result))
        path = args.json or protocols.default_json_path(
            args.run, args.protocol, args.data, "teacher" if args.teacher else baseline,
            result["features"])
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as handle:
                json.dump(result, handle, indent=1)
            print(f"results: {os.path.abspath(path)}")
        name = "linear" if args.protocol == "linear" else "kNN"
        print(f"{name} top-1: {result['top1']:.1f}%")
        return 0

    return cli.guard(work)


def console():
    """``caco-evaluate``: ``main()``, then the process ends at once (``cli.exit_after``)."""
    cli.exit_after(main)


if __name__ == "__main__":
    console()
