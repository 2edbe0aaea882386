"""A comparison's report: ``report.md``, the same as a self-contained ``report.html``, and PNG
plots, in ``OUT/report/``.

Every figure is read back from the run folders (``results.json``'s kNN, the linear
evaluations' JSONs, ``history.json``), never from what the runner printed: the report of a
comparison can be rewritten at any time (``caco-compare ... --report-only``).  Per method: the
mean and 95 % t interval over seeds of each protocol; each ranking sentence rests on the paired
difference (same seed = same split and data order) and its 95 % interval
(``caco_tf.evaluation.statistics``), "no difference measured" when it holds 0.
"""

import base64
import collections
import datetime
import html
import math
import os

from caco_tf.comparison import curves, runner
from caco_tf.errors import ConfigError, StateError
from caco_tf.evaluation import statistics
from caco_tf.training import run_folder

# The protocols of the table, in its order: (key, column title, file read, its field).
PROTOCOLS = (("knn_top1", "kNN top-1", "results.json", "knn_top1"),
             ("linear_top1", "linear top-1", runner.LINEAR, "top1"),
             ("few_label_top1", "few-label linear top-1", runner.FEW_LABEL, "top1"))


# The plots of a report with measured seeds: (file, caption).
PLOTS = (("accuracy.png", "Each method on the test split, 95 % intervals over seeds"),
         ("curves.png", "Each method's loss (relative change from its first epoch), embedding "
                        "rank and, where it ran, kNN monitor over the epochs (seed 0)"),
         ("health.png", "Health at the last epoch, each seed a point"))


# ---------------------------------------------------------------------- reading
def measured(comparison, key):
    """{protocol key: figure} of one run, from its run folder (absent: not measured yet); the
    few-label figure is the mean over the label draws once every draw is measured, with each
    draw's and their standard deviation (``runner.few_label_summary``)."""
    run_dir = comparison.run_dir(key)
    advice = f"remove the folder {run_dir} to train and measure that run again"
    figures = {}
    for name, _, file, field in PROTOCOLS:
        if name == "few_label_top1":  # one file per draw, below
            continue
        value = (comparison.read(os.path.join(run_dir, file), advice) or {}).get(field)
        if isinstance(value, (int, float)):
            figures[name] = float(value)
    draws = [(comparison.read(os.path.join(run_dir, runner.few_label_file(split)), advice)
              or {}).get("top1") for split in runner.few_label_splits(comparison)]
    if draws and all(isinstance(value, (int, float)) for value in draws):
        figures.update(runner.few_label_summary(draws))
    return figures


def measured_on(comparison):
    """{machine: number of runs} over the runs with a measurement, from their entries."""
    counts = {}
    for key, *_ in comparison.runs():
        for name in comparison.entry(key).get("machines", []):
            counts[name] = counts.get(name, 0) + 1
    return counts


def seeds_sentence(comparison):
    """Which CPU trained each seed's final runs: a paired test compares two methods' runs of
    one seed, and two CPUs compute in another order (a difference of a seed's size), so a
    seed whose runs ran on more than one is named with its methods on each; "" before any."""
    by_seed = {}  # {seed: {machines: [methods]}}
    for key, method, _, seed, final in comparison.runs():
        entry = comparison.entry(key)
        if final and "knn_top1" in entry:
            machines = " + ".join(entry.get("machines") or ["a machine not recorded"])
            by_seed.setdefault(seed, {}).setdefault(machines, []).append(method)
    if not by_seed:
        return ""
    # A run resumed on another CPU is two CPUs' run too.
    mixed = {seed: found for seed, found in by_seed.items()
             if len(found) > 1 or any(" + " in name for name in found)}
    if not mixed:
        on = {}
        for seed, found in sorted(by_seed.items()):
            on.setdefault(next(iter(found)), []).append(str(seed))
        return ("Each seed's final runs ran on one CPU (" + "; ".join(
            f"seed{'s' * (len(seeds) > 1)} {', '.join(seeds)}: {name}"
            for name, seeds in on.items()) + "), so every paired test compares runs of one CPU.")
    return " ".join(
        f"Seed {seed}'s final runs ran on more than one CPU ("
        + "; ".join(f"{name}: {', '.join(methods)}" for name, methods in found.items())
        + "): a pair across two of them holds the CPUs' difference too (a seeded run repeats "
        "only on one CPU model); to pair them alone, remove the folders of the runs not of one "
        "CPU and run the comparison's command again on it." for seed, found in sorted(mixed.items()))


def history(comparison, key):
    path = run_folder.RunFolder(comparison.run_dir(key)).history
    try:
        return run_folder.read_history(path)
    except ValueError as error:
        message = (f"{path} is damaged ({error}); remove the folder {comparison.run_dir(key)} "
                   f"to train and measure that run again")
        if comparison.damaged is None:
            raise StateError(message) from None
        comparison.damaged[message] = None  # the report says what it left out
        return []


def table_rows(comparison):
    """{method: {"trial", "seeds": {seed: figures}, "health"}} of the final runs."""
    arguments = comparison.plan["arguments"]
    rows = {}
    for method in arguments["methods"]:
        seeds, health = {}, []
        for seed in range(arguments["seeds"]):
            key = comparison.final_key(method, seed)
            figures = measured(comparison, key)
            if figures:
                seeds[seed] = figures
                last = (history(comparison, key) or [{}])[-1]
                entry = comparison.entry(key)
                health.append((last.get("rank_embedding"), last.get("uniformity"),
                               bool(entry.get("collapse_warned"))))
        failed = sum("failed" in comparison.entry(comparison.final_key(method, seed))
                     for seed in range(arguments["seeds"]))
        rows[method] = {"trial": comparison.chosen(method), "seeds": seeds, "health": health,
                        "failed": failed}
    return rows


# ---------------------------------------------------------------------- statistics
# A seed this close to chance (points) has collapsed, whatever the warnings said.
NEAR_CHANCE = 5.0


def bimodal(row, chance=None):
    """Why a method's seeds are collapse-or-not (some collapsed, some not: a t interval over
    them describes neither), or "": collapse warned on some seeds only, or the kNN of some
    seeds within ``NEAR_CHANCE`` points of chance and of others not."""
    warned = [h[2] for h in row["health"]]
    if any(warned) and not all(warned):
        return f"collapse warned on {sum(warned)} of {len(warned)} seeds"
    if chance is not None:
        knn = [f["knn_top1"] for f in row["seeds"].values() if "knn_top1" in f]
        low = sum(v <= chance + NEAR_CHANCE for v in knn)
        if 0 < low < len(knn):
            return f"{low} of {len(knn)} seeds at chance ({chance:.0f} %)"
    return ""


def per_seed_text(row, metric, why):
    values = [f"{row['seeds'][s][metric]:.1f}" for s in sorted(row["seeds"])
              if metric in row["seeds"][s]]
    return f"per seed: {' · '.join(values)} ({why})" if values else "–"


# The family-wise error level of the report's claims: Holm's step-down over each protocol's
# pairs keeps the chance of any false "A above B" among them below it.
ALPHA = 0.05
Pair = collections.namedtuple("Pair", "better worse difference seeds p adjusted apart")


def common_seeds(rows, metric, a, b):
    return [s for s in sorted(set(rows[a]["seeds"]) & set(rows[b]["seeds"]))
            if metric in rows[a]["seeds"][s] and metric in rows[b]["seeds"][s]]


def paired(rows, metric, a, b):
    """The paired comparison of methods ``a`` and ``b`` on ``metric`` over their common seeds
    (an uncorrected interval), or None below two."""
    common = common_seeds(rows, metric, a, b)
    if len(common) < 2:
        return None
    return statistics.paired_comparison([rows[a]["seeds"][s][metric] for s in common],
                                        [rows[b]["seeds"][s][metric] for s in common],
                                        names=(a, b)), len(common)


def pairs(rows, metric, alpha=ALPHA):
    """([``Pair``] of every pair of methods with two common seeds or more, the better mean
    first, its difference's uncorrected 95 % interval, paired t-test p and Holm-adjusted p over
    all of them; told apart when the adjusted p is below ``alpha``), the number of pairs with
    fewer common seeds (nothing measured)."""
    methods = ranking(rows, metric)
    found, unmeasured = [], 0
    for place, a in enumerate(methods):
        for b in methods[place + 1:]:
            common = common_seeds(rows, metric, a, b)
            if len(common) < 2:
                unmeasured += 1
                continue
            first, second = ([rows[m]["seeds"][s][metric] for s in common] for m in (a, b))
            difference = statistics.mean_interval([x - y for x, y in zip(first, second)])
            if difference.mean < 0:  # the better over the seeds both measured first
                a_, b_ = b, a
                difference = statistics.Interval(-difference.mean, -difference.high,
                                                 -difference.low, difference.count)
            else:
                a_, b_ = a, b
            found.append((a_, b_, difference, len(common),
                          statistics.paired_p_value(first, second)))
    adjusted = statistics.holm([p for *_, p in found])
    return [Pair(a, b, d, n, p, q, q < alpha)
            for (a, b, d, n, p), q in zip(found, adjusted)], unmeasured


def ranking(rows, metric):
    """Methods by mean ``metric`` (those measured), best first."""
    means = {m: sum(r["seeds"][s][metric] for s in r["seeds"] if metric in r["seeds"][s])
             / max(1, sum(1 for s in r["seeds"] if metric in r["seeds"][s]))
             for m, r in rows.items()
             if any(metric in figures for figures in r["seeds"].values())}
    return sorted(means, key=lambda m: -means[m])


def pair_text(pair):
    """One pair in words: its difference, uncorrected interval, p and adjusted p."""
    d = pair.difference
    return (f"{d.mean:+.1f} points, uncorrected 95 % interval [{d.low:+.2f}, {d.high:+.2f}], "
            f"p {p_text(pair.p)}, Holm-adjusted p {p_text(pair.adjusted)} ({pair.seeds} "
            f"paired seeds)")


def p_text(p):
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def sentences(rows, metric, title):
    """The ranking on ``metric`` in words: the best mean against each other method, each
    claim told apart only after Holm's correction over the protocol's every pair."""
    order = ranking(rows, metric)
    if len(order) < 2:
        return []
    best = order[0]
    family, _ = pairs(rows, metric)
    by_other = {(p.worse if p.better == best else p.better): p for p in family
                if best in (p.better, p.worse)}
    said, above, tied, unmeasured = [], [], [], []
    for other in order[1:]:
        pair = by_other.get(other)
        if pair is None:
            unmeasured.append(other)
            continue
        if pair.apart:
            (above if pair.better == best else []).append(other)
            words = f"{pair.better} above {pair.worse}"
        else:
            tied.append(other)
            words = f"no difference measured between {best} and {other}"
        said.append(f"{words}: {pair_text(pair)}.")
    summary = (f"On {title}, {best} has the highest mean; after Holm's correction over the "
               f"{len(family)} pairs it is above {', '.join(above)}" if above else
               f"On {title}, {best} has the highest mean, but after Holm's correction over the "
               f"{len(family)} pairs no paired test sets it above any other method")
    if above and tied:
        summary += f", and not distinguishable from {', '.join(tied)}"
    if unmeasured:
        said.append(f"{best} against {', '.join(unmeasured)}: fewer than two common seeds, "
                    f"nothing measured.")
    return [summary + "."] + said


def every_pair(rows, metric):
    """The pairs told apart on ``metric`` after Holm's correction (one sentence each, the better
    first), the number of pairs not told apart, and of pairs with fewer than two common seeds
    (nothing measured)."""
    family, unmeasured = pairs(rows, metric)
    apart = [f"{p.better} above {p.worse}: {pair_text(p)}"
             + (" (the same difference on every seed: an interval of no width)"
                if p.difference.high - p.difference.low < 1e-3 else "")
             for p in sorted(family, key=lambda p: p.adjusted) if p.apart]
    return apart, len(family) - len(apart), unmeasured


def uncorrected_count(rows, metric):
    """How many pairs an uncorrected 95 % interval alone would tell apart (description only)."""
    return sum(p.difference.low > 0 for p in pairs(rows, metric)[0])


def resolution(rows, metric, seeds, differences=(1.0, 2.0, 5.0), family_size=None):
    """What this design can resolve on ``metric``: the median spread over seeds of a paired
    difference (its standard deviation), the smallest difference told apart with 80 % power at
    Holm's strictest step, and the seeds each of ``differences`` would need; "" below two
    seeds.  ``family_size``: the pairs of the design judged (default: those of ``rows``; a
    pilot's rows judge a planned comparison of other methods)."""
    family, _ = pairs(rows, metric)
    spreads = sorted(_spread(rows, metric, p) for p in family)
    if not spreads or seeds < 2:
        return ""
    spread = spreads[len(spreads) // 2]
    count = family_size or len(family)
    smallest = statistics.resolvable_difference(spread, seeds, pairs=count)
    needs = []
    for difference in differences:
        needed = statistics.seeds_to_resolve(difference, spread, pairs=count)
        needs.append(f"{difference:g} point{'s' if difference != 1 else ''}: "
                     + (f"{needed} seeds" if needed else "more than 1,000 seeds"))
    return (f"Resolution: a paired difference over seeds has a median standard deviation of "
            f"{spread:.2f} point here; with {seeds} seeds and {count} pairs (Holm at "
            f"{ALPHA:g}), a true difference is told apart with 80 % power from about "
            f"{smallest:.1f} points; to resolve " + ", ".join(needs) + ".")


def pilot_resolution(pilot, seeds, methods):
    """Lines of what a planned comparison of ``seeds`` seeds and ``methods`` methods can
    resolve, from the seeds' spreads the ``pilot`` comparison measured ([] below two seeds)."""
    rows = table_rows(pilot)
    family = len(methods) * (len(methods) - 1) // 2
    lines = []
    for key, title, _, _ in PROTOCOLS:
        said = resolution(rows, key, seeds, family_size=family)
        if said:
            lines.append(f"  {title}: {said.removeprefix('Resolution: ')}")
    return lines


def _spread(rows, metric, pair):
    common = common_seeds(rows, metric, pair.better, pair.worse)
    values = [rows[pair.better]["seeds"][s][metric] - rows[pair.worse]["seeds"][s][metric]
              for s in common]
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


PAIR_HEADER = ["better mean", "other", "difference (points)", "uncorrected 95 % interval",
               "p", "Holm-adjusted p", "verdict"]


def pair_table(rows, metric):
    """Every pair's row of the report's table: the adjusted p of each claim."""
    family, _ = pairs(rows, metric)
    return [[p.better, p.worse, f"{p.difference.mean:+.1f}",
             f"[{p.difference.low:+.2f}, {p.difference.high:+.2f}]", p_text(p.p),
             p_text(p.adjusted), "told apart" if p.apart else "no difference measured"]
            for p in sorted(family, key=lambda p: (p.adjusted, p.p))]


BASELINE_NAMES = {"pixels": "the raw pixels", "untrained": "the untrained network"}
# The baselines' rows in the report's table.
BASELINE_ROWS = {"pixels": "raw pixels (baseline)", "untrained": "untrained network (baseline)"}


def against_baselines(rows, found, few_label_title=None):
    """What training adds on these images: the baselines' top-1 on each protocol measured
    (``found``: {name: {protocol key: figure}}, ``runner.baseline_figures``; or {name: kNN
    figure}) and, protocol by protocol, the methods whose seeds lie above, or below, the raw
    pixels' figure (one fixed number: the same images, no seed) by a t-test surviving Holm's
    correction over the methods, then the same against the untrained network (a family of its
    own).  ``few_label_title``: the few-label protocol's title (``few_label_title``)."""
    found = {name: figures if isinstance(figures, dict) else {"knn_top1": figures}
             for name, figures in found.items()}
    titles = {key: few_label_title if key == "few_label_top1" and few_label_title else title
              for key, title, _, _ in PROTOCOLS}
    keys = [key for key, *_ in PROTOCOLS if any(key in f for f in found.values())]
    if not keys:
        return ""
    text = ("Without pre-training, on the same test split (" + " · ".join(
        titles[key] for key in keys) + "): " + "; ".join(
        f"{BASELINE_NAMES[name]} " + " · ".join(
            f"{figures[key]:.1f} %" if key in figures else "–" for key in keys)
        for name, figures in found.items()) + ".")
    for key in keys:
        said = []
        for name, pronoun in (("pixels", "them"), ("untrained", "it")):
            if key not in found.get(name, {}):
                continue
            groups, tested = _against(rows, key, found[name][key])
            methods = f"{tested} method{'s' if tested != 1 else ''}"
            test = (f"t-test over seeds, Holm over the {methods} at {ALPHA:g}" if not said
                    else f"the same test, Holm over the {methods}")
            parts = []
            for group, relation in (("above", "above"), ("below", "below"),
                                    ("untold", "not told apart from")):
                if groups[group]:  # the first names the baseline and the test, the others refer
                    whom = (f"{BASELINE_NAMES[name]} ({test})" if not parts else pronoun)
                    parts.append(f"{relation} {whom}: {', '.join(groups[group])}")
            if groups["unmeasured"] and not said:
                parts.append(f"a single seed, nothing measured: {', '.join(groups['unmeasured'])}")
            if parts:
                said.append("; ".join(parts))
        if said:
            text += f" On the {titles[key]}, " + said[0] + "." + "".join(
                f" {more[0].upper()}{more[1:]}." for more in said[1:])
    return text


def _against(rows, key, figure):
    """({"above", "below", "untold", "unmeasured": [methods]}, the number tested) of the
    methods' seeds on ``key`` against one fixed ``figure``: a t-test, Holm over the methods."""
    groups = {"above": [], "below": [], "untold": [], "unmeasured": []}
    tested = []  # (method, its mean, the t-test's p against the baseline's one figure)
    for method in ranking(rows, key):
        values = [f[key] for f in rows[method]["seeds"].values() if key in f]
        if len(values) < 2:
            groups["unmeasured"].append(method)
            continue
        tested.append((method, _mean(values),
                       statistics.paired_p_value(values, [figure] * len(values))))
    for (method, mean, _), adjusted in zip(tested, statistics.holm([p for *_, p in tested])):
        groups["untold" if adjusted >= ALPHA else "above" if mean > figure
               else "below"].append(method)
    return groups, len(tested)


def baseline_rows(comparison, found, width):
    """The baselines as rows of the report's table (``width`` cells): their figure on each
    protocol (the few-label one with its spread over the draws), "not planned" for a probe a
    plan written before it did not measure them by, "–" while not measured."""
    probes = runner.baseline_probes(comparison)
    planned = {"knn_top1": "knn" in probes, "linear_top1": "linear" in probes,
               "few_label_top1": any(p.startswith("few_") for p in probes)}
    seed = comparison.plan["arguments"]["seed"]
    body = []
    for name in runner.BASELINES:
        figures = found.get(name, {})
        if not figures:
            continue
        cells = []
        for key, *_ in PROTOCOLS:
            if key not in figures:
                cells.append("–" if planned.get(key, True) else "not planned")
                continue
            cell = f"{figures[key]:.1f}"
            if key == "few_label_top1" and figures.get("few_label_top1_sd") is not None:
                cell += (f" (sd {figures['few_label_top1_sd']:.1f} over "
                         f"{len(figures['few_label_top1_draws'])} draws)")
            cells.append(cell)
        row = [BASELINE_ROWS[name], "–", "no training" if name == "pixels"
               else f"none (weights seeded {seed})"] + cells
        body.append(row + ["–"] * (width - len(row)))
    return body


def few_label_title(comparison):
    """The few-label protocol's title in the table: with its number of label draws."""
    draws = len(runner.few_label_splits(comparison))
    if not draws:
        return "few-label linear top-1"
    return "few-label linear top-1 (" + ("one label draw" if draws == 1
                                         else f"mean of {draws} label draws") + ")"


def few_label_spread(comparison, rows, found):
    """The few-label draws in words: how many, of which images, and the spread over them of
    each method's figure (the standard deviation of a run's draws, the mean over its seeds) and
    of each baseline's; "" for a plan of one draw."""
    draws = runner.few_label_splits(comparison)
    if len(draws) < 2:
        return ""
    text = (f"Few-label linear top-1: each figure is the mean over {len(draws)} draws of "
            f"{comparison.plan['arguments']['few_labels']} labelled training images per class "
            f"(`splits/{draws[0]}.json` to `{draws[-1]}.json`), the same draws for every "
            f"method, seed and baseline; a method's interval is over its seeds' means.")
    spreads = []
    for method, row in rows.items():
        sds = [f["few_label_top1_sd"] for f in row["seeds"].values()
               if f.get("few_label_top1_sd") is not None]
        if sds:
            spreads.append(f"{method} {_mean(sds):.1f}")
    for name in runner.BASELINES:
        if found.get(name, {}).get("few_label_top1_sd") is not None:
            spreads.append(f"{BASELINE_NAMES[name]} {found[name]['few_label_top1_sd']:.1f}")
    if spreads:
        text += (f" Its spread over the draws (the standard deviation of a run's {len(draws)} "
                 f"figures, the mean over a method's seeds), in points: " + "; ".join(spreads)
                 + ".")
    return text


def few_label_draw_blocks(comparison, rows, found):
    """The report's section of every few-label draw's figure, per run and baseline (none for
    a plan of one draw, or before any is measured)."""
    draws = runner.few_label_splits(comparison)
    if len(draws) < 2:
        return []
    body = []
    for method, row in rows.items():
        for seed in sorted(row["seeds"]):
            figures = row["seeds"][seed]
            if "few_label_top1_draws" in figures:
                body.append([method, str(seed)]
                            + [f"{v:.1f}" for v in figures["few_label_top1_draws"]]
                            + [f"{figures['few_label_top1']:.1f}",
                               f"{figures['few_label_top1_sd']:.2f}"])
    for name in runner.BASELINES:
        figures = found.get(name, {})
        if "few_label_top1_draws" in figures:
            body.append([BASELINE_ROWS[name], "–"]
                        + [f"{v:.1f}" for v in figures["few_label_top1_draws"]]
                        + [f"{figures['few_label_top1']:.1f}",
                           f"{figures['few_label_top1_sd']:.2f}"])
    if not body:
        return []
    return [("h", 2, "The few-label draws"), ("p", (
        f"Each final run's few-label linear top-1 on each draw of "
        f"{comparison.plan['arguments']['few_labels']} labelled images per class "
        f"(`splits/few_labels_<d>.json`, on the test split), their mean (the run's figure "
        f"above) and their standard deviation, in points.")),
        ("table", ["run", "seed"] + [f"draw {d}" for d in range(len(draws))]
         + ["mean", "standard deviation"], body)]


def split_resolution(rows, test_images):
    """What the test split itself can resolve: one standard error of the kNN top-1 figures
    measured on its images (the same images for every method and seed)."""
    means = [_mean(values) for values in (
        [f["knn_top1"] for f in row["seeds"].values() if "knn_top1" in f]
        for row in rows.values()) if values]
    if not means:
        return ""
    errors = sorted(statistics.accuracy_standard_error(m, test_images) for m in means)
    return (f"On {test_images:,} test images, one standard error of an accuracy, "
            f"√(p (1 − p) / n), is {errors[0]:.2f}–{errors[-1]:.2f} point at the methods' kNN "
            f"top-1; every run is measured on the same images, so the intervals over seeds "
            f"hold what changes with the seed (initialization, data order), not the draw of "
            f"the test images.")


# ---------------------------------------------------------------------- the document
def document(comparison, plots):
    """The report as blocks: ("h", level, text), ("p", text), ("table", header, rows),
    ("image", file, caption), ("code", text)."""
    from caco_tf.machine import machine, versions

    plan, arguments = comparison.plan, comparison.plan["arguments"]
    rows = table_rows(comparison)
    images = plan["images"]
    blocks = [("h", 1, "Which method for these images?"), ("p", (
        f"Written on {datetime.date.today()} by caco-tf {plan['caco_tf']} on {machine()}, "
        f"{versions()}, from the comparison in `{shown(comparison.folder)}`, started "
        f"{plan['created']}"
        + (f" at caco-tf commit {plan['commit']}" if plan.get("commit") else "")
        + " with:")), ("code", plan["command"])]
    where = measured_on(comparison)
    if where:
        blocks.append(("p", ("Runs measured on " + "; ".join(
            f"{name} ({count} run{'s' if count > 1 else ''})" for name, count in where.items())
            + " (a seeded run repeats bit for bit on one CPU model only). "
            + seeds_sentence(comparison)).rstrip()))
    blocks += [("p", (
        f"Data `{arguments['data']}`: {images['tune']:,} training and {images['validation']:,} "
        f"validation images for the trials; the chosen settings then train on "
        f"{images['train']:,} images with seeds 0–{arguments['seeds'] - 1} and are measured "
        f"once per seed on {images['test']:,} test images, which choose nothing. Shared budget: "
        + " ".join([f"`--config {arguments['config']}`"]
                   + [f"`{s}`" for s in arguments["settings"]])
        + f" ({plan['epochs']} epochs, batch {plan['batch_size']}). "
        + own_settings_sentence(comparison) + "Each method had "
        f"{arguments['trials']} trial(s) from its search space (below), chosen by validation "
        f"kNN top-1. Figures: mean over seeds [95 % t interval], %."))]
    header = ["method", "chosen trial", "seeds"] + [
        few_label_title(comparison) if key == "few_label_top1" else title
        for key, title, _, _ in PROTOCOLS] + [
        "rank · uniformity · collapse warned"]
    body = []
    classes = runner.class_count(comparison)
    chance = 100.0 / classes if classes else None
    for method, row in rows.items():
        trial = row["trial"]
        chosen = ("–" if trial is None else f"{trial}: `" + ", ".join(
            f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in comparison.trial_point(method, trial).items()) + "`")
        split = bimodal(row, chance)
        cells = [(per_seed_text(row, key, split) if split else
                  statistics.interval_text([f[key] for f in row["seeds"].values() if key in f]))
                 for key, _, _, _ in PROTOCOLS]
        health = row["health"]
        ranks = [h[0] for h in health if h[0] is not None]
        spreads = [h[1] for h in health if h[1] is not None]
        health_cell = (f"{_mean_text(ranks, '.1f')} · {_mean_text(spreads, '.2f')} · "
                       f"{sum(h[2] for h in health)} of {len(health)}") if health else "–"
        seeds = ", ".join(map(str, sorted(row["seeds"]))) or "–"
        if row.get("failed"):
            seeds += f" ({row['failed']} stopped itself)"
        body.append([method, chosen, seeds]
                    + cells + [health_cell])
    if comparison.damaged:  # --report-only on a folder with damaged files: what is missing
        blocks.append(("p", "**Not read** (damaged files; what they hold is left out):"))
        blocks.append(("list", list(comparison.damaged)))
    blocks += [("h", 2, "The methods on the test split")]
    finals = [key for key, *_, final in comparison.runs() if final]
    ended = sum(runner.finished(comparison, key, final=True) for key in finals)
    if ended < len(finals):  # a report of a comparison that goes on says so first
        blocks.append(("p", (
            f"**Not finished**: {ended} of {len(finals)} final runs measured; the same "
            f"command continues the comparison, and the report is rewritten from its run "
            f"folders.")))
    found = runner.baseline_figures(comparison)
    blocks.append(("table", header, body + baseline_rows(comparison, found, len(header))))
    for said in (against_baselines(rows, found, few_label_title(comparison)),
                 few_label_spread(comparison, rows, found),
                 split_resolution(rows, images["test"])):
        if said:
            blocks.append(("p", said))
    for key, title, _, _ in PROTOCOLS:
        said = sentences(rows, key, title)
        if said:
            apart, untold, unmeasured = every_pair(rows, key)
            blocks += [("h", 3, f"What the {title} can say"), ("list", said), ("p", (
                f"Every pair on the {title}: told apart after Holm's correction: "
                f"{len(apart)} of {len(apart) + untold} (an uncorrected 95 % interval alone "
                f"would exclude 0 for {uncorrected_count(rows, key)}: description, not claims)"
                + (f"; {unmeasured} with fewer than two common seeds (nothing measured)"
                   if unmeasured else "") + (":" if apart else "."))),
            ] + ([("list", apart)] if apart else [])
            said = resolution(rows, key, arguments["seeds"])
            if said:
                blocks.append(("p", said))
    blocks += [("p", "A paired test is over the seeds both methods finished (seed s: the "
                     "same split, initialization seed and data order). Every \"A above B\" "
                     "holds after Holm's step-down over the protocol's every pair, so the "
                     f"chance of any false claim among them is at most {ALPHA:g}; with "
                     f"{arguments['seeds']} seeds the tests are weak, and \"no difference "
                     "measured\" is not \"equal\".")]
    for file, caption in plots:
        blocks.append(("image", file, caption))
    blocks += curves.blocks(comparison, rows, {
        title: [pair for pair in pairs(rows, key)[0] if pair.apart]
        for key, title, _, _ in PROTOCOLS})
    blocks += [("h", 2, "Every trial on the validation split")]
    trial_rows = []
    for method in arguments["methods"]:
        close = comparison.close_trials(method)
        for trial in comparison.trials_of(method):
            key = comparison.trial_key(method, trial)
            figures = measured(comparison, key)
            entry = comparison.entry(key)
            figure = (f"{figures['knn_top1']:.1f}" if "knn_top1" in figures
                      else "failed" if "failed" in entry else "–")
            if "spares" in plan and runner.failed_trial(entry):
                figure += " (failed: replaced)" if "knn_top1" not in figures else (
                    " (collapse warned: replaced)")
            second = "–"
            if trial in close:
                again = measured(comparison, comparison.tie_key(method, trial))
                second = f"{again['knn_top1']:.1f}" if "knn_top1" in again else "to run"
            mark = " (chosen)" if rows[method]["trial"] == trial else ""
            spare = " (spare)" if trial >= len(plan["trials"][method]) else ""
            trial_rows.append([method, f"{trial}{spare}{mark}", ", ".join(
                f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                for k, v in comparison.trial_point(method, trial).items()), figure, second])
    blocks += [("p", (
        "A trial that failed (it stopped itself, or its collapse was warned) is replaced by "
        "the grid's next point; when trials lie within one standard error of the best "
        f"(the binomial error on {images['validation']:,} validation images), each is trained "
        "with a second seed and the mean of the two decides." if "spares" in plan else
        "Chosen by the validation kNN alone (a plan made before failed trials were replaced "
        "and close choices settled by a second seed).")),
        ("table", ["method", "trial", "settings", "validation kNN top-1 (%)",
                   "second seed (a close choice)"], trial_rows)]
    blocks += few_label_draw_blocks(comparison, rows, found)
    tables = [(title, pair_table(rows, key)) for key, title, _, _ in PROTOCOLS]
    if any(table for _, table in tables):
        blocks += [("h", 2, "Every pair, with its adjusted p"), ("p", (
            "Each protocol's pairs are one family: the paired t-test's two-sided p over the "
            "common seeds, adjusted by Holm's step-down over the family; a pair is told apart "
            f"when its adjusted p is below {ALPHA:g}. The interval is uncorrected (a "
            "description of the difference, not a claim)."))]
        for title, table in tables:
            if table:
                blocks += [("h", 3, title), ("table", PAIR_HEADER, table)]
    blocks += [("h", 2, "Search spaces"), ("p", (
        "Stated before any result: the encoder's learning rate (the budget's "
        f"{plan['budget_learning_rate']:g} times 1/3, 1 or 3) and the setting each method "
        "declares (`Setting(search=...)`, with the budget's own value); trial 0 is the budget "
        "as given, each next trial the point bringing the most values not yet tried (every "
        "dimension takes as many of its values as the trials allow), ties broken by a "
        "generator seeded with the comparison's seed and the method's name."
        if "spares" in plan else
        "declares (`Setting(search=...)`); trial 0 is the budget as given, the others drawn "
        "without replacement, seeded by the comparison's seed and the method's name.")),
        ("list", [f"{m}: " + "; ".join(f"`{k}` in {', '.join(f'{x:g}' if isinstance(x, float) else str(x) for x in v)}"
                                        for k, v in plan["search_spaces"][m])
                  + (f"; fitted to the data: {', '.join(plan['fitted'][m])}"
                     if plan["fitted"][m] else "")
                  for m in arguments["methods"]])]
    commands = []
    for method in arguments["methods"]:
        for seed in sorted(rows[method]["seeds"]):
            entry = comparison.entry(comparison.final_key(method, seed))
            if "command" in entry:
                commands.append(f"# {method}, seed {seed}\n{entry['command']}")
    if commands:
        blocks += [("h", 2, "The command of every row"), ("code", "\n".join(commands))]
    return blocks


def own_settings_sentence(comparison):
    """Which methods trained on their authors' views instead of the budget's, and each method's
    settings after the budget's (``Comparison.own_settings``), as a sentence; '' without."""
    own = {m: comparison.own_settings(m) for m in comparison.plan["arguments"]["methods"]}
    own = {method: settings for method, settings in own.items() if settings}
    if not own:
        return ""
    views = [m for m, settings in own.items() if any(s.startswith("data.views=") for s in settings)]
    return ((f"Trained on their authors' views, not the budget's: {', '.join(views)}. "
             if views else "") + "Settings of a method's own, after the budget's: "
            + "; ".join(f"{m} " + ", ".join(f"`{s}`" for s in settings)
                        for m, settings in own.items()) + ". ")


def _mean(values):
    return sum(values) / len(values) if values else math.nan


def _mean_text(values, spec):
    """The mean of ``values`` formatted, or – where none was measured (a method of one view
    logs no uniformity)."""
    return format(_mean(values), spec) if values else "–"


# ---------------------------------------------------------------------- rendering
def markdown(blocks):
    lines = []
    for block in blocks:
        kind = block[0]
        if kind == "h":
            lines += ["#" * block[1] + " " + block[2], ""]
        elif kind == "p":
            lines += [block[1], ""]
        elif kind == "code":
            lines += ["```", block[1], "```", ""]
        elif kind == "list":
            lines += [f"- {item}" for item in block[1]] + [""]
        elif kind == "table":
            lines += ["| " + " | ".join(block[1]) + " |",
                      "|" + "---|" * len(block[1])]
            lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in block[2]]
            lines.append("")
        elif kind == "image":
            lines += [f"![{block[2]}]({block[1]})", ""]
    return "\n".join(lines)


def _inline(text):
    """Markdown's code spans as <code>, the rest escaped."""
    parts = html.escape(text).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def page(blocks, folder):
    """One HTML file holding everything, the plots inlined as data URIs."""
    body = []
    for block in blocks:
        kind = block[0]
        if kind == "h":
            body.append(f"<h{block[1]}>{_inline(block[2])}</h{block[1]}>")
        elif kind == "p":
            body.append(f"<p>{_inline(block[1])}</p>")
        elif kind == "code":
            body.append(f"<pre>{html.escape(block[1])}</pre>")
        elif kind == "list":
            body.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in block[1]) + "</ul>")
        elif kind == "table":
            head = "".join(f"<th>{_inline(c)}</th>" for c in block[1])
            rows = "".join("<tr>" + "".join(f"<td>{_inline(str(c))}</td>" for c in row)
                           + "</tr>" for row in block[2])
            body.append(f"<table><tr>{head}</tr>{rows}</table>")
        elif kind == "image":
            with open(os.path.join(folder, block[1]), "rb") as handle:
                data = base64.b64encode(handle.read()).decode("ascii")
            body.append(f'<figure><img alt="{html.escape(block[2])}" '
                        f'src="data:image/png;base64,{data}"><figcaption>'
                        f"{_inline(block[2])}</figcaption></figure>")
    style = ("body{font-family:sans-serif;max-width:70em;margin:2em auto;line-height:1.4}"
             "table{border-collapse:collapse}td,th{border:1px solid #bbb;padding:.2em .5em}"
             "pre{background:#f4f4f4;padding:.5em;overflow-x:auto}img{max-width:100%}")
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>caco-compare report"
            f"</title><style>{style}</style></head><body>{''.join(body)}</body></html>\n")


# ---------------------------------------------------------------------- plots
def plot_accuracy(rows, path):
    """Each protocol's mean and 95 % interval per method."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.5), dpi=110)
    axis = figure.add_subplot()
    methods = list(rows)
    for offset, (key, title, _, _) in zip((-0.2, 0.0, 0.2), PROTOCOLS):
        xs, means, errors = [], [], [[], []]
        for index, method in enumerate(methods):
            values = [f[key] for f in rows[method]["seeds"].values() if key in f]
            if not values:
                continue
            found = statistics.mean_interval(values)
            low = found.mean - found.low if found.count > 1 else 0.0
            xs.append(index + offset)
            means.append(found.mean)
            errors[0].append(low)
            errors[1].append(low)
        if xs:
            axis.errorbar(xs, means, yerr=errors, fmt="o", capsize=3, label=title)
    axis.set_xticks(range(len(methods)), methods, rotation=30, ha="right")
    axis.set_ylabel("test top-1 (%)")
    low, high = axis.get_ylim()  # a t interval of few seeds can pass 0 or 100: accuracies cannot
    axis.set_ylim(max(low, 0.0), min(high, 100.0))
    axis.set_title("Each method on the test split: mean and 95 % interval over seeds")
    axis.legend(fontsize="small")
    axis.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)


def plot_curves(comparison, path):
    """Each method's loss (its relative change from the first epoch: the methods' losses have
    other scales and signs), its embedding's effective rank and, where it ran, its kNN monitor
    over the epochs, seed 0."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    curves = {}
    for method in comparison.plan["arguments"]["methods"]:
        rows = history(comparison, comparison.final_key(method, 0))
        if rows:
            curves[method] = rows
    monitored = any("knn_top1" in row for rows in curves.values() for row in rows)
    panels = [("loss", "loss, relative change from epoch 1"),
              ("rank_embedding", "embedding rank")]
    if monitored:
        panels.append(("knn_top1", "kNN monitor, held-out top-1 (%)"))
    figure = Figure(figsize=(5 * len(panels), 4), dpi=110)
    axes = figure.subplots(1, len(panels))
    palette = colormaps["tab20"].colors  # 12 methods: the dark shades first, then the light
    for place, (method, rows) in enumerate(curves.items()):
        color = palette[(2 * place) % 20 + (2 * place) // 20]
        first_loss = rows[0].get("loss")
        for axis, (field, _) in zip(axes, panels):
            points = [(row["epoch"], row[field]) for row in rows if row.get(field) is not None]
            if field == "loss" and first_loss:
                points = [(epoch, (value - first_loss) / abs(first_loss))
                          for epoch, value in points]
            if points:
                axis.plot(*zip(*points), marker="." if field == "knn_top1" else None,
                          color=color, label=method)
    for axis, (_, title) in zip(axes, panels):
        axis.set(title=f"{title} (seed 0)", xlabel="epoch")
    if curves:
        axes[0].legend(fontsize="x-small", ncol=2)
    figure.tight_layout()
    figure.savefig(path)


def plot_health(rows, path):
    """The last epoch's effective rank and uniformity of each method's runs."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 4), dpi=110)
    rank_axis, uniformity_axis = figure.subplots(1, 2)
    methods = list(rows)
    for index, method in enumerate(methods):
        for rank, uniformity, warned in rows[method]["health"]:
            colour = "tab:red" if warned else "tab:blue"
            if rank is not None:
                rank_axis.plot(index, rank, "o", color=colour)
            if uniformity is not None:
                uniformity_axis.plot(index, uniformity, "o", color=colour)
    for axis, title in ((rank_axis, "effective rank of the embeddings"),
                        (uniformity_axis, "uniformity (lower: more spread)")):
        axis.set_xticks(range(len(methods)), methods, rotation=30, ha="right")
        axis.set_title(title + "; red: collapse warned")
    figure.tight_layout()
    figure.savefig(path)


def plots_for(rows):
    """The plots of a report whose table is ``rows``: none before a seed is measured."""
    return list(PLOTS) if any(row["seeds"] for row in rows.values()) else []


def write(comparison):
    """Write the report into ``OUT/report``; returns that folder."""
    folder = os.path.join(comparison.folder, "report")
    os.makedirs(folder, exist_ok=True)
    rows = table_rows(comparison)
    plots = plots_for(rows)
    if plots:
        plot_accuracy(rows, os.path.join(folder, "accuracy.png"))
        plot_curves(comparison, os.path.join(folder, "curves.png"))
        plot_health(rows, os.path.join(folder, "health.png"))
    found = curves.final_curves(comparison) or curves.trial_curves(comparison)
    if found:
        curves.plot(found, os.path.join(folder, curves.PLOT[0]))
    blocks = document(comparison, plots)
    run_folder.write_text_atomically(os.path.join(folder, "report.md"), markdown(blocks))
    run_folder.write_text_atomically(os.path.join(folder, "report.html"), page(blocks, folder))
    return folder


# ---------------------------------------------------------------------- publishing
BEGIN, END = "<!-- caco-compare:begin -->", "<!-- caco-compare:end -->"


def publish(comparison, report_folder, page_path):
    """Put the report's test-split part (``section``) into the Markdown page ``page_path``
    between ``BEGIN`` and ``END``, each on a line of its own (appended when the page has
    neither), the whole report and its plots copied beside it in ``comparison/``: a page that
    quotes a comparison is rewritten from it, never typed.  Publishing the same report again
    leaves the page as it was, byte for byte.  Returns that folder."""
    import shutil

    try:
        with open(page_path, encoding="utf-8") as handle:
            page_text = handle.read()
    except FileNotFoundError:
        page_text = ""
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"--publish {page_path} cannot be read as a Markdown page "
                          f"({getattr(error, 'strerror', None) or error.reason}): name "
                          f"another page") from None
    before, after = split_page(page_text, page_path)  # refused before anything is written
    folder = os.path.join(os.path.dirname(os.path.abspath(page_path)), "comparison")
    os.makedirs(folder, exist_ok=True)
    for name in sorted(os.listdir(report_folder)):
        if name.endswith((".md", ".png")):
            shutil.copyfile(os.path.join(report_folder, name), os.path.join(folder, name))
    text = section(comparison, plots_for(table_rows(comparison)), page_path)
    if before is None:
        page_text = page_text.rstrip("\n") + ("\n\n" if page_text else "") + text + "\n"
    else:
        page_text = before + text + after
    run_folder.write_text_atomically(page_path, page_text)
    return folder


def split_page(text, page_path):
    """(what comes before the ``BEGIN`` line, what comes after the ``END`` line's marker) of
    a page, or (None, None) when it has neither; markers quoted within a line of prose are
    prose.  A marker without its partner, out of order or twice is one line."""
    lines = text.splitlines(keepends=True)
    found = {marker: [number for number, line in enumerate(lines) if line.strip() == marker]
             for marker in (BEGIN, END)}
    if not found[BEGIN] and not found[END]:
        return None, None
    begins, ends = found[BEGIN], found[END]
    if len(begins) != 1 or len(ends) != 1 or begins[0] > ends[0]:
        raise ConfigError(
            f"--publish {page_path} has {len(begins)} {BEGIN} and {len(ends)} {END} line(s)"
            + (", the end first" if len(begins) == len(ends) == 1 else "")
            + ": it needs one of each, in that order, each on a line of its own (or neither: "
              "the section is appended); mend the page")
    first, last = begins[0], ends[0]
    closing = lines[last]
    return ("".join(lines[:first]),
            closing[closing.index(END) + len(END):] + "".join(lines[last + 1:]))


def section(comparison, plots, page_path):
    """The page's quote of the report, ``BEGIN`` to ``END``: the test-split part (the table,
    what each protocol can say, ``plots`` as [(file, caption)]), one heading level down, then
    what the authors report at ImageNet scale (``paper_table``: a table of its own, never
    beside these images' figures), and the command that wrote it."""

    blocks = document(comparison, plots)
    start = blocks.index(("h", 2, "The methods on the test split"))
    end = blocks.index(("h", 2, "Every trial on the validation split"))
    quoted = []
    for block in blocks[start + 1:end]:  # the page's section is the h2: one level down
        if block[0] == "h":
            block = ("h", block[1] + 1, block[2])
        elif block[0] == "image":
            block = ("image", f"comparison/{block[1]}", block[2])
        quoted.append(block)
    quoted += paper_table(comparison)
    quoted.append(("p", (
        f"Written by `caco-compare --out {shown(comparison.folder)} --report-only --publish "
        f"{shown(page_path)}` from `{comparison.plan['command']}` "
        f"({comparison.plan['created'][:10]}); every trial, the search spaces and the command "
        "of every row: [the whole report](comparison/report.md).")))
    return f"{BEGIN}\n{markdown(quoted).rstrip()}\n{END}"


def shown(path):
    """``path`` as a command typed here would name it: relative below the working directory
    (a page written from a repository's root names its folders the same on every machine)."""
    relative = os.path.relpath(os.path.abspath(path))
    return relative if not relative.startswith("..") else os.path.abspath(path)


PAPER_COLUMN = "what the authors report: ImageNet linear top-1 (%), ResNet-50, their epochs"


def paper_table(comparison):
    """What each compared method's authors report at ImageNet scale (its class's
    ``DOCS_ROW["paper"]``), as blocks: a table of its own, labelled so: other images (1.28
    million), another network and budget; it says nothing of the figures above."""
    from caco_tf.methods import paper_figure

    return [("h", 3, "What the authors report at ImageNet scale"), ("p", (
        "Not a measurement of this comparison, and not comparable with its figures: each "
        "method's linear top-1 on ImageNet as its authors report it, with a ResNet-50 "
        "trained for their epochs at their batch sizes (as each method declares it, "
        "`DOCS_ROW[\"paper\"]` in `caco_tf/methods/`).")),
        ("table", ["method", PAPER_COLUMN],
         [[method, paper_figure(method)] for method in comparison.plan["arguments"]["methods"]])]
