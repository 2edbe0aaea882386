"""data.service: the pre-training pipeline on tf.data service, with a dispatcher and two
workers on 127.0.0.1 (``caco-data-service`` processes)."""

import gc
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from caco_tf.run_settings import RunSettings
from caco_tf import data
from caco_tf.data import augment, service
from caco_tf.data.sources import folder_source
from caco_tf.config import ConfigError, load_config
import launch


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH, STEPS = 4, 3


def start_cluster(logs, workers=2):
    """``caco-data-service`` processes on 127.0.0.1, standard error to files in ``logs`` (a
    full pipe would block them): (the dispatcher's address, the processes, their lines)."""
    from caco_tf.cli.data_service import free_port

    env = dict(os.environ, PYTHONPATH=ROOT, CUDA_VISIBLE_DEVICES="")
    port, processes, lines = free_port(), [], []

    def start(*args):
        with open(os.path.join(logs, f"{args[0]}-{len(processes)}.log"), "w") as log:
            processes.append(launch.Popen(
                [sys.executable, "-m", "caco_tf.cli.data_service", *args],
                stdout=subprocess.PIPE, stderr=log, text=True, env=env,
                start_new_session=True))

    start("dispatcher", "--port", str(port))
    lines.append(processes[0].stdout.readline().strip())  # the workers look for it at once
    for _ in range(workers):
        start("worker", "--dispatcher", f"127.0.0.1:{port}", "--port", "0", "--host",
              "127.0.0.1")
    lines += [process.stdout.readline().strip() for process in processes[1:]]
    return f"127.0.0.1:{port}", processes, lines


def stop_cluster(processes):
    gc.collect()  # the iterators go while the service is there to answer them
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0
        process.stdout.close()


@pytest.fixture
def views_without_xla(monkeypatch):
    """The colour views as TF kernels: each service worker compiles a job's XLA views anew
    (~6 s of a core per worker and job here), and the tests that use this check the service,
    not the views.  (Not for comparing served views with this process's: as TF kernels they
    differ in the last bits, the workers rewriting the pipeline's graph as this process does
    not, tests/conftest.py; XLA compiles the same views in both.)"""
    monkeypatch.setattr(augment, "JIT_COMPILE", False)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A dispatcher and two workers (``caco-data-service``): the dispatcher's address."""
    address, processes, _ = start_cluster(str(tmp_path_factory.mktemp("service")))
    yield address
    stop_cluster(processes)


def image_folder(root, count=12, bad=()):
    """``count`` PNGs of 30×40 (different sizes do not matter to per-image views); the files
    numbered in ``bad`` cut short."""
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(0)
    for index in range(count):
        path = os.path.join(root, f"{index:02d}.png")
        Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)).save(path)
        if index in bad:
            with open(path, "r+b") as handle:
                handle.truncate(60)
    return folder_source(str(root))


@pytest.mark.slow
def test_the_service_gives_the_pipelines_batches_for_each_trainer(cluster, tmp_path):
    source, views = image_folder(tmp_path / "images"), augment.AsymmetricViews(16)
    plain = data.pretrain_dataset(source, BATCH, views, seed=3, steps_per_epoch=STEPS)
    served = service.served_pretrain_dataset(source, BATCH, views, cluster, seed=3,
                                             steps_per_epoch=STEPS)
    expected = [batch for batch in plain.take(STEPS + 1)]  # into the second epoch
    for want, got in zip(expected, served.take(STEPS + 1)):
        for a, b in zip(want, got):
            np.testing.assert_array_equal(b.numpy(), a.numpy())

    # The second of two trainers (MultiWorkerMirroredStrategy): its own share of the images,
    # as its own pipeline would take it (tests/test_data.py: the shares part the epoch).
    context = tf.distribute.InputContext(2, 1, 2)
    plain = data.pretrain_dataset(source, BATCH, views, seed=3, input_context=context)
    served = service.served_pretrain_dataset(source, BATCH, views, cluster, seed=3,
                                             input_context=context)
    for want, got in zip(plain.take(2), served.take(2)):  # both batches of the share's epoch
        for a, b in zip(want, got):
            np.testing.assert_array_equal(b.numpy(), a.numpy())


@pytest.mark.usefixtures("views_without_xla")
@pytest.mark.slow
def test_a_bad_files_place_is_taken_by_a_good_image_of_its_batch_and_it_is_named(
        cluster, tmp_path):
    """The documented difference: without the service the next images of the order move up."""
    source = image_folder(tmp_path / "images", count=8, bad=(5,))
    skipped = data.SkippedFiles(list_path=str(tmp_path / "skipped_files.txt"))
    served = service.served_pretrain_dataset(source, BATCH, augment.AsymmetricViews(16),
                                             cluster, seed=0, steps_per_epoch=2,
                                             skipped=skipped)
    repeated = []  # per batch of epoch 0: the pairs of equal rows
    for views in served.take(2):
        rows = views[0].numpy()
        repeated.append([(a, b) for a in range(BATCH) for b in range(a + 1, BATCH)
                         if np.array_equal(rows[a], rows[b])])
    assert sorted(len(pairs) for pairs in repeated) == [0, 1], repeated
    assert skipped.total >= 1  # batch 2 (epoch 1) may be read ahead: the same file again
    assert data.listed_unreadable(tmp_path / "skipped_files.txt") == [
        str(tmp_path / "images" / "05.png")]


def test_a_batch_that_never_comes_stops_the_run_with_one_line():
    numbers = [0, 2, 3, 4]  # batch 1 was lost with its worker
    served = tf.data.Dataset.from_tensor_slices((
        tf.constant(numbers, tf.int64), tf.zeros([4, 2, 3]), tf.fill([4, 2], -1),
        tf.fill([4, 2], "")))
    ordered = service.in_order(served, first=0, ahead=2, grace=0.0)
    with pytest.raises(tf.errors.OpError) as raised:
        list(ordered)
    lost = service.batch_lost(raised.value)
    assert str(lost) == ("data.service: batch 1 never came (3 later ones did): a service "
                         "worker stopped; run the same command to resume from the last save")
    assert lost.exit_status == 75
    # A finite stream (an evaluation pass) that ends short of its last batch lost one too.
    ordered = service.in_order(served.take(1), first=0, end=2)
    with pytest.raises(tf.errors.OpError, match="batch 1 never came"):
        list(ordered)


@pytest.mark.slow
def test_an_evaluation_pass_through_the_service_gives_the_same_batches(cluster, tmp_path):
    """Class folders with a bad file, in chunks of 5 (the last one short): the batches, labels
    and named bad file of ``eval_dataset`` without the service, bit for bit."""
    image_folder(tmp_path / "images" / "a", count=6, bad=(2,))
    image_folder(tmp_path / "images" / "b", count=6)
    source = data.folder_source(str(tmp_path / "images"))
    normalize = augment.AsymmetricViews(16).normalize
    batches, bad = [], []
    for served in (False, True):
        listed = tmp_path / f"skipped-{served}.txt"
        skipped = data.SkippedFiles(list_path=str(listed))
        if served:
            dataset = service.served_eval_dataset(source, 4, normalize, cluster, 16, 3,
                                                  skipped=skipped, chunk=5)
        else:
            dataset = data.eval_dataset(source, 4, normalize, image_size=16, channels=3,
                                        skipped=skipped)
        batches.append([(images.numpy(), labels.numpy()) for images, labels in dataset])
        bad.append((skipped.total, data.listed_unreadable(listed)))
    assert [len(images) for images, _ in batches[1]] == [4, 4, 3]
    for (want, want_labels), (got, got_labels) in zip(*batches):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got_labels, want_labels)
    assert bad[0] == bad[1] == (1, [str(tmp_path / "images" / "a" / "02.png")])
    # What the service cannot read is read here, as without it.
    arrays = data.ArraySource(np.zeros((4, 16, 16, 3), np.uint8))
    assert not service.servable_files(arrays)


def test_an_unreachable_dispatcher_and_what_cannot_be_served_are_one_line(tmp_path):
    from caco_tf.cli.data_service import free_port

    port = free_port()
    with pytest.raises(data.DataError, match=f"^data.service: no dispatcher answers at "
                                             f"127.0.0.1:{port} .*leave data.service empty$"):
        service.check_dispatcher(f"127.0.0.1:{port}", seconds=2)
    with pytest.raises(data.DataError, match="^data.service must be a dispatcher's HOST:PORT"):
        service.service_address("no-port")
    with pytest.raises(data.DataError, match="^data.service reads image files"):
        service.check_servable(data.ArraySource(np.zeros((4, 8, 8, 1), np.uint8)),
                               augment.AsymmetricViews(8))
    with pytest.raises(ConfigError, match="^data.service runs the colour views"):
        load_config(None, ["data.service=localhost:5050"])  # the offline digits' views
    with pytest.raises(ConfigError, match="data.service"):
        load_config(None, ["data.service=localhost"])


@pytest.mark.usefixtures("views_without_xla")
@pytest.mark.slow
def test_the_commands_print_their_address_and_a_lost_worker_or_dispatcher_is_one_line(
        tmp_path):
    """caco-data-service dispatcher / worker as processes: one line each; a worker killed
    mid-stream either leaves the rest to the other worker or stops the stream with
    ``BatchLost`` (a batch it held never comes); the dispatcher killed mid-stream stops the
    next stream with ``BatchLost`` once no batch has come for the given time."""
    address, processes, lines = start_cluster(str(tmp_path))
    try:
        port = address.rpartition(":")[2]
        assert lines[0].startswith("dispatcher: ") and lines[0].endswith(
            f":{port} (data.service for the trainers)"), lines
        assert all(line.startswith("worker: 127.0.0.1:") and line.endswith(
            f"for the dispatcher at {address}") for line in lines[1:]), lines
        source = image_folder(tmp_path / "images", count=8)
        stream = iter(service.served_pretrain_dataset(
            source, BATCH, augment.AsymmetricViews(16), address, steps_per_epoch=2, ahead=8,
            grace=5.0))
        for _ in range(3):
            next(stream)
        os.killpg(processes[-1].pid, signal.SIGKILL)
        try:
            for _ in range(40):
                next(stream)
        except tf.errors.OpError as error:
            assert service.batch_lost(error) is not None, str(error)[-500:]
        del stream  # while the service answers

        stream = iter(service.served_pretrain_dataset(
            source, BATCH, augment.AsymmetricViews(16), address, steps_per_epoch=2,
            silence=3.0))
        next(stream)
        os.killpg(processes[0].pid, signal.SIGKILL)  # the dispatcher
        with pytest.raises(tf.errors.OpError) as raised:
            for _ in range(40):
                next(stream)
        assert str(service.batch_lost(raised.value)) == (
            f"data.service: no batch came for 3 s from the service at {address}: its "
            f"dispatcher or every worker stopped; start them again and run the same command "
            f"to resume from the last save")
    finally:
        stop_cluster(processes)


@pytest.mark.slow
def test_a_runs_evaluation_passes_read_through_the_service(cluster, tmp_path, monkeypatch):
    """The kNN sets (monitor and end of run) and the health and precise-BatchNorm samples of
    a run with data.service read the same batches through it; a batch it loses in any pass
    ends the run with the resumable one line."""
    from caco_tf import build, pretrain
    from caco_tf.evaluation import monitor
    from test_user_data import make_split_folder

    root = make_split_folder(tmp_path / "photos", train=3, val=2)
    made = []
    serve = service.served_eval_dataset
    monkeypatch.setattr(service, "served_eval_dataset",
                        lambda *args, **kwargs: made.append(args[0]) or serve(*args, **kwargs))
    passes = []
    for served in ([], [f"data.service={cluster}"]):
        config = load_config(None, [f"data.source=folder:{root}", "data.image_size=16",
                                    "data.channels=3", "data.views=asymmetric",
                                    "evaluation.batch_size=4", *served])
        settings = RunSettings.of(config)
        train, held_out = build.load_data(settings.data)
        views = build.run_views(config)
        _, test_set = monitor.knn_sets(settings, views, train, held_out)
        sample = build.eval_dataset(settings, views, train, every=2)
        passes.append([[(images.numpy(), labels.numpy()) for images, labels in dataset]
                       for dataset in (test_set.make((1, 0), 4), sample)])
    assert len(made) == 2  # both passes of the second configuration were served
    for plain, served in zip(*passes):
        assert len(served) == len(plain) > 0
        for (want, want_labels), (got, got_labels) in zip(plain, served):
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(got_labels, want_labels)

    lost = ("data.service: batch 1 never came (0 later ones did): a service worker stopped; "
            "run the same command to resume from the last save")
    with pytest.raises(service.BatchLost, match="^data.service: batch 1 never came"):
        with pretrain._lost_batches(settings.data):
            raise tf.errors.UnknownError(None, None, f"in a pass: {lost} [[{{node x}}]]")


def _train_served(address, source, folder, stop_after=None):
    """2 epochs of 2 steps of a tiny CaCo through the service, from the run folder's resume
    state, as ``caco_tf.pretrain`` trains; a real SIGTERM to this process after global step
    ``stop_after``.  Returns the model."""
    import keras

    from caco_tf.training import callbacks, interrupts
    from caco_tf.training.run_folder import RunFolder
    from tiny_methods import SIZE, tiny

    keras.utils.set_random_seed(0)
    model = tiny("caco", warmup_steps=2, run_eagerly=True)
    point = RunFolder(folder).read_backup()
    dataset = service.served_pretrain_dataset(
        source, BATCH, augment.AsymmetricViews(SIZE, channels=1), address, seed=0,
        channels=1, first_epoch=point.epoch if point else 0,
        first_step=point.step if point else 0, steps_per_epoch=2)
    signals = interrupts.StopSignals()
    resume = callbacks.Resume(folder, steps_per_epoch=2, signals=signals, point=point)

    def stop(batch, logs=None):
        if int(model.optimizer.iterations.numpy()) == stop_after:
            os.kill(os.getpid(), signal.SIGTERM)

    with signals:
        model.fit(dataset, epochs=2, steps_per_epoch=2, verbose=0, callbacks=[
            keras.callbacks.LambdaCallback(on_train_batch_end=stop), resume])
    return model


@pytest.mark.usefixtures("views_without_xla")
@pytest.mark.slow
def test_a_sigterm_inside_an_epoch_resumes_through_the_service_bit_for_bit(cluster, tmp_path):
    from caco_tf.training import interrupts

    source = image_folder(tmp_path / "images", count=8)
    uninterrupted = _train_served(cluster, source, str(tmp_path / "uninterrupted"))
    folder = str(tmp_path / "stopped")
    with pytest.raises(interrupts.Interrupted, match="stopped by SIGTERM at epoch 2, step 1"):
        _train_served(cluster, source, folder, stop_after=3)
    resumed = _train_served(cluster, source, folder)
    for a, b in zip(uninterrupted.weights + uninterrupted.optimizer.variables,
                    resumed.weights + resumed.optimizer.variables):
        np.testing.assert_array_equal(b.numpy(), a.numpy(), err_msg=a.path)
