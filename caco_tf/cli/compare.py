"""Which method for my images? (``caco-compare``, ``python -m caco_tf.cli.compare``).

    caco-compare                                   # every method on the shapes benchmark
    caco-compare --data folder:DIR --methods caco,byol,vicreg --epochs 2 --trials 2 --seeds 2
    caco-compare --data folder:DIR --dry-run       # what it would run, and how long

Each method is tuned on a validation split carved from the training images (``--trials``
settings drawn from its search space, the same number for every method), then its chosen
setting trains with each of ``--seeds`` seeds on every training image and is measured once on
the test split: kNN, linear and few-label linear top-1, and its health.  The report
(``OUT/report/report.md``, ``report.html``, plots) holds the table, the paired comparisons and
every trial.  Re-running the same command continues where a signal or a kill stopped it
(docs/compare.md).
"""

import logging
import os
import shlex
import signal
import sys

from caco_tf import cli

DEFAULT_DATA = "shapes"
DEFAULT_CONFIG = "shapes"
# Set by the comparison for each run: the user's --set cannot.
PER_RUN = ("method.name", "train.seed", "data.seed", "data.source", "data.held_out")


def parse_args(argv):
    parser = cli.ArgumentParser(
        prog="caco-compare",
        description="Compare the self-supervised methods on your images: tune each on a "
                    "validation split, train it with several seeds, report with paired "
                    "intervals.")
    parser.add_argument("--data", default=DEFAULT_DATA,
                        help="the images: folder:PATH (class sub-folders, or train/ and val/), "
                             "npz:PATH, tfds:NAME, tfrecord:GLOB, mnist, shapes (default: "
                             "shapes, the generated benchmark)")
    parser.add_argument("--labels", help="a CSV of 'relative/path,class' lines labelling an "
                                         "unlabelled folder (evaluation only)")
    parser.add_argument("--config", default=DEFAULT_CONFIG,
                        help="the shared budget: a shipped configuration's name or a YAML file "
                             "(default: shapes)")
    parser.add_argument("--methods", help="comma-separated methods (default: every method of "
                                          "a ConvNet; those of a ViT's tokens when named, "
                                          "with --backbone vit_micro_patch4)")
    budget = parser.add_argument_group("the shared budget (every method alike)")
    budget.add_argument("--epochs", type=int, help="train.epochs of every run")
    budget.add_argument("--batch-size", type=int, help="train.batch_size of every run")
    budget.add_argument("--image-size", type=int, help="data.image_size of every run")
    budget.add_argument("--backbone", help="model.backbone of every run")
    budget.add_argument("--views", help="data.views of every run (default: the budget's; a "
                                        "method that declares its authors' views takes those)")
    budget.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="any other setting of every run")
    plan = parser.add_argument_group("trials, seeds and splits")
    plan.add_argument("--trials", type=int, default=3,
                      help="settings tried per method on the validation split (default 3)")
    plan.add_argument("--seeds", type=int, default=3,
                      help="seeds of each method's chosen setting (default 3)")
    plan.add_argument("--seed", type=int, default=0,
                      help="the seed of the splits and of the trials' draw (default 0)")
    plan.add_argument("--few-labels", type=int, default=10, metavar="K",
                      help="labelled images per class of the few-label protocol (default 10; "
                           "0: none)")
    plan.add_argument("--few-label-draws", type=int, metavar="N",
                      help="draws of those labelled images, each a split: a run's few-label "
                           "figure is the mean over the draws (default 5; a rerun keeps its "
                           "plan's)")
    plan.add_argument("--validation-fraction", type=float, default=0.2,
                      help="of the training images, carved for validation (default 0.2)")
    plan.add_argument("--test-fraction", type=float, default=0.2,
                      help="of the images, carved for the test where the source has no "
                           "held-out split (default 0.2)")
    plan.add_argument("--linear-epochs", type=int, default=100,
                      help="epochs of the linear protocol (default 100)")
    plan.add_argument("--few-label-epochs", type=int, metavar="N",
                      help="epochs of the few-label protocol (default: --linear-epochs; with "
                           "a few images a class an epoch is one step; a rerun keeps its "
                           "plan's)")
    curves = parser.add_argument_group("learning curves (validation kNN during training)")
    curves.add_argument("--curve-every", type=int, metavar="N",
                        help="every run measures its curve every N epochs (default 1; 0: no "
                             "curves; a rerun keeps its plan's)")
    curves.add_argument("--curve-images", metavar="NEIGHBOURS,QUERIES",
                        help="the curve's class-balanced samples of the tune split "
                             "(neighbours) and of the validation split (queries) (default "
                             "2000,1000)")
    parser.add_argument("--out", default=os.path.join("runs", "compare"),
                        help="the comparison's folder (default: runs/compare)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan and the time estimate, train nothing")
    parser.add_argument("--pilot", metavar="DIR",
                        help="with --dry-run: what the planned seeds can resolve, from the "
                             "seeds' spreads of an earlier comparison's folder (default: this "
                             "--out's, once two seeds are measured)")
    parser.add_argument("--trials-only", action="store_true",
                        help="train and report the trials alone (a pilot: its learning curves "
                             "on the validation split, no test image read); the same command "
                             "without it goes on to the seeds")
    parser.add_argument("--report-only", action="store_true",
                        help="write the report from what is measured, train nothing")
    parser.add_argument("--publish", metavar="PAGE.md",
                        help="also put the report's test-split table, sentences and plots into "
                             "this Markdown page (between <!-- caco-compare:begin/end -->), "
                             "the whole report copied beside it in comparison/")
    parser.add_argument("--chief-timeout", type=float, default=600.0, metavar="SECONDS",
                        help="a worker of a comparison over machines (KERASTUNER_TUNER_ID="
                             "tuner0, ...) gives up after this long without an answer from "
                             "its chief (default 600)")
    cli.verbose_argument(parser)
    return parser.parse_args(argv)


def arguments_of(args):
    """The comparison's defining arguments (``runner.PLAN_KEYS``), checked: a ``ConfigError``
    line for a bad one."""
    from caco_tf.comparison import runner, trials
    from caco_tf.config import ConfigError
    from caco_tf.data import fingerprint
    from caco_tf.methods import METHODS

    every = trials.comparison_methods()
    methods = ([m.strip() for m in args.methods.split(",") if m.strip()]
               if args.methods is not None else every)
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise ConfigError(f"--methods: unknown {', '.join(unknown) or '(none given)'}; "
                          f"choose from {', '.join(every)}, or on a ViT "
                          f"{', '.join(trials.vit_methods())}")
    if len(set(methods)) != len(methods):
        raise ConfigError(f"--methods names a method twice: {args.methods}")
    for name, value, low in (("--trials", args.trials, 1), ("--seeds", args.seeds, 1),
                             ("--chief-timeout", args.chief_timeout, 1),
                             ("--few-labels", args.few_labels, 0),
                             ("--few-label-draws", 1 if args.few_label_draws is None
                              else args.few_label_draws, 1),
                             ("--linear-epochs", args.linear_epochs, 1),
                             ("--few-label-epochs", 1 if args.few_label_epochs is None
                              else args.few_label_epochs, 1),
                             ("--seed", args.seed, 0)):
        if value < low:
            raise ConfigError(f"{name} must be at least {low}, got {value}")
    for name, value in (("--validation-fraction", args.validation_fraction),
                        ("--test-fraction", args.test_fraction)):
        if not 0 < value < 1:
            raise ConfigError(f"{name} must be between 0 and 1, got {value}")
    curve_images = None
    if args.curve_images is not None:
        try:
            curve_images = [int(part) for part in args.curve_images.split(",")]
        except ValueError:
            curve_images = []
        if len(curve_images) != 2 or min(curve_images) < 1:
            raise ConfigError(f"--curve-images takes two counts, NEIGHBOURS,QUERIES (e.g. "
                              f"2000,1000), got {args.curve_images!r}")
    if args.curve_every is not None and args.curve_every < 0:
        raise ConfigError(f"--curve-every must be at least 0, got {args.curve_every}")
    for assignment in args.set:
        key = assignment.split("=", 1)[0].strip()
        if key in PER_RUN:
            raise ConfigError(f"--set {assignment}: the comparison sets {', '.join(PER_RUN)} "
                              f"for each run (use --data for the images)")
    settings = [f"{key}={value}" for key, value in (
        ("train.epochs", args.epochs), ("train.batch_size", args.batch_size),
        ("data.image_size", args.image_size), ("model.backbone", args.backbone),
        ("data.views", args.views)) if value is not None] + list(args.set)
    if args.epochs is not None and args.epochs >= 1:  # a warm-up keeps its share of the budget
        from caco_tf.config import load_config
        from caco_tf.methods.caco import scaled_warmups

        declared = load_config(runner.config_argument(args.config))
        settings += scaled_warmups(declared, args.epochs, methods, args.set)
    check_page(args.publish)
    # The images as resolved here: a rerun from another folder names other images.
    arguments = {"config": runner.config_argument(args.config),
                 "data": fingerprint.resolved(args.data), "data_as_typed": args.data,
                 "labels": os.path.abspath(args.labels) if args.labels else None,
                 "settings": settings, "methods": methods, "trials": args.trials,
                 "seeds": args.seeds, "seed": args.seed, "few_labels": args.few_labels,
                 "validation_fraction": args.validation_fraction,
                 "test_fraction": args.test_fraction, "linear_epochs": args.linear_epochs,
                 "curve_every": args.curve_every, "curve_images": curve_images,
                 "few_label_draws": args.few_label_draws,
                 "few_label_epochs": args.few_label_epochs}
    config = runner.budget_config(arguments)  # one line for a bad setting, now
    runner.check_backbone(methods, config)
    most = trials.max_trials(methods, config)
    if args.trials > most:
        raise ConfigError(f"--trials must be at most {most}: each method's search space holds "
                          f"{most} settings (docs/compare.md)")
    return arguments


def check_page(page):
    """``--publish PAGE.md`` names a page that can be written, before anything runs."""
    from caco_tf.config import ConfigError

    if page is None:
        return
    folder = os.path.dirname(os.path.abspath(page))
    if os.path.isdir(page):
        raise ConfigError(f"--publish {page} is a folder: name a Markdown page in it, e.g. "
                          f"--publish {os.path.join(page, 'results.md')}")
    if not os.path.isdir(folder):
        raise ConfigError(f"--publish {page}: its folder {folder} does not exist; create it "
                          f"or name a page in another folder")


def stop_between_runs(signum, frame):
    """A signal outside a training (which saves first): stop now, the state is saved."""
    from caco_tf.training.interrupts import Interrupted

    raise Interrupted(f"stopped by {signal.Signals(signum).name}; the same command continues "
                      f"the comparison", signum)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    cli.start(["--verbose"] if args.verbose else [])

    def work():
        from caco_tf.training import run_folder

        try:
            return compare(args, argv)
        except OSError as error:  # the comparison's own files (a run's are WriteErrors already)
            raise run_folder.write_error(error, error.filename or args.out,
                                         flag=flag_of(error.filename, args)) from None

    return cli.guard(work)


def flag_of(path, args):
    """The option naming where ``path`` was written: ``--publish`` for the page and the report
    copied beside it, else ``--out``."""
    if args.publish and path:
        beside = os.path.dirname(os.path.abspath(args.publish))
        if os.path.abspath(path) == os.path.abspath(args.publish) or os.path.abspath(
                path).startswith(os.path.join(beside, "comparison")):
            return "--publish"
    return "--out"


def compare(args, argv):
    """The command's work: plan, run, report (``main`` turns its errors into one line)."""
    from caco_tf.comparison import report, runner, tuning

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop_between_runs)
    # Many models in one process: TensorFlow's retracing notes say nothing to the user.
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    distribution = tuning.distribution()  # KerasTuner's variables, checked first
    arguments = arguments_of(args)
    comparison = runner.Comparison(args.out, tolerant=args.report_only)
    comparison.trials_only = args.trials_only
    if args.report_only:
        if comparison.plan is None:
            from caco_tf.config import ConfigError

            raise ConfigError(f"{comparison.folder} holds no comparison yet")
        return write_report(comparison, report, args.publish)
    if distribution and not distribution.chief:  # a worker of a comparison over machines
        tuning.wait_for_chief(distribution, args.chief_timeout, say=cli.say)
        tuning.wait_for_plan(comparison)
        planned = comparison.plan["arguments"]
        if args.data in (planned.get("data_as_typed"), planned["data"]):
            arguments["data"] = planned["data"]  # the chief's images, wherever typed from
        comparison.start(arguments, "")  # refuses other arguments than the chief's
        tuning.search(comparison, say=cli.say, timeout=args.chief_timeout)
        return 0
    if distribution:
        tuning.check_port_free(distribution)
    comparison.start(arguments, shlex.join(["caco-compare"] + list(argv)))
    tuning.check_book(comparison)
    runner.calibrate(comparison, say=cli.say)
    cli.say(describe(comparison, runner.estimate_seconds(comparison)))
    if args.dry_run:
        said = resolution_lines(comparison, args.pilot, report)
        if said:
            cli.say("\n".join(said))
        return 0
    tuning.search(comparison, say=cli.say)
    if not args.trials_only:
        runner.measure_baselines(comparison, say=cli.say)
    return write_report(comparison, report, args.publish)


def describe(comparison, seconds):
    """What the comparison runs, in a few lines, with the time it will take."""
    plan, arguments = comparison.plan, comparison.plan["arguments"]
    images = plan["images"]
    methods = arguments["methods"]
    lines = [
        f"comparison in {comparison.folder}: {len(methods)} methods "
        f"({', '.join(methods)}) on {arguments['data']}",
        f"  budget: --config {arguments['config']} {' '.join(arguments['settings'])}".rstrip()
        + f" ({plan['epochs']} epochs, batch {plan['batch_size']})",
    ] + [f"  {method}'s own, after the budget's: {' '.join(comparison.own_settings(method))}"
         for method in methods if comparison.own_settings(method)] + [
        f"  splits: {images['tune']:,} training + {images['validation']:,} validation images "
        f"for {arguments['trials']} trial(s) a method, then {images['train']:,} training "
        f"images x {arguments['seeds']} seed(s), measured on {images['test']:,} test images",
        f"  runs: {len(comparison.runs())} trainings"
        + (f" of which --trials-only trains the "
           f"{sum(not final for *_, final in comparison.runs())} trials" if comparison.trials_only
           else "") + f"; about {duration(seconds)} left on this machine (timed by "
           "each method's finished runs, this machine's first, else calibrated)",
    ]
    return "\n".join(lines)


def resolution_lines(comparison, pilot_folder, report):
    """The dry run's word on resolution: from ``pilot_folder``'s comparison, else from this
    one's measured seeds; [] with neither."""
    from caco_tf.comparison import runner
    from caco_tf.config import ConfigError

    arguments = comparison.plan["arguments"]
    pilot = comparison
    if pilot_folder:
        pilot = runner.Comparison(pilot_folder, tolerant=True)
        if pilot.plan is None:
            raise ConfigError(f"--pilot {pilot_folder} holds no comparison: name the --out "
                              f"folder of an earlier caco-compare")
    lines = report.pilot_resolution(pilot, arguments["seeds"], arguments["methods"])
    if not lines:
        return ([f"  no resolution from --pilot {pilot_folder}: it has fewer than two seeds "
                 f"of two methods measured"] if pilot_folder else [])
    return [f"what {arguments['seeds']} seeds can resolve, from the seeds' spreads of "
            f"{pilot.folder}:"] + lines


def duration(seconds):
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{max(1, round(seconds / 60))} min"


def write_report(comparison, report, page=None):
    folder = report.write(comparison)
    print(f"report: {os.path.join(folder, 'report.md')}")
    if page:
        copied = report.publish(comparison, folder, page)
        print(f"published in {page} (the whole report: {copied})")
    return 0


def console():
    """``caco-compare``: ``main()``, then the process ends at once (``cli.exit_after``)."""
    cli.exit_after(main)


if __name__ == "__main__":
    console()
