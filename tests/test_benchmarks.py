"""The scripts of benchmarks/: every one still runs (its tiny mode, ``--tiny``), and the pure
parts of a few (their sections and tables), without measuring anything."""

import ast
import glob
import hashlib
import os

import pytest

from benchmark_scripts import BENCHMARKS, load

ROOT = os.path.dirname(BENCHMARKS)
SCRIPTS = sorted(os.path.basename(path)[:-len(".py")]
                 for path in glob.glob(os.path.join(BENCHMARKS, "*.py"))
                 if not os.path.basename(path).startswith("_"))
# What a tiny run must leave as it found it: the published figures.
KEPT = ["BENCHMARKS.md", os.path.join("docs", "results.md")]


def test_every_script_has_a_tiny_mode():
    """A script's ``main(argv)`` takes ``--tiny`` (``_harness.parser`` adds it), so the slow
    test below can run it; a new script without one fails here first."""
    assert len(SCRIPTS) > 20
    for name in SCRIPTS:
        with open(os.path.join(BENCHMARKS, f"{name}.py")) as handle:
            source = handle.read()
        functions = {node.name: node for node in ast.walk(ast.parse(source))
                     if isinstance(node, ast.FunctionDef)}
        assert "main" in functions and functions["main"].args.args, f"{name}: no main(argv)"
        assert "_harness.parser(" in source or '"--tiny"' in source, f"{name}: no --tiny"


def _kept():
    digests = {}
    for path in KEPT:
        with open(os.path.join(ROOT, path), "rb") as handle:
            digests[path] = hashlib.sha1(handle.read()).hexdigest()
    return digests


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_a_script_runs_in_its_tiny_mode(name, tmp_path, monkeypatch):
    """The script's tiny mode runs to its end, from another folder, and leaves the published
    figures alone.  ``main(argv)`` runs in the test's process (TensorFlow is started once for
    every script a worker runs); one test a script, which tests/conftest.py schedules on its
    own, so that the two workers share the scripts."""
    monkeypatch.chdir(tmp_path)
    before = _kept()
    assert load(name).main(["--tiny"]) in (None, 0)
    assert _kept() == before


# ---------------------------------------------------------------------- the harness
def test_a_section_is_replaced_between_its_markers_or_appended(tmp_path):
    harness = load("_harness")
    path = tmp_path / "BENCHMARKS.md"
    path.write_text("# Benchmarks\n\n## A\n\n<!-- a:begin -->\nold\n<!-- a:end -->\n\nkept\n")
    harness.write_section("<!-- a:begin -->\nnew\n<!-- a:end -->\n", str(path), "a", "## A")
    harness.write_section("<!-- b:begin -->\nb\n<!-- b:end -->\n", str(path), "b", "## B")
    assert path.read_text() == ("# Benchmarks\n\n## A\n\n<!-- a:begin -->\nnew\n<!-- a:end -->"
                                "\n\nkept\n\n## B\n\n<!-- b:begin -->\nb\n<!-- b:end -->\n")


def test_alternatives_are_interleaved_and_reversed_every_other_round():
    harness = load("_harness")
    calls = []
    figures = harness.interleave({"a": lambda: calls.append("a"),
                                  "b": lambda: calls.append("b") or 2.5}, rounds=3, warmup=1)
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert figures["b"] == [2.5] * 3 and len(figures["a"]) == 3
    assert harness.command_line("/x/s.py", ["--output", "o.md", "--rounds", "2", "--note=n"]) \
        == "python benchmarks/s.py --rounds 2"


# ---------------------------------------------------------------------- step_time.py
def test_step_time_writes_each_kind_of_run_into_its_own_section(tmp_path):
    """Re-measuring one kind of run (the offline default's XLA gain) leaves the others' rows."""
    step_time = load("step_time")
    name = {argv: step_time.section_of(step_time.parse_args(argv.split()))[0]
            for argv in ("--only m_caco", "--interleave --only m_caco,m_caco_xla",
                         "--interleave --only r50_caco,r50_moco",
                         "--interleave --only r50_caco,m_caco", "--interleave")}
    assert name["--only m_caco"] == "step_time"
    assert name["--interleave --only m_caco,m_caco_xla"] == "step_time_offline_default"
    for argv in ("--interleave --only r50_caco,r50_moco", "--interleave --only r50_caco,m_caco",
                 "--interleave"):
        assert name[argv] == "step_time_interleaved", argv


# ---------------------------------------------------------------------- op_profile.py
def test_op_profile_sorts_op_types_into_kinds():
    kind_of = load("op_profile").kind_of
    assert kind_of("_MklNativeConv2DBackpropFilter") == "convolution, backward filter"
    assert kind_of("_MklNativeConv2DBackpropInput") == "convolution, backward data"
    assert kind_of("_MklNativePadWithConv2D") == "convolution, forward"
    assert kind_of("_MklNativeFusedBatchNormGradV3") == "BatchNorm, backward"
    assert kind_of("_MklNativeFusedBatchNormEx") == "BatchNorm, forward"
    assert kind_of("_MklNativeMaxPoolGrad") == "pooling"
    assert kind_of("ReluGrad") == kind_of("AddV2") == "element-wise (relu, add, mul, ...)"
    assert kind_of("AssignSubVariableOp") == "variables (read, assign)"
    assert kind_of("Pad") == kind_of("ConcatV2") == kind_of("_MklTranspose") \
        == "data movement (pad, slice, concat, transpose, tile)"
    assert kind_of("bitcast_dynamic-update-slice_fusion.1") == kind_of("dot") \
        == "XLA kernels (the bank's pass: bank.py compiles it)"
    assert kind_of("Cast") == "casts" and kind_of("NoSuchOp") == "other"


def test_method_steps_measures_every_registered_method():
    from caco_tf import methods

    listed = load("method_steps").registered_methods()
    assert listed[0] == "moco_v2"
    assert set(listed) == {name for name, cls in methods.METHODS.items()
                           if cls.SETTINGS_OF is None and cls.CONSUMES == "features"}


def test_the_vit_pages_held_out_table_is_what_its_tracked_runs_give(capsys):
    """docs/vit.md's held-out table of the ViT-era methods, and its count of the claims that
    hold, are ``vit_offline_table.py``'s output on the runs kept in benchmarks/vit_offline/."""
    load("vit_offline_table").main([os.path.join(BENCHMARKS, "vit_offline")])
    written = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    with open(os.path.join(ROOT, "docs", "vit.md"), encoding="utf-8") as page:
        text = page.read()
    assert len(written) >= 4
    for line in written:
        assert line in text, line
