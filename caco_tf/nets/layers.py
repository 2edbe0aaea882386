"""Layers that keras lacks or that keras runs slowly on CPU.

``BatchNormalization`` is keras' layer with one change: in training mode, on 4-D NHWC inputs, it
computes the batch statistics and the normalization with TensorFlow's fused kernel
(``FusedBatchNormV3``) instead of keras' ``moments`` + ``batch_normalization`` composite.  Same
arithmetic, same variables, same moving-statistics rule; on 2 CPU cores the fused forward +
backward of a [256, 28, 28, 32] activation takes 0.039 s against keras' 0.086 s
(``/tmp`` micro-benchmark, median of 8), which is 15 % of the offline default's step.
Masks, renorm, 2-D inputs and other backends take keras' own path.  Synchronized BatchNorm
(multi-replica statistics) sums in float64 (see ``synchronized_moments``).
"""

import keras
import tensorflow as tf

from caco_tf import keras_compat


@keras.saving.register_keras_serializable(package="caco_tf")
class BatchNormalization(keras.layers.BatchNormalization):
    """``keras.layers.BatchNormalization`` with a fused training path for NHWC images."""

    def _can_fuse(self, inputs, training, mask):
        axis = self.axis if isinstance(self.axis, int) else None
        return (training and self.trainable and not self.synchronized and not self.renorm
                and mask is None and self.scale and self.center
                and keras.backend.backend() == "tensorflow"
                and len(inputs.shape) == 4 and axis in (-1, 3))

    def _moments(self, inputs, mask):  # a Keras hook (keras_compat.OVERRIDDEN_HOOKS)
        if not self.synchronized or mask is not None:
            return keras_compat.batch_norm_moments(self, inputs, mask)
        return synchronized_moments(inputs, keras_compat.batch_norm_reduction_axes(self))

    def call(self, inputs, training=None, mask=None):
        if not self._can_fuse(inputs, training, mask):
            return super().call(inputs, training=training, mask=mask)
        # The kernel wants float32 statistics; half-precision inputs stay half precision.
        outputs, mean, variance = tf.compat.v1.nn.fused_batch_norm(
            inputs, tf.cast(self.gamma, tf.float32), tf.cast(self.beta, tf.float32),
            epsilon=self.epsilon, data_format="NHWC", is_training=True)[:3]
        # The kernel returns the Bessel-corrected variance; keras' moving variance (and this
        # layer's unfused path) use the biased one, so undo the correction.
        count = tf.cast(tf.reduce_prod(tf.shape(inputs)[:-1]), tf.float32)
        variance = variance * (count - 1.0) / tf.maximum(count, 1.0)
        self.moving_mean.assign(
            self.moving_mean * self.momentum + tf.stop_gradient(mean) * (1.0 - self.momentum))
        self.moving_variance.assign(
            self.moving_variance * self.momentum
            + tf.stop_gradient(variance) * (1.0 - self.momentum))
        return tf.cast(outputs, self.compute_dtype)


def synchronized_moments(inputs, axes):
    """Mean and (biased) variance over the global batch of all replicas.

    Like keras' synchronized BatchNorm, one pass of three independent all-reduces (sum, sum of
    squares, count) and var = E[x²] - E[x]²; unlike it, the sums are float64.  In float32 that
    difference cancels catastrophically when the variance is small next to the mean, and one
    device and N replicas then disagree at the 1e-4 level.  (A two-pass variance would need a
    second, dependent all-reduce, which MirroredStrategy launched in different orders on
    different replicas.)  Outside a replica context this is plain ``tf.nn.moments``.
    """
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return tf.nn.moments(tf.cast(inputs, tf.float32), axes)
    inputs = tf.cast(inputs, tf.float64)
    local_count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(inputs), axes)), tf.float64)
    total = context.all_reduce(tf.distribute.ReduceOp.SUM, tf.reduce_sum(inputs, axes))
    squares = context.all_reduce(tf.distribute.ReduceOp.SUM,
                                 tf.reduce_sum(tf.square(inputs), axes))
    count = context.all_reduce(tf.distribute.ReduceOp.SUM, local_count)
    mean = total / count
    variance = tf.maximum(squares / count - tf.square(mean), 0.0)
    return tf.cast(mean, tf.float32), tf.cast(variance, tf.float32)


def recalibrate_batchnorm(model, batches):
    """Re-estimate the moving mean and variance of every BatchNormalization in ``model`` as the
    image-weighted average of its batch statistics over ``batches`` ("precise BN", Wu & Johnson
    2021, *Rethinking "Batch" in BatchNorm*).  Returns the number of images used.

    Pre-training fills the moving statistics from the last few batches of *augmented* views
    (momentum 0.9, torch's default), while the backbone is then used on un-augmented images;
    re-estimating them on those images (no labels, no other variable changes) gives the
    statistics of the distribution that evaluation and export see.  Each forward runs in
    training mode, so every layer's statistics are those of its input as normalized during
    training.  Runs eagerly (the momentum changes per batch); in a cross-replica context the
    mirrored moving statistics get the same value on every replica.

    ``batches``: normalized images ``[B, H, W, C]``, or ``(images, labels)`` pairs.
    """
    norms = [layer for layer in keras_compat.nested_layers(model)
             if isinstance(layer, keras.layers.BatchNormalization)]
    momenta = [layer.momentum for layer in norms]
    seen = 0
    try:
        for batch in batches:
            images = batch[0] if isinstance(batch, (tuple, list)) else batch
            count = int(images.shape[0])
            for layer in norms:  # new = old·seen/(seen+B) + batch·B/(seen+B): a running mean
                layer.momentum = seen / (seen + count)
            model(images, training=True)
            seen += count
    finally:
        for layer, momentum in zip(norms, momenta):
            layer.momentum = momentum
    return seen


@keras.saving.register_keras_serializable(package="caco_tf")
class NormalizedDense(keras.layers.Layer):
    """A linear layer without bias whose every output unit's weight vector has unit norm:
    y = x · (V / ‖V‖), each column of V normalized.  PyTorch's ``weight_norm`` with its scale g
    fixed to 1 (DINO's last layer, ``norm_last_layer``); the gradient reaches V through the
    normalization.  Initialized as DINO's: a normal of standard deviation 0.02."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = int(units)

    def build(self, input_shape):
        self.kernel = self.add_weight(
            shape=(int(input_shape[-1]), self.units), name="kernel",
            initializer=keras.initializers.TruncatedNormal(stddev=0.02))

    def call(self, inputs):
        kernel = tf.math.l2_normalize(tf.cast(self.kernel, self.compute_dtype), axis=0,
                                      epsilon=1e-12)
        return tf.matmul(tf.cast(inputs, self.compute_dtype), kernel)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units,)

    def get_config(self):
        return {**super().get_config(), "units": self.units}
