"""The generated shapes (``caco_tf.data.shapes``, data.source shapes / shapes_validation): seeded,
class-balanced, independent images; splits disjoint, the validation split carved from the
training images only; no training here."""

import numpy as np
import pytest

from caco_tf.config import load_config
from caco_tf.data import shapes, sources


@pytest.fixture
def small_splits(monkeypatch):
    """The splits' sizes made small (the real ones: 20,000 / 20,000, 15,000 of them training
    in shapes_validation): the same code, a fraction of the time."""
    monkeypatch.setattr(shapes, "TRAIN", 60)
    monkeypatch.setattr(shapes, "TEST", 40)
    monkeypatch.setattr(shapes, "VALIDATION_TRAIN", 40)


def _fresh(count, seed):
    """The generator without its per-process cache."""
    return shapes.generate.__wrapped__(count, seed)


def test_deterministic_for_a_seed():
    first, again = _fresh(30, 5), _fresh(30, 5)
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], again[1])
    other = _fresh(30, 6)[0]
    assert not any(np.array_equal(a, b) for a, b in zip(first[0], other))


def test_shapes_dtypes_and_labels():
    images, labels = _fresh(50, 0)
    assert images.shape == (50, shapes.SIZE, shapes.SIZE, 1) and images.dtype == np.uint8
    assert labels.shape == (50,) and labels.dtype == np.int64
    assert labels.min() == 0 and labels.max() == len(shapes.CLASSES) - 1
    assert np.bincount(labels).tolist() == [5] * 10  # class-balanced
    assert images.std() > 20  # shapes and noise, not a blank
    assert shapes.draw(3, rng=np.random.default_rng(0)).shape == (shapes.SIZE, shapes.SIZE, 1)


def test_each_image_its_own_stream():
    """Image i depends on (seed, i) alone: the first images of a split are the same whatever its
    length, and image i is the image ``draw`` makes from the stream default_rng([seed, i])."""
    short, long = _fresh(12, 3)[0], _fresh(40, 3)[0]
    np.testing.assert_array_equal(short, long[:12])
    for i in (0, 7, 39):
        np.testing.assert_array_equal(
            long[i], shapes.draw(i % 10, rng=np.random.default_rng([3, i])))


def test_the_cached_arrays_are_read_only():
    images, labels = shapes.generate(20, 11)
    assert shapes.generate(20, 11)[0] is images
    with pytest.raises(ValueError):
        images[0, 0, 0, 0] = 0
    with pytest.raises(ValueError):
        labels[0] = 0


def _rows(images):
    return {image.tobytes() for image in images}


def test_splits_disjoint_and_validation_carved_from_training(small_splits):
    full, carved = shapes.load_shapes(), shapes.load_shapes_validation()
    (train, train_labels), (test, _) = full["train"], full["test"]
    assert len(train) == 60 and len(test) == 40
    # No held-out image is a training image (nor a re-placement: other streams, other images).
    assert not _rows(train) & _rows(test)
    # shapes_validation: both halves from the training images, in order, none from the test.
    (v_train, v_train_labels), (v_test, v_test_labels) = carved["train"], carved["test"]
    np.testing.assert_array_equal(np.concatenate([v_train, v_test]), train)
    np.testing.assert_array_equal(np.concatenate([v_train_labels, v_test_labels]), train_labels)
    assert not _rows(v_train) & _rows(v_test)
    assert not (_rows(v_train) | _rows(v_test)) & _rows(test)
    assert np.bincount(v_test_labels).tolist() == [2] * 10


def test_independent_images():
    """Images of one split are not copies or shifts of each other: the same class at the same
    position in two streams gives different pixels, and images are only weakly correlated."""
    images = _fresh(200, 0)[0].astype(np.float64).reshape(200, -1)
    assert len(_rows(images)) == 200
    centred = images - images.mean(1, keepdims=True)
    unit = centred / np.linalg.norm(centred, axis=1, keepdims=True)
    similarity = unit @ unit.T
    np.fill_diagonal(similarity, 0)
    assert np.abs(similarity).max() < 0.9


def test_generating_images_is_quick():
    """A few hundred images, as a smoke test of the vectorized path (no timed assertion: the
    30,000 of a run take a few seconds; benchmarks/shapes_pilots.md)."""
    images, labels = _fresh(300, 9)
    assert len(images) == len(labels) == 300


def test_load_source_by_name(small_splits):
    for name, sizes in (("shapes", (60, 40)), ("shapes_validation", (40, 20))):
        train, held_out = sources.load_source(name, channels=1)
        assert (len(train), len(held_out)) == sizes
        assert train.images.shape[1:] == (shapes.SIZE, shapes.SIZE, 1)
        assert held_out.has_labels and train.name == name


def test_config_loads():
    config = load_config("shapes")
    assert config["name"] == "shapes" and config["data"]["source"] == "shapes"
    assert config["data"]["image_size"] == shapes.SIZE and config["data"]["channels"] == 1
    validation = load_config("shapes", ["data.source=shapes_validation", "method.name=byol"])
    assert validation["data"]["source"] == "shapes_validation"


def test_the_pixel_baseline_without_a_run_keeps_the_images_own_size(monkeypatch, tmp_path):
    """``caco-evaluate knn --pixels --data SOURCE`` without a run: the images' own side (16
    here), not the default configuration's 28 px (which averaged the shapes' noise away)."""
    from caco_tf.evaluation import protocols

    rng = np.random.default_rng(0)
    for name in ("train", "test"):
        np.savez(tmp_path / f"{name}.npz", images=rng.integers(0, 255, (20, 16, 16, 1), np.uint8),
                 labels=np.arange(20) % 2)
    sizes = []
    monkeypatch.setattr(protocols, "knn", lambda backbone, labelled, preprocessing, *a, **k: (
        sizes.append(preprocessing.image_size), {"top1": 0.0})[1])
    protocols.evaluate("knn", data=f"npz:{tmp_path / 'train.npz'}",
                       held_out=f"npz:{tmp_path / 'test.npz'}", baseline="pixels")
    assert sizes == [16]
