"""DINOv2's loss terms (caco_tf.losses) against their definitions in NumPy: KoLeo, iBOT's
masked-patch loss, and Sinkhorn-Knopp centering of the teacher (SwAV's ``sinkhorn`` at the
teacher's temperature, DINOv2's ``sinkhorn_knopp_teacher``)."""

import numpy as np
import pytest
import tensorflow as tf

from caco_tf import losses


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_koleo_is_minus_the_mean_log_distance_to_the_nearest_other_row():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(7, 5))
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    distances = np.linalg.norm(unit[:, None] - unit[None], axis=-1)
    np.fill_diagonal(distances, np.inf)
    nearest = distances.argmin(1)
    expected = -np.mean(np.log(np.linalg.norm(unit - unit[nearest] + 1e-8, axis=1) + 1e-8))
    assert float(losses.koleo_loss(tf.constant(x))) == pytest.approx(expected, rel=1e-5)


def test_koleo_falls_as_the_rows_spread_and_its_gradient_pushes_neighbours_apart():
    close = tf.constant([[1.0, 0.0], [0.99, 0.14], [0.0, 1.0]])
    spread = tf.constant([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]])
    assert float(losses.koleo_loss(spread)) < float(losses.koleo_loss(close))
    with tf.GradientTape() as tape:
        tape.watch(close)
        loss = losses.koleo_loss(close)
    step = -tape.gradient(loss, close).numpy()  # descent moves row 0 away from row 1
    assert np.dot(step[0], (close[0] - close[1]).numpy()) > 0


def test_the_ibot_loss_averages_masked_patches_per_image_then_every_image():
    rng = np.random.default_rng(1)
    teacher = rng.dirichlet(np.ones(6), size=(3, 4))
    student = rng.normal(size=(3, 4, 6))
    masks = np.array([[1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]], bool)
    cross = -(teacher * _log_softmax(student / 0.1)).sum(-1)
    expected = (cross[0, [0, 2]].mean() + 0.0 + cross[2].mean()) / 3  # image 1: none masked
    found = losses.ibot_patch_loss(tf.constant(teacher), tf.constant(student),
                                   tf.constant(masks), 0.1)
    assert float(found) == pytest.approx(expected, rel=1e-5)


def test_the_ibot_loss_trains_the_student_only_and_not_through_unmasked_patches():
    teacher = tf.constant(np.full((1, 2, 3), 1 / 3))
    student = tf.Variable(np.arange(6.0).reshape(1, 2, 3))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(teacher)
        loss = losses.ibot_patch_loss(teacher, student, tf.constant([[True, False]]), 0.1)
    assert tape.gradient(loss, teacher) is None
    gradient = tape.gradient(loss, student).numpy()
    assert np.abs(gradient[0, 0]).sum() > 0 and np.all(gradient[0, 1] == 0)


def test_sinkhorn_centering_is_dinov2s_teacher_assignment():
    """DINOv2's sinkhorn_knopp_teacher: Q = exp(t/τ)ᵀ, Q/ΣQ, then 3 times rows to 1/K,
    columns to 1/B; returned ×B: each sample a distribution, each prototype 1/K of the mass."""
    rng = np.random.default_rng(2)
    logits, temperature = rng.normal(size=(8, 5)), 0.07
    q = np.exp(logits / temperature).T
    q /= q.sum()
    for _ in range(3):
        q /= q.sum(1, keepdims=True) * 5
        q /= q.sum(0, keepdims=True) * 8
    expected = (q * 8).T
    found = losses.sinkhorn(tf.constant(logits), temperature, 3).numpy()
    np.testing.assert_allclose(found, expected, rtol=1e-4)
    np.testing.assert_allclose(found.sum(1), 1.0, rtol=1e-5)
