"""train.py end to end: a short run, resuming after a kill as if never interrupted, refusing
schedule or shape changes on resume, and the export command on a finished run (bad inputs:
tests/test_bad_input.py)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml

from caco_tf.training import optimizers
from caco_tf.training.callbacks import is_wall_clock
from caco_tf.training.run_folder import weight_arrays

import launch
from tiny_run import offline_digits


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 4  # 256 images / batch 64


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    """256 real digits from the offline set, as an .npz (images and labels)."""
    return offline_digits(tmp_path_factory.mktemp("data"), 256, 0)[0]


def small_config(tmp_path, data_path, epochs=4):
    config = {
        "name": "tiny",
        "data": {"source": f"npz:{data_path}"},
        "model": {"projector_hidden": 64, "embedding_dim": 32, "widths": [8, 16, 32, 64]},
        "method": {"caco": {"bank_size": 128, "bank_lr": 0.3, "temperature": 0.1,
                            "bank_temperature": 0.1}},
        "train": {"epochs": epochs, "batch_size": 64, "lr_warmup_epochs": 1},
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def train(*args, **kwargs):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    return launch.run([sys.executable, os.path.join(ROOT, "train.py"), *args], cwd=ROOT,
                      env=env, capture_output=True, text=True, timeout=300, **kwargs)


def _epochs_done(run_dir):
    path = os.path.join(run_dir, "history.json")
    if not os.path.exists(path):
        return 0
    try:
        with open(path) as handle:
            return len(json.load(handle))
    except ValueError:
        return 0


@pytest.fixture(scope="module")
def finished_run(small_data, tmp_path_factory):
    """A finished, uninterrupted 4-epoch run: (its config file, its run folder)."""
    folder = tmp_path_factory.mktemp("finished")
    config = small_config(folder, small_data)
    run_dir = str(folder / "run")
    result = train("--config", config, "--run-dir", run_dir, "--quiet")
    assert result.returncode == 0, result.stderr[-2000:]
    return config, run_dir


def assert_same_run(run_dir, reference_dir):
    """The two runs' histories (but wall-clock figures) and final weights, bank, bank momentum
    and optimizer state are equal bit for bit."""
    history = json.load(open(os.path.join(run_dir, "history.json")))
    reference = json.load(open(os.path.join(reference_dir, "history.json")))
    strip = [{k: v for k, v in row.items() if not is_wall_clock(k)} for row in history]
    assert strip == [{k: v for k, v in row.items() if not is_wall_clock(k)} for row in reference]
    resumed = weight_arrays(os.path.join(run_dir, "checkpoints", "last.weights.h5"))
    uninterrupted = weight_arrays(os.path.join(reference_dir, "checkpoints", "last.weights.h5"))
    assert resumed.keys() == uninterrupted.keys()
    bank = "layers/memory_bank/vars/"
    assert resumed[bank + "0"].shape == resumed[bank + "1"].shape == (128, 32)  # and momentum
    for name in uninterrupted:
        np.testing.assert_array_equal(resumed[name], uninterrupted[name], err_msg=name)


# SIGTERM and SIGHUP through the same command: tests/test_long_run_faults.py (a closed
# terminal), tests/test_distributed.py (a preempted worker).
@pytest.mark.parametrize("name,status,per_call", [("INT", 130, 2)])
@pytest.mark.slow
def test_a_signal_saves_inside_the_epoch_and_the_run_goes_on_bit_for_bit(
        small_data, finished_run, tmp_path, name, status, per_call):
    """SIGINT (Ctrl-C) after step 6, inside epoch 2, the stopped run taking 2 steps per
    compiled call (train.steps_per_execution): the step ends, the state is saved with the
    stream's position, one line says so, the exit status is 128 + the signal; the same
    command, one step per call, then ends as the uninterrupted run, bit for bit."""
    config = small_config(tmp_path, small_data)
    run_dir = str(tmp_path / "run")
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    stopped = launch.run([sys.executable, os.path.join(ROOT, "tests", "stop_at_step.py"),
                          "6", name, "--config", config, "--run-dir", run_dir, "--quiet",
                          "--set", f"train.steps_per_execution={per_call}"],
                         cwd=str(tmp_path), env=env, capture_output=True, text=True,
                         timeout=300)
    assert stopped.returncode == status, stopped.stderr[-2000:]
    assert "Traceback" not in stopped.stderr
    assert stopped.stderr.splitlines()[-1] == (
        f"stopped by SIG{name} at epoch 2, step 2 of {STEPS} (global step 6); saved in "
        f"{os.path.join(run_dir, 'backup')}; run the same command to continue")
    metadata = json.load(open(os.path.join(run_dir, "backup", "training_metadata.json")))
    newest = metadata["checkpoints"][0]
    assert (newest["epoch"], newest["step"], newest["iterations"]) == (1, 2, 6)
    assert len(json.load(open(os.path.join(run_dir, "history.json")))) == 1

    resumed = train("--config", config, "--run-dir", run_dir, "--quiet")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_same_run(run_dir, finished_run[1])


@pytest.mark.slow
def test_a_hard_kill_loses_at_most_the_time_since_the_last_periodic_save(
        small_data, finished_run, tmp_path):
    """With saves every 0.6 s inside the epochs, SIGKILL once a mid-epoch save exists after
    epoch 1: the same command resumes inside the epoch and ends with the uninterrupted run's
    weights, bank, bank momentum, optimizer state and history, bit for bit (one machine, same
    seed)."""
    config = small_config(tmp_path, small_data)
    run_dir = str(tmp_path / "run")
    every = ["--set", "train.checkpoint_every_minutes=0.01"]
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    # Slowed a little (40 ms a step) so that several periodic saves fall inside epochs.
    process = launch.Popen(
        [sys.executable, "-c", "import sys, time; sys.argv[0] = 'train.py';"
         "from caco_tf.training import callbacks as c; end = c.Throughput.on_train_batch_end;"
         "c.Throughput.on_train_batch_end = "
         "lambda s, b, logs=None: (time.sleep(0.04), end(s, b, logs));"
         "from caco_tf.cli import train; sys.exit(train.main(sys.argv[1:]))",
         "--config", config, "--run-dir", run_dir, "--quiet", *every],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metadata = os.path.join(run_dir, "backup", "training_metadata.json")
    deadline = time.time() + 240
    newest = None
    while process.poll() is None and time.time() < deadline:
        try:
            newest = json.load(open(metadata))["checkpoints"][0]
        except (OSError, ValueError, KeyError):
            newest = None
        if newest and newest["step"] > 0 and newest["epoch"] >= 1:
            break
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert newest and newest["step"] > 0, "no mid-epoch save before the kill"
    saved_epoch = newest["epoch"]  # whole epochs before the save
    before = json.load(open(os.path.join(run_dir, "history.json")))

    resumed = train("--config", config, "--run-dir", run_dir, *every)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    # It went on from the save, inside the epoch it stopped in: no epoch was trained again.
    epochs_run = [line for line in resumed.stdout.splitlines() if line.startswith("Epoch ")]
    assert epochs_run[0] == f"Epoch {saved_epoch + 1}/4"
    history = json.load(open(os.path.join(run_dir, "history.json")))
    assert [row["epoch"] for row in history] == [1, 2, 3, 4]
    assert history[:saved_epoch] == before[:saved_epoch]
    # The optimizer's step counter came back too: the last epoch's mean learning rate is the
    # schedule's over steps 12..15, not over a restarted 0..3.
    schedule = optimizers.WarmupCosine(0.03 * 64 / 256, 4 * STEPS, STEPS)
    expected_lr = np.mean([float(schedule(step)) for step in range(3 * STEPS, 4 * STEPS)])
    assert history[3]["lr"] == pytest.approx(expected_lr, rel=1e-4)
    assert history[3]["bank_lr"] > 0  # past the warm-up epoch: the CaCo phase

    # Against the run that was never interrupted: the same images, order and views were seen.
    assert_same_run(run_dir, finished_run[1])
    assert "run folder: " + os.path.abspath(run_dir) in resumed.stdout
    assert os.path.exists(os.path.join(run_dir, "saved_model", "backbone", "1",
                                       "saved_model.pb"))


@pytest.mark.slow
def test_a_resume_refuses_new_schedules_unless_told_to_rescale(finished_run, tmp_path):
    config, finished = finished_run
    run_dir = str(tmp_path / "run")
    shutil.copytree(finished, run_dir)
    refused = train("--config", config, "--run-dir", run_dir, "--quiet",
                    "--set", "train.epochs=5")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    error = [line for line in refused.stderr.splitlines() if line.startswith("error: ")]
    assert error == [f"error: cannot resume {run_dir} at epoch 4: train.epochs: 4 -> 5 would "
                     f"change the schedules of the run in progress; re-run with the settings "
                     f"it was trained with, or add --set train.on_schedule_change=rescale to "
                     f"re-plan the rest of the run over the new length"]
    rescaled = train("--config", config, "--run-dir", run_dir, "--quiet",
                     "--set", "train.epochs=5", "--set", "train.on_schedule_change=rescale")
    assert rescaled.returncode == 0, rescaled.stderr[-2000:]
    history = json.load(open(os.path.join(run_dir, "history.json")))
    assert [row["epoch"] for row in history] == [1, 2, 3, 4, 5]
    # Epoch 5 follows the new plan: the cosine over 5 epochs, at steps 16..19.
    schedule = optimizers.WarmupCosine(0.03 * 64 / 256, 5 * STEPS, STEPS)
    expected_lr = np.mean([float(schedule(step)) for step in range(4 * STEPS, 5 * STEPS)])
    assert history[4]["lr"] == pytest.approx(expected_lr, rel=1e-4)


@pytest.mark.slow
def test_resuming_with_a_differently_shaped_model_is_a_one_line_error(finished_run):
    config, run_dir = finished_run
    saved_config = open(os.path.join(run_dir, "config.yaml")).read()
    # The online probe adds layers the backup does not hold.
    result = train("--config", config, "--run-dir", run_dir, "--quiet",
                   "--set", "evaluation.online_probe=true", "--set", "train.epochs=5",
                   "--set", "train.on_schedule_change=rescale")
    assert result.returncode == 2
    error = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and "Traceback" not in result.stderr
    assert "cannot resume from " + os.path.join(run_dir, "backup") in error[0]
    assert ("settings changed since it was saved: evaluation.online_probe: False -> True, "
            "train.epochs: 4 -> 5, train.on_schedule_change: 'refuse' -> 'rescale'.") in error[0]
    # The run folder still describes the backup, so evaluation and export keep working.
    assert open(os.path.join(run_dir, "config.yaml")).read() == saved_config


@pytest.mark.slow
def test_export_entry_point_rebuilds_the_run(finished_run, tmp_path):
    _, run_dir = finished_run
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    result = launch.run([sys.executable, "export/export_saved_model.py", "--run", run_dir,
                         "--out", str(tmp_path / "served"), "--serving-version", "7"], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert os.path.exists(tmp_path / "served" / "backbone" / "7" / "saved_model.pb")
    missing = launch.run([sys.executable, "export/export_saved_model.py", "--run",
                          str(tmp_path / "nothing")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2 and "error: no config.yaml in " in missing.stderr


def test_the_progress_bar_shows_the_short_list_only(capsys):
    from caco_tf.training.callbacks import ProgressBar

    bar = ProgressBar()
    bar.set_params({"epochs": 1, "steps": 2, "verbose": 1})
    logs = {"loss": 1.5, "mpp_prob": 0.25, "alignment": 0.75, "bank_norm": 3.0}
    bar.on_train_begin()
    bar.on_epoch_begin(0)
    for step in range(2):
        bar.on_train_batch_end(step, dict(logs))
    bar.on_epoch_end(0, dict(logs))
    shown = capsys.readouterr().out
    assert "loss: 1.5" in shown and "mpp_prob: 0.25" in shown
    assert "alignment" not in shown and "bank_norm" not in shown
