"""The paper's ablation (Table positive_nega) plus MoCo v2 and SimCLR on the offline MNIST split.

    python benchmarks/ablation.py                  # 6 settings × 3 seeds → RESULTS.md
    python benchmarks/ablation.py --epochs 2 --seeds 1 --settings caco,simclr --output /tmp/a.md

Every setting trains with ``train.py`` (one subprocess per run) from the same config
(configs/mnist.yaml unless ``--config``) at the same budget: epochs, batch size, backbone,
views, optimizer and schedules, bank size and τ; only ``method.name`` and the seed
(``train.seed`` = ``data.seed``) change.  Each run is then evaluated on the held-out 1,000 digits:
weighted kNN top-1 (``results.json``, as train.py reports it) and linear top-1
(``python -m caco_tf.cli.evaluate linear``, its defaults: chosen on the validation split).  Nothing
here is tuned; the held-out digits are only ever evaluated on.

Resumable: run folders live in ``WORK/<budget tag>/<setting>-seed<N>`` and every finished run's
figures are cached in ``WORK/<budget tag>/cache.json`` and in the tracked copy
``benchmarks/ablation_cache/<budget tag>.json`` (committed, so a fresh clone skips the runs
another machine finished).  Re-running the same command skips what is cached, continues a killed
training from its last epoch (train.py resumes) and rewrites the report from the cache.
``--report-only`` writes the report from what is cached so far; a partial report says so.
``--tiny``: one tiny run of CaCo, kNN only (a temporary work folder and report, no tracked
cache).
"""

import datetime
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402
from caco_tf import METHODS, ConfigError, load_config  # noqa: E402

REPO = _harness.ROOT
# Most of its work runs in child processes: tests/test_benchmarks.py runs its tiny mode on a
# thread, beside the scripts that work in the test's own process.
RUNS_IN_CHILD_PROCESSES = True


# Table order: the paper's four ablation rows, then the two baselines.
SETTINGS = ("none", "positive", "negative", "caco", "moco_v2", "simclr")
assert set(SETTINGS) <= set(METHODS)
NAMES = {"none": "None", "positive": "Positive (NNCLR-like)", "negative": "Negative (AdCo-like)",
         "caco": "Positive+Negative (CaCo)", "moco_v2": "MoCo v2", "simclr": "SimCLR"}
SOURCES = {  # where a query's positive and negatives come from (caco_tf.methods)
    "none": ("other view's key", "batch keys"),
    "positive": ("nearest neighbour in a FIFO queue", "batch keys"),
    "negative": ("other view's key", "adversarial bank"),
    "caco": ("MPP of the bank", "bank (co-operative-adversarial)"),
    "moco_v2": ("other view's key", "FIFO queue"),
    "simclr": ("other view's query", "batch queries"),
}
# ResNet-50, ImageNet, 200 epochs, linear top-1 (%), from /work/shared/caco-paper.tex.
PAPER = {
    "none": "70.2 (T1)", "positive": "70.7 (T1)", "negative": "70.6 (T1)",
    "caco": "71.3 (T1)",
    "moco_v2": "67.5 (T2); 70.2 symmetric (T3)",
    "simclr": "61.9 (T2); 67.0 batch 8192 (T3)",
}
PAPER_NOTE = (
    "Paper figures: ResNet-50 on ImageNet, 200 epochs, linear top-1. T1 = Table "
    "`positive_nega` (batch 1,024, bank/queue 65,536: the ablation's four rows); T2 = Table "
    "`imagenet200` (single crop, batch 256); T3 = Table `memory_size` (symmetric loss; MoCo v2 "
    "batch 256, SimCLR batch 8,192). The paper has no ablation-protocol runs of MoCo v2 or "
    "SimCLR, so their figures come from those comparison tables.")


def parse_args(argv=None):
    parser = _harness.parser(__doc__, output=False)
    parser.add_argument("--config", default=os.path.join(REPO, "configs", "mnist.yaml"),
                        help="the shared run config (default: configs/mnist.yaml)")
    parser.add_argument("--epochs", type=int, help="pre-training epochs (default: the config's)")
    parser.add_argument("--batch-size", type=int, help="batch size (default: the config's)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    parser.add_argument("--settings", default=",".join(SETTINGS),
                        help=f"comma-separated subset of {','.join(SETTINGS)}")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra config override, applied to every setting alike")
    parser.add_argument("--linear-epochs", type=int, default=100,
                        help="linear classifier epochs (default 100, evaluate's default)")
    parser.add_argument("--no-linear", action="store_true", help="kNN only")
    parser.add_argument("--own-warmup", action="store_true",
                        help="warm-up only for the settings with a bank (the earlier "
                             "protocol); default: the same warm-up pass for every setting")
    parser.add_argument("--work-dir", default=os.path.join(REPO, "runs", "ablation"),
                        help="run folders and the cache (default: runs/ablation)")
    parser.add_argument("--output", default=os.path.join(REPO, "RESULTS.md"),
                        help="the Markdown report (default: RESULTS.md)")
    parser.add_argument("--notes", default=os.path.join(REPO, "benchmarks", "ablation_notes.md"),
                        help="hand-written Markdown appended to the report when the file exists "
                             "(default: benchmarks/ablation_notes.md; what was tried, caveats)")
    parser.add_argument("--report-only", action="store_true",
                        help="write the report from the cache, train nothing")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)
    if args.tiny:
        args.settings, args.seeds, args.epochs, args.no_linear = "caco", 1, 1, True
    args.settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    unknown = [s for s in args.settings if s not in SETTINGS]
    if unknown:
        parser.error(f"unknown settings {', '.join(unknown)} (known: {', '.join(SETTINGS)})")
    if args.seeds < 1 or args.linear_epochs < 1:
        parser.error("--seeds and --linear-epochs must be positive")
    per_run = ("method.name", "train.seed", "data.seed", "train.epochs", "train.batch_size")
    for assignment in args.set:
        if assignment.split("=", 1)[0].strip() in per_run:
            parser.error(f"--set {assignment}: {', '.join(per_run)} are set by this script "
                         f"(use --settings, --seeds, --epochs, --batch-size)")
    return args


# ---------------------------------------------------------------------- the budget
def budget(args):
    """The overrides every setting shares, and a tag naming them (the cache's folder)."""
    config = load_config(args.config, args.set)
    epochs = args.epochs or config["train"]["epochs"]
    batch = args.batch_size or config["train"]["batch_size"]
    shared = list(args.set) + [f"train.epochs={epochs}", f"train.batch_size={batch}",
                               # The kNN monitor logs held-out accuracy during training: off,
                               # it costs time and nothing here reads it.
                               "evaluation.knn_monitor_every=0"]
    caco = config["method"]["caco"]
    warmup = caco["warmup_epochs"]
    if warmup >= epochs:  # only for tiny validation budgets: keep one epoch after the warm-up
        warmup = epochs - 1
        shared.append(f"method.caco.warmup_epochs={warmup}")
    # The ablation rows (none, positive, negative) read CaCo's settings; MoCo v2 and SimCLR get
    # the same: τ, bank size, key momentum, and (unless --own-warmup) the same MoCo-style
    # warm-up pass first, so that all make the same encoder updates from the same starting
    # point and the comparison is of the losses alone.
    momentum = f"{{start: {caco['key_momentum']}, end: 1.0, shape: cosine}}"
    shared += [f"method.moco_v2.temperature={caco['temperature']}",
               f"method.moco_v2.bank_size={caco['bank_size']}",
               f"method.moco_v2.key_momentum={momentum}",
               f"method.simclr.temperature={caco['temperature']}"]
    own = ["moco_v2"] if args.own_warmup else ["moco_v2", "simclr"]
    for method in own:
        shared += [f"method.{method}.warmup_epochs={warmup}"] + [
            f"method.{method}.{key}={caco[key]}" for key in
            ("warmup_min_steps", "warmup_temperature", "resync_after_warmup")]
    if not args.own_warmup:
        shared += [f"method.simclr.warmup_bank_size={caco['bank_size']}",
                   f"method.simclr.warmup_key_momentum={caco['key_momentum']}"]
    resolved = load_config(args.config, shared)  # fails here, once, on a bad override
    with open(args.config, "rb") as handle:
        digest = hashlib.sha1(handle.read() + json.dumps(
            [shared, args.linear_epochs, args.no_linear]).encode()).hexdigest()[:8]
    return shared, resolved, f"e{epochs}-b{batch}-{digest}"


def train_command(args, shared, setting, seed, run_dir):
    overrides = shared + [f"method.name={setting}", f"train.seed={seed}", f"data.seed={seed}"]
    return ([sys.executable, os.path.join(REPO, "train.py"), "--config", args.config,
             "--run-dir", run_dir, "--quiet"]
            + [part for value in overrides for part in ("--set", value)])


def linear_command(args, run_dir):
    return [sys.executable, "-m", "caco_tf.cli.evaluate", "linear", "--run", run_dir,
            "--epochs", str(args.linear_epochs),
            "--json", os.path.join(run_dir, "eval_linear.json")]


def linear_available():
    return os.path.exists(os.path.join(REPO, "caco_tf", "evaluation", "linear.py"))


# ---------------------------------------------------------------------- running
TRACKED_CACHE = os.path.join(REPO, "benchmarks", "ablation_cache")


def cache_paths(work, tag, tracked=True):
    """The work folder's cache and its tracked copy (the one that survives a lost machine)."""
    return [os.path.join(work, "cache.json")] + (
        [os.path.join(TRACKED_CACHE, f"{tag}.json")] if tracked else [])


def load_cache(paths):
    """Every finished run found in any of ``paths`` (entries with more figures win)."""
    cache = {"runs": {}}
    for path in paths:
        if os.path.exists(path):
            with open(path) as handle:
                for key, entry in json.load(handle)["runs"].items():
                    if len(entry) >= len(cache["runs"].get(key, {})):
                        cache["runs"][key] = entry
    return cache


def save_cache(cache, paths):
    for path in paths:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temporary = path + ".tmp"
        with open(temporary, "w") as handle:
            json.dump(cache, handle, indent=1, sort_keys=True)
        os.replace(temporary, path)  # a kill mid-write never leaves a broken cache


def run_logged(command, log_path):
    """Run ``command`` from the repository root, its output into ``log_path``; raise on failure."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    with open(log_path, "a") as log:
        log.write(f"\n$ {' '.join(command)}\n")
        log.flush()
        code = subprocess.call(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    if code != 0:
        raise RuntimeError(f"exit {code}: {' '.join(command)} (log: {log_path})")


def run_one(args, shared, setting, seed, run_dir, entry):
    """Train (or resume) and evaluate one run; fills and returns its cache ``entry``."""
    os.makedirs(run_dir, exist_ok=True)
    log = os.path.join(run_dir, "benchmark.log")
    results_path = os.path.join(run_dir, "results.json")
    if "knn_top1" not in entry:
        if not os.path.exists(results_path):  # results.json is written last: the run finished
            # config.yaml is written when training starts: present now, this attempt resumes.
            entry["resumed"] = os.path.exists(os.path.join(run_dir, "config.yaml"))
            start = time.time()
            run_logged(train_command(args, shared, setting, seed, run_dir), log)
            entry["train_seconds"] = round(time.time() - start, 1)
            entry["machine"] = _harness.machine()
        with open(results_path) as handle:
            entry["knn_top1"] = json.load(handle)["knn_top1"]
    if not args.no_linear and linear_available() and "linear_top1" not in entry:
        start = time.time()
        run_logged(linear_command(args, run_dir), log)
        with open(os.path.join(run_dir, "eval_linear.json")) as handle:
            entry["linear_top1"] = json.load(handle)["top1"]
        entry["linear_seconds"] = round(time.time() - start, 1)
    return entry


def run_all(args, shared, work, tag):
    cache_path = cache_paths(work, tag, tracked=not args.tiny)
    cache = load_cache(cache_path)
    failures = []
    for seed in range(args.seeds):  # seed-major: a partial experiment covers every setting
        for setting in args.settings:
            key = f"{setting}/seed{seed}"
            run_dir = os.path.join(work, f"{setting}-seed{seed}")
            entry = cache["runs"].get(key, {})
            done = "knn_top1" in entry and (
                args.no_linear or not linear_available() or "linear_top1" in entry)
            if done:
                print(f"{key}: cached")
                continue
            if args.dry_run:
                print(" ".join(train_command(args, shared, setting, seed, run_dir)))
                if not args.no_linear:
                    print(" ".join(linear_command(args, run_dir)))
                continue
            print(f"{key}: training in {run_dir} ...", flush=True)
            try:
                entry = run_one(args, shared, setting, seed, run_dir, entry)
            except RuntimeError as error:  # the others still run; a re-run retries this one
                print(f"{key}: failed, {error}", file=sys.stderr, flush=True)
                failures.append(key)
                continue
            cache["runs"][key] = entry
            save_cache(cache, cache_path)
            linear = f", linear {entry['linear_top1']:.1f}%" if "linear_top1" in entry else ""
            print(f"{key}: kNN {entry['knn_top1']:.1f}%{linear} "
                  f"({entry.get('train_seconds', 0):.0f} s training)", flush=True)
    return cache, failures


# ---------------------------------------------------------------------- the report
def summary(values):
    """(mean, sample std, n); std is NaN below two values."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan, 0
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else math.nan
    return mean, std, n


def figures(cache, settings, seeds, metric):
    return {s: [cache["runs"][f"{s}/seed{k}"][metric] for k in range(seeds)
                if metric in cache["runs"].get(f"{s}/seed{k}", {})] for s in settings}


def cell(values, seeds):
    """Mean ± sample std; the number of seeds when fewer than planned have finished."""
    mean, std, n = summary(values)
    if n == 0:
        return "–"
    if n == 1:
        return f"{mean:.1f} (1 seed)"
    return f"{mean:.1f} ± {std:.1f}" + (f" ({n} seeds)" if n < seeds else "")


def compare(caco, other):
    """The verdict for CaCo against one other setting on one metric, as a phrase."""
    (mean_c, std_c, n_c), (mean_o, std_o, n_o) = summary(caco), summary(other)
    if n_c < 2 or n_o < 2:
        return "undecided", "fewer than 2 seeds: no spread to compare with"
    difference, spread = mean_c - mean_o, std_c + std_o
    numbers = f"difference {difference:+.2f} points, spread {spread:.2f}"
    if difference > spread:
        return "beats", numbers
    if -difference > spread:
        return "loses", numbers
    return "within the spread", numbers


def verdict(results, settings):
    lines = []
    metrics = [m for m in results if any(results[m].values())]
    if "caco" not in settings or not any(results[m]["caco"] for m in metrics):
        return ["No Positive+Negative (caco) runs yet: nothing to compare."]
    for metric in metrics:
        name = {"knn_top1": "kNN top-1", "linear_top1": "linear top-1"}[metric]
        outcomes = []
        for other in settings:
            if other == "caco" or not results[metric][other]:
                continue
            outcome, numbers = compare(results[metric]["caco"], results[metric][other])
            outcomes.append(outcome)
            lines.append(f"- {name}, Positive+Negative vs {NAMES[other]}: **{outcome}** "
                         f"({numbers}).")
        if outcomes and all(o == "beats" for o in outcomes):
            lines.append(f"- **{name}: Positive+Negative beats every other setting by more "
                         f"than the spread over seeds, as the paper's claim predicts.**")
        elif outcomes and all(o in ("beats", "undecided") for o in outcomes):
            lines.append(f"- **{name}: undecided**: too few seeds for a spread "
                         f"(run with --seeds 3).")
        elif outcomes:
            beaten = outcomes.count("beats")
            lines.append(f"- **{name}: the paper's claim is not reproduced at this scale**: "
                         f"Positive+Negative beats {beaten} of {len(outcomes)} other settings "
                         f"by more than the spread over seeds.")
    return lines


def partial_note(cache, settings, seeds, command):
    """A line saying which runs are still missing, or nothing when all have finished."""
    planned = [f"{s}/seed{k}" for k in range(seeds) for s in settings]
    missing = [key for key in planned if "knn_top1" not in cache["runs"].get(key, {})]
    if not missing:
        return []
    return [f"**Partial: {len(planned) - len(missing)} of {len(planned)} runs have finished**; "
            f"missing: {', '.join(missing)}. Cells are over the seeds finished; `{command}` "
            f"finishes the rest and rewrites this report.", ""]


def write_report(args, argv, cache, resolved, tag, path):
    settings, seeds = args.settings, args.seeds
    results = {"knn_top1": figures(cache, settings, seeds, "knn_top1"),
               "linear_top1": figures(cache, settings, seeds, "linear_top1")}
    linear_note = ("" if linear_available() and not args.no_linear else
                   " Linear top-1 was not measured (" +
                   ("--no-linear" if args.no_linear else "caco_tf/linear.py is missing") + ").")
    times = [e["train_seconds"] for e in cache["runs"].values()
             if "train_seconds" in e and not e.get("resumed")]
    train, caco = resolved["train"], resolved["method"]["caco"]
    # The command that trains these runs: --report-only only rewrites this file.
    command = _harness.command_line(__file__, [a for a in argv if a != "--report-only"])
    lines = [
        "# Positives, negatives, or both? The paper's ablation on the offline MNIST split",
        "",
        f"Written by `{command}` on {datetime.date.today()}; budget tag `{tag}`.",
        "",
    ] + partial_note(cache, settings, seeds, command) + [
        f"Every setting: `{os.path.relpath(args.config, REPO)}` with "
        f"{train['epochs']} epochs, batch {train['batch_size']}, backbone "
        f"{resolved['model']['backbone']}, views {resolved['data']['views']}, encoder lr "
        f"{train['learning_rate']}, τ {caco['temperature']}, bank/queue {caco['bank_size']} "
        f"rows, bank lr {caco['bank_lr']} (Negative and CaCo only), warm-up epochs "
        f"{caco['warmup_epochs']} (the MoCo-style pass that fills the bank; "
        + ("the same pass for every setting, None and SimCLR too, so that all make the same "
           "encoder updates from the same starting point and differ only in their own loss "
           "over the remaining epochs" if not args.own_warmup else
           "settings without a bank, None and SimCLR, train with their own loss from the "
           "first step") + ")"
        + (f", overrides {', '.join(args.set)}" if args.set else "") + ". "
        f"Seeds 0–{seeds - 1} (train.seed = data.seed). Held-out 1,000 digits against the "
        f"4,000 training digits: weighted kNN top-1 (k={resolved['evaluation']['knn_k']}, "
        f"T={resolved['evaluation']['knn_temperature']}) and linear top-1 (`python -m "
        f"caco_tf.cli.evaluate linear`, {args.linear_epochs} epochs, its default settings)."
        + linear_note + " Mean ± sample standard deviation over seeds.",
        "",
        "| setting | positive | negatives | paper, ImageNet linear top-1 (%) "
        "| kNN top-1 (%) | linear top-1 (%) |",
        "|---|---|---|---|---|---|",
    ]
    for setting in settings:
        positive, negatives = SOURCES[setting]
        lines.append(f"| {NAMES[setting]} | {positive} | {negatives} | {PAPER[setting]} | "
                     f"{cell(results['knn_top1'][setting], seeds)} | "
                     f"{cell(results['linear_top1'][setting], seeds)} |")
    lines += ["", PAPER_NOTE, ""]
    machines = {}
    for entry in cache["runs"].values():
        name = entry.get("machine", "an unrecorded machine")
        machines[name] = machines.get(name, 0) + 1
    lines += ["Measured on " + "; ".join(f"{name} ({count} run{'s' * (count > 1)})"
                                         for name, count in machines.items())
              + ", no GPU. A seeded run repeats bit for bit on one CPU model, not across models.",
              ""]
    if times:
        lines += [f"One training run took {min(times) / 60:.1f}–{max(times) / 60:.1f} minutes "
                  f"here (wall clock, the machine possibly shared).", ""]
    lines += [
        "## Verdict",
        "",
        "Criterion: Positive+Negative *beats* a setting on a metric when its mean exceeds the "
        "setting's mean by more than the sum of the two sample standard deviations over seeds; "
        "it *loses* when the reverse holds; otherwise the difference is *within the spread*. "
        "Nothing was tuned for this comparison, and the held-out 1,000 digits were never used "
        "to choose anything: all settings share the offline default's hyper-parameters, which "
        "were chosen for CaCo on the validation split (a caveat: they may suit CaCo better "
        "than the other settings).",
        "",
    ] + verdict(results, settings) + [
        "",
        "## Per seed",
        "",
        "| setting | seed | kNN top-1 (%) | linear top-1 (%) | training (s) |",
        "|---|---|---|---|---|",
    ]
    for setting in settings:
        for seed in range(seeds):
            entry = cache["runs"].get(f"{setting}/seed{seed}")
            if entry:
                linear = f"{entry['linear_top1']:.1f}" if "linear_top1" in entry else "–"
                lines.append(f"| {NAMES[setting]} | {seed} | {entry['knn_top1']:.1f} | "
                             f"{linear} | {entry.get('train_seconds', '–')} |")
    if args.notes and os.path.exists(args.notes):
        with open(args.notes) as handle:
            lines += ["", handle.read().strip()]
    with open(path, "w") as handle:
        handle.write("\n".join(lines) + "\n")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        if args.tiny:
            args.work_dir, args.output = scratch, os.path.join(scratch, "RESULTS.md")
            args.set = [s for s in _harness.tiny_training(scratch)
                        if not s.startswith("train.epochs=")] + args.set
        return run(args, argv)


def run(args, argv):
    try:
        shared, resolved, tag = budget(args)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    work = os.path.join(args.work_dir, tag)
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "budget.yaml"), "w") as handle:
        yaml.safe_dump({"config": args.config, "overrides": shared,
                        "linear_epochs": args.linear_epochs}, handle, sort_keys=False)
    failures = []
    if args.report_only:
        cache = load_cache(cache_paths(work, tag))
        if cache["runs"]:
            save_cache(cache, cache_paths(work, tag))  # the tracked copy catches up
    else:
        cache, failures = run_all(args, shared, work, tag)
    if args.dry_run:
        return 0
    write_report(args, argv, cache, resolved, tag, args.output)
    print(f"report: {os.path.abspath(args.output)} (cache: {work}/cache.json)")
    if failures:
        print(f"failed (re-run to retry): {', '.join(failures)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
