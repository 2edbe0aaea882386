"""Copy a working folder's plan, state, splits and finished runs' JSON files here (the tracked
copy that resume.sh starts from): python keep.py [WORK] (default /work/shapes_v2)."""

import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def failed(entry_path):
    """The run stopped itself (a NaN, a collapse): a finished run, its failure the measurement."""
    try:
        with open(entry_path) as handle:
            return "failed" in json.load(handle)
    except (OSError, ValueError):
        return False


def keep(work):
    kept = 0
    for root, _, files in os.walk(work):
        relative = os.path.relpath(root, work)
        if relative.split(os.sep)[0] in ("tuner", "report"):
            continue  # rebuilt from the runs (the baselines are measurements: kept)
        if relative.startswith("runs") and "results.json" not in files \
                and not failed(os.path.join(root, "comparison.json")):
            continue  # a run under way: its checkpoints are not kept
        for name in files:
            if name.endswith(".json"):
                os.makedirs(os.path.join(HERE, relative), exist_ok=True)
                shutil.copy2(os.path.join(root, name), os.path.join(HERE, relative, name))
                kept += 1
    return kept


if __name__ == "__main__":
    print(f"kept {keep(sys.argv[1] if len(sys.argv) > 1 else '/work/shapes_v2')} files")
