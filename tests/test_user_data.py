"""The user's own data at the user's scale: TFRecord shards, an ImageNet-style folder with
train/ and val/, a held-out source of the user's choosing, bounded class-balanced evaluation
samples shared by replicas, the kNN by blocks, and batches replicas cannot share."""

import io
import os
import sys

import numpy as np
import pytest
import tensorflow as tf
import yaml
from PIL import Image

from caco_tf import data
from caco_tf.evaluation import knn
from test_data import EchoImageViews
import launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _png(value, size=6):
    buffer = io.BytesIO()
    Image.fromarray(np.full((size, size), value, np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def _example(encoded, label=None):
    feature = {"image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[encoded]))}
    if label is not None:
        feature["image/class/label"] = tf.train.Feature(
            int64_list=tf.train.Int64List(value=[label]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_shards(folder, shards=3, per_shard=8, bad=False):
    """Shards of PNGs whose pixel value encodes (image number) and label = number % 4; with
    ``bad``, one record that is not an Example and one truncated image."""
    folder.mkdir(parents=True, exist_ok=True)
    number = 0
    for shard in range(shards):
        with tf.io.TFRecordWriter(str(folder / f"train-{shard:05d}-of-{shards:05d}")) as writer:
            for _ in range(per_shard):
                writer.write(_example(_png(10 * number % 250 + 1), number % 4))
                number += 1
            if bad and shard == 1:
                writer.write(b"not a tf.train.Example")
                writer.write(_example(_png(3)[:20], 1))
    return str(folder / "train-*")


@pytest.mark.slow
def test_tfrecord_shards_are_read_interleaved_sharded_and_bad_records_counted(tmp_path):
    pattern = write_shards(tmp_path / "shards", bad=True)
    source = data.load_source(f"tfrecord:{pattern}")[0]
    assert isinstance(source, data.RecordSource) and source.has_labels
    assert len(source) == 25  # 24 images + the truncated one (it parses; its image is bad)
    assert data.num_classes(source) == 4
    skipped = data.SkippedFiles()
    views = EchoImageViews(6)
    seen = []
    for pipeline in range(2):  # two input pipelines: each an even share of the records
        context = tf.distribute.InputContext(2, pipeline, 2)
        stream = data.pretrain_dataset(source, 8, views, seed=1, input_context=context,
                                       skipped=skipped, image_size=6, channels=1,
                                       steps_per_epoch=3)
        for (view1, _) in stream.take(3):
            seen += [int(round(value)) for value in view1.numpy()[:, 0, 0, 0]]
    assert len(seen) == 24 and len(set(seen)) >= 20  # one epoch: mostly distinct images
    assert skipped.total >= 1  # the truncated image (the non-Example record is dropped too)
    labelled = data.eval_dataset(source, 8, lambda x: x, image_size=6, channels=1)
    labels = np.concatenate([batch[1].numpy() for batch in labelled])
    assert len(labels) == 24 and sorted(set(labels)) == [0, 1, 2, 3]


def test_tfrecord_errors_are_one_line(tmp_path):
    with pytest.raises(data.DataError, match="no TFRecord files match"):
        data.load_source(f"tfrecord:{tmp_path}/nothing-*")
    (tmp_path / "empty.tfrecord").write_bytes(b"")
    with pytest.raises(data.DataError, match="hold no records"):
        data.load_source(f"tfrecord:{tmp_path}/empty.tfrecord")


def make_split_folder(root, classes=("ant", "bee", "cat"), train=4, val=2, missing=None):
    for split, count in (("train", train), ("val", val)):
        for c, name in enumerate(classes):
            if split == "val" and name == missing:
                continue
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                Image.fromarray(np.full((8, 8, 3), 40 * c + i, np.uint8)).save(
                    folder / f"{i}.png")
    return root


def test_an_imagenet_style_folder_gives_train_and_held_out(tmp_path):
    root = make_split_folder(tmp_path / "photos", missing="bee")
    train, held_out = data.load_source(f"folder:{root}", channels=3)
    assert train.class_names == ("ant", "bee", "cat") and len(train) == 12
    # val/ lacks bee/: its classes keep the training indices (cat is 2, not 1).
    assert len(held_out) == 4 and sorted(set(held_out.labels)) == [0, 2]
    assert held_out.class_names == ("ant", "bee", "cat")
    # A folder of class sub-folders that happen not to be train/val stays one labelled set.
    flat, none = data.load_source(f"folder:{root / 'train'}", channels=3)
    assert none is None and flat.class_names == ("ant", "bee", "cat")


def test_a_held_out_source_of_the_users_choosing(tmp_path):
    root = make_split_folder(tmp_path / "photos")
    train = data.folder_source(str(root / "train"))
    held_out = data.load_held_out(f"folder:{root / 'val'}", train, channels=3)
    assert len(held_out) == 6 and list(held_out.class_names) == ["ant", "bee", "cat"]
    images = np.zeros((5, 8, 8, 3), np.uint8)
    np.savez(tmp_path / "held.npz", images=images, labels=np.arange(5) % 3)
    assert len(data.load_held_out(f"npz:{tmp_path / 'held.npz'}", train, channels=3)) == 5
    np.savez(tmp_path / "unlabelled.npz", images=images)
    with pytest.raises(data.DataError, match="has no labels"):
        data.load_held_out(f"npz:{tmp_path / 'unlabelled.npz'}", train, channels=3)
    (root / "val" / "dog").mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(root / "val" / "dog" / "0.png")
    with pytest.raises(data.DataError, match="class folder 'dog' is not a training class"):
        data.load_held_out(f"folder:{root / 'val'}", train, channels=3)
    with pytest.raises(data.DataError, match="held-out images must be one of"):
        data.load_held_out("mnist", train)


def test_balanced_subsets_of_arrays_and_records(tmp_path):
    labels = np.array([0] * 50 + [1] * 10 + [2] * 40)
    source = data.ArraySource(np.arange(100, dtype=np.uint8).reshape(100, 1, 1, 1), labels)
    subset = data.balanced_subset(source, 30)
    assert np.bincount(subset.labels).tolist() == [10, 10, 10]
    assert data.balanced_subset(source, 100) is source  # no larger than the set: itself
    assert np.bincount(data.balanced_subset(source, 60).labels).tolist() == [20, 10, 20]
    # Records: one pass over the labels that stops once every quota is full.
    records = data.load_source(f"tfrecord:{write_shards(tmp_path / 'shards')}")[0]
    chosen = data.balanced_subset(records, 8)
    assert len(chosen) == 8
    batches = data.eval_dataset(chosen, 4, lambda x: x, image_size=6, channels=1)
    chosen_labels = np.concatenate([b[1].numpy() for b in batches])
    assert np.bincount(chosen_labels).tolist() == [2, 2, 2, 2]


def test_knn_by_blocks_equals_one_block():
    rng = np.random.default_rng(0)
    train = rng.normal(size=(300, 8)).astype(np.float32)
    train /= np.linalg.norm(train, axis=1, keepdims=True)
    train[7] = train[150]  # an exact tie across blocks: the lower index wins in both
    labels = rng.integers(0, 5, 300)
    test = rng.normal(size=(40, 8)).astype(np.float32)
    test /= np.linalg.norm(test, axis=1, keepdims=True)
    whole = knn.knn_votes(train, labels, test, k=10, num_classes=5, train_block=1000)
    blocks = knn.knn_votes(train, labels, test, k=10, num_classes=5, train_block=64, chunk=7)
    np.testing.assert_allclose(blocks, whole, rtol=1e-5)  # the same neighbours, summed in
    np.testing.assert_array_equal(blocks.argmax(1), whole.argmax(1))  # another order


@pytest.mark.slow
def test_features_computed_by_two_replicas_are_the_single_devices():
    from test_distributed import _two_cpus

    strategy = _two_cpus()
    rng = np.random.default_rng(3)
    images = rng.normal(size=(23, 4, 4, 1)).astype(np.float32)  # uneven shares and batches
    labels = np.arange(23) % 5
    with strategy.scope():
        backbone = tf.keras.Sequential([tf.keras.Input((4, 4, 1)), tf.keras.layers.Flatten(),
                                        tf.keras.layers.Dense(6)])

    def make(shards, batch_size):
        return tf.data.Dataset.from_tensor_slices((images, labels)).shard(*shards).batch(
            batch_size)

    eval_set = knn.EvalSet(make, len(images), batch_size=8)
    features, got_labels = knn.extract_features(backbone, eval_set, strategy=strategy)
    single, single_labels = knn.extract_features(backbone, make((1, 0), 8))
    assert len(features) == 23
    order = np.lexsort(features.T)
    single_order = np.lexsort(single.T)
    np.testing.assert_allclose(features[order], single[single_order], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got_labels[order], single_labels[single_order])
    # Another pass (a monitor's next epoch) of the same shapes reuses the traced step.
    traces = knn._gathered_features.experimental_get_tracing_count()
    again, _ = knn.extract_features(backbone, knn.EvalSet(make, len(images), 8), strategy=strategy)
    np.testing.assert_array_equal(again, features)
    assert knn._gathered_features.experimental_get_tracing_count() == traces


def test_batches_that_replicas_cannot_share_are_one_line_errors():
    from test_distributed import _two_cpus
    from test_model import tiny_caco, views

    strategy = _two_cpus()
    with strategy.scope():
        model = tiny_caco()
    view1, view2 = views(batch=14)
    odd = tf.data.Dataset.from_tensor_slices((view1, view2)).batch(7, drop_remainder=True)
    with pytest.raises(data.DataError) as error:
        model.fit(odd, epochs=1, verbose=0)
    assert str(error.value) == ("under 2 replicas every batch must split evenly: batches of 7 "
                                "images do not; use a multiple of 2")
    unknown = tf.data.Dataset.from_tensor_slices((view1, view2)).batch(4)
    with pytest.raises(data.DataError, match="drop_remainder=True"):
        model.fit(unknown, epochs=1, verbose=0)


@pytest.mark.slow
def test_the_evaluation_command_takes_the_users_own_train_and_held_out(tmp_path, capsys):
    """Transfer to the user's labelled images: --data a folder of classes, --held-out another."""
    from caco_tf.cli import evaluate
    from tiny_run import make_run

    root = make_split_folder(tmp_path / "photos", train=4, val=2)
    run_dir, _ = make_run(tmp_path / "run")
    assert evaluate.main(["knn", "--run", run_dir, "--data", f"folder:{root / 'train'}",
                          "--held-out", f"folder:{root / 'val'}", "--k", "3"]) == 0
    out = capsys.readouterr().out
    assert "| 12 / 6 |" in out and "kNN top-1: " in out
    assert evaluate.main(["knn", "--run", run_dir, "--data", f"folder:{root}"]) == 0  # train/ val/
    assert evaluate.main(["knn", "--run", run_dir, "--data", f"folder:{root / 'train'}"]) == 2
    assert "has no labelled held-out split; pass --held-out SOURCE" in capsys.readouterr().err


@pytest.mark.slow
def test_the_shipped_configuration_for_own_images(tmp_path):
    """configs/folder_resnet18.yaml (issue 23, point 6) trains end to end on an ImageNet-style
    folder (data.source folder:ROOT and nothing else), ResNet-18 with the paper's asymmetric
    views, logs the health and speed figures, and scores val/ by kNN; its warm-up lasts
    method.caco.warmup_min_steps however few steps an epoch has."""
    from caco_tf import build
    from caco_tf import config as config_lib

    shipped = os.path.join(ROOT, "configs", "folder_resnet18.yaml")
    settings = config_lib.load_config(shipped)
    assert settings["model"]["backbone"] == "resnet18"
    assert 64 <= settings["data"]["image_size"] <= 96
    # 1 epoch of 47 steps (3,000 images at batch 64) is far too short for the EMA to follow:
    # the 500-step floor holds; an epoch longer than the floor keeps its own length.
    assert build.warmup_steps(settings, 47) == 500
    assert build.warmup_steps(settings, 20_000) == 20_000

    root = make_split_folder(tmp_path / "photos", train=8, val=4)  # 24 train, 12 val images
    result = launch.run(
        [sys.executable, os.path.join(ROOT, "train.py"), "--config", shipped,
         "--set", f"data.source=folder:{root}", "--set", "data.image_size=64",
         "--set", "train.batch_size=4", "--set", "train.epochs=2",
         "--set", "train.lr_warmup_epochs=1", "--set", "method.caco.bank_size=16",
         "--set", "method.caco.warmup_min_steps=8", "--set", "model.projector_hidden=64",
         "--set", "evaluation.knn_monitor_every=1", "--set", "evaluation.knn_k=3",
         "--set", "evaluation.knn_monitor_k=3", "--set", "evaluation.health_images=16",
         "--run-dir", str(tmp_path / "run"), "--quiet"],
        capture_output=True, text=True, timeout=600, cwd=str(tmp_path),
        env=dict(os.environ, PYTHONPATH=ROOT))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "kNN top-1: " in result.stdout
    history = yaml.safe_load(open(tmp_path / "run" / "history.json"))
    assert len(history) == 2 and {
        "knn_top1", "rank_features", "rank_embedding", "mpp_usage", "alignment", "uniformity",
        "step_ms", "images_per_s", "data_wait"} <= set(history[-1])


def test_a_named_pipe_among_tfrecord_shards_is_one_line(tmp_path):
    """Counting its records would wait for a writer for ever."""
    pattern = write_shards(tmp_path / "shards", shards=1)
    os.mkfifo(tmp_path / "shards" / "train-99999-of-00001")
    with pytest.raises(data.DataError) as caught:
        data.load_source(f"tfrecord:{pattern}")
    assert str(caught.value) == (
        f"{tmp_path / 'shards' / 'train-99999-of-00001'} matches {pattern} but is not a regular "
        f"file (a named pipe, a device, a folder); narrow the pattern or move it away")
