"""The run folder over a long run's failures: a full disk, a read-only or failing disk, a
truncated checkpoint, two processes on one folder (``caco_tf.training.run_folder``).  Disks
are real: size-limited and read-only tmpfs mounts (root only), beside injected errors."""

import contextlib
import errno
import json
import logging
import os
import signal
import subprocess
import sys

import pytest

from caco_tf.training import run_folder
from caco_tf.training.run_folder import RunFolder, RunFolderError, WriteError
import launch
from tiny_run import offline_digits

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextlib.contextmanager
def tmpfs(path, size, read_only=False):
    """A real file system of ``size`` bytes at ``path`` (skips where mounting is refused)."""
    os.makedirs(path, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                             capture_output=True)
    if mounted.returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield str(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.fixture(scope="module")
def model():
    from test_model import tiny_caco
    return tiny_caco()


def saved_size(model, tmp_path):
    path = str(tmp_path / "probe.weights.h5")
    model.save_weights(path)
    return os.path.getsize(path)


def test_a_full_disk_is_one_line_and_keeps_the_previous_checkpoint(model, tmp_path):
    size = saved_size(model, tmp_path)
    model.optimizer.iterations.assign(0)
    with tmpfs(tmp_path / "disk", 2 * size + 64 * 1024) as disk:  # room for one checkpoint
        folder = RunFolder(os.path.join(disk, "run"))
        folder.write_backup(model, 1, 0, 3)
        model.optimizer.iterations.assign(5)
        with pytest.raises(WriteError) as caught:
            for step in (1, 2):  # the second copy cannot fit beside the first
                folder.write_backup(model, 1, step, 3)
        message = str(caught.value)
        assert "\n" not in message and "No space left on device" in message
        assert message.startswith(f"cannot write {folder.backup}")
        assert "the previous checkpoint (after epoch 1) is intact; free space on its disk" in (
            message) or "the previous checkpoint (epoch 2, step 1) is intact" in message
        point = folder.read_backup()
        assert point is not None and os.path.exists(point.weights)
        assert not [n for n in os.listdir(folder.backup) if n.startswith(".partial")]
        model.load_weights(point.weights)  # the kept checkpoint is whole


def test_a_read_only_run_folder_is_one_line(model, tmp_path):
    with tmpfs(tmp_path / "disk", 1 << 20, read_only=True) as disk:
        folder = RunFolder(disk)
        with pytest.raises(WriteError) as caught:
            folder.write_backup(model, 1, 0, 3)
    assert "Read-only file system" in str(caught.value)
    assert "make the run folder writable" in str(caught.value)
    assert caught.value.exit_status == 74


def test_an_io_error_while_saving_leaves_no_partial_file(model, tmp_path, monkeypatch):
    folder = RunFolder(str(tmp_path))
    folder.write_backup(model, 1, 0, 3)

    def failing(path, contents):
        with open(path, "wb") as handle:
            handle.write(contents[:len(contents) // 2])
        raise OSError(errno.EIO, os.strerror(errno.EIO), path)

    monkeypatch.setattr(run_folder, "_write_synced", failing)
    with pytest.raises(WriteError, match="Input/output error.*check the disk"):
        folder.write_backup(model, 2, 0, 3)
    names = sorted(os.listdir(folder.backup))
    assert len(names) == 2 and names[1] == "training_metadata.json", names
    assert folder.read_backup().epoch == 1


def test_a_truncated_latest_checkpoint_falls_back_to_the_previous_with_a_warning(
        model, tmp_path, caplog):
    folder = RunFolder(str(tmp_path))
    folder.write_backup(model, 1, 0, 3)
    model.optimizer.iterations.assign(4)
    folder.write_backup(model, 1, 1, 3, {"loss": [1.5, 1.0]})
    model.optimizer.iterations.assign(0)
    newest = folder.read_backup()
    assert (newest.epoch, newest.step, newest.metrics) == (1, 1, {"loss": [1.5, 1.0]})
    with open(newest.weights, "r+b") as handle:  # a crash's truncation
        handle.truncate(os.path.getsize(newest.weights) // 2)
    with caplog.at_level(logging.WARNING, logger="caco_tf"):
        point = folder.read_backup()
    assert (point.epoch, point.step) == (1, 0)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and warnings[0].startswith(
        f"warning: the latest checkpoint {newest.weights} is damaged (")
    # Damaged bits of the same length are caught by the checksum.
    with open(point.weights, "r+b") as handle:
        handle.seek(100)
        handle.write(b"\xff" * 8)
    with pytest.raises(RunFolderError, match="every checkpoint in .* is damaged"):
        folder.read_backup()


def test_the_checkpoints_of_the_first_layout_still_resume(model, tmp_path):
    backup = tmp_path / "backup"
    backup.mkdir()
    model.save_weights(str(backup / "epoch-0003.weights.h5"))
    (backup / "training_metadata.json").write_text(json.dumps(
        {"epoch": 3, "weights": "epoch-0003.weights.h5", "steps_per_epoch": 7}))
    point = RunFolder(str(tmp_path)).read_backup()
    assert (point.epoch, point.step, point.steps_per_epoch) == (3, 0, 7)


HOLD = ("import sys, time; from caco_tf.training.run_folder import RunFolder; "
        "lock = RunFolder(sys.argv[1]).lock(); print('held', flush=True); time.sleep(120)")


def test_one_writer_per_run_folder_and_a_dead_holder_does_not_block(tmp_path):
    folder = RunFolder(str(tmp_path / "run"))
    env = dict(os.environ, PYTHONPATH=ROOT)
    holder = launch.Popen([sys.executable, "-c", HOLD, folder.path], env=env,
                          stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunFolderError) as caught:
            folder.lock()
        assert str(caught.value) == (
            f"{folder.path} is in use by process {holder.pid} on {os.uname().nodename} "
            f"(since {json.load(open(folder.lock_path))['started']}): wait for it to end or "
            f"stop it, or pass another --run-dir")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with folder.lock():  # the kernel released the dead holder's lock
        assert json.load(open(folder.lock_path))["pid"] == os.getpid()


@pytest.mark.slow
def test_a_run_folder_too_small_for_the_run_is_refused_at_the_start_with_the_sizes(tmp_path):
    """caco-train whose run folder's file system cannot hold the run's checkpoints and exports:
    one ``error:`` line at the start with the sizes, exit status 74, no traceback, and no
    folder left (it used to fail at the first save, or once trained, at the export)."""
    data = offline_digits(tmp_path, 128, 0)[0]
    with tmpfs(tmp_path / "disk", 48 * 1024) as disk:
        run_dir = os.path.join(disk, "run")
        env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3",
                   CUDA_VISIBLE_DEVICES="")
        result = launch.run(
            [sys.executable, os.path.join(ROOT, "train.py"), "--run-dir", run_dir, "--quiet",
             "--set", f"data.source=npz:{data}", "--set", "train.epochs=2",
             "--set", "method.caco.warmup_epochs=1",
             "--set", "train.batch_size=64", "--set", "method.caco.bank_size=64",
             "--set", "model.projector_hidden=32", "--set", "model.embedding_dim=16",
             "--set", "evaluation.knn_monitor_every=0", "--set", "evaluation.health_images=0"],
            cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
        left = os.path.exists(run_dir)
    assert result.returncode == 74, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and not left
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(
        f"error: cannot write {run_dir}: its file system has ")
    assert " but the run's files need about " in errors[0]
    assert "(resume checkpoints 3 x " in errors[0] and "the SavedModel " in errors[0]
    assert errors[0].endswith("free space on its disk (or pass another --run-dir), then run "
                              "the same command to continue")


def test_a_run_that_exports_nothing_needs_room_for_its_checkpoints_alone(model):
    """``train.export: false`` (a comparison's runs): no model.keras or SavedModel is asked for."""
    exported, _ = run_folder.space_needed(model)
    bare, parts = run_folder.space_needed(model, exported=False)
    assert bare < exported and "resume checkpoints 3 x " in parts
    assert "model.keras" not in parts and "SavedModel" not in parts


def test_a_resume_that_cannot_continue_names_the_versions(model, tmp_path):
    import keras

    from caco_tf import __version__
    from caco_tf.methods.caco import CaCo
    from caco_tf.nets import backbones
    from caco_tf.training import callbacks
    from caco_tf.config import ConfigError

    folder = RunFolder(str(tmp_path))
    folder.write_backup(model, 1, 0, 3)
    path = os.path.join(folder.backup, "training_metadata.json")
    metadata = json.load(open(path))
    assert metadata["checkpoints"][0]["version"] == __version__
    metadata["checkpoints"][0]["version"] = "0.1.0"
    json.dump(metadata, open(path, "w"))
    other = CaCo(model.backbone, backbones.build_projector(4, hidden_dim=16, output_dim=6),
                 bank_size=int(model.memory_bank.rows.shape[0]) + 1)  # another shape
    other.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9))
    resume = callbacks.Resume(folder)
    resume.set_model(other)
    with pytest.raises(ConfigError, match=f"it was saved by caco-tf 0.1.0, this is "
                                          f"{__version__} \\(CHANGELOG.md\\)"):
        resume.on_train_begin()


def test_only_a_folder_holding_nothing_of_value_is_discarded(tmp_path):
    """What a run writes before its first save (config.yaml, skipped_files.txt, .lock, empty
    folders) is all a discarded folder may hold: a history, a checkpoint or a user's file
    keeps it."""
    folder = RunFolder(str(tmp_path / "run"))
    for kept in ("history.json", os.path.join("backup", "training_metadata.json"), "notes.txt"):
        os.makedirs(os.path.join(folder.path, "tensorboard"), exist_ok=True)
        for name in ("config.yaml", "skipped_files.txt", ".lock", kept):
            os.makedirs(os.path.dirname(os.path.join(folder.path, name)), exist_ok=True)
            open(os.path.join(folder.path, name), "w").close()
        assert not folder.discard_if_valueless()
        assert os.path.exists(os.path.join(folder.path, kept))
        os.remove(os.path.join(folder.path, kept))
        assert folder.discard_if_valueless() and not os.path.exists(folder.path)


@pytest.mark.parametrize("metadata, reason", [
    ([1, 2], "a JSON list, not an object"),
    ({"checkpoints": {}}, "'checkpoints' is not a list of checkpoints"),
    ({"checkpoints": [{"epoch": "3", "weights": "a.weights.h5"}]},
     "a checkpoint's 'epoch' is '3'"),
    ({"checkpoints": [{"epoch": 3}]}, "a checkpoint's 'weights' is None"),
    ({"checkpoints": [{"epoch": 3, "weights": "../../etc/x"}]}, "not a file name"),
    ({"checkpoints": [{"epoch": 3, "weights": "a", "metrics": {"loss": "x"}}]},
     "a checkpoint's metric 'loss' is 'x'"),
    ({"weights": "latest.weights.h5"}, "no 'epoch'"),
])
def test_training_metadata_of_the_wrong_shape_is_one_line(tmp_path, metadata, reason):
    """Valid JSON that is not what this library wrote: one line naming the file and what to
    do, never a traceback (every relaunch died the same way)."""
    folder = RunFolder(str(tmp_path))
    os.makedirs(folder.backup)
    path = os.path.join(folder.backup, "training_metadata.json")
    with open(path, "w") as handle:
        json.dump(metadata, handle)
    with pytest.raises(RunFolderError) as caught:
        folder.read_backup()
    assert str(caught.value).startswith(f"cannot read {path}: ")
    assert reason in str(caught.value) and "\n" not in str(caught.value)
    assert str(caught.value).endswith(f"restore it, or move {folder.backup} away to start the "
                                      f"run again")


def test_a_damaged_history_is_moved_aside_and_the_run_goes_on(tmp_path, caplog):
    from caco_tf.training.callbacks import HistoryJSON

    path = tmp_path / "history.json"
    for damaged in ('[{"epoch": 1, "loss": 2.5}, {"epo', '{"epoch": 1}', '[{"loss": 1}]'):
        path.write_text(damaged)
        history = HistoryJSON(str(path))
        with caplog.at_level(logging.WARNING, logger="caco_tf"):
            caplog.clear()
            history.on_train_begin()
            history.on_epoch_end(2, {"loss": 1.5})
        assert json.load(open(path)) == [{"epoch": 3, "loss": 1.5}]
        assert (tmp_path / "history.json.damaged").read_text() == damaged
        [warning] = [record.getMessage() for record in caplog.records]
        assert warning.startswith(f"warning: {path} is damaged (")
        assert warning.endswith(f"moved to {path}.damaged; the history goes on from the next "
                                f"epoch (the earlier epochs' figures are in TensorBoard)")


@pytest.mark.parametrize("text, reason", [
    ("train: {epochs: 4\nmodel: [", "not valid YAML: "),
    ("- a\n- b\n", "not a mapping of settings"),
    ("train: 3\n", "not a mapping of settings"),
])
def test_a_damaged_config_yaml_of_a_run_to_resume_is_one_line(model, tmp_path, text, reason):
    from caco_tf import pretrain
    from caco_tf.config import ConfigError, load_config

    folder = RunFolder(str(tmp_path))
    folder.write_backup(model, 1, 0, 3)
    with open(folder.config, "w") as handle:
        handle.write(text)
    with pytest.raises(ConfigError) as caught:
        pretrain.changes_since_backup(folder, load_config())
    assert str(caught.value) == (
        f"cannot read {folder.config} ({reason}{str(caught.value).split(reason)[1].split(')')[0]}"
        f"): it records the settings the checkpoint in {folder.backup} was trained with; "
        f"restore it, or delete it to resume with this command's settings")
    os.remove(folder.config)  # what the line says to do
    assert pretrain.changes_since_backup(folder, load_config()) == []


def test_figures_name_a_damaged_history(tmp_path):
    from caco_tf.errors import UserError
    from caco_tf.evaluation import figures

    (tmp_path / "history.json").write_text('[{"epoch": 1, "lo')
    with pytest.raises(UserError, match=r"cannot read .*history.json: not valid JSON \(.*\); "
                                        r"restore it, or move it away"):
        figures.read_history(str(tmp_path))


@pytest.mark.parametrize("assignment, change", [
    ("method.name=simclr", "method.name: 'caco' -> 'simclr'"),
    ("model.backbone=cifar_resnet18", "model.backbone: 'small_convnet' -> 'cifar_resnet18'"),
    ("model.widths=[8,8,8,8]", "model.widths: None -> [8, 8, 8, 8]"),
    ("model.embedding_dim=64", "model.embedding_dim: 128 -> 64"),
    ("method.caco.bank_size=512", "method.caco.bank_size: 1024 -> 512"),
    ("method.byol.predictor_hidden=64", "method.byol.predictor_hidden: 512 -> 64"),
])
def test_a_resume_that_changes_what_is_trained_is_refused_naming_the_setting(
        tmp_path, assignment, change):
    """Even with train.on_schedule_change=rescale: a CaCo checkpoint does not become SimCLR."""
    from caco_tf import pretrain
    from caco_tf.config import ConfigError, load_config

    config = load_config("mnist", [assignment, "train.on_schedule_change=rescale"])
    point = run_folder.ResumePoint(3, 0, "w", 250, {}, 750, "0.3.0")
    changes = pretrain.changed_settings(load_config("mnist"), config)
    assert change in changes
    with pytest.raises(ConfigError) as caught:
        pretrain.check_plan(config, str(tmp_path), point, changes, 250)
    assert str(caught.value) == (
        f"cannot resume {tmp_path} at epoch 3: {change} would change what is trained (its "
        f"checkpoint holds what the settings it was trained with built); re-run with those "
        f"settings, or pass another --run-dir to train anew")


def test_a_resume_with_other_changed_settings_says_what_changed():
    from caco_tf import pretrain

    point = run_folder.ResumePoint(3, 20, "w", 250, {}, 770, "0.3.0")
    changes = ["train.precision: 'float32' -> 'mixed_bfloat16'"]
    pretrain.check_plan({"train": {"on_schedule_change": "refuse"}}, "RUN", point, changes, 250)
    assert pretrain.resumed_with("RUN", point, changes) == (
        "resuming RUN at epoch 4, step 20 with changed settings: train.precision: 'float32' -> "
        "'mixed_bfloat16'")


def test_the_epoch_checkpoint_is_the_resume_checkpoint_written_once(model, tmp_path):
    """At an epoch's end the weights checkpoint is a hard link of the resume checkpoint just
    written (the same bytes: written once, not twice); it outlives that checkpoint's removal,
    and where the resume checkpoint is of another point it is written on its own."""
    from caco_tf.training import callbacks

    folder = RunFolder(str(tmp_path))
    checkpoint = callbacks.Checkpoint(folder.checkpoint, folder)
    checkpoint.set_model(model)
    model.stop_reason = None
    model.optimizer.iterations.assign(30)
    folder.write_backup(model, 2, 0, 15)
    checkpoint.on_epoch_end(1)
    newest = folder.read_backup().weights
    assert os.path.samefile(folder.checkpoint, newest)
    expected = run_folder.weight_arrays(newest)
    for step in (31, 32):  # two newer resume checkpoints: the linked one is removed
        model.optimizer.iterations.assign(step)
        folder.write_backup(model, 2, step - 30, 15)
    assert not os.path.exists(newest)
    assert run_folder.weight_arrays(folder.checkpoint).keys() == expected.keys()
    checkpoint.on_epoch_end(2)  # the newest resume point is inside epoch 3: written anew
    assert not os.path.samefile(folder.checkpoint, folder.read_backup().weights)
    assert os.stat(folder.checkpoint).st_nlink == 1
