"""The fused BatchNormalization must be keras' layer, numerically: outputs, gradients, statistics."""

import keras
import numpy as np
import tensorflow as tf

from caco_tf.layers import BatchNormalization


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
    np.testing.assert_allclose(layer.__class__()(images, training=False), images / np.sqrt(1 + 1e-3),
                               atol=1e-5)
