"""Distribution: one device == two mirrored replicas, mixed precision, XLA, and a multi-worker
run on two local processes that loses a worker and resumes."""

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from caco_tf.training import distribute
from caco_tf.config import ConfigError
from test_model import BATCH, one_batch_dataset, tiny_caco, views
import launch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.lru_cache(maxsize=None)
def _mirrored(replicas=2):
    """One MirroredStrategy per replica count for the whole session: a second strategy over the
    same devices in one process restarts the collective instance keys and collides with the
    first's.  Strategies of different sizes get group keys of their own (as TensorFlow's own
    tests do, strategy_combinations.py), or the second meets the first's groups."""
    _MirroredStrategy._collective_key_base += 100000
    return _MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")[:replicas]])


_MirroredStrategy = tf.distribute.MirroredStrategy  # the class, whatever a test patches


def _cpus(replicas):
    if len(tf.config.list_logical_devices("CPU")) < replicas:
        pytest.skip(f"needs {replicas} logical CPU devices (set up in conftest before TF starts)")
    return _mirrored(replicas)


def _two_cpus():
    return _cpus(2)


def _assert_close(actual, expected, what):
    """Equal to 1e-5 relative to the array's scale (elementwise rtol fails on near-zeros), and
    to 1e-7 for an array all near 0 (a bias BatchNorm cancels: float32 noise of 1e-8)."""
    expected = np.asarray(expected)
    scale = max(float(np.abs(expected).max()), 1e-2)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5 * scale, err_msg=what)


@pytest.mark.slow
def test_two_replicas_equal_one_device():
    strategy = _two_cpus()
    # Global batch 2·BATCH, split over the replicas; 2 warm-up steps fill the 32-row bank
    # (the gather order matters) before 3 CaCo steps.
    batches = [views(seed, batch=2 * BATCH) for seed in range(5)]
    dataset = tf.data.Dataset.from_tensor_slices(
        (np.stack([b[0] for b in batches]), np.stack([b[1] for b in batches])))
    warmup = 2

    single = tiny_caco(sync=True, warmup_steps=warmup)
    single_history = single.fit(dataset, epochs=1, verbose=0)
    with strategy.scope():
        mirrored = tiny_caco(sync=True, warmup_steps=warmup)
    mirrored_history = mirrored.fit(dataset, epochs=1, verbose=0)

    assert mirrored.distribute_strategy.num_replicas_in_sync == 2
    copies = [v.numpy() for v in mirrored.memory_bank.rows.value.values]
    np.testing.assert_array_equal(copies[0], copies[1])  # every replica holds the same bank
    _assert_close(copies[0], single.memory_bank.rows.numpy(), "bank")
    _assert_close(mirrored.memory_bank.velocity.numpy(), single.memory_bank.velocity.numpy(),
                  "bank velocity")
    for a, b in zip(single.query_encoder.weights + single.key_encoder.weights,
                    mirrored.query_encoder.weights + mirrored.key_encoder.weights):
        _assert_close(b.numpy(), a.numpy(), a.path)
    for name in ("loss", "contrast_top1", "mpp_prob"):
        assert mirrored_history.history[name][0] == pytest.approx(
            single_history.history[name][0], rel=1e-5), name


@pytest.mark.parametrize("policy", [pytest.param("mixed_float16", marks=pytest.mark.slow),
                                    "mixed_bfloat16"])
def test_mixed_precision_keeps_the_bank_and_loss_in_float32(policy):
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        model = tiny_caco()
        history = model.fit(one_batch_dataset(*views()).repeat(3), epochs=1, verbose=0)
    finally:
        keras.config.set_dtype_policy(previous)
    assert model.query_encoder.layers[1].compute_dtype in ("float16", "bfloat16")
    assert (model.memory_bank.rows.dtype == "float32"
            and model.memory_bank.velocity.dtype == "float32")
    assert model.query_encoder.output.dtype == "float32"  # embeddings → logits → softmax → loss
    assert np.isfinite(history.history["loss"]).all()
    assert np.abs(model.memory_bank.velocity.numpy()).max() > 0  # the bank did take its step
    if policy == "mixed_float16":  # float16 gradients underflow without loss scaling
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)


@pytest.mark.slow
def test_xla_train_step_matches_the_plain_step():
    dataset = one_batch_dataset(*views()).repeat(2)
    plain = tiny_caco()
    plain.fit(dataset, epochs=1, verbose=0)
    compiled = tiny_caco()
    compiled.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), jit_compile=True)
    compiled.fit(dataset, epochs=1, verbose=0)
    np.testing.assert_allclose(compiled.memory_bank.rows.numpy(), plain.memory_bank.rows.numpy(),
                               rtol=1e-4, atol=1e-5)


def test_make_strategy_names(monkeypatch):
    assert distribute.make_strategy("default") is tf.distribute.get_strategy()
    built = []
    monkeypatch.setattr(tf.distribute, "MirroredStrategy", lambda devices: built.append(devices))
    distribute.make_strategy("mirrored")  # every GPU, else every logical CPU device
    devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
    assert built == [[d.name for d in devices]]
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ConfigError, match="TF_CONFIG"):
        distribute.make_strategy("multiworker")
    assert distribute.is_chief(_mirrored()) and not distribute.is_multi_worker(_mirrored())


# ---------------------------------------------------------------------- two worker processes
def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _patience():
    """How many times slower than when quiet this machine runs now: 1 + the load per core
    (the 1-minute load average or a 0.5 s sample of the busy time, whichever is higher), at
    most 6.  The multi-worker tests' timeouts scale with it: a worker that compiles its first
    step late on a busy machine must not look lost, and a quiet machine waits no longer."""
    def times():
        with open("/proc/stat") as handle:
            fields = [int(value) for value in handle.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # all, idle (and waiting for I/O)

    cores = os.cpu_count() or 1
    try:
        total, idle = times()
        time.sleep(0.5)
        total2, idle2 = times()
        busy = cores * (1 - (idle2 - idle) / max(total2 - total, 1))
    except OSError:
        busy = 0.0
    return min(6.0, 1.0 + max(os.getloadavg()[0], busy) / cores)


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """896 offline digits for training (7 steps of 128 an epoch) and 256 held out, as .npz
    files: the worker processes' data, a quarter of the offline default's steps' work."""
    from tiny_run import offline_digits
    return offline_digits(tmp_path_factory.mktemp("digits"), 896, 256)


def _launch(index, ports, run_dir, log_dir, attempt, digits, *extra, script=("train.py",)):
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", PYTHONPATH=REPO,
               TF_CONFIG=json.dumps({"cluster": cluster,
                                     "task": {"type": "worker", "index": index}}))
    log = open(os.path.join(log_dir, f"worker{index}-{attempt}.log"), "w")
    command = [sys.executable, os.path.join(REPO, script[0]), *script[1:], "--strategy",
               "multiworker",
               "--set", f"data.source=npz:{digits[0]}", "--set", f"data.held_out=npz:{digits[1]}",
               "--set", "train.epochs=2", "--set", "method.caco.warmup_epochs=1",
               "--set", "train.batch_size=128", "--set", "method.caco.bank_size=256",
               "--set", "model.widths=[8,16,32,64]", "--set", "model.projector_hidden=64",
               "--set", "train.jit_compile=false", "--set", "train.steps_per_execution=1",
               "--run-dir", run_dir, "--quiet", *extra]
    return launch.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                        start_new_session=True)


def _epochs_logged(run_dir):
    try:
        with open(os.path.join(run_dir, "history.json")) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return []


def _wait(process, timeout):
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.wait()


def _newest_save(run_dir):
    with open(os.path.join(run_dir, "backup", "training_metadata.json")) as handle:
        return json.load(handle)["checkpoints"][0]


@pytest.mark.slow
def test_multiworker_run_survives_a_signal_to_one_worker(tmp_path, digits):
    """Two local workers train 2 epochs of offline digits.  SIGTERM to worker 1 alone in
    epoch 2: both workers save the same step (the chief writes) and exit with 143; relaunched
    (with train.steps_per_execution 3), the run finishes from that save.  (A worker lost for
    good: the next test.)"""
    run_dir, logs = str(tmp_path / "run"), str(tmp_path)
    ports = _free_ports(2)
    workers = [_launch(i, ports, run_dir, logs, 1, digits) for i in range(2)]
    deadline = time.time() + 240
    while not _epochs_logged(run_dir) and time.time() < deadline:
        assert all(w.poll() is None for w in workers), open(f"{logs}/worker0-1.log").read()[-3000:]
        time.sleep(0.2)
    first = _epochs_logged(run_dir)
    assert [row["epoch"] for row in first] == [1], "epoch 1 never finished"
    time.sleep(1)  # into epoch 2 (7 steps an epoch), whose new phase compiles first
    workers[1].send_signal(signal.SIGTERM)  # a preemption of the non-chief worker only
    codes = [_wait(w, 60) for w in workers]
    chief_log = open(f"{logs}/worker0-1.log").read()
    assert codes == [143, 143], chief_log[-3000:]
    saved = _newest_save(run_dir)
    # The step the signal followed: inside epoch 2, or its start if the epoch's end was slow.
    assert saved["epoch"] == 1 and saved["iterations"] == 7 + saved["step"], saved
    assert f"(global step {saved['iterations']}); saved in" in chief_log
    assert f"(global step {saved['iterations']}); the chief saved it" in open(
        f"{logs}/worker1-1.log").read()

    # Relaunched with 3 steps per compiled call: the calls realign on the saved step.
    workers = [_launch(i, ports, run_dir, logs, 2, digits, "--set", "train.steps_per_execution=3")
               for i in range(2)]
    codes = [_wait(w, 240) for w in workers]
    assert codes == [0, 0], open(f"{logs}/worker0-2.log").read()[-3000:]

    history = _epochs_logged(run_dir)
    assert [row["epoch"] for row in history] == [1, 2]
    assert history[0] == first[0]  # epoch 1 was restored, not redone
    assert _newest_save(run_dir)["epoch"] == 2
    with open(os.path.join(run_dir, "backup", "training_metadata.json")) as handle:
        decided = json.load(handle)["decided"]  # one decision for both workers, recorded
    assert decided["xla"] is False and decided["precision"] in ("float32", "mixed_bfloat16")
    with open(os.path.join(run_dir, "results.json")) as handle:
        results = json.load(handle)
    assert results["replicas"] == 2 and results["knn_top1"] > 50.0
    # Only the chief wrote, and only into the run folder's known places.
    assert sorted(os.listdir(run_dir)) == [".lock", "backup", "checkpoints", "config.yaml",
                                           "history.json", "model.keras", "results.json",
                                           "saved_model", "skipped_files.txt", "tensorboard"]
    assert os.path.isdir(os.path.join(run_dir, "saved_model", "backbone", "1"))
    with open(os.path.join(logs, "worker1-2.log")) as handle:
        assert "run folder:" not in handle.read()  # the chief alone reports


def _logs(logs):
    return "\n".join(open(os.path.join(logs, name)).read()[-2000:]
                     for name in sorted(os.listdir(logs)) if name.endswith(".log"))


def _one_line_and_75(code, log, waited, timeout):
    """Worker 0 ended with exit status 75 and one error line naming worker 1, in about the
    timeout (and the watchdog's reading of its peers), with no traceback; the line."""
    assert code == 75, log[-3000:]
    assert waited < 3 * timeout + 60 and "Traceback" not in log, log[-3000:]
    errors = [line for line in log.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: worker task 1 is not answering: "), \
        errors
    assert errors[0].endswith("relaunch every worker with the same command: the run resumes "
                              "from its last save")
    return errors[0]


@pytest.mark.slow
def test_no_worker_waits_forever_for_a_stopped_peer(tmp_path, digits):
    """Worker 1 is paused (SIGSTOP) in epoch 2: worker 0 does not wait for ever; it ends with
    one line naming the step and worker 1, exit status 75, so a scheduler can relaunch."""
    run_dir, logs = str(tmp_path / "run"), str(tmp_path)
    ports = _free_ports(2)
    timeout = round(10 * _patience())
    workers = [_launch(i, ports, run_dir, logs, 1, digits, "--set",
                       f"distribute.collective_timeout_seconds={timeout}") for i in range(2)]
    try:
        deadline = time.time() + 60 + 18 * timeout
        while not _epochs_logged(run_dir) and time.time() < deadline:
            assert all(w.poll() is None for w in workers), _logs(logs)
            time.sleep(0.2)
        assert _epochs_logged(run_dir), "epoch 1 never finished: " + _logs(logs)
        workers[1].send_signal(signal.SIGSTOP)
        stopped = time.time()
        code = _wait(workers[0], 60 + 6 * timeout)
        waited = time.time() - stopped
    finally:
        os.killpg(workers[1].pid, signal.SIGKILL)
        _wait(workers[1], 10)
    line = _one_line_and_75(code, open(f"{logs}/worker0-1.log").read(), waited, timeout)
    # In a step, or at epoch 1's end or epoch 2's start if worker 0 had not begun its step.
    assert line.startswith(tuple(
        "error: worker task 1 is not answering: " + where
        for where in ("global step ", "the end of epoch 1 ", "the start of epoch 2 "))), line


@pytest.mark.slow
def test_a_peer_lost_during_the_epoch_end_evaluation_is_one_line(tmp_path, digits):
    """Worker 1 pauses itself (SIGSTOP) as the kNN monitor starts at the end of epoch 1, whose
    feature gathers are collectives: worker 0 ends within the timeout with one line naming
    worker 1 and the epoch's end, exit status 75."""
    run_dir, logs = str(tmp_path / "run"), str(tmp_path)
    ports = _free_ports(2)
    timeout = round(10 * _patience())
    extra = ["--set", f"distribute.collective_timeout_seconds={timeout}",
             "--set", "evaluation.knn_monitor_every=1"]
    note = str(tmp_path / "stopped-at")
    workers = [_launch(0, ports, run_dir, logs, 1, digits, *extra),
               _launch(1, ports, run_dir, logs, 1, digits, *extra,
                       script=("tests/stop_in_evaluation.py", note))]
    try:
        code = _wait(workers[0], 60 + 24 * timeout)
        waited = time.time() - float(open(note).read())
    finally:
        os.killpg(workers[1].pid, signal.SIGKILL)
        _wait(workers[1], 10)
    line = _one_line_and_75(code, open(f"{logs}/worker0-1.log").read(), waited, timeout)
    assert line.startswith("error: worker task 1 is not answering: the end of epoch 1 (after "
                           "global step 7) "), line
    assert not _epochs_logged(run_dir)  # it stopped inside epoch 1's end


def test_xla_is_kept_on_one_device_and_dropped_across_cpu_replicas(caplog):
    from caco_tf.build import use_xla
    assert use_xla(True, 1) is True and use_xla(False, 2) is False
    if tf.config.list_physical_devices("GPU"):  # conftest hides them; a run that shows them
        assert use_xla(True, 2) is True         # keeps XLA across GPU replicas
        return
    assert use_xla(True, 2) is False
    assert "no collectives across CPU replicas" in caplog.text


def test_a_lost_peer_is_named_from_the_coordination_service_or_the_watchdog(monkeypatch):
    from caco_tf.training import peers

    heartbeats = tf.errors.UnavailableError(None, None, (
        "Collective ops is aborted by: Error reported from /job:worker/task:0: The following "
        "tasks are unhealthy (stopped sending heartbeats):\n/job:worker/replica:0/task:2\nThe "
        "tasks have crashed."))
    assert str(peers.peer_error(heartbeats, 41)) == (
        "worker task 2 is not answering: global step 42 could not finish (its heartbeats "
        "stopped); relaunch every worker with the same command: the run resumes from its last "
        "save")
    assert peers.peer_error(tf.errors.InvalidArgumentError(None, None, "a bug"), 1) is None

    watchdog = peers.StuckPeerWatchdog(10, ("worker", 0), [("worker", i) for i in range(4)],
                                       exit=lambda status: None)
    watchdog._step = 100
    snapshots = iter([{("worker", 1): (5, 100, "step"), ("worker", 2): (7, 100, "step"),
                       ("worker", 3): (9, 99, "step")},
                      {("worker", 1): (5, 100, "step"), ("worker", 2): (8, 100, "input"),
                       ("worker", 3): (10, 99, "step")}])
    monkeypatch.setattr(watchdog, "_read", lambda: next(snapshots))
    monkeypatch.setattr(peers, "PUBLISH_EVERY", 0.0)
    assert watchdog.behind() == ("worker task 1 is not answering, worker task 2 is waiting for "
                                 "its input data, worker task 3 is behind, at step 99")
    deadline = tf.errors.DeadlineExceededError(None, None, "Collective ... /job:worker/task:0")
    monkeypatch.setattr(watchdog, "behind", lambda: "worker task 3 is behind, at step 99")
    assert str(peers.peer_error(deadline, 100, watchdog)).startswith(
        "worker task 3 is behind, at step 99: global step 101 could not finish (a collective "
        "waited longer than distribute.collective_timeout_seconds)")


def test_the_watchdog_names_where_the_run_stands():
    from types import SimpleNamespace

    from caco_tf.training import peers

    watchdog = peers.StuckPeerWatchdog(10, ("worker", 0), [("worker", 0), ("worker", 1)])
    watchdog.set_model(SimpleNamespace(optimizer=SimpleNamespace(iterations=tf.Variable(7))))
    watchdog.params = {"steps": 7}
    phases = [(watchdog.on_epoch_begin, 0, "the start of epoch 1 (after global step 0)"),
              (watchdog.on_train_batch_begin, 0, "global step 1"),
              (watchdog.on_train_batch_end, 6, "the end of epoch 1 (after global step 7)"),
              (watchdog.on_epoch_end, 0, "the end of epoch 1 (after global step 7)"),
              (watchdog.on_epoch_begin, 1, "the start of epoch 2 (after global step 7)"),
              (watchdog.on_train_batch_begin, 0, "global step 8")]
    for callback, index, where in phases:
        callback(index)
        assert watchdog.where() == where, callback.__name__


@pytest.mark.slow
def test_the_watchdog_times_every_phase_and_a_long_pass_by_its_batches(monkeypatch, capfd):
    """Between steps (the epoch's end) and in a named phase after training, a wait longer than
    the timeout ends the worker with one line saying where the run stood; a pass that marks
    its progress batch by batch (``peers.ticking``) is timed batch by batch."""
    from types import SimpleNamespace

    from caco_tf.training import peers

    ended = []
    watchdog = peers.StuckPeerWatchdog(1.5, ("worker", 0), [("worker", 0), ("worker", 1)],
                                       exit=ended.append)
    monkeypatch.setattr(watchdog, "behind", lambda: "worker task 1 is not answering")
    monkeypatch.setattr(watchdog, "_publish", lambda: None)
    watchdog.set_model(SimpleNamespace(optimizer=SimpleNamespace(iterations=tf.Variable(7))))
    watchdog.params = {"steps": 7}
    watchdog.on_train_begin()
    watchdog.on_epoch_begin(0)
    watchdog.on_train_batch_begin(6)
    watchdog.on_train_batch_end(6)  # the epoch's last step: its end's collectives follow
    for _ in peers.ticking(range(4)):  # a pass of 4 batches of 1 s each: never 1.5 s idle
        time.sleep(1.0)
    assert ended == []
    deadline = time.time() + 10
    while not ended and time.time() < deadline:
        time.sleep(0.1)
    assert ended == [75]
    assert capfd.readouterr().err.splitlines()[-1] == (
        "error: worker task 1 is not answering: the end of epoch 1 (after global step 7) has "
        "waited more than 1.5 s (distribute.collective_timeout_seconds); relaunch every worker "
        "with the same command: the run resumes from its last save")
    watchdog.close()
    with watchdog.watching("the end-of-run kNN evaluation"):
        while len(ended) < 2 and time.time() < deadline + 10:
            time.sleep(0.1)
    assert ended == [75, 75] and capfd.readouterr().err.splitlines()[-1].startswith(
        "error: worker task 1 is not answering: the end-of-run kNN evaluation (after global "
        "step 7) has waited more than 1.5 s")


def test_keras_clipping_on_several_replicas_is_refused_in_one_line():
    from tiny_methods import tiny

    with _two_cpus().scope():
        with pytest.raises(ValueError, match="^optimizer clipnorm on 2 replicas clips each "
                                             "replica's share of the gradient"):
            tiny("byol", optimizer=lambda: keras.optimizers.SGD(0.1, clipnorm=1.0))
    tiny("byol", optimizer=lambda: keras.optimizers.SGD(0.1, clipnorm=1.0))  # one: exact
