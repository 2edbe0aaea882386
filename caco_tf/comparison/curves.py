"""Each run's learning curve, and what it says of the budget.

Every run of a comparison measures, every ``curve_every`` epochs, the kNN top-1 of a fixed
sample of the validation split against a fixed sample of the tune split (``Comparison.
curve_settings``: never the test split), with the compute spent so far (``callbacks.
Throughput``: steps, images seen, the steps' seconds).  From the final runs' curves:

- ``still_rising``: a method whose curve still climbs over the last quarter of its budget by
  more than its seeds' spread is **under-trained at this budget**: more compute may change its
  rank;
- ``at_equal_seconds``: every method's curve read at the same training time (the shortest of
  run's time on the CPU that trained it: a second of one CPU is not a second of another), a
  ranking at equal compute beside the one at equal epochs.
"""

import math

import numpy as np

from caco_tf.evaluation import statistics
from caco_tf.training import run_folder

CURVE = "knn_top1"  # the monitor's field in history.json


def curve(history):
    """{"epoch", "steps", "images_seen", "seconds", "top1"} (arrays, the epochs the monitor
    measured) of one run's ``history`` (its history.json rows), and "monitor_seconds", the
    monitor's total; None without a curve.  "seconds" are the training steps' cumulated, over
    every epoch (the monitor's own time is not in them)."""
    seconds, points = 0.0, []
    monitor = 0.0
    for row in history:
        seconds += row.get("train_seconds", 0.0)
        monitor += row.get(f"{CURVE}_seconds", 0.0)
        if CURVE in row:
            points.append((row["epoch"], row.get("steps", math.nan),
                           row.get("images_seen", math.nan), seconds, row[CURVE]))
    if not points:
        return None
    columns = np.asarray(points, dtype=float).T
    result = dict(zip(("epoch", "steps", "images_seen", "seconds", "top1"), columns))
    result["monitor_seconds"], result["train_seconds"] = monitor, seconds
    return result


def read_curve(comparison, key):
    """The curve of run ``key`` (``curve``) with the "machines" that trained it (a tuple: more
    than one for a run resumed on another; empty when not recorded), or None."""
    path = run_folder.RunFolder(comparison.run_dir(key)).history
    try:
        measured = curve(run_folder.read_history(path))
    except ValueError:
        return None  # the report names a damaged history where it reads the table
    if measured is not None:
        measured["machines"] = tuple(comparison.entry(key).get("machines") or ())
    return measured


def final_curves(comparison):
    """{method: {seed: curve}} of the final runs that have one and finished: a run that
    stopped itself (a NaN loss) is out of the test table, so out of the curves too (its short
    time would otherwise set every run's "equal seconds")."""
    return _curves_of(comparison, lambda method: {
        seed: key for seed in range(comparison.plan["arguments"]["seeds"])
        if "failed" not in comparison.entry(key := comparison.final_key(method, seed))})


def trial_curves(comparison):
    """{method: {trial: curve}} of the trials that have one (a pilot's: ``--trials-only``)."""
    return _curves_of(comparison, lambda method: {
        trial: comparison.trial_key(method, trial) for trial in comparison.trials_of(method)})


def _curves_of(comparison, keys_of):
    """{method: {name: curve}} of the runs ``keys_of(method)`` ({name: run key}) that have one."""
    found = {}
    for method in comparison.plan["arguments"]["methods"]:
        runs = {name: read_curve(comparison, key) for name, key in keys_of(method).items()}
        runs = {name: measured for name, measured in runs.items() if measured is not None}
        if runs:
            found[method] = runs
    return found


def flattening_epoch(measured, within=1.0):
    """The first epoch from which the curve stays within ``within`` points of its end."""
    end = float(measured["top1"][-1])
    epochs = measured["epoch"]
    for place in range(len(epochs)):
        if all(abs(float(v) - end) <= within for v in measured["top1"][place:]):
            return int(epochs[place])
    return int(epochs[-1])


def value_at(measured, axis, where):
    """The curve's top-1 at ``where`` on ``axis`` ("epoch", "images_seen", "seconds"),
    linearly interpolated; None outside what it measured."""
    xs, ys = measured[axis], measured["top1"]
    if len(xs) == 0 or where < xs[0] - 1e-9 or where > xs[-1] + 1e-9:
        return None
    return float(np.interp(where, xs, ys))


def last_quarter_gain(measured):
    """The top-1 gained over the last quarter of the run's epochs (None when the curve has no
    point at three quarters or before)."""
    end = measured["epoch"][-1]
    start = value_at(measured, "epoch", 0.75 * end)
    if start is None:
        return None
    return float(measured["top1"][-1]) - start


def still_rising(seed_curves):
    """(gain, noise, rising) of one method's curves over its seeds: the mean last-quarter gain,
    the seeds' spread of the final top-1 (their standard deviation; with one seed, none) and
    whether the gain exceeds it.  None when no curve reaches back a quarter."""
    gains = [g for g in (last_quarter_gain(c) for c in seed_curves.values()) if g is not None]
    if not gains:
        return None
    finals = [float(c["top1"][-1]) for c in seed_curves.values()]
    noise = float(np.std(finals, ddof=1)) if len(finals) > 1 else 0.0
    gain = float(np.mean(gains))
    return gain, noise, gain > noise and gain > 0


def at_equal_seconds(curves):
    """({machine: seconds}, {method: [top-1 per seed]}): every run's curve read at the same
    training time as every other run of its machine ("" when not recorded): the shortest run's
    there, which every run reached (a run slowed by other work on a shared machine ends later,
    and a time past a seed's end would leave that seed out).  Only machines that trained every
    method count (a method's runs elsewhere would be read against no other method), and no run
    resumed on another machine (its seconds are two CPUs')."""
    ends = {}  # {machine: {method: [end seconds]}}
    for method, seeds in curves.items():
        for measured in seeds.values():
            if machine_of(measured) is not None:
                ends.setdefault(machine_of(measured), {}).setdefault(method, []).append(
                    measured["seconds"][-1])
    seconds = {machine: float(min(min(s) for s in by_method.values()))
               for machine, by_method in ends.items() if len(by_method) == len(curves)}
    read = {}
    for method, seeds in curves.items():
        values = [value_at(c, "seconds", seconds[machine_of(c)]) for c in seeds.values()
                  if machine_of(c) in seconds]
        read[method] = [v for v in values if v is not None]
    return seconds, read


def monitor_share(curves):
    """The monitor's seconds over the training steps' seconds, over every curve."""
    monitor = sum(c["monitor_seconds"] for seeds in curves.values() for c in seeds.values())
    train = sum(c["train_seconds"] for seeds in curves.values() for c in seeds.values())
    return monitor / train if train else None


def plot(curves, path):
    """Every method's curve against images seen and against seconds: the mean over seeds, a
    band from the lowest to the highest seed (points where every seed measured)."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4.2), dpi=110)
    axes = figure.subplots(1, 2)
    palette = colormaps["tab20"].colors  # 12 methods: the dark shades first, then the light
    for place, (method, seeds) in enumerate(curves.items()):
        color = palette[(2 * place) % 20 + (2 * place) // 20]
        for axis, field in zip(axes, ("images_seen", "seconds")):
            length = min(len(c["top1"]) for c in seeds.values())
            xs = np.mean([c[field][:length] for c in seeds.values()], axis=0)
            ys = np.asarray([c["top1"][:length] for c in seeds.values()])
            axis.plot(xs, ys.mean(axis=0), color=color, label=method, marker=".")
            if len(ys) > 1:
                axis.fill_between(xs, ys.min(axis=0), ys.max(axis=0), color=color, alpha=0.15)
    axes[0].set(xlabel="images seen", ylabel="validation kNN top-1 (%)",
                title="learning curves: mean over seeds, band = lowest to highest seed")
    axes[1].set(xlabel="training seconds (the steps', mean over the seeds' machines)",
                ylabel="validation kNN top-1 (%)", title="against training time")
    if curves:
        axes[0].legend(fontsize="x-small", ncol=2)
    figure.tight_layout()
    figure.savefig(path)


PLOT = ("learning_curves.png", "Each method's validation kNN top-1 during training, against "
                               "images seen and against the training steps' seconds")


def blocks(comparison, rows, told_apart):
    """The report's learning-curve section (``report.document``'s blocks), or [] without
    curves.  ``rows``: the report's table rows; ``told_apart``: {protocol title: [``Pair``]
    told apart after correction}, to name the verdicts an under-trained method is in."""
    curves = final_curves(comparison)
    if not curves:
        return pilot_blocks(comparison)
    arguments = comparison.plan["arguments"]
    memory, queries = arguments["curve_images"]
    share = monitor_share(curves)
    said = [("h", 2, "Learning curves"), ("p", (
        f"Every run measured its kNN top-1 every {arguments['curve_every']} epoch(s) on a fixed "
        f"class-balanced sample of {queries:,} validation images against {memory:,} of the "
        f"tune split (k {comparison.plan['knn_k']}, the test split is never read during "
        f"training)" + (f"; the curves cost {100 * share:.1f} % of the training steps' time"
                        if share is not None else "") + "."))]
    flagged = []
    for method, seeds in curves.items():
        found = still_rising(seeds)
        if found and found[2]:
            gain, noise, _ = found
            verdicts = [f"{p.better} above {p.worse} ({title})"
                        for title, apart in told_apart.items() for p in apart
                        if method in (p.better, p.worse)]
            flagged.append(f"**{method}: under-trained at this budget, its rank may change**: "
                           f"+{gain:.1f} points over the last quarter of its epochs, its seeds' "
                           f"spread {noise:.1f}" + (
                               f"; in the verdicts {', '.join(verdicts)}" if verdicts
                               else "; in no verdict told apart"))
    said.append(("p", (f"{len(flagged)} of {len(curves)} methods still rising at the end "
                       "(the last quarter's gain above the seeds' spread of the final figure)"
                       + (":" if flagged else "."))))
    if flagged:
        said.append(("list", flagged))
    seconds, read = at_equal_seconds(curves)
    column = (f"at {next(iter(seconds.values())):.0f} s" if len(seconds) == 1
              else "at equal seconds")
    by_epochs = sorted(curves, key=lambda m: -np.mean([c["top1"][-1] for c in curves[m].values()]))
    by_seconds = sorted(read, key=lambda m: -np.mean(read[m]) if read[m] else math.inf)
    table = []
    for method in by_epochs:
        seeds = curves[method]
        flops = [comparison.entry(comparison.final_key(method, seed)).get("step_flops")
                 for seed in seeds]
        total = [f * c["steps"][-1] for f, c in zip(flops, seeds.values()) if f]
        table.append([method, f"{np.mean([c['seconds'][-1] for c in seeds.values()]):.0f}",
                      f"{np.mean([c['images_seen'][-1] for c in seeds.values()]):,.0f}",
                      f"{np.mean(total) / 1e12:.1f}" if total else "–",
                      statistics.interval_text([float(c["top1"][-1]) for c in seeds.values()]),
                      str(by_epochs.index(method) + 1), statistics.interval_text(read.get(method, [])),
                      str(by_seconds.index(method) + 1) if read.get(method) else "–"])
    slowed = slowed_runs(curves)
    said += [("p", "At equal compute: " + equal_seconds_words(seconds, curves) + ", beside "
              "the end of the equal-epoch budget. Validation figures from the curves' samples: "
              "a description of the budget, not a claim." + (
                  f" Slowed by other work (a run over {SLOWED} times its method's median "
                  "training time on its CPU; read at equal seconds, it is behind its method): "
                  + ", ".join(slowed) + "." if slowed else "")),
             ("table", ["method", "training seconds", "images seen",
                        "counted TFLOPs (steps × a step's)", "validation kNN at the end",
                        "rank at equal epochs", column, "rank at equal seconds"],
              table), ("image",) + PLOT]
    return said


# A run this many times slower than its method's median on its CPU shared the machine.
SLOWED = 1.3


def slowed_runs(curves):
    """["method seed S (its seconds against the median)"] of the runs whose training took more
    than ``SLOWED`` times the median of their method's runs on their CPU: other work on a
    shared machine slowed them, so at equal seconds they read lower than the method would."""
    found = []
    for method, seeds in curves.items():
        by_machine = {}
        for seed, measured in seeds.items():
            by_machine.setdefault(measured.get("machines", ()), []).append(
                (seed, float(measured["seconds"][-1])))
        for runs in by_machine.values():
            median = float(np.median([s for _, s in runs]))
            found += [f"{method} seed {seed} ({s:.0f} s against {median:.0f} s)"
                      for seed, s in runs if len(runs) > 1 and s > SLOWED * median]
    return found


def equal_seconds_words(seconds, curves):
    """How ``at_equal_seconds`` read the curves, with each machine's time."""
    if not seconds:
        return "no machine trained every method, so no curve is read at equal seconds"
    if len(seconds) == 1 and set(seconds) == {""}:
        return (f"each curve read at {seconds['']:.0f} training seconds (the shortest run's, "
                "which every run reached)")
    left = {" + ".join(c.get("machines", ())) for seeds in curves.values()
            for c in seeds.values()} - set(seconds)
    return ("each run's curve read at the training seconds of the shortest run on the CPU "
            "that trained it, which every run there reached (a second of one CPU is not one of "
            "another): " + "; ".join(
                f"{s:.0f} s on {machine or 'an unnamed machine'}"
                for machine, s in seconds.items())
            + (f" (runs on {', '.join(sorted(m or 'an unnamed machine' for m in left))}, which "
               "did not train every method or trained a run in part, left out)" if left else ""))


def machine_of(measured):
    """The one machine that trained a curve's run ("" when not recorded; None for a run
    resumed on another, whose seconds are two CPUs')."""
    machines = measured.get("machines") or ("",)
    return machines[0] if len(machines) == 1 else None


def pilot_blocks(comparison):
    """The curves of a comparison whose seeds have not trained (a pilot): each trial's
    validation kNN at each quarter of its epochs, its last quarter's gain and the epoch from
    which it stays within a point of its end: where the budget's knee lies."""
    found = trial_curves(comparison)
    if not found:
        return []
    table = []
    for method, trials in found.items():
        for trial, measured in trials.items():
            end = measured["epoch"][-1]
            quarters = [value_at(measured, "epoch", f * end) for f in (0.25, 0.5, 0.75, 1.0)]
            gain = last_quarter_gain(measured)
            table.append([method, str(trial)] + [
                "–" if v is None else f"{v:.1f}" for v in quarters] + [
                "–" if gain is None else f"{gain:+.1f}", str(flattening_epoch(measured)),
                f"{measured['train_seconds']:.0f}"])
    end = int(max(m["epoch"][-1] for trials in found.values() for m in trials.values()))
    return [("h", 2, "Learning curves of the trials (validation split)"), ("p", (
        f"Each trial's kNN top-1 on the validation sample at each quarter of its {end} "
        "epochs, the gain over its last quarter and the epoch from which it stays within one "
        "point of its end: where the budget's knee lies, read before any test image.")),
        ("table", ["method", "trial", "25 %", "50 %", "75 %", "end", "last quarter's gain",
                   "within a point from epoch", "training seconds"], table),
        ("image",) + PLOT]
