"""TFDS's real preparation path, offline: data sets built from local files through the project's
``tfds:`` source, then read by the pre-training pipeline and by ``caco-evaluate``; and a data set
that needs a download failing within seconds when there is no network.

(Every other TFDS test reads ``tfds.testing.mock_data``, which skips preparation.)"""

import io
import os
import sys
import tarfile

import numpy as np
import pytest
import yaml
from PIL import Image

from caco_tf import build, data
from caco_tf.data import augment
from caco_tf.data.sources import unreachable_reason
from caco_tf.config import load_config
import launch


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _digits(count, seed=0):
    images, labels = data.load_offline_mnist()["train"]
    keep = np.flatnonzero(labels < 3)[seed:seed + count]
    return images[keep], labels[keep]


@pytest.fixture(scope="module")
def tiny_digits(tmp_path_factory):
    """caco_tiny_digits prepared from PNG files into a fresh data_dir: (data_dir, train, test)."""
    from tfds_fixtures import caco_tiny_digits  # registers the builder in this process

    manual = tmp_path_factory.mktemp("manual")
    for split, (images, labels) in (("train", _digits(24)), ("test", _digits(9, seed=100))):
        for i, (image, label) in enumerate(zip(images, labels)):
            folder = manual / split / caco_tiny_digits.CLASSES[label]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image[..., 0]).save(folder / f"{i}.png")
    data_dir = tmp_path_factory.mktemp("tfds")
    train, test = data.load_source("tfds:caco_tiny_digits", channels=1, data_dir=str(data_dir),
                                   manual_dir=str(manual))
    return str(data_dir), train, test


@pytest.mark.slow
def test_a_data_set_prepared_from_local_files_feeds_training(tiny_digits):
    data_dir, train, test = tiny_digits
    assert (len(train), len(test)) == (24, 9)
    assert os.path.isdir(os.path.join(data_dir, "caco_tiny_digits", "1.0.0"))
    assert data.num_classes(train) == 3
    view1, view2 = next(iter(data.pretrain_dataset(train, 8, augment.DigitViews(), seed=0,
                                                   image_size=28, channels=1)))
    assert view1.shape == view2.shape == (8, 28, 28, 1)


@pytest.mark.slow
def test_the_prepared_data_set_is_read_by_name_by_the_evaluation_command(tiny_digits, tmp_path):
    """A process that never saw the builder reads the prepared set from data.data_dir."""
    data_dir, _, _ = tiny_digits
    config = load_config(None, [
        "data.source=tfds:caco_tiny_digits", f"data.data_dir={data_dir}",
        "model.projector_hidden=32", "model.embedding_dim=16", "method.caco.bank_size=16",
        "train.batch_size=8", "evaluation.knn_k=3"])
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    build.build_model(config, steps_per_epoch=1).save_weights(
        str(run_dir / "checkpoints" / "last.weights.h5"))
    result = launch.run([sys.executable, "-m", "caco_tf.cli.evaluate", "knn", "--run",
                         str(run_dir)], cwd=str(tmp_path), capture_output=True, text=True,
                        timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| 24 / 9 |" in result.stdout and "kNN top-1: " in result.stdout


# ImageNet's own layout: a train tar of per-class tars, a flat validation tar whose labels TFDS
# takes by position from its validation label file.
WNIDS = ["n01440764", "n01443537", "n01484850"]


def _jpeg(seed):
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (40 + seed % 7, 48, 3), dtype=np.uint8)).save(
        buffer, "JPEG")
    return buffer.getvalue()


def _add(archive, name, payload):
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    archive.addfile(info, io.BytesIO(payload))


def imagenet_manual_dir(folder, per_class=3, validation=5):
    with tarfile.open(folder / "ILSVRC2012_img_train.tar", "w") as train:
        for c, wnid in enumerate(WNIDS):
            inner = io.BytesIO()
            with tarfile.open(fileobj=inner, mode="w") as class_tar:
                for i in range(per_class):
                    _add(class_tar, f"{wnid}_{1000 + i}.JPEG", _jpeg(10 * c + i))
            _add(train, f"{wnid}.tar", inner.getvalue())
    with tarfile.open(folder / "ILSVRC2012_img_val.tar", "w") as val:
        for i in range(1, validation + 1):
            _add(val, f"ILSVRC2012_val_{i:08d}.JPEG", _jpeg(100 + i))
    return folder


@pytest.mark.slow
def test_imagenet2012_is_prepared_from_a_manual_dir_in_imagenets_layout(tmp_path):
    (tmp_path / "manual").mkdir()
    manual = imagenet_manual_dir(tmp_path / "manual")
    train, held_out = data.load_source("tfds:imagenet2012", channels=3,
                                       data_dir=str(tmp_path / "tfds"), manual_dir=str(manual))
    assert (len(train), len(held_out)) == (9, 5)
    assert held_out.split == "validation" and data.num_classes(train) == 1000
    views = augment.AsymmetricViews(size=16)
    batch = next(iter(data.pretrain_dataset(train, 4, views, seed=0, image_size=16,
                                            channels=3, with_labels=True)))
    (view1, view2), labels = batch
    assert view1.shape == (4, 16, 16, 3) and set(labels.numpy()) <= {0, 1, 2}


def test_imagenet2012_without_its_files_names_data_manual_dir(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(data.DataError) as error:
        data.load_source("tfds:imagenet2012", channels=3, data_dir=str(tmp_path / "tfds"),
                         manual_dir=str(empty))
    message = str(error.value)
    assert "data.manual_dir" in message and "ILSVRC2012_img_train.tar" in message
    assert "\n" not in message


def test_an_unreachable_download_host_is_found_in_seconds(monkeypatch):
    assert unreachable_reason("127.0.0.1", 9, timeout=3.0)  # the discard port: nothing listens
    # A lookup or connection that never answers is given up after the timeout, not awaited.
    import socket
    import threading

    monkeypatch.setattr(socket, "create_connection",
                        lambda *args, **kwargs: threading.Event().wait())
    assert unreachable_reason("example.invalid", 443, timeout=0.2) == "no answer within 0.2 s"


def test_a_data_set_that_needs_a_download_fails_within_seconds_without_network(tmp_path,
                                                                               monkeypatch):
    if unreachable_reason("www.cs.toronto.edu", 443) is None:
        pytest.skip("this machine reaches CIFAR-10's host: the test would download it")
    import tensorflow_datasets as tfds

    def download_and_prepare(*args, **kwargs):  # TFDS's download, whose retries take minutes
        raise AssertionError("the download was attempted without network")

    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", download_and_prepare)
    with pytest.raises(data.DataError) as error:
        data.load_source("tfds:cifar10", channels=3, data_dir=str(tmp_path / "tfds"))
    message = str(error.value)
    assert "www.cs.toronto.edu" in message and "data.data_dir" in message
    assert "\n" not in message
