"""The bank update against the paper's closed forms (eqs. nor_pos_grad, nor_neg_grad, real_update)."""

import numpy as np
import pytest

from caco_tf import bank as bank_lib


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def closed_form(queries, bank, positive_index, tau):
    """The paper's general gradient with ‖b‖ ≠ 1, sign-flipped for negatives, batch mean.

    ∂ℓ/∂b_{j+} = -(1/τ)(1-p) (‖b‖² z - (z·b) b) / (‖z‖ ‖b‖³)  (kept: cooperative descent)
    ∂ℓ/∂b_j    = +(1/τ) p     (‖b‖² z - (z·b) b) / (‖z‖ ‖b‖³)  (flipped: adversarial ascent)
    """
    expected = np.zeros_like(bank)
    probs = _softmax(queries @ _unit(bank).T / tau)
    norms = np.linalg.norm(bank, axis=-1)
    for n, z in enumerate(queries):
        for j, b in enumerate(bank):
            tangent = (norms[j] ** 2 * z - (z @ b) * b) / (np.linalg.norm(z) * norms[j] ** 3)
            if j == positive_index[n]:
                expected[j] += -(1.0 / tau) * (1.0 - probs[n, j]) * tangent
            else:
                expected[j] += -(1.0 / tau) * probs[n, j] * tangent
    return expected / len(queries)


@pytest.fixture
def problem():
    rng = np.random.default_rng(0)
    queries = _unit(rng.normal(size=(6, 5)))
    bank = rng.normal(size=(9, 5)) * rng.uniform(0.5, 2.0, size=(9, 1))  # raw, non-unit rows
    positive_index = np.array([0, 3, 3, 8, 1, 0])  # rows 0 and 3 are positives twice
    return queries, bank, positive_index


def test_matches_closed_form_with_raw_rows(problem):
    queries, bank, positive_index = problem
    got = bank_lib.cooperative_adversarial_gradient(queries, bank, positive_index, 0.08).numpy()
    np.testing.assert_allclose(got, closed_form(queries, bank, positive_index, 0.08),
                               rtol=1e-4, atol=1e-6)


def test_unit_rows_give_nor_pos_and_nor_neg_grad(problem):
    queries, bank, positive_index = problem
    bank = _unit(bank)
    tau = 0.2
    got = bank_lib.cooperative_adversarial_gradient(queries, bank, positive_index, tau).numpy()
    probs = _softmax(queries @ bank.T / tau)
    expected = np.zeros_like(bank)
    for n, z in enumerate(queries):
        for j, b in enumerate(bank):
            t_z = (np.eye(5) - np.outer(b, b)) @ z  # T_j z
            step = (1 - probs[n, j]) if j == positive_index[n] else probs[n, j]
            expected[j] -= step / tau * t_z / len(queries)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)


def test_each_row_is_tangent_to_its_unit_row(problem):
    queries, bank, positive_index = problem
    got = bank_lib.cooperative_adversarial_gradient(queries, bank, positive_index, 0.08).numpy()
    np.testing.assert_allclose(np.sum(got * _unit(bank), axis=-1), 0.0, atol=1e-6)
    assert np.all(np.linalg.norm(got, axis=-1) > 1e-6)


def test_stacked_views_are_a_mean_per_view_summed(problem):
    """views=2: the two-view step's single call equals one call per view, summed."""
    queries, bank, positive_index = problem
    rng = np.random.default_rng(2)
    other = _unit(rng.normal(size=queries.shape))
    other_index = np.array([2, 2, 5, 7, 0, 1])
    got = bank_lib.cooperative_adversarial_gradient(
        np.concatenate([queries, other]), bank, np.concatenate([positive_index, other_index]),
        0.08, views=2).numpy()
    expected = (closed_form(queries, bank, positive_index, 0.08)
                + closed_form(other, bank, other_index, 0.08))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)


def test_a_given_similarity_replaces_the_product_with_the_bank(problem):
    queries, bank, positive_index = problem
    similarity = queries @ _unit(bank).T
    got = bank_lib.cooperative_adversarial_gradient(queries, bank, positive_index, 0.08,
                                                    similarity=similarity).numpy()
    np.testing.assert_allclose(got, closed_form(queries, bank, positive_index, 0.08),
                               rtol=1e-4, atol=1e-6)
    # It is used as given: another similarity gives another gradient.
    shifted = bank_lib.cooperative_adversarial_gradient(
        queries, bank, positive_index, 0.08, similarity=np.roll(similarity, 1, axis=1)).numpy()
    assert np.abs(shifted - got).max() > 1e-3


def test_positive_and_negatives_both_move_towards_the_query():
    rng = np.random.default_rng(1)
    query = _unit(rng.normal(size=(1, 8)))
    bank = _unit(rng.normal(size=(12, 8)))
    gradient = bank_lib.cooperative_adversarial_gradient(query, bank, [4], 0.08).numpy()
    before = _unit(bank) @ query[0]
    after = _unit(bank - 0.01 * gradient) @ query[0]
    assert np.all(after > before)  # every row, the MPP (4) and the 11 negatives alike
    # The plain (unflipped) gradient would push the negatives away instead.
    plain = gradient.copy()
    plain[np.arange(12) != 4] *= -1
    assert np.all((_unit(bank - 0.01 * plain) @ query[0])[np.arange(12) != 4]
                  < before[np.arange(12) != 4])


def test_momentum_step_is_torch_sgd():
    bank, velocity, gradient = np.ones((2, 3)), np.full((2, 3), 0.5), np.full((2, 3), 2.0)
    new_bank, new_velocity = bank_lib.momentum_step(bank, velocity, gradient, 3.0, 0.9)
    np.testing.assert_allclose(new_velocity, 0.9 * 0.5 + 2.0)
    np.testing.assert_allclose(new_bank, 1.0 - 3.0 * (0.9 * 0.5 + 2.0))


def test_enqueue_wraps_around():
    bank = np.zeros((5, 2), np.float32)
    rows = np.arange(8, dtype=np.float32).reshape(4, 2) + 1
    new_bank, pointer = bank_lib.enqueue(bank, rows, 3)
    assert int(pointer) == 2
    np.testing.assert_array_equal(new_bank.numpy(), [[5, 6], [7, 8], [0, 0], [1, 2], [3, 4]])
