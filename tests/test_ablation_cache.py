"""benchmarks/ablation.py's resumable cache and partial report (no training here)."""

import json

from benchmark_scripts import load


def load_ablation():
    return load("ablation")


def test_cache_merges_the_work_folder_and_the_tracked_copy(tmp_path):
    ablation = load_ablation()
    work, tracked = tmp_path / "work.json", tmp_path / "tracked" / "tag.json"
    work.write_text(json.dumps({"runs": {"caco/seed0": {"knn_top1": 97.0},
                                         "none/seed0": {"knn_top1": 96.0}}}))
    tracked.parent.mkdir()
    tracked.write_text(json.dumps({"runs": {"caco/seed0": {"knn_top1": 97.0, "linear_top1": 96.5},
                                            "simclr/seed1": {"knn_top1": 95.0}}}))
    cache = ablation.load_cache([str(work), str(tracked)])
    # The entry with more figures wins; runs found in either file are kept.
    assert cache["runs"] == {"caco/seed0": {"knn_top1": 97.0, "linear_top1": 96.5},
                             "none/seed0": {"knn_top1": 96.0},
                             "simclr/seed1": {"knn_top1": 95.0}}
    fresh = tmp_path / "fresh" / "tag.json"  # a folder that does not exist yet
    ablation.save_cache(cache, [str(work), str(fresh)])
    for path in (work, fresh):
        assert json.loads(path.read_text()) == cache
    assert not list(tmp_path.rglob("*.tmp"))


def test_partial_report_names_the_missing_runs_and_counts_seeds():
    ablation = load_ablation()
    cache = {"runs": {"caco/seed0": {"knn_top1": 97.0}, "caco/seed1": {"knn_top1": 98.0},
                      "none/seed0": {"knn_top1": 96.0}}}
    note = ablation.partial_note(cache, ["none", "caco"], 2, "python benchmarks/ablation.py")
    assert "3 of 4 runs" in note[0] and "none/seed1" in note[0] and "caco/seed" not in note[0]
    assert ablation.partial_note(cache, ["caco"], 2, "cmd") == []
    assert ablation.cell([97.0, 98.0], 3) == "97.5 ± 0.7 (2 seeds)"
    assert ablation.cell([97.0, 98.0], 2) == "97.5 ± 0.7"
    assert ablation.cell([97.0], 3) == "97.0 (1 seed)"
    assert ablation.cell([], 3) == "–"
