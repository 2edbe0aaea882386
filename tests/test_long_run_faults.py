"""A long run against what its machine and its user do to it, with real processes, signals and
file systems: two launches on one folder, a full disk, a stop for collapse, a reader that goes
away (``| head``), a closed terminal (SIGHUP).  Nothing of value is ever deleted, and the same
command continues.  Each run is the smallest that trains: 2 epochs of 4 steps."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from caco_tf.training.callbacks import is_wall_clock
from caco_tf.training.run_folder import RunFolder, weight_arrays

import launch
from tiny_run import offline_digits


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The --set arguments of a tiny run on 128 offline digits (4 steps an epoch, 2 epochs)."""
    path = offline_digits(tmp_path_factory.mktemp("data"), 128, 0)[0]
    settings = [f"data.source=npz:{path}", "train.epochs=2", "method.caco.warmup_epochs=1",
                "train.batch_size=32", "method.caco.bank_size=64", "model.projector_hidden=32",
                "model.embedding_dim=16", "model.widths=[8,8,8,8]", "train.jit_compile=false",
                "train.steps_per_execution=1", "evaluation.knn_monitor_every=0",
                "evaluation.health_images=0"]
    return [word for setting in settings for word in ("--set", setting)]


def command(run_dir, tiny, *extra, script="train.py"):
    return [sys.executable, os.path.join(ROOT, script), *extra, "--run-dir", str(run_dir),
            *tiny]


def environment():
    return dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")


def run(arguments, cwd, **kwargs):
    return launch.run(arguments, cwd=str(cwd), env=environment(), capture_output=True,
                      text=True, timeout=300, **kwargs)


def errors(stderr):
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


@contextlib.contextmanager
def tmpfs(path, size, options=""):
    """A real file system of ``size`` bytes at ``path`` (``options``: e.g. "ro"; skips where
    mounting is refused)."""
    os.makedirs(path, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(filter(None, [
        f"size={size}", options])), "tmpfs", str(path)], capture_output=True)
    if mounted.returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield str(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


# The second launch: it finds no run folder, says so, then (slowed here) reaches the folder once
# the first launch holds it.
LATE = """
import os, sys, time
sys.argv[0] = "train.py"
from caco_tf import pretrain
from caco_tf.cli import train
lock = os.path.join(sys.argv[sys.argv.index("--run-dir") + 1], ".lock")
run = pretrain.run

def late(*args, **kwargs):
    print("no folder yet" if not os.path.exists(os.path.dirname(lock)) else "?", flush=True)
    while not (os.path.exists(lock) and os.path.getsize(lock)):
        time.sleep(0.05)
    return run(*args, **kwargs)

pretrain.run = late
sys.exit(train.main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_second_launch_on_a_new_folder_leaves_it_to_the_first(tiny, tmp_path):
    """Two launches on a folder that does not exist yet, the second reaching it while the
    first trains: the second is refused in one line and deletes nothing (it used to remove the
    folder the first was training in)."""
    run_dir = tmp_path / "run"
    second = launch.Popen([sys.executable, "-c", LATE, "--quiet", "--run-dir", str(run_dir),
                           *tiny], cwd=str(tmp_path), env=environment(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert second.stdout.readline() == "no folder yet\n"
    first = run(command(run_dir, tiny, "--quiet"), tmp_path)
    _, refused = second.communicate(timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    assert second.returncode == 2, refused[-2000:]
    assert len(errors(refused)) == 1 and "Traceback" not in refused
    assert errors(refused)[0].startswith(f"error: {run_dir} is in use by process ")
    folder = RunFolder(run_dir)  # whole: what the first wrote before the second came is there
    assert all(os.path.exists(path) for path in (folder.config, folder.skipped_files,
                                                 folder.history, folder.results))


@pytest.fixture(scope="module")
def reference(tiny, tmp_path_factory):
    """The run never interrupted: its folder."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    result = run(command(run_dir, tiny, "--quiet"), ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    return str(run_dir)


def assert_same_run(run_dir, reference_dir):
    """Histories (but wall-clock figures) and the final state equal, bit for bit."""
    def history(folder):
        rows = json.load(open(RunFolder(folder).history))
        return [{k: v for k, v in row.items() if not is_wall_clock(k)} for row in rows]

    assert history(run_dir) == history(reference_dir)
    resumed = weight_arrays(RunFolder(run_dir).checkpoint)
    uninterrupted = weight_arrays(RunFolder(reference_dir).checkpoint)
    assert resumed.keys() == uninterrupted.keys()
    for name in uninterrupted:
        np.testing.assert_array_equal(resumed[name], uninterrupted[name], err_msg=name)


@pytest.mark.slow
def test_a_full_disk_keeps_the_checkpoint_and_the_same_command_ends_as_never_stopped(
        tiny, reference, tmp_path):
    """The disk fills up in epoch 2 of a new run: one line, exit status 74, the checkpoint of
    epoch 1 kept (the folder was removed with it); once space is freed, the same command ends
    as the run never stopped, bit for bit."""
    with tmpfs(tmp_path / "disk", 16 << 20) as disk:
        run_dir = os.path.join(disk, "run")
        filler = os.path.join(disk, "filler")
        full = run(command(run_dir, tiny, "6", filler, "--quiet",
                           script=os.path.join("tests", "fill_disk_at_step.py")), tmp_path)
        assert full.returncode == 74, full.stderr[-2000:]
        assert "Traceback" not in full.stderr
        [line] = errors(full.stderr)
        assert line.startswith(f"error: cannot write {os.path.join(run_dir, 'backup')}")
        assert ("No space left on device; the previous checkpoint (after epoch 1) is intact; "
                "free space on its disk (or pass another --run-dir), then run the same "
                "command to continue") in line
        assert RunFolder(run_dir).read_backup().epoch == 1
        os.remove(filler)
        again = run(command(run_dir, tiny, "--quiet"), tmp_path)
        assert again.returncode == 0, again.stderr[-2000:]
        assert_same_run(run_dir, reference)


@pytest.mark.slow
def test_a_full_disk_while_exporting_is_one_line_and_the_same_command_finishes(tiny, tmp_path):
    """The disk fills up once trained, as the SavedModel is written (TensorFlow's own write):
    one line, exit status 74 (it was a traceback); once space is freed, the same command
    writes what the end of the run writes, without training again."""
    with tmpfs(tmp_path / "disk", 16 << 20) as disk:
        run_dir = os.path.join(disk, "run")
        filler = os.path.join(disk, "filler")
        full = run(command(run_dir, tiny, "export", filler, "--quiet",
                           script=os.path.join("tests", "fill_disk_at_step.py")), tmp_path)
        assert full.returncode == 74, full.stderr[-2000:]
        assert "Traceback" not in full.stderr
        [line] = errors(full.stderr)
        assert line.startswith(f"error: cannot write {os.path.join(run_dir, 'saved_model')}")
        assert line.endswith("No space left on device; free space on its disk (or pass another "
                             "--run-dir), then run the same command to continue")
        trained = open(RunFolder(run_dir).history).read()
        os.remove(filler)
        again = run(command(run_dir, tiny, "--quiet"), tmp_path)
        assert again.returncode == 0, again.stderr[-2000:]
        assert os.path.exists(os.path.join(run_dir, "saved_model", "backbone", "1",
                                           "saved_model.pb"))
        assert os.path.exists(RunFolder(run_dir).results)
        assert open(RunFolder(run_dir).history).read() == trained  # no epoch trained again


@pytest.mark.slow
def test_a_stop_for_collapse_keeps_the_backup_it_names(tiny, tmp_path):
    """train.stop_on_collapse in a new run: the line says the last good state is kept in
    RUN_DIR/backup, and it is."""
    run_dir = str(tmp_path / "run")
    collapsing = ("import sys; sys.argv[0] = 'train.py'; from caco_tf.training import callbacks;"
                  "callbacks.is_collapsed = lambda logs, *rest: 'a test collapse';"
                  "from caco_tf.cli import train; sys.exit(train.main(sys.argv[1:]))")
    result = run([sys.executable, "-c", collapsing, "--run-dir", run_dir, "--quiet",
                  "--set", "train.stop_on_collapse=true", *tiny], tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    [line] = errors(result.stderr)
    assert (f"a collapse after epoch 2 (a test collapse); its last good state (epoch 1) is kept "
            f"in {os.path.join(run_dir, 'backup')};") in line
    assert RunFolder(run_dir).read_backup().epoch == 1


@pytest.mark.slow
def test_a_closed_standard_output_is_one_warning_and_the_run_goes_on(tiny, tmp_path):
    """``caco-train | head -1``: the reader goes away after the first line; the run goes on to
    its end (exit status 0), says so once on standard error, and keeps its folder."""
    run_dir = tmp_path / "run"
    process = launch.Popen(command(run_dir, tiny), cwd=str(tmp_path), env=environment(),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline().startswith("images: ")
    process.stdout.close()  # as `head -1` does once it has its line
    stderr = process.stderr.read()
    assert process.wait(timeout=300) == 0, stderr[-2000:]
    assert stderr.splitlines() == [
        "warning: standard output was closed (Broken pipe); the run goes on; its progress is "
        "in the run folder's history.json and tensorboard/"]
    assert os.path.exists(RunFolder(run_dir).results)


@pytest.mark.slow
def test_a_closed_terminal_saves_as_sigterm_does(tiny, tmp_path):
    """A run in a terminal that closes (an ssh session lost): the kernel sends SIGHUP and the
    terminal takes no more output; the run finishes its step, saves and exits with 129 (what
    follows a save is the same as after SIGINT: tests/test_train_cli.py)."""
    import fcntl
    import pty
    import select
    import termios

    run_dir = tmp_path / "run"
    terminal, attached = pty.openpty()

    def in_the_terminal():  # a session of its own, whose controlling terminal is the pty
        os.setsid()
        fcntl.ioctl(attached, termios.TIOCSCTTY, 0)

    process = launch.Popen(command(run_dir, tiny), cwd=str(tmp_path), env=environment(),
                           stdin=attached, stdout=attached, stderr=attached,
                           preexec_fn=in_the_terminal)
    os.close(attached)
    shown, deadline = b"", time.time() + 240
    while b"Epoch 2/2" not in shown and time.time() < deadline:
        if select.select([terminal], [], [], 1)[0]:
            try:
                shown += os.read(terminal, 4096)
            except OSError:
                break
    os.close(terminal)  # the terminal is gone: SIGHUP
    assert process.wait(timeout=120) == 128 + signal.SIGHUP, shown.decode()[-2000:]
    newest = json.load(open(os.path.join(run_dir, "backup", "training_metadata.json")))
    assert newest["checkpoints"][0]["epoch"] == 1  # epoch 1's end, or a step of epoch 2
    assert len(json.load(open(RunFolder(run_dir).history))) == 1  # epoch 2 not finished


@pytest.mark.slow
def test_signals_are_honoured_while_the_input_waits_for_ever(tiny, tmp_path):
    """The images become named pipes once listed (a reader of one waits until something
    writes): the first step never ends.  A SIGTERM then says so in one line, and a second one
    ends the run at once (both used to be ignored: only SIGKILL ended it)."""
    import errno
    import select

    from PIL import Image

    folder = tmp_path / "images"
    folder.mkdir()
    names = [str(folder / f"{number:03d}.png") for number in range(64)]
    for name in names:
        Image.fromarray(np.full((28, 28), 128, np.uint8)).save(name)
    process = launch.Popen(command(tmp_path / "run", tiny, "--quiet")
                           + ["--set", f"data.source=folder:{folder}"],
                           cwd=str(tmp_path), env=environment(), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    writers = []
    try:
        assert process.stdout.readline().startswith("images: 64 for training")
        for name in names:
            os.remove(name)
            os.mkfifo(name)
        deadline = time.time() + 120
        while not writers and time.time() < deadline:  # until the input opens one of them
            for name in names:
                try:
                    writers.append(os.open(name, os.O_WRONLY | os.O_NONBLOCK))
                except OSError as error:
                    assert error.errno == errno.ENXIO  # no reader yet
            time.sleep(0.1)
        assert writers and process.poll() is None
        process.send_signal(signal.SIGTERM)
        lines, deadline = [], time.time() + 60
        while not any("has not ended" in line for line in lines) and time.time() < deadline:
            if select.select([process.stderr], [], [], 1)[0]:
                lines.append(process.stderr.readline())
        assert lines[-1] == (
            "SIGTERM received 5 s ago and the step in progress has not ended (it waits for its "
            "input, or a long compiled call): the run saves once it ends; send SIGTERM again "
            "to stop at once (the run resumes from its last saved state)\n"), lines
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 128 + signal.SIGTERM
        assert process.stderr.read().splitlines()[-1] == (
            "stopped at once by a second SIGTERM: the run resumes from its last saved state")
    finally:
        for writer in writers:
            os.close(writer)
        if process.poll() is None:
            process.kill()
            process.wait()
