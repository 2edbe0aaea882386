"""The CaCo train/test steps: one step checked against the paper's update, warm-up, evaluate.
(Multi-device equivalence is in test_distributed.py.)"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from caco_tf import bank as bank_lib
from caco_tf import losses
from caco_tf.nets import backbones
from caco_tf.nets.layers import BatchNormalization
from caco_tf.methods.caco import CaCo

BATCH, BANK, SIZE = 8, 32, 12


def tiny_caco(warmup_steps=0, bank_learning_rate=0.5, key_momentum=0.9, sync=False,
              steps_per_execution=1):
    keras.utils.set_random_seed(0)
    backbone = keras.Sequential([
        keras.Input((SIZE, SIZE, 1)),
        keras.layers.Conv2D(4, 3, strides=2, use_bias=False),
        BatchNormalization(synchronized=sync),
        keras.layers.ReLU(),
        keras.layers.GlobalAveragePooling2D()], name="backbone")
    projector = backbones.build_projector(4, hidden_dim=16, output_dim=6, sync_batchnorm=sync)
    model = CaCo(backbone, projector, bank_size=BANK, temperature=0.1, bank_temperature=0.2,
                 bank_learning_rate=bank_learning_rate, bank_momentum=0.9,
                 key_momentum=key_momentum, warmup_steps=warmup_steps)
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                  steps_per_execution=steps_per_execution)
    return model


def views(seed=0, batch=BATCH):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(batch, SIZE, SIZE, 1)).astype("float32"),
            rng.normal(size=(batch, SIZE, SIZE, 1)).astype("float32"))


def one_batch_dataset(view1, view2):
    return tf.data.Dataset.from_tensors((view1, view2))


def test_one_step_follows_the_paper():
    model = tiny_caco()
    view1, view2 = views()
    bank0 = model.memory_bank.rows.numpy()
    key_weight0 = model.key_encoder.trainable_variables[0].numpy()
    # The pre-step forward pass (training mode: batch statistics, as the step uses).
    query1 = model.query_encoder(view1, training=True)
    query2 = model.query_encoder(view2, training=True)
    key1 = model.key_encoder(view1, training=True)
    key2 = model.key_encoder(view2, training=True)
    bank_unit = losses.l2_normalize(bank0)
    positive1 = losses.most_probable_positive(key2, bank_unit)  # the *other* view's key
    positive2 = losses.most_probable_positive(key1, bank_unit)
    gradient = (bank_lib.cooperative_adversarial_gradient(query1, bank0, positive1, 0.2)
                + bank_lib.cooperative_adversarial_gradient(query2, bank0, positive2, 0.2))
    expected_loss = float(tf.reduce_mean(losses.caco_loss(query1, bank_unit, positive1, 0.1))
                          + tf.reduce_mean(losses.caco_loss(query2, bank_unit, positive2, 0.1)))
    # The encoder's gradient of that loss, through the stop-gradient bank (eq. caco).
    encoder_weights = model.query_encoder.trainable_variables
    encoder_weights0 = [w.numpy() for w in encoder_weights]
    with tf.GradientTape() as tape:
        loss = (tf.reduce_mean(losses.caco_loss(model.query_encoder(view1, training=True),
                                                bank_unit, positive1, 0.1))
                + tf.reduce_mean(losses.caco_loss(model.query_encoder(view2, training=True),
                                                  bank_unit, positive2, 0.1)))
    encoder_gradient = tape.gradient(loss, encoder_weights)

    history = model.fit(one_batch_dataset(view1, view2), epochs=1, verbose=0)

    # Bank: SGD momentum from zero velocity → b - η g, g summed over the two views.
    np.testing.assert_allclose(model.memory_bank.velocity.numpy(), gradient.numpy(), rtol=1e-4,
                               atol=1e-7)
    np.testing.assert_allclose(model.memory_bank.rows.numpy(), bank0 - 0.5 * gradient.numpy(),
                               rtol=1e-4, atol=1e-6)
    assert np.abs(model.memory_bank.rows.numpy() - bank0).max() > 1e-4
    # Loss and metrics reported through the trackers.
    assert history.history["loss"][0] == pytest.approx(expected_loss, rel=1e-4)
    for name in ("contrast_top1", "mpp_prob", "lr", "bank_lr", "distinct_mpp", "bank_norm"):
        assert name in history.history
    assert history.history["bank_lr"][0] == pytest.approx(0.5)
    # Query encoder: SGD's first step (zero momentum buffer) down the loss's gradient.
    for weight, weight0, gradient in zip(encoder_weights, encoder_weights0, encoder_gradient):
        np.testing.assert_allclose(weight.numpy(), weight0 - 0.1 * gradient.numpy(), rtol=1e-4,
                                   atol=1e-6)
    # Key encoder: EMA of parameters towards the updated query encoder.
    query_weight = model.query_encoder.trainable_variables[0].numpy()
    assert np.abs(query_weight - key_weight0).max() > 1e-6  # the encoder did move
    np.testing.assert_allclose(model.key_encoder.trainable_variables[0].numpy(),
                               0.9 * key_weight0 + 0.1 * query_weight, rtol=1e-5, atol=1e-7)
    assert int(model.optimizer.iterations.numpy()) == 1


def test_evaluate_changes_nothing():
    model = tiny_caco()
    bank0 = model.memory_bank.rows.numpy()
    weights0 = [w.numpy() for w in model.weights]
    result = model.evaluate(one_batch_dataset(*views()), verbose=0, return_dict=True)
    assert np.isfinite(result["loss"]) and result["loss"] > 0
    np.testing.assert_array_equal(model.memory_bank.rows.numpy(), bank0)
    for before, after in zip(weights0, model.weights):
        np.testing.assert_array_equal(before, after.numpy())


def test_warmup_fills_the_bank_with_keys_then_resyncs():
    model = tiny_caco(warmup_steps=4)
    batches = [views(seed) for seed in range(5)]
    dataset = tf.data.Dataset.from_tensor_slices(
        (np.stack([b[0] for b in batches]), np.stack([b[1] for b in batches])))
    model.fit(dataset.take(4), epochs=1, verbose=0)
    # 4 steps × 8 keys = 32 rows: every row is now a (unit) key embedding.
    np.testing.assert_allclose(np.linalg.norm(model.memory_bank.rows.numpy(), axis=-1), 1.0,
                               rtol=1e-5)
    assert int(model.memory_bank.pointer.numpy()) == 0
    assert model.train_function.current == 0  # the warm-up phase
    # The first CaCo step re-syncs the key encoder to the query encoder before stepping, so
    # afterwards key = m·query_before + (1-m)·query_after.
    query_before = model.query_encoder.trainable_variables[0].numpy()
    model.fit(dataset.skip(4), epochs=1, verbose=0)
    query_after = model.query_encoder.trainable_variables[0].numpy()
    assert model.train_function.current == 1  # the method's own steps
    np.testing.assert_allclose(model.key_encoder.trainable_variables[0].numpy(),
                               0.9 * query_before + 0.1 * query_after, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_steps_per_execution_runs_the_same_steps():
    """One step per call (from Python) and 4 per call (one compiled loop) train alike: the
    warm-up ends inside a call (step 5), epochs of 6 steps end with a short call, and the
    resync happens at its step."""
    batches = [views(seed) for seed in range(12)]
    dataset = tf.data.Dataset.from_tensor_slices(
        (np.stack([b[0] for b in batches]), np.stack([b[1] for b in batches]))).repeat()
    trained = []
    for per_call in (1, 4):
        model = tiny_caco(warmup_steps=5, steps_per_execution=per_call)
        history = model.fit(dataset, epochs=2, steps_per_epoch=6, verbose=0)
        assert int(model.optimizer.iterations.numpy()) == 12
        assert model.input_wait > 0.0  # measured in either way
        trained.append(([w.numpy() for w in model.weights], history.history["loss"]))
    for one, four in zip(*(weights for weights, _ in trained)):
        np.testing.assert_array_equal(one, four)
    assert trained[0][1] == trained[1][1]  # the epochs' logged losses too
