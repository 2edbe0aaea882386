"""The linear protocol: frozen backbone, one Dense layer, top-1/top-5; the ImageNet recipe's
transforms at tiny sizes (RandomResizedCrop + flip; resize to S/0.875 and centre crop S)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from caco_tf import data
from caco_tf.evaluation import linear
from caco_tf.nets.layers import BatchNormalization


def coordinate_image(height, width):
    """[H, W, 2] float: channel 0 the row index, channel 1 the column index."""
    rows, columns = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    return tf.constant(np.stack([rows, columns], -1), tf.float32)


def test_random_resized_crop_respects_scale_and_ratio():
    image = coordinate_image(60, 80)
    crops = []
    for seed in range(30):
        crop = linear.random_resized_crop(image, tf.constant([seed, 1]), 12).numpy()
        assert crop.shape == (12, 12, 2)
        # The crop's extent in the source image, from its corner coordinates.
        height = crop[-1, 0, 0] - crop[0, 0, 0] + 1
        width = crop[0, -1, 1] - crop[0, 0, 1] + 1
        area = height * width / (60 * 80)
        assert 0.08 * 0.8 <= area <= 1.0 + 1e-6
        if area < 0.99:  # a sampled crop (the fallback is the whole image)
            assert 0.75 * 0.8 <= width / height <= 4 / 3 * 1.25
        crops.append(crop)
    again = linear.random_resized_crop(image, tf.constant([0, 1]), 12).numpy()
    np.testing.assert_array_equal(again, crops[0])  # stateless: the seed decides
    assert len({c.tobytes() for c in crops}) > 20  # and different seeds differ


def test_train_transform_flips_some_images_and_normalizes():
    preprocessing = linear.Preprocessing(8, 1, 0.5, 0.25)
    image = tf.constant(np.tile(np.arange(8, dtype=np.uint8)[None, :, None] * 30, (8, 1, 1)))
    flipped = 0
    for seed in range(20):
        view = preprocessing.train(image, tf.constant([seed, 0], tf.int64)).numpy()
        assert view.shape == (8, 8, 1)
        assert view.min() >= (0 - 0.5) / 0.25 - 1e-6 and view.max() <= (1 - 0.5) / 0.25 + 1e-6
        flipped += view[4, 0, 0] > view[4, -1, 0]  # the ramp increases left to right
    assert 0 < flipped < 20


def test_digit_train_transform_never_flips_and_moves_the_strokes():
    # A vertical bar left of centre: a flip would put it right of centre; the mild affine
    # (DIGIT_AFFINE: shift ≤ 10 %, crop ≥ 60 % of the area, rotation ≤ 10°) never does.
    preprocessing = linear.Preprocessing(28, 1, 0.0, 1.0)
    image = np.zeros((28, 28, 1), np.uint8)
    image[6:22, 8:10] = 255
    views = [preprocessing.train(tf.constant(image), tf.constant([seed, 0], tf.int64),
                                 "digits").numpy() for seed in range(20)]
    for view in views:
        assert view.shape == (28, 28, 1) and 0.0 <= view.min() and view.max() <= 1.0 + 1e-6
        columns = np.nonzero(view[..., 0].sum(0) > 0.5)[0]
        assert columns.mean() < 13.5  # still left of centre
    assert len({v.tobytes() for v in views}) == 20  # a fresh view per seed
    again = preprocessing.train(tf.constant(image), tf.constant([0, 0], tf.int64), "digits")
    np.testing.assert_array_equal(again.numpy(), views[0])


def test_test_transform_resizes_the_shorter_side_then_centre_crops():
    # The ImageNet test transform (256 → 224) at a tiny size: S = 7, shorter side → 8.
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(3, 16, 12, 1), dtype=np.uint8)
    source = data.ArraySource(images, np.arange(3))
    preprocessing = linear.Preprocessing(7, 1, 0.0, 1.0)
    got, labels = next(iter(linear.eval_batches(source, preprocessing, 8)))
    resized = tf.image.resize(images.astype(np.float32) / 255.0, [10, 8], method="bilinear",
                              antialias=True).numpy()  # 16×12 → 10×8 (shorter side 8)
    np.testing.assert_allclose(got.numpy(), resized[:, 1:8, 0:7, :], atol=1e-6)
    np.testing.assert_array_equal(labels.numpy(), [0, 1, 2])


def blob_images(count, classes, size=6, seed=0):
    """uint8 [N, size, size, 1]: a bright pixel at the class's position, plus noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, size=count)
    images = rng.integers(0, 60, size=(count, size, size, 1))
    images[np.arange(count), labels // size, labels % size, 0] = 255
    return images.astype(np.uint8), labels


def test_linear_protocol_separates_separable_classes():
    train = data.ArraySource(*blob_images(120, 8, seed=0))
    test = data.ArraySource(*blob_images(60, 8, seed=1))
    preprocessing = linear.Preprocessing(6, 1, 0.0, 1.0)
    result = linear.linear_evaluation(linear.pixels_backbone(preprocessing), train, test, 8,
                                      preprocessing, epochs=30, batch_size=32,
                                      learning_rate=0.1, l2=0.0)
    assert result["top1"] == 100.0 and result["top5"] == 100.0
    assert (result["train_images"], result["test_images"]) == (120, 60)
    assert result["path"] == "cached features"


def test_labels_carrying_no_signal_stay_near_chance_on_held_out_data():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(200, 6, 6, 1), dtype=np.uint8)
    train = data.ArraySource(images[:150], rng.integers(0, 10, 150))
    test = data.ArraySource(images[150:], rng.integers(0, 10, 50))
    preprocessing = linear.Preprocessing(6, 1, 0.0, 1.0)
    result = linear.linear_evaluation(linear.pixels_backbone(preprocessing), train, test, 10,
                                      preprocessing, epochs=20, batch_size=50, l2=0.0)
    assert result["top1"] < 40.0
    assert result["top1"] <= result["top5"]


def tiny_backbone(channels=1):
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((8, 8, channels)),
        keras.layers.Conv2D(4, 3, use_bias=False),
        BatchNormalization(),
        keras.layers.ReLU(),
        keras.layers.GlobalAveragePooling2D()], name="backbone")


@pytest.mark.parametrize("augment", ["none", "imagenet"])
def test_backbone_stays_frozen(augment):
    backbone = tiny_backbone()
    backbone.layers[1].moving_mean.assign(np.full(4, 0.3, np.float32))  # non-default stats
    before = [w.numpy().copy() for w in backbone.weights]
    rng = np.random.default_rng(0)
    # 12×10 RGB images for an 8×8 grayscale backbone: converted, cropped and resized.
    images = rng.integers(0, 256, size=(40, 12, 10, 3), dtype=np.uint8)
    source = data.ArraySource(data.convert_array_channels(images, 1), rng.integers(0, 3, 40))
    preprocessing = linear.Preprocessing(8, 1, 0.5, 0.25)
    result = linear.linear_evaluation(backbone, source, source, 3, preprocessing, epochs=2,
                                      batch_size=16, augment=augment, l2=0.0)
    for old, new in zip(before, backbone.weights):
        np.testing.assert_array_equal(old, new.numpy())
    assert backbone.trainable  # restored
    assert np.isfinite(result["loss"]) and result["augment"] == augment
    assert result["path"] == ("cached features" if augment == "none" else "images")


def test_head_trains_only_one_dense_layer():
    head = linear.linear_head(5, 3)
    assert [w.shape for w in head.trainable_weights] == [(5, 3), (3,)]
    # At inference the head is affine in the features: f(a) + f(b) - f(0) = f(a + b).
    a, b = np.random.default_rng(0).normal(size=(2, 4, 5)).astype(np.float32)
    head.layers[-1].kernel.assign(np.arange(15, dtype=np.float32).reshape(5, 3) / 10)

    def f(x):
        return head(x, training=False).numpy()

    np.testing.assert_allclose(f(a) + f(b) - f(np.zeros_like(a)), f(a + b), atol=1e-4)


def test_l2_penalty_is_lambda_times_the_squared_kernel_and_spares_the_bias():
    head = linear.linear_head(5, 3, l2=0.25)
    kernel = np.arange(15, dtype=np.float32).reshape(5, 3) / 10
    head.layers[-1].kernel.assign(kernel)
    head.layers[-1].bias.assign(np.ones(3, np.float32))
    features = np.zeros((2, 5), np.float32)
    head(features, training=False)
    assert len(head.losses) == 1  # the kernel's; the bias and the standardization carry none
    np.testing.assert_allclose(float(head.losses[0]), 0.25 * np.sum(kernel ** 2), rtol=1e-6)
    assert linear.linear_head(5, 3).losses == []  # λ = 0: no penalty at all


def test_best_l2_takes_the_top_score_and_breaks_ties_towards_more_regularization():
    assert linear.best_l2({0.0: 90.0, 0.01: 91.0, 0.1: 89.0}) == 0.01
    assert linear.best_l2({0.0: 91.0, 0.001: 91.0, 0.1: 90.5}) == 0.001
    assert linear.best_l2({0.0: 80.0}) == 0.0


def weak_dense_signal(count, dims=400, signal=0.1, seed=0):
    """Two classes whose means differ a little in every one of many standardized dimensions."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, count)
    shift = signal * (2 * labels - 1)[:, None]
    return (rng.normal(size=(count, dims)) + shift).astype(np.float32), labels


@pytest.mark.slow
def test_cross_validation_scores_every_row_once_and_exposes_an_overstrong_penalty():
    features, labels = weak_dense_signal(60)
    fit = dict(epochs=20, batch_size=20, learning_rate=0.1, momentum=0.9, weight_decay=0.0)
    scores = linear.select_l2(features, labels, 2, grid=(0.0, 1.0), folds=3, **fit)
    assert set(scores) == {0.0, 1.0}
    # λ = 1 pulls the 400 small weights the classes need towards zero: held-out rows show it.
    assert scores[1.0] < scores[0.0] - 10.0
    assert linear.best_l2(scores) == 0.0
    for score in scores.values():  # each of the 60 rows is scored exactly once
        assert score * 60 / 100 == pytest.approx(round(score * 60 / 100), abs=1e-4)
    assert linear.select_l2(features, labels, 2, grid=(0.0, 1.0), folds=3, **fit) == scores


def test_steps_in_one_graph_call_train_the_same_weights(monkeypatch):
    """Several steps a call (``STEPS_PER_EXECUTION``) run the same steps in the same order:
    the head's weights and its scores equal one step a call to the bit, a partial last call
    (5 steps an epoch, 3 a call) included."""
    features, labels = weak_dense_signal(100, dims=20)
    fit = dict(epochs=4, batch_size=20, learning_rate=0.1, momentum=0.9, weight_decay=0.0)
    results = []
    for steps in (1, 3):
        monkeypatch.setattr(linear, "STEPS_PER_EXECUTION", steps)
        keras.utils.set_random_seed(0)
        head = linear.linear_head(20, 2, l2=0.01)
        linear._train(head, linear.feature_batches(features, labels, 20, shuffle_seed=0),
                      len(features), **fit)
        assert head.steps_per_execution == steps
        scores = linear._test(head, linear.feature_batches(features, labels, 20))
        results.append(([w.numpy() for w in head.weights], scores))
    (weights_one, scores_one), (weights_three, scores_three) = results
    assert scores_one == scores_three
    for one, three in zip(weights_one, weights_three, strict=True):
        np.testing.assert_array_equal(one, three)


@pytest.mark.parametrize("weight_decay", [0.0, 1e-3])
def test_a_head_reused_between_fits_trains_as_a_fresh_one_to_the_bit(weight_decay):
    """``HeadFits``' one head, reset before each fit, ends each fit with the weights and the
    scores of a new ``linear_head`` compiled afresh, to the bit: λ = 0 (no penalty term at all
    on the fresh head) and λ > 0, fits of other lengths, one after another."""
    features, labels = weak_dense_signal(90, dims=12)
    fit = dict(epochs=3, batch_size=20, learning_rate=0.1, momentum=0.9,
               weight_decay=weight_decay)
    fits = linear.HeadFits(12, 2, True, 0.1, 0.9, weight_decay)
    for l2, rows in ((0.0, 90), (0.01, 60), (0.0, 70)):
        trained = []
        for reuse in (False, True):
            keras.utils.set_random_seed(0)
            head = fits.fresh(l2) if reuse else linear.linear_head(12, 2, l2=l2)
            linear._train(head, linear.feature_batches(features[:rows], labels[:rows], 20,
                                                       shuffle_seed=0),
                          rows, fits=fits if reuse else None, **fit)
            scores = linear._test(head, linear.feature_batches(features, labels, 20))
            trained.append(([w.numpy() for w in head.weights], scores))
        (fresh, fresh_scores), (reused, reused_scores) = trained
        assert reused_scores == fresh_scores, l2
        for a, b in zip(fresh, reused, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_auto_l2_is_chosen_on_the_training_split_alone():
    train = data.ArraySource(*blob_images(120, 8, seed=0))
    images, labels = blob_images(60, 8, seed=1)
    preprocessing = linear.Preprocessing(6, 1, 0.0, 1.0)
    results = [linear.linear_evaluation(
        linear.pixels_backbone(preprocessing), train, data.ArraySource(images, test_labels), 8,
        preprocessing, epochs=5, batch_size=32, learning_rate=0.1, l2="auto",
        l2_grid=(0.0, 0.01, 1.0), l2_folds=3)
        for test_labels in (labels, (labels + 1) % 8)]  # right and wrong test labels
    chosen, wrong = results
    assert chosen["l2_scores"] == wrong["l2_scores"] and chosen["l2"] == wrong["l2"]
    assert set(chosen["l2_scores"]) == {"0", "0.01", "1"} and chosen["l2_folds"] == 3
    assert chosen["l2"] == linear.best_l2({float(k): v for k, v in
                                           chosen["l2_scores"].items()})
    assert chosen["top1"] > 90.0 > wrong["top1"]  # the test labels only affect the score
    fixed = linear.linear_evaluation(
        linear.pixels_backbone(preprocessing), train, data.ArraySource(images, labels), 8,
        preprocessing, epochs=5, batch_size=32, learning_rate=0.1, l2=chosen["l2"])
    assert fixed["top1"] == chosen["top1"] and "l2_scores" not in fixed  # the same final fit


def test_auto_l2_needs_cached_features():
    source = data.ArraySource(*blob_images(20, 4))
    preprocessing = linear.Preprocessing(6, 1, 0.0, 1.0)
    with pytest.raises(ValueError, match="l2='auto' chooses"):
        linear.linear_evaluation(linear.pixels_backbone(preprocessing), source, source, 4,
                                 preprocessing, epochs=1, augment="digits", l2="auto")
    with pytest.raises(ValueError, match="l2_folds must be between 2"):
        linear.select_l2(np.zeros((3, 2), np.float32), np.zeros(3), 2, folds=4, epochs=1,
                         batch_size=2, learning_rate=0.1, momentum=0.9, weight_decay=0.0)


@pytest.mark.slow
def test_raw_pixels_on_real_digits_learn():
    split = data.load_offline_mnist()
    train = data.ArraySource(*(part[:1000] for part in split["train"]))
    test = data.ArraySource(*(part[:500] for part in split["test"]))
    preprocessing = linear.Preprocessing(28, 1, 0.0, 1.0)
    result = linear.linear_evaluation(linear.pixels_backbone(preprocessing), train, test, 10,
                                      preprocessing, epochs=20, l2=0.0)
    assert result["top1"] > 80.0 and result["top5"] > 95.0
