"""Health without labels: the metrics against closed forms on constructed embeddings, the
collapse rule (judged after the warm-up), and a NaN loss stopping a run while its last good
state stays."""

import types

import numpy as np
import pytest
import tensorflow as tf

from caco_tf import health
from caco_tf.training import callbacks
from caco_tf.training.run_folder import RunFolder
from caco_tf.training.stop_reason import StopReason


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.mark.parametrize("rank", [1, 3, 8])
def test_effective_rank_of_a_rank_r_set_is_r(rank):
    rng = np.random.default_rng(rank)
    # Orthogonal directions with equal weights: the singular values are all equal, RankMe = r.
    basis = np.linalg.qr(rng.normal(size=(32, rank)))[0].T  # [r, 32] orthonormal rows
    coefficients = np.linalg.qr(rng.normal(size=(512, rank)))[0] * np.sqrt(512 / rank)
    equal = coefficients @ basis
    assert float(health.effective_rank(equal)) == pytest.approx(rank, rel=1e-3)
    # Random points of a rank-r subspace: close to r (unequal singular values lower it).
    points = rng.normal(size=(512, rank)) @ basis
    assert rank * 0.8 < float(health.effective_rank(points)) <= rank + 1e-3


def test_effective_rank_follows_rankmes_formula():
    z = np.random.default_rng(0).normal(size=(64, 16)).astype(np.float32)
    sigma = np.linalg.svd(z, compute_uv=False)
    p = sigma / sigma.sum() + health.RANK_EPSILON
    assert float(health.effective_rank(z)) == pytest.approx(np.exp(-(p * np.log(p)).sum()),
                                                            rel=1e-4)


def test_alignment_and_uniformity_closed_forms():
    rng = np.random.default_rng(1)
    z = _unit(rng.normal(size=(50, 8))).astype(np.float32)
    assert float(health.alignment(z, z)) == 0.0
    assert float(health.alignment(z, -z)) == pytest.approx(4.0, rel=1e-5)  # ||z - (-z)||² = 4
    # All embeddings equal: every pair at distance 0, uniformity log 1 = 0.
    assert float(health.uniformity(np.repeat(z[:1], 10, axis=0))) == pytest.approx(0.0, abs=1e-6)
    # Two antipodal points: the one pair (both orders) at squared distance 4: log e^(-8) = -8.
    assert float(health.uniformity(np.stack([z[0], -z[0]]))) == pytest.approx(-8.0, rel=1e-5)
    # The NumPy definition over all ordered pairs i != j.
    distances = ((z[:, None] - z[None]) ** 2).sum(-1)
    pairs = distances[~np.eye(50, dtype=bool)]
    assert float(health.uniformity(z)) == pytest.approx(np.log(np.exp(-2 * pairs).mean()),
                                                        rel=1e-4)


def test_histogram_usage_and_entropy():
    counts = np.zeros(100)
    counts[:4] = 5.0  # four rows used equally
    assert float(health.histogram_usage(counts)) == pytest.approx(0.04)
    assert float(health.histogram_entropy(counts)) == pytest.approx(np.log(4), rel=1e-6)
    collapsed = np.zeros(100)
    collapsed[7] = 1000.0
    assert float(health.histogram_entropy(collapsed)) == pytest.approx(0.0, abs=1e-6)


def test_the_collapse_rule():
    from test_model import tiny_caco  # K = 32 rows

    caco = tiny_caco()
    # 4,000 images an epoch (8,000 MPP assignments): 2 % of the 32 rows is 0.64.
    epoch = callbacks.EpochCount(3, 250, 4000)
    assert callbacks.is_collapsed({"mpp_usage": 0 / 32}, caco, epoch) == (
        "the positives use 0 of 32 bank rows")
    assert callbacks.is_collapsed({"mpp_usage": 3 / 32}, caco, epoch) is None
    assert callbacks.is_collapsed({"rank_embedding": 1.3}).startswith(
        "the embeddings' effective rank is 1.30")
    assert callbacks.is_collapsed({"rank_embedding": 40.0}) is None
    assert callbacks.is_collapsed({"uniformity": -0.05}).startswith(
        "the embeddings bunch together (uniformity -0.050")
    assert callbacks.is_collapsed({"uniformity": -0.9}) is None


def test_a_nan_loss_stops_the_run_at_its_step_and_keeps_the_last_good_state(tmp_path):
    from test_model import tiny_caco, views

    model = tiny_caco()
    batches = [views(seed) for seed in range(6)]  # 3 steps an epoch
    poisoned = [b[0].copy() for b in batches]
    poisoned[4][0, 0, 0, 0] = np.nan  # epoch 2, its second batch
    dataset = tf.data.Dataset.from_tensor_slices(
        (np.stack(poisoned), np.stack([b[1] for b in batches])))
    guard = callbacks.HealthMonitor()
    resume = callbacks.Resume(str(tmp_path), steps_per_epoch=3)
    history = model.fit(dataset, epochs=2, steps_per_epoch=3, callbacks=[guard, resume],
                        verbose=0)
    assert model.stop_reason == StopReason("divergence",
                                           "the loss became nan at step 5 (epoch 2, batch 2)")
    assert len(history.history["loss"]) == 2 and np.isnan(history.history["loss"][1])
    backup = RunFolder(str(tmp_path)).read_backup()
    assert backup.epoch == 1  # epoch 2 was not saved
    restored = tiny_caco()
    restored.load_weights(backup.weights)
    assert np.isfinite(restored.memory_bank.rows.numpy()).all()
    assert int(restored.optimizer.iterations.numpy()) == 3



def test_a_stop_reason_is_a_divergence_or_a_collapse_and_reads_as_its_message():
    reason = StopReason("collapse", "a collapse after epoch 3 (why)")
    assert str(reason) == "a collapse after epoch 3 (why)" and f"{reason}" == str(reason)
    with pytest.raises(ValueError, match="kind is one of divergence, collapse, got 'nan'"):
        StopReason("nan", "the loss became nan")


class _Run:
    """What HealthMonitor reads of a model: its warm-up length, step counter and own check."""

    COLLAPSE_ADVICE = "advice"

    def __init__(self, warmup_steps):
        self.warmup_steps, self.stop_reason, self.stop_training = warmup_steps, None, False
        self.optimizer = types.SimpleNamespace(iterations=tf.Variable(0, dtype=tf.int64))

    def collapse(self, logs, epoch):
        return None

    def judged(self, epoch):
        return True


def test_the_collapse_rule_judges_the_epochs_after_the_warm_up(caplog):
    run = _Run(warmup_steps=20)  # 10 steps an epoch: epochs 1 and 2 are the warm-up
    guard = callbacks.HealthMonitor(stop_on_collapse=True)
    guard.set_model(run)
    bunched, spread = {"uniformity": -0.05}, {"uniformity": -0.9}
    epochs = []
    for epoch, logs in enumerate([bunched, bunched, spread, bunched, bunched]):
        run.optimizer.iterations.assign(10 * (epoch + 1))
        guard.on_epoch_end(epoch, dict(logs))
        epochs.append((run.stop_reason, run.stop_training))
        if run.stop_training:
            break
    # The warm-up's bunched epochs pass (recorded, not judged); the first bunched epoch after
    # it warns once and, with stop_on_collapse, stops the run there.
    assert epochs[:3] == [(None, False)] * 3
    assert epochs[3] == (StopReason("collapse", "a collapse after epoch 4 (the embeddings bunch "
                                    "together (uniformity -0.050, above -0.2))"), True)
    assert len(epochs) == 4
    warnings = [r.getMessage() for r in caplog.records if "collapse" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith("warning: collapse after epoch 4: ")


def test_without_a_warm_up_the_first_epoch_is_judged(caplog):
    run = _Run(warmup_steps=0)
    guard = callbacks.HealthMonitor()  # warns, does not stop
    guard.set_model(run)
    for epoch in range(2):
        run.optimizer.iterations.assign(10 * (epoch + 1))
        guard.on_epoch_end(epoch, {"rank_embedding": 1.2})
    assert run.stop_reason is None and not run.stop_training
    warnings = [r.getMessage() for r in caplog.records if "collapse" in r.getMessage()]
    assert warnings == [warnings[0]] and "after epoch 1: the embeddings' effective rank is 1.20" \
        in warnings[0]


def test_the_ranks_are_those_of_the_backbone_and_the_query_encoder():
    from test_model import tiny_caco, views

    model = tiny_caco()
    images = np.concatenate(views(seed=3))
    guard = callbacks.HealthMonitor(sample=tf.data.Dataset.from_tensor_slices(images).batch(5))
    guard.set_model(model)
    ranks = guard.ranks()  # one compiled pass of the backbone per batch
    features = model.backbone(images, training=False)
    embeddings = model.query_encoder(images, training=False)
    assert ranks["rank_features"] == pytest.approx(float(health.effective_rank(features)), rel=1e-5)
    assert ranks["rank_embedding"] == pytest.approx(float(health.effective_rank(embeddings)),
                                                    rel=1e-5)
