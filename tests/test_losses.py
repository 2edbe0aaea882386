"""Losses and MPP selection against NumPy."""

import numpy as np

from caco_tf import losses


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def test_caco_loss_is_cross_entropy_over_the_bank():
    rng = np.random.default_rng(0)
    queries, bank = _unit(rng.normal(size=(4, 6))), _unit(rng.normal(size=(10, 6)))
    positive = np.array([1, 5, 5, 9])
    got = losses.caco_loss(queries, bank, positive, 0.08).numpy()
    expected = -_log_softmax(queries @ bank.T / 0.08)[np.arange(4), positive]
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_most_probable_positive_is_argmax_over_normalized_rows():
    rng = np.random.default_rng(1)
    keys = _unit(rng.normal(size=(5, 6)))
    raw_bank = rng.normal(size=(20, 6)) * rng.uniform(0.1, 10, size=(20, 1))
    got = losses.most_probable_positive(keys, losses.l2_normalize(raw_bank)).numpy()
    np.testing.assert_array_equal(got, np.argmax(keys @ _unit(raw_bank).T, axis=-1))
    # Not the argmax of raw inner products, which favours long rows.
    assert not np.array_equal(got, np.argmax(keys @ raw_bank.T, axis=-1))


def test_moco_loss_puts_the_key_first():
    rng = np.random.default_rng(3)
    queries, keys = _unit(rng.normal(size=(4, 6))), _unit(rng.normal(size=(4, 6)))
    bank = _unit(rng.normal(size=(9, 6)))
    got = losses.moco_loss(queries, keys, bank, 0.2).numpy()
    logits = np.concatenate([np.sum(queries * keys, -1, keepdims=True), queries @ bank.T], 1)
    np.testing.assert_allclose(got, -_log_softmax(logits / 0.2)[:, 0], rtol=1e-5)


def test_embedding_spread_is_one_for_an_even_spread_and_zero_for_a_point():
    z = np.random.default_rng(0).normal(size=(64, 8)).astype(np.float32) * 3.0
    expected = _unit(z).std(axis=0).mean() * np.sqrt(8)
    np.testing.assert_allclose(losses.embedding_spread(z).numpy(), expected, rtol=1e-5)
    basis = np.concatenate([np.eye(8), -np.eye(8)]).astype(np.float32)  # ±e_i: std 1/√8
    np.testing.assert_allclose(losses.embedding_spread(basis).numpy(), 1.0, rtol=1e-5)
    assert losses.embedding_spread(np.ones((5, 8), np.float32)).numpy() == 0.0
