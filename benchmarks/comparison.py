"""The paper's comparison methods on the offline data, at equal budgets: docs/results.md's table.

    python benchmarks/comparison.py                 # tune on validation, then 3 seeds held out
    python benchmarks/comparison.py --stage tune    # the validation trials only
    python benchmarks/comparison.py --report-only   # the table from what is cached
    python benchmarks/comparison.py --epochs 5      # the short budget: tuned by the 5-epoch screen

Every method trains with ``train.py`` on ``configs/mnist.yaml``'s budget (the same backbone,
projector widths, views, batch 16, 40 epochs, encoder optimizer), only its own section
``method.<name>`` and, where a trial says so, the encoder's learning rate differing.  Its own
settings are chosen on the validation split (``data.source=mnist_validation``, seed 0) among a
fixed list of trials (``TRIALS``: the same number for every method, the first being its
authors' recipe scaled to this data), by validation kNN top-1; the chosen trial then trains with
seeds 0-2 on the 4,000 training digits and is measured once on the held-out 1,000: weighted kNN
top-1 (``results.json``) and linear top-1 (``caco-evaluate linear``).  The held-out digits
choose nothing.  Each run's health is read from its last epoch (effective rank, uniformity)
and its log (whether the collapse warning fired).

``--epochs N`` shortens every run to N epochs (its runs are cached apart, under ``eN/``).  At 5
epochs the tuning stage is the screen below (``SCREEN``: the same budget, validation split, seed
0), measured before the trials were drawn up; CaCo and MoCo v2 run at the same budget with the
offline default's settings as the reference rows.

Resumable, as benchmarks/ablation.py: every finished run is cached in
``WORK/cache.json`` and in the tracked ``benchmarks/comparison_cache.json``; re-running the
same command skips what is cached and continues a killed training (train.py resumes).
Every run's settings are checked first (``load_config``): a renamed key stops the script at
once, not hours into its runs.  ``--tiny``: that check and the page's section from the tracked
cache, into a temporary copy (its runs are ``train.py`` and ``caco-evaluate linear``, as
benchmarks/ablation.py's, whose tiny mode trains one).
"""

import datetime
import json
import math
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402
from ablation import load_cache, run_logged, save_cache, summary  # noqa: E402

REPO = _harness.ROOT
CONFIG = os.path.join(REPO, "configs", "mnist.yaml")
CACHE = os.path.join(REPO, "benchmarks", "comparison_cache.json")
RESULTS = os.path.join(REPO, "docs", "results.md")
TITLE = "## The comparison methods on the offline digits"
# The budget every run shares beyond configs/mnist.yaml: the kNN monitor off (nothing reads it).
SHARED = ["evaluation.knn_monitor_every=0"]

# The trials of each method's own settings on the validation split, three each, drawn up after a
# 5-epoch screen of each method on the validation split (numbers below).  The first is the
# authors' recipe (the method's defaults, caco_tf.methods) with its sizes scaled to 4,000 digits
# (queues and prototypes below the image count, heads at the projector's 512), the others move
# the setting its authors or its known failures say matters most.
TRIALS = {
    "byol": [
        ["method.byol.predictor_hidden=512"],
        ["method.byol.predictor_hidden=512", "method.byol.key_momentum=0.99"],
        ["method.byol.predictor_hidden=512", "train.learning_rate=0.1"],
    ],
    "simsiam": [
        ["method.simsiam.predictor_hidden=128"],
        ["method.simsiam.predictor_hidden=128", "train.learning_rate=0.01"],
        ["method.simsiam.predictor_hidden=512"],
    ],
    "moco_v3": [
        ["method.moco_v3.predictor_hidden=512"],
        ["method.moco_v3.predictor_hidden=512", "method.moco_v3.temperature=0.2"],
        ["method.moco_v3.predictor_hidden=512", "method.moco_v3.temperature=0.5"],
    ],
    "nnclr": [
        ["method.nnclr.predictor_hidden=512", "method.nnclr.queue_size=1024"],
        ["method.nnclr.predictor_hidden=512", "method.nnclr.queue_size=1024",
         "method.nnclr.temperature=0.2"],
        ["method.nnclr.predictor_hidden=512", "method.nnclr.queue_size=2048"],
    ],
    # A queue slowed SwAV here (5 epochs, validation: 93.8 % with 1,024 rows, 95.0 % without).
    "swav": [
        ["method.swav.num_prototypes=30"],
        ["method.swav.num_prototypes=100"],
        ["method.swav.num_prototypes=30", "method.swav.epsilon=0.03"],
    ],
    # BatchNorm in the head (DINO's --use_bn_in_head): 95.7 % against 93.7 % without it (5
    # epochs, validation), where the teacher stayed near uniform.
    "dino": [
        ["method.dino.out_dim=4096", "method.dino.head_batchnorm=true"],
        ["method.dino.out_dim=1024", "method.dino.head_batchnorm=true"],
        ["method.dino.out_dim=4096"],
    ],
    # A batch of 16 caps the cross-correlation's rank at 15: the projection's width is part of
    # Barlow Twins' trials (5 epochs, validation: 93.3 % at 16, 91.5 % at 32, 90.3 % at 128);
    # SGD at 0.03 was unstable (82 %).
    "barlow_twins": [
        ["method.barlow_twins.redundancy_weight=0.0051", "train.learning_rate=0.01"],
        ["model.embedding_dim=16", "method.barlow_twins.redundancy_weight=0.05",
         "train.learning_rate=0.01"],
        ["model.embedding_dim=32", "method.barlow_twins.redundancy_weight=0.02",
         "train.learning_rate=0.01"],
    ],
    "vicreg": [
        [],
        ["train.learning_rate=0.01"],
        ["train.learning_rate=0.1"],
    ],
}
METHODS = tuple(TRIALS)
# The reference rows, nothing to choose: CaCo's offline default, and MoCo v2 with CaCo's bank
# size, temperature and key momentum (as benchmarks/ablation.py's row).
REFERENCES = {"caco": [[]],
              "moco_v2": [["method.moco_v2.bank_size=1024", "method.moco_v2.temperature=0.1",
                           "method.moco_v2.key_momentum=0.99"]]}

# The 5-epoch screen on the validation split (seed 0, `train.py --set train.epochs=5 --set
# data.source=mnist_validation --set evaluation.knn_monitor_every=0` plus each trial's settings;
# 2026-11-26, AMD EPYC 7B13 (Zen 3), 2 cores): validation kNN top-1 (%).  It is the tuning
# stage of the 5-epoch comparison.
SCREEN = {
    "byol": [(["method.byol.predictor_hidden=512"], 94.9)],
    "simsiam": [(["method.simsiam.predictor_hidden=128"], 94.5)],
    "moco_v3": [(["method.moco_v3.predictor_hidden=512", "method.moco_v3.temperature=0.2"],
                 96.3)],
    "nnclr": [(["method.nnclr.predictor_hidden=512", "method.nnclr.queue_size=1024"], 95.7)],
    "swav": [
        (["method.swav.num_prototypes=100", "method.swav.queue_size=256",
          "method.swav.queue_start_epoch=1"], 91.8),
        (["method.swav.num_prototypes=30", "method.swav.queue_size=1024",
          "method.swav.queue_start_epoch=1"], 93.8),
        (["method.swav.num_prototypes=100", "method.swav.epsilon=0.03",
          "method.swav.queue_size=1024", "method.swav.queue_start_epoch=1"], 94.1),
        (["method.swav.num_prototypes=30"], 95.0),
    ],
    "dino": [
        (["method.dino.out_dim=4096"], 93.7),
        (["method.dino.out_dim=1024", "method.dino.key_momentum=0.999"], 93.1),
        (["method.dino.out_dim=4096", "method.dino.head_batchnorm=true"], 95.7),
    ],
    "barlow_twins": [
        (["method.barlow_twins.redundancy_weight=0.05"], 82.0),
        (["method.barlow_twins.redundancy_weight=0.0051", "train.learning_rate=0.01"], 90.3),
        (["method.barlow_twins.redundancy_weight=0.05", "train.learning_rate=0.003"], 81.9),
        (["model.embedding_dim=16", "method.barlow_twins.redundancy_weight=0.05",
          "train.learning_rate=0.01"], 93.3),
        (["model.embedding_dim=32", "method.barlow_twins.redundancy_weight=0.02",
          "train.learning_rate=0.01"], 91.5),
    ],
    "vicreg": [([], 95.4)],
}
DEFAULT_EPOCHS = 40  # configs/mnist.yaml's


def trials(method, epochs):
    """The lists of settings tried for ``method`` at this budget."""
    if method in REFERENCES:
        return REFERENCES[method]
    if epochs == 5:
        return [overrides for overrides, _ in SCREEN[method]]
    return TRIALS[method]


def prefix(epochs):
    return "" if epochs == DEFAULT_EPOCHS else f"e{epochs}/"


def screen_into(cache):
    """The 5-epoch screen's figures as the 5-epoch tuning stage's entries."""
    for method, screened in SCREEN.items():
        for trial, (_, figure) in enumerate(screened):
            cache["runs"].setdefault(f"e5/tune/{method}/{trial}",
                                     {"knn_top1": figure, "source": "the 5-epoch screen"})


def parse_args(argv=None):
    parser = _harness.parser(__doc__, output=False)
    parser.add_argument("--stage", choices=("tune", "held-out", "all"), default="all")
    parser.add_argument("--methods", default=",".join(METHODS + tuple(REFERENCES)),
                        help=f"comma-separated subset of {','.join(METHODS + tuple(REFERENCES))}")
    parser.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS,
                        help="every run's epochs (5: tuned by the 5-epoch screen)")
    parser.add_argument("--work-dir", default=os.path.join(REPO, "runs", "comparison"))
    parser.add_argument("--output", help="the page whose comparison section this rewrites "
                        "(default: docs/results.md)")
    parser.add_argument("--seeds", type=int, default=3, help="held-out seeds 0..N-1")
    parser.add_argument("--set", action="append", default=[], help="passed to every train.py")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    per_run = ("method.name", "train.seed", "data.seed", "train.epochs", "data.source")
    for assignment in args.set:
        if assignment.split("=", 1)[0].strip() in per_run:
            parser.error(f"--set {assignment}: {', '.join(per_run)} are set by this script")
    if args.tiny:
        args.report_only = True
    args.methods = [m for m in args.methods.split(",") if m]
    unknown = set(args.methods) - set(METHODS) - set(REFERENCES)
    if unknown:
        parser.error(f"unknown methods {', '.join(sorted(unknown))}")
    return args


def run_settings(args, method, overrides, seed, data_source):
    """The ``--set`` assignments of one run."""
    return SHARED + [f"train.epochs={args.epochs}", f"method.name={method}",
                     f"data.source={data_source}", f"train.seed={seed}",
                     f"data.seed={seed}"] + overrides + args.set


def check_settings(args):
    """Every run's configuration loads (a key renamed since raises ``ConfigError`` here)."""
    from caco_tf import load_config

    for method in args.methods:
        for overrides in trials(method, args.epochs):
            load_config(CONFIG, run_settings(args, method, overrides, 0, "mnist"))


def train_command(settings, run_dir):
    return ([sys.executable, os.path.join(REPO, "train.py"), "--config", CONFIG,
             "--run-dir", run_dir, "--quiet"] + [p for s in settings for p in ("--set", s)])


def run(cache, key, command, run_dir, linear=False):
    """Train (or resume) one run and read its figures into ``cache['runs'][key]``."""
    entry = cache["runs"].setdefault(key, {})
    os.makedirs(run_dir, exist_ok=True)
    log = os.path.join(run_dir, "benchmark.log")
    if "knn_top1" not in entry:
        start = time.time()
        run_logged(command, log)
        entry["train_seconds"] = round(time.time() - start, 1)
        entry["machine"] = _harness.machine()
        with open(os.path.join(run_dir, "results.json")) as handle:
            entry["knn_top1"] = json.load(handle)["knn_top1"]
        with open(os.path.join(run_dir, "history.json")) as handle:
            last = json.load(handle)[-1]
        entry["rank_embedding"] = last.get("rank_embedding")
        entry["uniformity"] = last.get("uniformity")
        with open(log) as handle:
            entry["collapse_warning"] = bool(re.search(r"warning: collapse", handle.read()))
    if linear and "linear_top1" not in entry:
        run_logged([sys.executable, "-m", "caco_tf.cli.evaluate", "linear", "--run", run_dir,
                    "--json", os.path.join(run_dir, "eval_linear.json")], log)
        with open(os.path.join(run_dir, "eval_linear.json")) as handle:
            entry["linear_top1"] = json.load(handle)["top1"]
    return entry


def chosen_trial(cache, method, epochs):
    """The trial with the best validation kNN (the first on a tie; a failed run loses), or
    None before all ran; the only one when there is nothing to choose."""
    if len(trials(method, epochs)) == 1:
        return 0
    entries = [cache["runs"].get(f"{prefix(epochs)}tune/{method}/{trial}", {})
               for trial in range(len(trials(method, epochs)))]
    if any("knn_top1" not in entry and "failed" not in entry for entry in entries):
        return None
    scores = [entry.get("knn_top1", -math.inf) for entry in entries]
    return max(range(len(scores)), key=lambda trial: (scores[trial], -trial))


def run_all(args, cache, paths):
    work, epochs = args.work_dir, args.epochs

    def command(method, trial, seed, data_source, run_dir):
        return train_command(run_settings(args, method, trials(method, epochs)[trial], seed,
                                          data_source), run_dir)

    if args.stage in ("tune", "all"):
        for trial in range(3):  # trial-major: a partial tuning covers every method
            for method in args.methods:
                if trial >= len(trials(method, epochs)) or len(trials(method, epochs)) == 1:
                    continue
                key = f"{prefix(epochs)}tune/{method}/{trial}"
                if {"knn_top1", "failed"} & set(cache["runs"].get(key, {})):
                    continue
                print(f"{key}: training ...", flush=True)
                try:
                    run(cache, key, command(method, trial, 0, "mnist_validation",
                                            os.path.join(work, key)), os.path.join(work, key))
                    print(f"{key}: validation kNN {cache['runs'][key]['knn_top1']:.1f}%",
                          flush=True)
                except RuntimeError as error:  # a trial that fails (a NaN loss) loses
                    cache["runs"][key]["failed"] = str(error)
                    print(f"{key}: failed, {error}", flush=True)
                save_cache(cache, paths)
    if args.stage in ("held-out", "all"):
        for seed in range(args.seeds):
            for method in args.methods:
                trial = chosen_trial(cache, method, epochs)
                if trial is None:
                    print(f"{method}: its trials have not all run: no held-out runs yet")
                    continue
                key = f"{prefix(epochs)}held-out/{method}/seed{seed}"
                entry = cache["runs"].get(key, {})
                if "knn_top1" in entry and "linear_top1" in entry:
                    continue
                print(f"{key}: training (trial {trial}) ...", flush=True)
                entry = run(cache, key, command(method, trial, seed, "mnist",
                                                os.path.join(work, key)),
                            os.path.join(work, key), linear=True)
                entry["trial"] = trial
                save_cache(cache, paths)
                print(f"{key}: kNN {entry['knn_top1']:.1f}%, linear "
                      f"{entry['linear_top1']:.1f}%", flush=True)


# ---------------------------------------------------------------------- the report
def cell(values, digits=1):
    mean, std, n = summary([v for v in values if v is not None])
    if n == 0:
        return "–"
    return f"{mean:.{digits}f}" if n == 1 else f"{mean:.{digits}f} ± {std:.{digits}f}"


def marker(epochs):
    return "comparison" if epochs == DEFAULT_EPOCHS else f"comparison-e{epochs}"


def paired_lines(args, runs, at):
    """Which pairs of methods a paired interval over the seeds tells apart (seed s: the same
    data order for every method), per metric (caco_tf.comparison.report.every_pair)."""
    from caco_tf.comparison import report as comparison_report

    lines = []
    for metric, title in (("knn_top1", "kNN top-1"), ("linear_top1", "linear top-1")):
        rows = {m: {"seeds": {s: {metric: runs[f"{at}held-out/{m}/seed{s}"][metric]}
                              for s in range(args.seeds)
                              if metric in runs.get(f"{at}held-out/{m}/seed{s}", {})}}
                for m in args.methods}
        apart, untold, unmeasured = comparison_report.every_pair(rows, metric)
        lines += ["", f"Paired over the seeds, held-out {title}: {len(apart)} of "
                      f"{len(apart) + untold + unmeasured} pairs told apart by a 95 % t interval of the "
                      f"seed-by-seed difference{' (below)' if apart else ''}; every other pair: "
                      f"no difference measured.", ""]
        lines += [f"- {sentence}" for sentence in apart]
    return lines


def report(args, cache):
    from caco_tf.methods import paper_figure

    runs, epochs, at = cache["runs"], args.epochs, prefix(args.epochs)
    command = "python benchmarks/comparison.py" + (
        "" if epochs == DEFAULT_EPOCHS else f" --epochs {epochs}")
    machines = sorted({e.get("machine", "?") for k, e in runs.items()
                       if k.startswith(at + "held-out/") and "machine" in e})
    steps = epochs * 250
    tuned = (f"its own settings chosen on the validation split among the trials below (seed 0, "
             f"validation kNN top-1{', the 5-epoch screen' if epochs == 5 else ''})")
    lines = [
        f"Written by `{command}` on {datetime.date.today()}, measured on "
        f"{'; '.join(machines) or '(nothing yet)'}, no GPU; a seeded run repeats bit "
        "for bit on one CPU model only.  Every method: `configs/mnist.yaml`'s budget (small "
        "ConvNet with 2×2 grid pooling, projector 512 → 128, digit views, batch 16, SGD, "
        f"learning rate 0.03 unless its trial says otherwise) for {epochs} epochs = "
        f"{steps:,} steps, {tuned}, then seeds 0–{args.seeds - 1} on the 4,000 training "
        "digits, measured "
        "once on the held-out 1,000: weighted kNN top-1 (k=5, T=0.07) and linear top-1 "
        "(`caco-evaluate linear`, its defaults).  CaCo runs the offline default, MoCo v2 with "
        "CaCo's bank size, temperature and key momentum (nothing chosen for either).  Mean ± "
        "sample standard deviation over the seeds; one standard error on 1,000 images is "
        "about 0.5 point; a ranking needs the paired intervals below the table.",
        "",
        "| method | chosen settings (validation) | seeds | held-out kNN top-1 (%) | held-out "
        "linear top-1 (%) | health: rank · uniformity · collapse warned | paper, ImageNet "
        "ResNet-50 linear top-1 (%) |",
        "|---|---|---|---|---|---|---|",
    ]
    for method in args.methods:
        trial = chosen_trial(cache, method, epochs)
        seeds = [runs.get(f"{at}held-out/{method}/seed{s}", {}) for s in range(args.seeds)]
        settings = (", ".join(trials(method, epochs)[trial]) if trial is not None
                    else "(tuning)")
        warned = sum(bool(e.get("collapse_warning")) for e in seeds if e)
        health = (f"{cell([e.get('rank_embedding') for e in seeds])} · "
                  f"{cell([e.get('uniformity') for e in seeds], 2)} · "
                  f"{warned} of {sum(1 for e in seeds if e)}")
        done = [str(s) for s, e in enumerate(seeds) if "knn_top1" in e]
        chosen = f"`{settings}`" if settings else "its defaults"
        lines.append(f"| {method} | {chosen} | {', '.join(done) or '–'} | "
                     f"{cell([e.get('knn_top1') for e in seeds])} | "
                     f"{cell([e.get('linear_top1') for e in seeds])} | {health} | "
                     f"{paper_figure(method)} |")
    lines += paired_lines(args, runs, at)
    lines += ["", "The trials on the validation split (seed 0, kNN top-1 %):", ""]
    for method in args.methods:
        if method in REFERENCES:
            continue
        row = []
        for trial, overrides in enumerate(trials(method, epochs)):
            entry = runs.get(f"{at}tune/{method}/{trial}", {})
            shown = ", ".join(o.split(".", 2)[-1] if o.startswith("method.") else o
                              for o in overrides) or "defaults"
            figure = (f"{entry['knn_top1']:.1f}" if "knn_top1" in entry else
                      "failed" if "failed" in entry else "–")
            row.append(f"{figure} (`{shown}`)")
        lines.append(f"- {method}: " + "; ".join(row))
    return lines


def main(argv=None):
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        if args.tiny:  # the tracked cache is read, never written
            args.work_dir = scratch
        paths = [os.path.join(args.work_dir, "cache.json"), CACHE]
        check_settings(args)
        os.makedirs(args.work_dir, exist_ok=True)
        cache = load_cache(paths)
        if args.epochs == 5:
            screen_into(cache)
        if not args.report_only:
            run_all(args, cache, paths)
    _harness.publish(args, marker(args.epochs), TITLE, report(args, cache), default=RESULTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
