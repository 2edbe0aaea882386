"""Pre-train an encoder (``caco-train``, ``python train.py``).

    caco-train                                        # offline MNIST default, ~8 CPU minutes
    caco-train --config NAME|PATH.yaml [--set key=value ...] [--run-dir DIR]
    caco-train --list-configs                         # the configurations the package ships

Re-running the same command resumes the run where it stopped.  Ctrl-C, SIGTERM and SIGHUP (a
closed terminal) finish the step, save and exit with 130 / 143 / 129; a failed write to the run
folder exits with 74; a setting or file to fix with 2 (docs/long-runs.md).
"""

import os

from caco_tf import cli

DEFAULT_CONFIG = "mnist"  # shipped with the package: the offline default


def parse_args(argv):
    parser = cli.ArgumentParser(prog="caco-train", description="Pre-train a CaCo encoder.")
    parser.add_argument("--config", default=DEFAULT_CONFIG,
                        help="a shipped configuration's name (--list-configs) or a YAML file "
                             "(default: mnist, the offline run)")
    parser.add_argument("--list-configs", action="store_true",
                        help="print the shipped configurations, one line each, and exit")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config key, e.g. --set method.caco.bank_lr=0.3")
    parser.add_argument("--run-dir", help="run folder (default: runs/<config name>)")
    parser.add_argument("--strategy", choices=("auto", "default", "mirrored", "multiworker"),
                        help="tf.distribute strategy (default: the config's distribute.strategy, "
                             "auto = mirrored when more than one GPU is visible)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    cli.verbose_argument(parser)
    return parser.parse_args(argv)


def list_configs():
    from caco_tf.config import describe_config, shipped_configs

    shipped = shipped_configs()
    width = max(map(len, shipped), default=0)
    for name, path in shipped.items():
        print(f"{name:<{width}}  {describe_config(path)}")
    return 0


def main(argv=None):
    args = parse_args(argv)
    if args.list_configs:
        return list_configs()
    cli.start(["--verbose"] if args.verbose else [])
    # A reader that goes away (`| head`, a closed terminal) must not end days of training.
    cli.survive_closed_stdout("the run goes on; its progress is in the run folder's "
                              "history.json and tensorboard/")

    def work():
        from caco_tf.config import load_config

        assignments = list(args.set)
        if args.strategy:
            assignments.append(f"distribute.strategy={args.strategy}")
        config = load_config(args.config, assignments)
        if config["distribute"]["strategy"] == "multiworker":
            cli.leave_with_peers()
        run_dir = args.run_dir or os.path.join("runs", config["name"])
        from caco_tf import pretrain

        results = pretrain.run(config, run_dir, verbose=0 if args.quiet else 1)
        if results:  # empty on a non-chief worker of a multi-worker run: the chief reports
            print(f"run folder: {os.path.abspath(run_dir)}")
            if "knn_top1" in results:
                print(f"kNN top-1: {results['knn_top1']:.1f}%")
        return 0

    return cli.guard(work)


def console():
    """``caco-train``: ``main()``, then the process ends at once (``cli.exit_after``)."""
    cli.exit_after(main)


if __name__ == "__main__":
    console()
