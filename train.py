"""Pre-train a CaCo encoder.

    python train.py                                   # offline MNIST default, ~10 CPU minutes
    python train.py --config configs/NAME.yaml [--set key=value ...] [--run-dir DIR]

Re-running the same command resumes the run from its last finished epoch.
"""

import argparse
import os
import sys

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "mnist.yaml")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--config", default=DEFAULT_CONFIG,
                        help="YAML run config (default: configs/mnist.yaml, the offline run)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config key, e.g. --set caco.bank_lr=0.3")
    parser.add_argument("--run-dir", help="run folder (default: runs/<config name>)")
    parser.add_argument("--strategy", choices=("auto", "default", "mirrored", "multiworker"),
                        help="tf.distribute strategy (default: the config's distribute.strategy, "
                             "auto = mirrored when more than one GPU is visible)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from caco_tf.config import ConfigError, load_config
    from caco_tf.data import DataError

    try:
        assignments = list(args.set)
        if args.strategy:
            assignments.append(f"distribute.strategy={args.strategy}")
        config = load_config(args.config, assignments)
        run_dir = args.run_dir or os.path.join("runs", config["name"])
        from caco_tf import pretrain
        results = pretrain.run(config, run_dir, verbose=0 if args.quiet else 1)
    except (ConfigError, DataError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not results:  # a non-chief worker of a multi-worker run: the chief reports
        return 0
    print(f"run folder: {os.path.abspath(run_dir)}")
    if "knn_top1" in results:
        print(f"kNN top-1: {results['knn_top1']:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
