"""The online linear probe (``evaluation.online_probe``): a Dense head with its own optimizer on
stop-gradient backbone features of the first crop of labelled batches, its top-1 a metric of
the run (``probe_top1``), for evaluation only: it never changes the encoder.

Its parts are the model's attributes ``online_probe``, ``probe_optimizer`` and ``probe_top1``:
the names under which the ``.keras`` files and checkpoints hold them.
"""

import keras
import tensorflow as tf

from caco_tf.training import distribute


def attach(model, classes):
    """Give ``model`` a probe over ``classes`` classes (none when ``classes`` is None or 0)."""
    model.online_probe = None
    if classes:
        # Parameter-free standardization, then one Dense: the features' scale then sets
        # neither the probe's speed nor its learning rate.
        model.online_probe = keras.Sequential([
            keras.Input((model.backbone.output_shape[-1],)),
            keras.layers.BatchNormalization(center=False, scale=False, momentum=0.9,
                                            dtype="float32"),
            keras.layers.Dense(classes, dtype="float32")], name="online_probe")
        model.probe_optimizer = keras.optimizers.Adam(1e-2)
        model.probe_top1 = keras.metrics.SparseCategoricalAccuracy(name="probe_top1")


def build_optimizer(model):
    """Create the probe optimizer's slots (at ``compile``), if the model has a probe."""
    if model.online_probe is not None:
        model.probe_optimizer.build(model.online_probe.trainable_variables)


def step(model, labels, images, learn=True):
    """The online probe on the first crop's backbone features, when enabled and the batch
    is labelled: inference-mode and stop-gradient features (as keras-cv's
    ContrastiveTrainer), so neither the encoder's gradients nor its BatchNorm see it."""
    if model.online_probe is None or labels is None:
        return
    features = tf.stop_gradient(tf.cast(model.backbone(images, training=False), tf.float32))
    with tf.GradientTape() as tape:
        logits = model.online_probe(features, training=learn)
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
            labels, logits, from_logits=True)) / distribute.num_replicas()
    if learn:
        variables = model.online_probe.trainable_variables
        model.probe_optimizer.apply(tape.gradient(loss, variables), variables)
    model.probe_top1.update_state(labels, logits)
