"""What the comparison's runs cost, from their JSON files: python cost.py [FOLDER] (default:
this folder).  For each phase (the trials on the tune split, the final seeds) and each CPU
that trained runs: how many runs, their training steps' seconds summed (``comparison.json``'s
``train_seconds``) and the learning-curve monitor's seconds (``history.json``'s
``knn_top1_seconds``).  The probes' seconds are not recorded at the frozen commit that trained
these runs: the wall time per run, probes included, is measured from the working folder's
file times (``--walls WORK``: each final run's end against the previous one's, within one
seed, which ran back to back)."""

import json
import os
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))


def runs(folder):
    """(phase, path, entry, history rows) of every run that has a comparison.json."""
    for phase in ("tune", "final"):
        root = os.path.join(folder, "runs", phase)
        for method in sorted(os.listdir(root)) if os.path.isdir(root) else ():
            for name in sorted(os.listdir(os.path.join(root, method))):
                path = os.path.join(root, method, name)
                try:
                    with open(os.path.join(path, "comparison.json")) as handle:
                        entry = json.load(handle)
                except (OSError, ValueError):
                    continue
                try:
                    with open(os.path.join(path, "history.json")) as handle:
                        history = json.load(handle)
                except (OSError, ValueError):
                    history = []
                yield phase, path, entry, history


def summary(folder):
    """{(phase, cpu): [runs, train seconds, monitor seconds]}."""
    totals = defaultdict(lambda: [0, 0.0, 0.0])
    for phase, _, entry, history in runs(folder):
        cpu = " + ".join(entry.get("machines") or ["not recorded"])
        row = totals[(phase, cpu)]
        row[0] += 1
        row[1] += float(entry.get("train_seconds", 0.0))
        row[2] += sum(float(r.get("knn_top1_seconds", 0.0)) for r in history)
    return dict(totals)


def walls(work, seed):
    """{method: seconds from the previous final run's end to this one's} for ``seed``'s runs
    in the working folder ``work``, in the order they ended (the first has no predecessor)."""
    ends = []
    for phase, path, entry, _ in runs(work):
        if phase == "final" and entry.get("seed") == seed:
            ends.append((os.path.getmtime(os.path.join(path, "comparison.json")), entry["method"]))
    ends.sort()
    return {method: end - before for (before, _), (end, method) in zip(ends, ends[1:])}


def main(argv):
    if argv[:1] == ["--walls"]:
        work, seed = argv[1], int(argv[2])
        found = walls(work, seed)
        for method, seconds in found.items():
            print(f"{method}: {seconds / 60:.1f} min")
        if found:
            print(f"mean {sum(found.values()) / len(found) / 60:.1f} min a run over "
                  f"{len(found)} runs (training, curve, kNN and probes)")
        return
    folder = argv[0] if argv else HERE
    print("| phase | CPU | runs | training steps (h) | curve monitor (h) |")
    print("|---|---|---|---|---|")
    total = [0, 0.0, 0.0]
    for (phase, cpu), (count, train, monitor) in sorted(summary(folder).items()):
        print(f"| {phase} | {cpu} | {count} | {train / 3600:.2f} | {monitor / 3600:.2f} |")
        total = [total[0] + count, total[1] + train, total[2] + monitor]
    print(f"| all | | {total[0]} | {total[1] / 3600:.2f} | {total[2] / 3600:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
