"""The bank update against the paper's closed forms (eqs. nor_pos_grad, nor_neg_grad,
real_update)."""

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


# ---------------------------------------------------------------------- the tiled passes
@pytest.fixture
def tiled_problem():
    """Two views of 4 queries, keys, a 12-row raw bank with a tie across tiles."""
    rng = np.random.default_rng(2)
    queries = _unit(rng.normal(size=(8, 5)))
    keys = _unit(rng.normal(size=(8, 5)))
    bank = rng.normal(size=(12, 5)) * rng.uniform(0.5, 2.0, size=(12, 1))
    bank[9] = 2.0 * bank[2]  # row 2 exactly (a power of 2), in another tile: argmax ties
    keys[0] = _unit(bank[2])
    velocity = rng.normal(size=(12, 5)) * 0.1
    return queries, keys, bank, velocity


def _logsumexp(x):
    top = x.max(axis=-1)
    return top + np.log(np.exp(x - top[:, None]).sum(axis=-1))


@pytest.mark.parametrize("rows_per_tile", [3, 4, 12])
def test_bank_statistics_are_the_whole_bank_s(tiled_problem, rows_per_tile):
    queries, keys, bank, _ = tiled_problem
    got = bank_lib.bank_statistics(queries, keys, bank, 0.1, 0.2, rows_per_tile)
    query_similarity, key_similarity = queries @ _unit(bank).T, keys @ _unit(bank).T
    np.testing.assert_array_equal(got.positive_index, key_similarity.argmax(axis=-1))
    assert int(got.positive_index[0]) == 2  # the first of the tied rows 2 and 9
    np.testing.assert_allclose(got.positive_probability,
                               _softmax(key_similarity / 0.1).max(axis=-1), rtol=1e-5)
    np.testing.assert_array_equal(got.nearest_index, query_similarity.argmax(axis=-1))
    np.testing.assert_allclose(got.loss_log_normalizer, _logsumexp(query_similarity / 0.1),
                               rtol=1e-5)
    np.testing.assert_allclose(got.bank_log_normalizer, _logsumexp(query_similarity / 0.2),
                               rtol=1e-5)
    tiles = 12 // rows_per_tile
    np.testing.assert_allclose(  # [tiles, N, rows] back to [N, K]
        np.concatenate(list(got.similarity.numpy()), axis=-1), query_similarity, atol=1e-6)
    assert got.similarity.shape == (tiles, 8, rows_per_tile)
    np.testing.assert_allclose(got.mean_norm, np.linalg.norm(bank, axis=-1).mean(), rtol=1e-5)


@pytest.mark.parametrize("rows_per_tile", [3, 12])
def test_tiled_update_is_the_momentum_step_of_the_closed_form(tiled_problem, rows_per_tile):
    queries, keys, bank, velocity = tiled_problem
    statistics = bank_lib.bank_statistics(queries, keys, bank, 0.1, 0.2, rows_per_tile)
    positive_index = statistics.positive_index.numpy()
    expected_unit, new_bank, new_velocity = bank_lib.tiled_caco_update(
        queries, statistics, bank, velocity, 0.1, 0.2, 3.0, 0.9, 2, rows_per_tile)
    # Views stacked [z¹; z²]: each view's batch mean, summed (eq. real_update's direction).
    gradient = (closed_form(queries[:4], bank, positive_index[:4], 0.2)
                + closed_form(queries[4:], bank, positive_index[4:], 0.2))
    np.testing.assert_allclose(new_velocity, 0.9 * velocity + gradient, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(new_bank, bank - 3.0 * (0.9 * velocity + gradient),
                               rtol=1e-4, atol=1e-5)
    # Σ_j p_nj b̂_j at the loss's τ: the loss's gradient is (that - b̂_{j+}) / τ.
    np.testing.assert_allclose(expected_unit,
                               _softmax(queries @ _unit(bank).T / 0.1) @ _unit(bank),
                               rtol=1e-5, atol=1e-6)
    # Without the momentum step (several replicas): the same direction, unaveraged.
    same_unit, direction = bank_lib.tiled_caco_gradient(queries, statistics, bank, 0.1, 0.2, 2,
                                                        rows_per_tile)
    np.testing.assert_allclose(direction, gradient, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(same_unit, expected_unit, rtol=1e-6)


def test_tile_rows_divide_the_bank():
    assert bank_lib.tile_rows(65536) == 1024
    assert bank_lib.tile_rows(1000) == 1000
    assert bank_lib.tile_rows(3 * 1024) == 1024
    assert bank_lib.tile_rows(5 * 1031) == 1031 * 5  # 5 rows a tile would be too few: one tile
    for size in (12, 4096, 4097, 100_000):
        assert size % bank_lib.tile_rows(size) == 0
