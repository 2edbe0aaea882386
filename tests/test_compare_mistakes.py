"""caco-compare as a hostile user meets it: every mistake and every damaged file is one line
naming what the user wrote (or what to do), nothing is mixed into a comparison or lost."""

import json
import os
import socket

import numpy as np
import pytest
from PIL import Image

from caco_tf.cli import compare as compare_cli
from caco_tf.comparison import report, runner

from test_comparison import compare, fake_comparison, free_port, write_folder

# A comparison planned, not trained (Comparison.start): the fewest runs, the cheapest checks.
PLANNED = ["--config", "mnist", "--methods", "byol", "--trials", "1", "--seeds", "1",
           "--few-labels", "0", "--image-size", "16", "--batch-size", "8", "--views",
           "symmetric", "--set",
           "model.widths=[8, 16, 32, 64]"]
KERASTUNER = ("KERASTUNER_TUNER_ID", "KERASTUNER_ORACLE_IP", "KERASTUNER_ORACLE_PORT")


@pytest.fixture(autouse=True)
def alone(monkeypatch):
    """No KerasTuner variable from the machine running the tests."""
    for name in KERASTUNER:
        monkeypatch.delenv(name, raising=False)


def plan(argv, out):
    """Plan (or re-check) the comparison of ``argv`` in ``out`` as the command does."""
    arguments = compare_cli.arguments_of(compare_cli.parse_args(argv + ["--out", str(out)]))
    return runner.Comparison(out).start(arguments, "caco-compare")


def one_error(capsys, argv, status=2):
    code, lines = compare(argv, capsys)
    assert code == status and len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


# ---------------------------------------------------------------------- the images pinned
def test_a_rerun_from_another_folder_or_on_changed_images_is_refused(tmp_path, monkeypatch,
                                                                    capsys):
    for place, seed in (("a", 0), ("b", 1)):
        write_folder(tmp_path / place / "photos", per_class=12, seed=seed)
    out = tmp_path / "c"
    monkeypatch.chdir(tmp_path / "a")
    planned = plan(PLANNED + ["--data", "folder:photos"], out)
    assert planned["arguments"]["data"] == f"folder:{tmp_path / 'a' / 'photos'}"
    assert json.loads((out / "splits" / "test.json").read_text())["source"] == \
        planned["arguments"]["data"]  # every run reads the images planned, wherever it starts
    plan(PLANNED + ["--data", "folder:photos"], out)  # the same images: accepted
    monkeypatch.chdir(tmp_path / "b")  # the same command where photos/ holds other images
    line = one_error(capsys, PLANNED + ["--data", "folder:photos", "--out", str(out),
                                        "--dry-run"])
    assert f"holds a comparison with other data (data: 'folder:{tmp_path / 'a' / 'photos'}' " \
           f"before, 'folder:{tmp_path / 'b' / 'photos'}' now)" in line
    # The planned images themselves changed: one removed, one rewritten.
    os.remove(tmp_path / "a" / "photos" / "class1" / "1_0.png")
    Image.new("RGB", (16, 16)).save(tmp_path / "a" / "photos" / "class2" / "2_3.png")
    monkeypatch.chdir(tmp_path / "a")
    line = one_error(capsys, PLANNED + ["--data", "folder:photos", "--out", str(out),
                                        "--dry-run"])
    assert line.startswith(f"error: the images of folder:{tmp_path / 'a' / 'photos'} changed "
                           f"since the comparison in {out} was planned")
    assert "class1 holds 11 images, 12 before; class2's images changed" in line
    assert line.endswith("restore them, or compare these images in another --out")


def test_a_worker_reads_the_chiefs_images_whatever_its_folder(tmp_path, monkeypatch, capsys):
    write_folder(tmp_path / "a" / "photos", per_class=12)
    (tmp_path / "elsewhere").mkdir()
    out = tmp_path / "c"
    monkeypatch.chdir(tmp_path / "a")
    plan(PLANNED + ["--data", "folder:photos"], out)
    monkeypatch.chdir(tmp_path / "elsewhere")  # no photos/ here: the plan's are read
    port = free_port()
    with socket.create_server(("127.0.0.1", port)):  # a port that answers, but no oracle
        monkeypatch.setenv("KERASTUNER_TUNER_ID", "tuner0")
        monkeypatch.setenv("KERASTUNER_ORACLE_IP", "127.0.0.1")
        monkeypatch.setenv("KERASTUNER_ORACLE_PORT", str(port))
        status, lines = compare(PLANNED + ["--data", "folder:photos", "--out", str(out),
                                           "--chief-timeout", "1"], capsys)
    assert lines[0] == (f"waiting for the chief at 127.0.0.1:{port} (KERASTUNER_ORACLE_IP and "
                        f"_PORT; up to 1 s, --chief-timeout)")
    assert status == 75 and lines[-1].startswith(f"error: no chief answered at 127.0.0.1:{port} "
                                                 f"within 1 s"), lines


# ---------------------------------------------------------------------- degenerate splits
def test_splits_of_one_class_or_no_image_are_refused_before_any_training(tmp_path, capsys):
    folder = write_folder(tmp_path / "few", classes=2, per_class=12)
    for index in range(1, 12):  # class1 down to one image
        os.remove(folder / "class1" / f"1_{index}.png")
    line = one_error(capsys, PLANNED + ["--data", f"folder:{folder}", "--out",
                                        str(tmp_path / "c"), "--dry-run"])
    assert line.startswith("error: the test split would hold 2 image(s) of 1 class(es) "
                           "('class0': 2): every split a comparison measures needs two classes "
                           "or more with at least 2 image(s) each; add images of the smaller "
                           "classes or raise --test-fraction"), line
    assert not (tmp_path / "c" / "plan.json").exists()
    tiny = write_folder(tmp_path / "tiny", classes=3, per_class=1)
    line = one_error(capsys, PLANNED + ["--data", f"folder:{tiny}", "--batch-size", "1",
                                        "--out", str(tmp_path / "d"), "--dry-run"])
    assert "error: the test split would hold 0 image(s) of 0 class(es) (no images)" in line


def test_a_labels_file_of_one_class_or_not_utf8_is_one_line(tmp_path, capsys):
    folder = write_folder(tmp_path / "flat", per_class=4, labelled=False)
    labels = tmp_path / "labels.csv"
    labels.write_text("".join(f"{name},cats\n" for name in sorted(os.listdir(folder))))
    argv = PLANNED + ["--data", f"folder:{folder}", "--labels", str(labels), "--out",
                      str(tmp_path / "c"), "--dry-run"]
    assert one_error(capsys, argv) == (f"error: --labels {labels} names 1 class(es) (cats): a "
                                       f"comparison needs two or more")
    labels.write_bytes("".join(f"{name},{'chats' if i % 2 else 'chiens'}\n" for i, name in
                               enumerate(sorted(os.listdir(folder)))).encode("latin-1")
                       + "élan.png,chats\n".encode("latin-1"))
    assert one_error(capsys, argv).startswith(f"error: --labels {labels} is not UTF-8 text "
                                              f"(byte 0xe9 at offset")


# ---------------------------------------------------------------------- damaged state
@pytest.fixture
def finished(tmp_path):
    """A finished comparison (fake figures), its calibration and baselines in place: the
    command given it has nothing to train."""
    comparison = fake_comparison(tmp_path / "c", {"caco": [90.0, 91.0, 92.0]})
    comparison.state = {"calibration": {"caco": {"step_seconds": 0.01, "setup_seconds": 1.0}},
                        "evaluation": {"image_seconds": 0.0, "fit_seconds": 0.0,
                                       "epoch_seconds": 0.0, "step_seconds": 0.0}}
    comparison.save()
    runner.write_json_atomically(comparison.plan_path, comparison.plan)
    os.makedirs(os.path.join(comparison.folder, "baselines"))
    for name in runner.BASELINES:
        runner.write_json_atomically(runner.baseline_path(comparison, name), {"top1": 50.0})
    return comparison


def its_command(comparison):
    return ["--config", "mnist", "--data", "mnist", "--methods", "caco", "--trials", "2",
            "--seeds", "3", "--few-labels", "0", "--linear-epochs", "1", "--out",
            comparison.folder]


@pytest.mark.parametrize("name", ["plan.json", "state.json", "runs/final/caco/seed1/"
                                  "comparison.json", "tuner/oracle.json"])
@pytest.mark.parametrize("damage", ["empty", "truncated"])
def test_a_damaged_state_file_is_one_line_naming_it(finished, name, damage, capsys):
    path = os.path.join(finished.folder, *name.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    whole = json.dumps({"ongoing_trials": {}, "tuner_ids": []}) if "tuner" in name else open(
        path).read()
    with open(path, "w") as handle:
        handle.write("" if damage == "empty" else whole[:len(whole) // 2])
    line = one_error(capsys, its_command(finished))
    said = "empty" if damage == "empty" else "not whole JSON"
    assert line.startswith(f"error: {path} is damaged ({said}"), line
    advice = {"plan.json": "restore it from a copy (docs/compare.md), or choose another --out",
              "state.json": "remove it: it holds only the calibration",
              "comparison.json": f"remove the folder {os.path.dirname(path)} to train that run "
                                 f"again",
              "oracle.json": f"remove the folder {os.path.dirname(path)} (KerasTuner's book"}
    assert advice[os.path.basename(path)] in line


def test_the_report_says_what_it_could_not_read(finished, capsys):
    results = os.path.join(finished.run_dir("final/caco/seed2"), "results.json")
    with open(results, "w") as handle:
        handle.write('{"knn_top1": 9')
    with open(finished.state_path, "w") as handle:
        handle.write("")
    status, lines = compare(its_command(finished) + ["--report-only"], capsys)
    assert status == 0, lines
    text = open(os.path.join(finished.folder, "report", "report.md")).read()
    assert "**Not read** (damaged files; what they hold is left out):" in text
    assert f"{results} is damaged (not whole JSON" in text
    assert f"{finished.state_path} is damaged (empty)" in text
    assert "90.5 [" in text  # caco's two seeds that could be read, 90 and 91
    # Without --report-only the same damage stops the command when it reports, naming it.
    with open(finished.state_path, "w") as handle:
        json.dump(finished.state, handle)
    status, lines = compare(its_command(finished), capsys)
    assert status == 2 and lines[-1].startswith(f"error: {results} is damaged"), lines
    assert not any(line.startswith("Traceback") for line in lines)


# ---------------------------------------------------------------------- KerasTuner's variables
@pytest.mark.parametrize("variables, words", [
    ({"KERASTUNER_ORACLE_IP": "127.0.0.1"}, "error: KERASTUNER_TUNER_ID, KERASTUNER_ORACLE_PORT "
                                            "not set: a comparison over machines needs all of"),
    ({"KERASTUNER_TUNER_ID": "chief", "KERASTUNER_ORACLE_IP": "127.0.0.1",
      "KERASTUNER_ORACLE_PORT": "84x0"}, "error: KERASTUNER_ORACLE_PORT must be a port number "
                                         "from 1 to 65535, got '84x0'"),
])
def test_kerastuners_variables_are_checked_first(variables, words, monkeypatch, tmp_path,
                                                 capsys):
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert one_error(capsys, ["--out", str(tmp_path / "c")]).startswith(words)
    assert not (tmp_path / "c").exists()


def test_a_busy_port_is_refused_before_planning(monkeypatch, tmp_path, capsys):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        for name, value in zip(KERASTUNER, ("chief", "127.0.0.1", str(port))):
            monkeypatch.setenv(name, value)
        line = one_error(capsys, PLANNED + ["--data", "mnist", "--out", str(tmp_path / "c")])
    assert line.startswith(f"error: KERASTUNER_ORACLE_PORT {port} cannot be served on "
                           f"127.0.0.1 (Address already in use): choose another port")
    assert not (tmp_path / "c" / "plan.json").exists()


def test_a_chief_on_a_finished_comparison_writes_the_report_and_exits(finished, monkeypatch,
                                                                      capsys):
    for name, value in zip(KERASTUNER, ("chief", "127.0.0.1", str(free_port()))):
        monkeypatch.setenv(name, value)
    status, lines = compare(its_command(finished), capsys)
    assert status == 0 and f"every run of {finished.folder} is measured: nothing to serve" in \
        lines, lines
    assert os.path.exists(os.path.join(finished.folder, "report", "report.md"))


def test_a_worker_without_its_chief_gives_up_in_the_time_it_states(monkeypatch, tmp_path,
                                                                   capsys):
    port = free_port()  # nothing listens
    for name, value in zip(KERASTUNER, ("tuner0", "127.0.0.1", str(port))):
        monkeypatch.setenv(name, value)
    status, lines = compare(PLANNED + ["--data", "mnist", "--out", str(tmp_path / "c"),
                                       "--chief-timeout", "1"], capsys)
    assert status == 75 and len(lines) == 2, lines
    assert lines[1] == (f"error: no chief answered at 127.0.0.1:{port} within 1 s: start it "
                        f"(KERASTUNER_TUNER_ID=chief, the same command) or correct "
                        f"KERASTUNER_ORACLE_IP and _PORT, then start this worker again: its "
                        f"runs continue")


# ---------------------------------------------------------------------- outputs, arguments
def test_outputs_in_bad_places_are_one_line_and_write_nothing(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert one_error(capsys, PLANNED + ["--data", "mnist", "--out", str(tmp_path / "file")]) == (
        f"error: --out {tmp_path / 'file'} is a file: a comparison's folder is needed; pass "
        f"another --out")
    (tmp_path / "docs").mkdir()
    line = one_error(capsys, PLANNED + ["--data", "mnist", "--out", str(tmp_path / "c"),
                                        "--publish", str(tmp_path / "docs")])
    assert line == (f"error: --publish {tmp_path / 'docs'} is a folder: name a Markdown page in "
                    f"it, e.g. --publish {tmp_path / 'docs' / 'results.md'}")
    line = one_error(capsys, PLANNED + ["--data", "mnist", "--out", str(tmp_path / "c"),
                                        "--publish", str(tmp_path / "none" / "r.md")])
    assert line.startswith(f"error: --publish {tmp_path / 'none' / 'r.md'}: its folder")
    assert sorted(os.listdir(tmp_path)) == ["docs", "file"] and not os.listdir(tmp_path / "docs")


@pytest.mark.parametrize("methods", ["", ",", " , "])
def test_no_method_named_is_refused_as_none(methods, tmp_path, capsys):
    assert one_error(capsys, ["--methods", methods, "--out", str(tmp_path / "c")]).startswith(
        "error: --methods: unknown (none given); choose from caco, ")


@pytest.mark.parametrize("budget, extra", [("mnist", " --set model.pool_grid=1"),
                                           ("shapes", " --set model.widths=null")])
def test_a_vit_method_on_a_convnet_budget_is_one_line_that_says_what_to_pass(
        budget, extra, tmp_path, capsys):
    """Every method of a ViT's tokens named is refused at once, before anything is written;
    what the line says to pass is enough for the command to plan."""
    argv = ["--config", budget, "--data", "mnist", "--methods", "mae,byol,ijepa", "--out",
            str(tmp_path / "c")]
    line = one_error(capsys, argv)
    assert line == (f"error: --methods mae, ijepa: they work on a Vision Transformer's patch "
                    f"tokens, and the budget's model.backbone small_convnet has none: pass "
                    f"--backbone vit_micro_patch4{extra} (or another ViT preset: docs/vit.md)")
    assert not os.listdir(tmp_path)
    advice = line.split(": pass ")[1].split(" (or ")[0].split()
    arguments = compare_cli.arguments_of(compare_cli.parse_args(argv + advice))
    assert "model.backbone=vit_micro_patch4" in arguments["settings"]


# ---------------------------------------------------------------------- --publish
def test_publish_reads_markers_on_their_own_lines_only_and_is_idempotent(finished, tmp_path):
    folder = report.write(finished)
    page = tmp_path / "page.md"
    prose = (f"# Results\n\nThe section sits between `{report.BEGIN}` and `{report.END}`, "
             f"which caco-compare rewrites.\n\n{report.BEGIN}\nstale\n{report.END}\n\nkept\n")
    page.write_text(prose)
    report.publish(finished, folder, str(page))
    once = page.read_bytes()
    assert once.startswith(prose[:prose.index("stale")].encode()) and b"stale" not in once
    assert once.endswith(f"{report.END}\n\nkept\n".encode())
    report.publish(finished, folder, str(page))
    assert page.read_bytes() == once
    for broken, why in ((f"{report.END}\n{report.BEGIN}\n", "the end first"),
                        (f"{report.BEGIN}\nlost\n", "has 1 <!-- caco-compare:begin --> and 0"),
                        (f"{report.BEGIN}\n{report.END}\n{report.BEGIN}\n{report.END}\n",
                         "has 2")):
        page.write_text("# Results\n\n" + broken)
        with pytest.raises(runner.ConfigError, match=why):
            report.publish(finished, folder, str(page))
        assert page.read_text() == "# Results\n\n" + broken


def test_the_recovery_docs_describe_needs_no_trained_model(finished, tmp_path, monkeypatch):
    """Baselines are measured from the budget, not from a run's exported model: a comparison
    restored from its JSON files alone measures them again."""
    import shutil

    shutil.rmtree(os.path.join(finished.folder, "baselines"))
    asked = []
    monkeypatch.setattr("caco_tf.evaluation.protocols.evaluate",
                        lambda protocol, **given: asked.append(given) or {"top1": 42.0})
    assert runner.measure_baselines(finished, say=lambda line: None) == {
        "pixels": 42.0, "untrained": 42.0}
    assert all(given.get("run") is None and given["config"]["train"]["seed"] == 0
               for given in asked)


def test_a_signal_between_runs_is_not_swallowed_by_code_that_catches_every_error():
    """The handler raises wherever the process is: inside ``inspect`` (which turns any
    Exception into a TypeError) or KerasTuner (which retries a trial on any Exception) the
    stop would be lost and the comparison go on; 2026-12-05 it did, inside Keras' Input."""
    import inspect
    import signal

    from caco_tf.training.interrupts import Interrupted

    def signalled(self, x):  # a default whose evaluation the signal interrupts
        return x

    previous = signal.signal(signal.SIGTERM, compare_cli.stop_between_runs)
    try:
        with pytest.raises(Interrupted, match="stopped by SIGTERM") as stop:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                inspect.getfullargspec(signalled)  # the handler runs in here or before
                for _ in range(10 ** 6):
                    pass
            except Exception as error:  # noqa: BLE001 — what library code does
                pytest.fail(f"the stop was caught as {error!r}")
        assert stop.value.exit_status == 143
    finally:
        signal.signal(signal.SIGTERM, previous)
