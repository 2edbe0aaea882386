"""The multi-crop CaCo step (model.multicrop_train_step): the paper's loss over crops, checked
against a hand computation, and the two-view step it reduces to without local crops."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from caco_tf import bank as bank_lib
from caco_tf import losses
from caco_tf.nets import backbones
from caco_tf.methods.caco import CaCo

BATCH, BANK = 8, 32


def tiny_caco(multi_crop, warmup_steps=0):
    keras.utils.set_random_seed(0)
    backbone = keras.Sequential([
        keras.Input((None, None, 1)),  # every crop size
        keras.layers.Conv2D(4, 3, strides=2, use_bias=False),
        keras.layers.BatchNormalization(),
        keras.layers.ReLU(),
        keras.layers.GlobalAveragePooling2D()], name="backbone")
    projector = backbones.build_projector(4, hidden_dim=16, output_dim=6)
    model = CaCo(backbone, projector, bank_size=BANK, temperature=0.1, bank_temperature=0.2,
                 bank_learning_rate=0.5, bank_momentum=0.9, key_momentum=0.9,
                 warmup_steps=warmup_steps, multi_crop=multi_crop)
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9))
    return model


def crops(local=2, seed=0):
    rng = np.random.default_rng(seed)
    global_crops = [rng.normal(size=(BATCH, 12, 12, 1)).astype("float32") for _ in range(2)]
    local_crops = [rng.normal(size=(BATCH, 8, 8, 1)).astype("float32") for _ in range(local)]
    return tuple(global_crops + local_crops)


def fit_one(model, batch):
    return model.fit(tf.data.Dataset.from_tensors(batch), epochs=1, verbose=0).history


@pytest.mark.slow
def test_without_local_crops_it_is_the_two_view_step():
    two_view, multi = tiny_caco(False), tiny_caco(True)
    batch = crops(local=0)
    history_two, history_multi = fit_one(two_view, batch), fit_one(multi, batch)
    # The two-view step takes the same formulas tile by tile (caco_tf.bank's tiled passes),
    # the multi-crop step by products and a tape: equal up to float32 rounding.
    assert history_multi["loss"] == pytest.approx(history_two["loss"], rel=1e-6)
    np.testing.assert_allclose(multi.memory_bank.rows.numpy(), two_view.memory_bank.rows.numpy(),
                               rtol=1e-5, atol=1e-6)
    for a, b in zip(multi.query_encoder.weights + multi.key_encoder.weights,
                    two_view.query_encoder.weights + two_view.key_encoder.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def test_multicrop_step_follows_the_loss_over_crops():
    model = tiny_caco(True)
    batch = crops(local=2)
    bank0 = model.memory_bank.rows.numpy()
    # The pre-step forward passes, as the step makes them (training mode, one pass per crop).
    queries = [model.query_encoder(c, training=True) for c in batch]
    key1 = model.key_encoder(batch[0], training=True)
    key2 = model.key_encoder(batch[1], training=True)
    bank_unit = losses.l2_normalize(bank0)
    positive1 = losses.most_probable_positive(key2, bank_unit)  # the *other* global crop
    positive2 = losses.most_probable_positive(key1, bank_unit)

    def ce(query, positive):
        return float(tf.reduce_mean(losses.caco_loss(query, bank_unit, positive, 0.1)))

    def grad(query, positive):
        return bank_lib.cooperative_adversarial_gradient(query, bank0, positive, 0.2).numpy()

    local_pairs = [(q, p) for q in queries[2:] for p in (positive1, positive2)]
    # Reference: mean over global pairs + mean over local pairs; the step's loss is twice it.
    expected_loss = 2 * (0.5 * (ce(queries[0], positive1) + ce(queries[1], positive2))
                         + np.mean([ce(q, p) for q, p in local_pairs]))
    expected_gradient = 2 * (0.5 * (grad(queries[0], positive1) + grad(queries[1], positive2))
                             + np.mean([grad(q, p) for q, p in local_pairs], axis=0))

    history = fit_one(model, batch)

    assert history["loss"][0] == pytest.approx(expected_loss, rel=1e-5)
    np.testing.assert_allclose(model.memory_bank.velocity.numpy(), expected_gradient, rtol=1e-4,
                               atol=1e-7)
    np.testing.assert_allclose(model.memory_bank.rows.numpy(), bank0 - 0.5 * expected_gradient,
                               rtol=1e-4, atol=1e-6)
    # The local crops do move the bank: without them the update differs.
    two_crops_gradient = grad(queries[0], positive1) + grad(queries[1], positive2)
    assert np.abs(expected_gradient - two_crops_gradient).max() > 1e-5


@pytest.mark.slow
def test_warmup_and_evaluation_use_the_global_crops():
    model = tiny_caco(True, warmup_steps=1)
    batches = tf.data.Dataset.from_tensors(crops(local=3)).repeat(2)
    history = model.fit(batches, epochs=1, verbose=0).history  # one warm-up step, one CaCo step
    assert int(model.optimizer.iterations.numpy()) == 2 and np.isfinite(history["loss"][0])
    # The warm-up enqueued the key embeddings of the first global crop.
    assert int(model.memory_bank.pointer.numpy()) == BATCH
    result = model.evaluate(tf.data.Dataset.from_tensors(crops(local=3)), verbose=0,
                            return_dict=True)
    assert np.isfinite(result["loss"])
