"""W-MSE (caco_tf.methods.w_mse): the whitening and the loss against closed forms in NumPy, one
step of the method against them, and the batches it refuses in one line.  The tests every
method takes (every part moving, 1 against 2 and 4 replicas, a SIGTERM resume, save and load)
run it from the registry."""

import numpy as np
import pytest

from caco_tf import losses
from caco_tf.config import ConfigError, load_config
from caco_tf.build import RunPlan, check_sizes
from caco_tf.run_settings import RunSettings
from test_methods import fit_once, projections, unit
from tiny_methods import MULTI_CROP, tiny, views


def np_whiten(z, group_size, epsilon=0.0):
    """Each group's (z - mean) W with W = Cov^(-1/2) from the Cholesky factor, in float64."""
    out = []
    for group in z.astype(np.float64).reshape(-1, group_size, z.shape[1]):
        centered = group - group.mean(0)
        covariance = centered.T @ centered / (group_size - 1)
        covariance = (1 - epsilon) * covariance + epsilon * np.eye(z.shape[1])
        out.append(centered @ np.linalg.inv(np.linalg.cholesky(covariance)).T)
    return np.concatenate(out)


def np_w_mse(z1, z2, group_size, epsilon=0.0):
    w1, w2 = unit(np_whiten(z1, group_size, epsilon)), unit(np_whiten(z2, group_size, epsilon))
    return np.mean(2 - 2 * np.sum(w1 * w2, -1))


def test_whitening_gives_each_group_zero_mean_and_identity_covariance():
    z = np.random.default_rng(0).normal(size=(16, 3)).astype("float32") * [1.0, 5.0, 0.2]
    white = losses.whiten(z, 8).numpy()
    np.testing.assert_allclose(white, np_whiten(z, 8), rtol=1e-4, atol=1e-5)
    for group in white.reshape(2, 8, 3):
        np.testing.assert_allclose(group.mean(0), 0, atol=1e-5)
        np.testing.assert_allclose(np.cov(group, rowvar=False), np.eye(3), atol=1e-4)
    shrunk = losses.whiten(z, 4, epsilon=0.5).numpy()  # 4 rows: singular without shrinkage
    np.testing.assert_allclose(shrunk, np_whiten(z, 4, 0.5), rtol=1e-4, atol=1e-5)


def test_the_loss_matches_numpy():
    rng = np.random.default_rng(1)
    z1, z2 = (rng.normal(size=(12, 4)).astype("float32") for _ in range(2))
    assert float(losses.w_mse_loss(z1, z2, 6)) == pytest.approx(np_w_mse(z1, z2, 6), rel=1e-5)
    assert float(losses.w_mse_loss(z1, z1, 6)) == pytest.approx(0.0, abs=1e-5)


def test_a_step_takes_the_whitened_views_loss():
    model = tiny("w_mse")
    v1, v2 = views()  # a batch of 8: one whitening group (tiny: whitening_size 8, epsilon 0.1)
    z1, z2 = projections(model, (v1, v2))
    history = fit_once(model, (v1, v2))
    assert history["loss"][0] == pytest.approx(np_w_mse(z1, z2, 8, 0.1), rel=1e-4)


@pytest.mark.parametrize("assignments, message", [
    (["train.batch_size=96"], "method.w_mse.whitening_size 128 must divide a replica's batch "
                              r"\(96 images"),
    (["method.w_mse.whitening_size=32", "train.batch_size=64"],
     r"method.w_mse.whitening_size 32 must exceed model.embedding_dim \(256\)"),
])
def test_a_batch_it_cannot_whiten_is_one_line(assignments, message):
    config = load_config(None, ["method.name=w_mse"] + assignments)
    plan = RunPlan.of(RunSettings.of(config),
                      steps_per_epoch=4000 // config["train"]["batch_size"])
    with pytest.raises(ConfigError, match=message):
        check_sizes(plan, 4000, config["model"]["embedding_dim"])


# ---------------------------------------------------------------------- K equal views (W-MSE 4)
def np_w_mse_views(views_, group_size, epsilon=0.0):
    """The mean of the pair loss over every pair of views (htdt/self-supervised's num_pairs)."""
    pairs = [(i, j) for i in range(len(views_)) for j in range(i + 1, len(views_))]
    return np.mean([np_w_mse(views_[i], views_[j], group_size, epsilon) for i, j in pairs])


def test_the_loss_of_k_views_is_the_mean_over_their_pairs():
    rng = np.random.default_rng(2)
    four = [rng.normal(size=(12, 4)).astype("float32") for _ in range(4)]
    assert float(losses.w_mse_views_loss(four, 6)) == pytest.approx(
        np_w_mse_views(four, 6), rel=1e-5)
    assert float(losses.w_mse_views_loss(four[:2], 6)) == float(losses.w_mse_loss(*four[:2], 6))


def test_a_step_of_four_views_takes_every_pair_and_refuses_two():
    model = tiny("w_mse", views=4)
    batch = views(crops=4)
    projected = projections(model, batch)
    history = fit_once(model, batch)
    assert history["loss"][0] == pytest.approx(np_w_mse_views(projected, 8, 0.1), rel=1e-4)
    with pytest.raises(ValueError, match="method 'w_mse' takes 4 views, got 2 crops"):
        fit_once(tiny("w_mse", views=4), views())


def test_the_views_follow_the_methods_crops():
    from caco_tf.build import run_views

    for name in ("digits", "asymmetric", "symmetric"):
        config = load_config(None, ["method.name=w_mse", "method.w_mse.views=4",
                                    f"data.views={name}"])
        assert run_views(config).num_views == 4, name
    assert run_views(load_config(None, ["method.name=byol"])).num_views == 2
    with pytest.raises(ConfigError, match="method.name w_mse takes K equal views "
                                          r"\(method.w_mse.views, default 2\); data.views "
                                          f"multicrop works with method.name {MULTI_CROP}$"):
        load_config(None, ["method.name=w_mse", "data.views=multicrop", "data.image_size=32"])


@pytest.mark.slow
def test_four_views_on_one_replica_equal_two_replicas():
    import keras
    import tensorflow as tf

    from test_distributed import _assert_close, _cpus
    from tiny_methods import BATCH

    batch = views(batch=2 * BATCH, crops=4)  # a replica's sub-batches: whitening_size 8
    runs = []
    for replicas in (1, 2):
        keras.utils.set_random_seed(0)
        with _cpus(replicas).scope() if replicas > 1 else tf.distribute.get_strategy().scope():
            model = tiny("w_mse", sync=True, run_eagerly=True, views=4)
        runs.append((model, fit_once(model, batch)["loss"][0]))
    (single, single_loss), (mirrored, loss) = runs
    assert loss == pytest.approx(single_loss, rel=1e-5, abs=1e-6)
    for a, b in zip(single.weights, mirrored.weights):
        _assert_close(b.numpy(), a.numpy(), f"2 replicas: {a.path}")
