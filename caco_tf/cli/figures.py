"""The paper's analysis figures for a run (``caco-figures``, ``python -m caco_tf.cli.figures``).

    caco-figures --run RUN_DIR [--out DIR] [--queries 6] [--negatives 6]
                 [--points 1000] [--max-train 20000] [--seed 0]
    caco-figures attention --run RUN_DIR --images FILE_OR_FOLDER [--out DIR] [--fraction 0.6]
    caco-figures reconstruction --run RUN_DIR [--out DIR] [--count 8] [--seed 0]

The first writes prob_acc.png, t_sne.png and query_ex.png (``caco_tf.evaluation.figures``);
``attention`` a ViT run's self-attention maps (``caco_tf.evaluation.attention``);
``reconstruction`` an MAE run's reconstructions (``caco_tf.evaluation.reconstruction``).
"""

import os

from caco_tf import cli


def parse_args(argv):
    parser = cli.ArgumentParser(prog="caco-figures",
                                     description="The paper's analysis figures for a run.")
    parser.add_argument("--run", help="run folder written by caco-train")
    parser.add_argument("--out", help="output folder (default: RUN/figures)")
    parser.add_argument("--queries", type=int, default=6, help="query rows in query_ex.png")
    parser.add_argument("--negatives", type=int, default=6, help="negatives per query")
    parser.add_argument("--points", type=int, default=1000, help="held-out points in t-SNE")
    parser.add_argument("--max-train", type=int, default=20000,
                        help="training images searched for surrogates (the first N)")
    parser.add_argument("--seed", type=int, default=0)
    cli.verbose_argument(parser)
    figures = parser.add_subparsers(dest="figure", metavar="attention|reconstruction")
    attention = figures.add_parser(
        "attention", help="a ViT run's self-attention maps",
        description="A ViT run's self-attention maps: each head's class-token attention of the "
                    "last block over each image, and the smallest patch sets holding a "
                    "fraction of it (DINO's figures).")
    attention.add_argument("--run", required=True,
                           help="run folder written by caco-train (a ViT)")
    attention.add_argument("--images", required=True, help="an image file or a folder of images")
    attention.add_argument("--out", help="output folder (default: RUN/figures/attention)")
    attention.add_argument("--fraction", type=float, default=0.6,
                           help="the share of each head's attention the masks hold (DINO: 0.6)")
    cli.verbose_argument(attention)
    reconstruction = figures.add_parser(
        "reconstruction", help="an MAE run's reconstructions",
        description="An MAE run's reconstructions: held-out images, the patches the encoder "
                    "sees, and the decoder's reconstruction of the masked ones.")
    reconstruction.add_argument("--run", required=True,
                                help="run folder written by caco-train (method.name mae)")
    reconstruction.add_argument("--out", help="output folder (default: RUN/figures)")
    reconstruction.add_argument("--count", type=int, default=8, help="images shown")
    reconstruction.add_argument("--seed", type=int, default=0, help="the masks' seed")
    cli.verbose_argument(reconstruction)
    args = parser.parse_args(argv)
    if args.figure is None and args.run is None:
        parser.error("the following arguments are required: --run")
    return args


def main(argv=None):
    args = parse_args(argv)
    cli.start(["--verbose"] if args.verbose else [])

    def work():
        from caco_tf.errors import ConfigError

        if args.figure == "attention":
            from caco_tf.evaluation.attention import attention_figures

            paths = attention_figures(args.run, args.images, args.out, args.fraction)
        elif args.figure == "reconstruction":
            from caco_tf.evaluation.reconstruction import reconstruction_figures

            paths = reconstruction_figures(args.run, args.out, args.count, args.seed)
        else:
            for name in ("queries", "negatives", "points", "max_train"):
                if getattr(args, name) <= 0:
                    raise ConfigError(f"--{name.replace('_', '-')} must be positive, got "
                                      f"{getattr(args, name)}")
            from caco_tf.evaluation.figures import make_figures

            paths = make_figures(args.run, args.out, args.queries, args.negatives, args.points,
                                 args.max_train, args.seed)
        for path in paths:
            print(f"figure: {os.path.abspath(path)}")
        return 0

    return cli.guard(work)


def console():
    """``caco-figures``: ``main()``, then the process ends at once (``cli.exit_after``)."""
    cli.exit_after(main)


if __name__ == "__main__":
    console()
