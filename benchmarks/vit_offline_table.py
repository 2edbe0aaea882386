"""docs/vit.md's table of the ViT-era methods held out (on the digits; I-JEPA's on the shapes),
read from run folders.

    python benchmarks/vit_offline_table.py RUNS_DIR      (--tiny: made-up runs, the test's)

RUNS_DIR holds ``held_<method>_s<seed>/`` run folders, each with the probes that
``caco-evaluate knn|linear --run RUN`` and ``... --untrained --seed SEED`` wrote
(``eval_<protocol>.json``, ``eval_<protocol>_untrained.json``), and those of other features
(``--features patch_mean``: ``eval_<protocol>[_untrained]_patch_mean.json``), each features' own
rows against the untrained ViT under the same features.  Each method is set against the
same ViT at its initialization, seed by seed (the paired t interval), and, where
``benchmarks/vit_untrained_init.py`` wrote them (``eval_<protocol>_untrained_xavier.json``),
against the same ViT untrained under MAE's xavier initialization.  Every claim of the page is
one family under Holm's correction: these rows' and the page's three earlier claims (MoCo v3
and DINO above their untrained ViT, MoCo v3 above DINO: ``EARLIER_P``).
"""

import argparse
import glob
import json
import os
import re
import sys
import tempfile

from caco_tf.evaluation import POOLINGS, pooling_name, statistics

# The two-sided paired p of docs/vit.md's earlier claims (its MoCo v3 / DINO table).
EARLIER_P = {"MoCo v3 above its untrained ViT (kNN)": 0.007,
             "DINO above its untrained ViT (kNN)": 0.011,
             "MoCo v3 above DINO (kNN)": 0.012}
NAMES = {"mae": "MAE", "dinov2": "DINOv2", "ijepa": "I-JEPA",
         "mae_xavier60": "MAE (xavier init, 60 epochs)",
         "mae_xavier120": "MAE (xavier init, 120 epochs)",
         "ijepa_shapes": "I-JEPA (on the shapes)"}
PROTOCOLS = ("linear", "knn")
# caco-evaluate --features: (the probes' file suffix, the rows' words); the class token unnamed.
WORDS = {"class": "", "patch_mean": ", mean patch token",
         "class+patch_mean": ", class and mean patch tokens"}
FEATURES = {pooling: ("" if pooling == "class" else "_" + pooling_name(pooling), WORDS[pooling])
            for pooling in POOLINGS}
# The untrained baselines: (file suffix, the claim's words), the first required.
BASELINES = (("_untrained", "its untrained ViT"),
             ("_untrained_xavier", "its ViT untrained under xavier init"))


def figures(runs_dir):
    """{(method, features): {seed: {protocol: (trained, {baseline suffix: untrained})}}} of
    every finished run folder."""
    found = {}
    for folder in sorted(glob.glob(os.path.join(runs_dir, "held_*_s*"))):
        match = re.fullmatch(r"held_(\w+?)_s(\d+)", os.path.basename(folder))
        if not match or not os.path.isdir(folder):
            continue
        method, seed = match.group(1), int(match.group(2))
        for features, (pooled, _) in FEATURES.items():
            probes = {}
            for protocol in PROTOCOLS:
                trained, first = (os.path.join(folder, f"eval_{protocol}{kind}{pooled}.json")
                                  for kind in ("", BASELINES[0][0]))
                if not (os.path.exists(trained) and os.path.exists(first)):
                    continue
                baselines = {}
                for suffix, _ in BASELINES:
                    path = os.path.join(folder, f"eval_{protocol}{suffix}{pooled}.json")
                    if os.path.exists(path):
                        baselines[suffix] = json.load(open(path))["top1"]
                probes[protocol] = (json.load(open(trained))["top1"], baselines)
            if len(probes) == len(PROTOCOLS):
                found.setdefault((method, features), {})[seed] = probes
    return found


def row_name(method, features):
    """The rows' method words: its name, and its features unless the class token."""
    return NAMES.get(method, method) + FEATURES[features][1]


def _p(value):
    return "< 0.001" if value < 0.001 else f"{value:.3f}"


def table(found):
    claims, rows = {}, []
    for (method, features), seeds in found.items():
        method = row_name(method, features)
        order = sorted(seeds)
        for protocol in PROTOCOLS:
            trained = [seeds[s][protocol][0] for s in order]
            for suffix, words in BASELINES:
                if not all(suffix in seeds[s][protocol][1] for s in order):
                    continue  # a baseline measured on every seed, or not at all
                untrained = [seeds[s][protocol][1][suffix] for s in order]
                name = f"{method} above {words} ({protocol})"
                paired = statistics.paired_comparison(trained, untrained)
                p = statistics.paired_p_value(trained, untrained) if len(order) > 1 else 1.0
                claims[name] = p
                rows.append((method, protocol, order, trained, untrained, paired, name, words))
    family = dict(EARLIER_P, **claims)
    adjusted = dict(zip(family, statistics.holm(list(family.values()))))
    every_seed = sorted({seed for row in rows for seed in row[2]})  # a method may have more
    print("| method | probe | " + " | ".join(f"seed {s}" for s in every_seed) +
          " | mean [95 % interval] | against | untrained, same seeds | trained − untrained, "
          "paired | p (Holm) |")
    print("|---|---|" + "---:|" * len(every_seed) + "---|---|---|---|---|")
    for method, protocol, order, trained, untrained, paired, name, words in rows:
        difference = paired.difference
        verdict = _verdict(adjusted[name], difference)
        by_seed = dict(zip(order, trained))
        print(f"| {method} | {protocol} | "
              + " | ".join(f"{by_seed[s]:.1f} %" if s in by_seed else "–" for s in every_seed)
              + f" | {statistics.interval_text(trained)} | {words}"
              f" | {statistics.interval_text(untrained)}"
              f" | {difference.mean:+.1f} points [{difference.low:.1f}, {difference.high:.1f}]"
              f" | {_p(family[name])} ({_p(adjusted[name])}): "
              f"{verdict} |")
    reversed_ = sum(_verdict(adjusted[row[6]], row[5].difference) == "below" for row in rows)
    held = sum(adjusted[n] < 0.05 for n in family) - reversed_
    print(f"\nThe page's {len(family)} paired claims, one family: {held} of {len(family)} hold "
          f"after Holm's correction at 0.05" + (f"; {reversed_} reversed (the trained network "
                                               f"below its baseline)." if reversed_ else "."))


def _verdict(adjusted_p, difference):
    """A two-sided test's reading: a difference told apart after correction, either way."""
    if adjusted_p >= 0.05:
        return "no difference after correction"
    return "above" if difference.low > 0 else "below"


def write_tiny_runs(folder):
    """Two methods' run folders of made-up probes, of 3 and 5 seeds, the first's with its mean
    patch token too (``--tiny``: the table's path, no training)."""
    for method, gain, seeds in (("mae", 12.0, 3), ("ijepa", 0.5, 5)):
        for seed in range(seeds):
            run = os.path.join(folder, f"held_{method}_s{seed}")
            os.makedirs(run, exist_ok=True)
            for protocol in PROTOCOLS:
                untrained = 30.0 + seed
                for pooled in ("", "_patch_mean")[:2 if method == "mae" else 1]:
                    for kind, top1 in (("", untrained + gain + 0.3 * seed),
                                       ("_untrained", untrained)):
                        name = f"eval_{protocol}{kind}{pooled}.json"
                        with open(os.path.join(run, name), "w") as handle:
                            json.dump({"protocol": protocol, "top1": top1}, handle)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs_dir", nargs="?", help="a folder of held_<method>_s<seed>/ runs")
    parser.add_argument("--tiny", action="store_true", help="made-up run folders (a test)")
    args = parser.parse_args(argv)
    if args.tiny:
        with tempfile.TemporaryDirectory() as folder:
            write_tiny_runs(folder)
            return table(figures(folder))
    if not args.runs_dir or not os.path.isdir(args.runs_dir):
        parser.error(f"RUNS_DIR must be a folder, got {args.runs_dir!r}")
    found = figures(args.runs_dir)
    if not found:
        sys.exit(f"error: no finished held_<method>_s<seed>/ run folder in {args.runs_dir}")
    return table(found)


if __name__ == "__main__":
    sys.exit(main())
