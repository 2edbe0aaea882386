"""The fused BatchNormalization must be keras' layer, numerically: outputs, gradients, statistics;
the precise-BN re-estimation is the image-weighted average of batch statistics."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from caco_tf.nets.layers import BatchNormalization, recalibrate_batchnorm


def _run(layer, images, gamma):
    layer.build(images.shape)
    layer.gamma.assign(gamma)
    with tf.GradientTape() as tape:
        tape.watch(images)
        outputs = layer(images, training=True)
        loss = tf.reduce_sum(outputs * tf.sin(outputs))
    return outputs, tape.gradient(loss, [images, layer.gamma, layer.beta])


def test_fused_training_path_matches_keras():
    rng = np.random.default_rng(0)
    images = tf.constant(rng.normal(1.0, 3.0, (16, 5, 5, 8)), tf.float32)
    gamma = tf.constant(rng.normal(size=8), tf.float32)
    fused = BatchNormalization(momentum=0.9, epsilon=1e-5)
    plain = keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5)
    fused_out, fused_grads = _run(fused, images, gamma)
    plain_out, plain_grads = _run(plain, images, gamma)
    np.testing.assert_allclose(fused_out, plain_out, atol=1e-5)
    for mine, theirs in zip(fused_grads, plain_grads):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-4)
    # Moving statistics use the biased batch variance, as keras does.
    np.testing.assert_allclose(fused.moving_mean, plain.moving_mean, atol=1e-6)
    np.testing.assert_allclose(fused.moving_variance, plain.moving_variance, rtol=1e-5)
    np.testing.assert_allclose(
        fused.moving_variance, 0.9 + 0.1 * np.var(images.numpy(), axis=(0, 1, 2)), rtol=1e-5)


def test_inference_and_dense_inputs_take_keras_path():
    layer = BatchNormalization()
    dense = tf.random.normal([4, 3])
    np.testing.assert_allclose(layer(dense, training=True),
                               keras.layers.BatchNormalization()(dense, training=True), atol=1e-5)
    images = tf.random.normal([2, 3, 3, 4])
    np.testing.assert_allclose(layer.__class__()(images, training=False),
                               images / np.sqrt(1 + 1e-3), atol=1e-5)


def _two_layer_model(norm):
    inputs = keras.Input((4, 4, 3))
    x = keras.layers.Conv2D(5, 3, padding="same", use_bias=False, name="conv")(inputs)
    x = norm(name="bn1")(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Conv2D(6, 1, use_bias=False, name="conv2")(x)
    return keras.Model(inputs, norm(name="bn2")(x))


def _expected_statistics(model, batches):
    """NumPy closed form: per layer, the image-weighted mean of the batch means and of the
    (biased) batch variances, each layer's input normalized by its batch statistics."""
    kernel1, kernel2 = (model.get_layer(n).kernel.numpy() for n in ("conv", "conv2"))
    gamma1, beta1 = (model.get_layer("bn1").gamma.numpy(), model.get_layer("bn1").beta.numpy())
    sums = {name: [0.0, 0.0] for name in ("bn1", "bn2")}
    total = 0
    for batch in batches:
        x = tf.nn.conv2d(batch, kernel1, 1, "SAME").numpy()
        mean, variance = x.mean((0, 1, 2)), x.var((0, 1, 2))
        sums["bn1"][0] += len(batch) * mean
        sums["bn1"][1] += len(batch) * variance
        x = np.maximum(gamma1 * (x - mean) / np.sqrt(variance + 1e-3) + beta1, 0.0)
        x = np.einsum("bhwc,cd->bhwd", x, kernel2[0, 0])
        sums["bn2"][0] += len(batch) * x.mean((0, 1, 2))
        sums["bn2"][1] += len(batch) * x.var((0, 1, 2))
        total += len(batch)
    return {name: (s[0] / total, s[1] / total) for name, s in sums.items()}


def _batches(seed=1):
    rng = np.random.default_rng(seed)  # unequal sizes: the average is weighted by images
    return [rng.normal(2.0, 1.5, (size, 4, 4, 3)).astype("float32") for size in (8, 3, 5)]


@pytest.mark.parametrize("norm", [BatchNormalization, keras.layers.BatchNormalization],
                         ids=["fused", "keras"])
def test_recalibrate_batchnorm_is_the_average_of_batch_statistics(norm):
    keras.utils.set_random_seed(0)
    model = _two_layer_model(lambda name: norm(momentum=0.9, name=name))
    kernels = [w.numpy() for w in model.trainable_weights]
    batches = _batches()
    assert recalibrate_batchnorm(model, ((b, np.zeros(len(b))) for b in batches)) == 16
    for name, (mean, variance) in _expected_statistics(model, batches).items():
        layer = model.get_layer(name)
        np.testing.assert_allclose(layer.moving_mean, mean, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(layer.moving_variance, variance, rtol=1e-4, atol=1e-5)
        assert layer.momentum == 0.9  # restored
    for before, after in zip(kernels, model.trainable_weights):  # nothing else changes
        np.testing.assert_array_equal(before, after.numpy())


def test_recalibrate_batchnorm_under_mirrored_strategy_sets_every_replica():
    devices = [d.name for d in tf.config.list_logical_devices("CPU")[:2]]
    if len(devices) < 2:
        pytest.skip("needs two logical CPU devices (set up in conftest before TF starts)")
    keras.utils.set_random_seed(0)
    single = _two_layer_model(BatchNormalization)
    with tf.distribute.MirroredStrategy(devices).scope():
        mirrored = _two_layer_model(BatchNormalization)
    mirrored.set_weights(single.get_weights())
    recalibrate_batchnorm(single, _batches())
    recalibrate_batchnorm(mirrored, _batches())
    for name in ("bn1", "bn2"):
        expected = single.get_layer(name).moving_variance.numpy()
        variable = mirrored.get_layer(name).moving_variance.value
        for component in variable.values:
            np.testing.assert_allclose(component.numpy(), expected, rtol=1e-5)
