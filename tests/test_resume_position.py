"""A resume inside an epoch starts reading where the stopped stream stood: the checkpoint
records how many items of the epoch's order each input pipeline had consumed (bad ones
included) and which were bad, and the resumed stream reads none of the images before that
place, with the uninterrupted run's images, views and bad-file accounting.  Files passed over
are made unreadable after the stop: a resume that read them would count them as bad and
train on other images."""

import json
import os

import numpy as np
import pytest
from PIL import Image

from caco_tf import data
from caco_tf.data import augment
from caco_tf.training.callbacks import is_wall_clock

BATCH, STEPS, GOOD, BAD = 8, 4, 32, 5  # an epoch of 4 batches takes every good image


def _folder(path):
    """``GOOD`` small gray PNGs and ``BAD`` files that are not images; (the folder, the bad
    files' paths)."""
    rng = np.random.default_rng(0)
    os.makedirs(path, exist_ok=True)
    for index in range(GOOD):
        Image.fromarray(rng.integers(0, 256, (28, 28), np.uint8)).save(
            os.path.join(path, f"good{index:02d}.png"))
    bad = []
    for index in range(BAD):
        bad.append(os.path.join(path, f"bad{index}.png"))
        with open(bad[-1], "wb") as handle:
            handle.write(b"\x89PNG\r\n\x1a\n not an image")
    return str(path), bad


def _spoil(paths):
    for path in paths:
        with open(path, "wb") as handle:
            handle.write(b"spoilt after the stop")


def _passed_over(source, seed, epoch, position):
    """The image files of the epoch's order before ``position`` (StreamPosition.at)."""
    _, items = data.epoch_order(source, seed, epoch)
    return [name.decode() for _, name in items.take(position["items"]).as_numpy_iterator()]


@pytest.mark.slow
def test_a_resumed_stream_reads_nothing_before_its_place(tmp_path):
    folder, bad = _folder(tmp_path / "images")
    source = data.folder_source(folder)
    views = augment.DigitViews()

    def stream(position, skipped, **resume):
        return data.pretrain_dataset(source, BATCH, views, seed=3, steps_per_epoch=STEPS,
                                     skipped=skipped, position=position, **resume)

    full, counted = data.StreamPosition(), data.SkippedFiles()
    batches = [b[0].numpy() for b in stream(full, counted).take(2 * STEPS)]
    place = full.at(1, 2)  # epoch 2, after 2 of its 4 batches
    assert place["items"] >= 2 * BATCH and all(name in bad for _, name in place["bad"])
    # Bad files before the place (restored by the resume) and after it (met again).
    assert 0 < len(place["bad"]) < len(full.at(1, STEPS)["bad"])
    passed = [path for path in _passed_over(source, 3, 1, place) if path not in bad]
    assert len(passed) == 2 * BATCH
    _spoil(passed)

    resumed, recounted = data.StreamPosition(), data.SkippedFiles()
    rest = [b[0].numpy() for b in stream(resumed, recounted, first_epoch=1, first_step=2,
                                         resume_at=[place]).take(STEPS - 2)]
    for index, batch in enumerate(rest):
        np.testing.assert_array_equal(batch, batches[STEPS + 2 + index])
    # The epoch's bad files: those met before the stop (recorded) and after it.
    assert resumed.at(1, STEPS) == full.at(1, STEPS)

    # Without the recorded place (a checkpoint of caco_tf 0.3) the files before it are read
    # and checked: the spoilt ones count as bad and the stream moves on to other images.
    old = data.StreamPosition()
    other = [b[0].numpy() for b in stream(old, data.SkippedFiles(), first_epoch=1,
                                          first_step=2).take(STEPS - 2)]
    assert old.at(1, STEPS) != full.at(1, STEPS)
    assert any(np.any(a != b) for a, b in zip(other, batches[STEPS + 2:]))


@pytest.mark.slow
def test_a_stopped_image_folder_run_resumes_bit_for_bit_without_rereading(tmp_path,
                                                                          monkeypatch):
    """train's run on an image folder with bad files, stopped by a real SIGTERM inside epoch
    2 and resumed after the files it had passed over in that epoch were spoilt: the weights
    and history of the uninterrupted run, and its list of bad files."""
    import signal

    from caco_tf import pretrain
    from caco_tf.training import callbacks, interrupts, precision
    from caco_tf.config import load_config
    from caco_tf.training.run_folder import RunFolder, weight_arrays

    folder, bad = _folder(tmp_path / "images")
    config = load_config(None, [
        f"data.source=folder:{folder}", "train.epochs=2", "train.batch_size=8",
        "method.caco.warmup_epochs=1", "method.caco.bank_size=16", "model.projector_hidden=16",
        "model.embedding_dim=8", "model.widths=[4,4,4,4]", "train.jit_compile=false",
        "train.steps_per_execution=1", "evaluation.knn_monitor_every=0",
        "evaluation.health_images=0", "train.precise_bn_images=0"])
    source = data.folder_source(folder)
    met = set()  # the bad files the epochs meet before their last good image: all of them
    for epoch in (0, 1):
        order = _passed_over(source, config["data"]["seed"], epoch, {"items": GOOD + BAD})
        last_good = max(i for i, path in enumerate(order) if path not in bad)
        met |= {path for path in order[:last_good] if path in bad}
    assert met == set(bad)
    reference, run_dir = str(tmp_path / "reference"), str(tmp_path / "run")
    pretrain.run(config, reference, verbose=0)

    batch_end = callbacks.Throughput.on_train_batch_end

    def stop_after_step_6(self, batch, logs=None):
        batch_end(self, batch, logs)
        if int(self.model.optimizer.iterations.numpy()) == STEPS + 2:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(callbacks.Throughput, "on_train_batch_end", stop_after_step_6)
    with pytest.raises(interrupts.Interrupted, match="at epoch 2, step 2 of 4"):
        pretrain.run(config, run_dir, verbose=0)
    monkeypatch.undo()
    metadata = json.load(open(os.path.join(run_dir, "backup", "training_metadata.json")))
    place, = metadata["checkpoints"][0]["positions"]
    # The run folder records what the run decided from its machine, which its resumes keep.
    policy, why = precision.resolve(config["train"]["precision"])
    assert metadata["decided"] == {"precision": policy, "why": why, "xla": False}
    assert place["items"] >= 2 * BATCH and {name for _, name in place["bad"]} <= set(bad)
    passed = [p for p in _passed_over(source, config["data"]["seed"], 1, place) if p not in bad]
    _spoil(passed)

    pretrain.run(config, run_dir, verbose=0)
    history = [[{k: v for k, v in row.items() if not is_wall_clock(k)}
                for row in json.load(open(RunFolder(f).history))] for f in (run_dir, reference)]
    assert history[0] == history[1]
    resumed = weight_arrays(RunFolder(run_dir).checkpoint)
    uninterrupted = weight_arrays(RunFolder(reference).checkpoint)
    assert resumed.keys() == uninterrupted.keys()
    for name in uninterrupted:
        np.testing.assert_array_equal(resumed[name], uninterrupted[name], err_msg=name)
    # Every bad file stays listed; none of the spoilt ones was met before the run's end (the
    # stream's read-ahead past the last epoch may meet them).
    listed = [set(open(RunFolder(f).skipped_files).read().splitlines())
              for f in (run_dir, reference)]
    assert listed[1] == {f"unreadable\t{path}" for path in bad}
    assert listed[0] - {f"unreadable\t{path}" for path in passed} == listed[1]


def test_the_chief_records_every_workers_place(tmp_path, monkeypatch):
    """Under several input pipelines each worker publishes its own place at a save and the
    chief records them all, by pipeline; a place a worker does not know (arrays) records
    none, so that the resume reads as before rather than from a wrong place."""
    from types import SimpleNamespace

    import tensorflow as tf

    from caco_tf.training import callbacks, peers

    store = {}
    monkeypatch.setattr(peers, "share", lambda key, value: store.__setitem__(key, value))
    monkeypatch.setattr(peers, "fetch", lambda key, timeout=None, what=None: store[key])
    model = SimpleNamespace(optimizer=SimpleNamespace(iterations=tf.Variable(14)))
    places = []
    for pipeline in (1, 0):  # the worker publishes, then the chief gathers
        position = data.StreamPosition()
        position.pipeline = (2, pipeline)
        position.batch_ended(1, 3, 40 + pipeline)
        position.bad_item(1, 7, f"bad-of-{pipeline}.jpg")
        resume = callbacks.Resume(str(tmp_path), writer=pipeline == 0, position=position)
        resume.set_model(model)
        places.append(resume._positions(1, 4))
    assert places == [None, [{"items": 40, "bad": [[7, "bad-of-0.jpg"]]},
                             {"items": 41, "bad": [[7, "bad-of-1.jpg"]]}]]
    store["caco_tf/position/14/1"] = None  # a worker that knows no place
    assert resume._positions(1, 4) is None
    assert resume._positions(1, 0) is None  # an epoch's end: the epoch's start, no place


class _Streamed(data.FileSource):
    """File names passed one by one, block by block (``shuffled``), as record sources are."""

    def shard_arrays(self, shards=(1, 0), labels=False):
        return None


@pytest.mark.parametrize("shards", [(1, 0), (2, 1), (3, 0), (3, 2)])
def test_file_names_permuted_whole_keep_the_order_of_block_by_block(shards):
    """An epoch's order of file names permuted as one tensor (every epoch's start and every
    resume: fast) is the order the block-by-block permutation gives, labels along; shards of
    unequal sizes ((3, 2): 3 names, blocks of 4) keep block by block."""
    names = [f"image{i:02d}.png" for i in range(10)]
    for labels in (False, True):
        orders = [list(data.epoch_order(kind(names, np.arange(10) % 3), 7, 2, shards,
                                        labels=labels)[1].take(12).as_numpy_iterator())
                  for kind in (data.FileSource, _Streamed)]
        assert len(orders[0]) == 12
        assert repr(orders[0]) == repr(orders[1]), (shards, labels)
