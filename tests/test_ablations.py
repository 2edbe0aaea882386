"""The ablation rows and baselines (caco_tf.methods): their losses and bank rules against NumPy,
one fit step of each, the config switch, and two mirrored replicas against one device."""

import numpy as np
import pytest
import tensorflow as tf

from caco_tf import bank as bank_lib
from caco_tf import losses, methods
from caco_tf.config import ConfigError, load_config
from caco_tf.methods.base import Method
from caco_tf.methods.contrastive import ContrastiveMethod

from tiny_methods import BANK, BATCH, MULTI_CROP, by_tier, tiny, views

TAU, BANK_TAU, BANK_LR = 0.1, 0.2, 0.5


def pre_step(model, view1, view2):
    """Queries and keys (None without a key encoder) as the first training step sees them
    (training-mode BatchNorm)."""
    keys = ([model.key_encoder(view1, training=True).numpy(),
             model.key_encoder(view2, training=True).numpy()] if model.key_encoder else
            [None, None])
    return [model.query_encoder(view1, training=True).numpy(),
            model.query_encoder(view2, training=True).numpy()] + keys


# ---------------------------------------------------------------------- NumPy references
def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def np_batch_infonce(queries, positives, candidates, tau, offset=0):
    losses_ = []
    for i, (z, positive) in enumerate(zip(queries, positives)):
        logits = candidates @ z / tau
        logits[offset + i] = z @ positive / tau
        losses_.append(-_log_softmax(logits)[offset + i])
    return np.array(losses_)


def np_nt_xent(embeddings, tau, candidates=None, offset=0):
    candidates = embeddings if candidates is None else candidates
    count = len(embeddings)
    result = []
    for a, z in enumerate(embeddings):
        logits = candidates @ z / tau
        others = [m for m in range(len(candidates)) if m != offset + a]
        partner = offset + (a + count // 2) % count
        result.append(-(logits[partner] - np.log(np.exp(logits[others]).sum())))
    return np.array(result)


def np_moco(queries, keys, bank, tau):
    logits = np.concatenate([np.sum(queries * keys, -1, keepdims=True),
                             queries @ _unit(bank).T], axis=-1) / tau
    return -_log_softmax(logits)[:, 0]


def np_adco_gradient(queries, keys, bank, tau):
    """AdCo's update: g_j = -(1/τ) mean_n p_nj (z_n - (z_n·b̂_j) b̂_j) / ‖b_j‖, p over [k; bank]."""
    norms = np.linalg.norm(bank, axis=-1)
    unit = bank / norms[:, None]
    logits = np.concatenate([np.sum(queries * keys, -1, keepdims=True), queries @ unit.T], -1)
    probs = np.exp(_log_softmax(logits / tau))[:, 1:]
    gradient = np.zeros_like(bank)
    for n, z in enumerate(queries):
        for j in range(len(bank)):
            gradient[j] -= probs[n, j] * (z - (z @ unit[j]) * unit[j]) / norms[j] / tau
    return gradient / len(queries)


@pytest.fixture
def embeddings():
    rng = np.random.default_rng(0)
    return [_unit(rng.normal(size=shape)).astype("float32")
            for shape in ((4, 5), (4, 5), (10, 5), (9, 5))]


# ---------------------------------------------------------------------- pure functions
def test_batch_infonce_matches_numpy(embeddings):
    queries, positives, candidates, _ = embeddings
    # In-batch ("None"): the own keys are the positives.
    got = losses.batch_infonce_loss(queries, candidates[:4], candidates[:4], 0.1).numpy()
    np.testing.assert_allclose(got, np_batch_infonce(queries, candidates[:4], candidates[:4],
                                                     0.1), rtol=1e-5)
    # A replica's rows 3..6 of a gathered batch, with other positives ("Positive").
    got = losses.batch_infonce_loss(queries, positives, candidates, 0.2, offset=3).numpy()
    np.testing.assert_allclose(got, np_batch_infonce(queries, positives, candidates, 0.2, 3),
                               rtol=1e-5)


def test_nt_xent_matches_numpy(embeddings):
    _, _, candidates, _ = embeddings
    local = candidates[2:6]  # [z¹; z²] of two images, rows 2..5 of the global batch
    np.testing.assert_allclose(losses.nt_xent_loss(local, 0.1).numpy(),
                               np_nt_xent(local, 0.1), rtol=1e-5)
    np.testing.assert_allclose(losses.nt_xent_loss(local, 0.5, candidates, offset=2).numpy(),
                               np_nt_xent(local, 0.5, candidates, 2), rtol=1e-5)


def test_adversarial_negative_gradient_is_adcos_closed_form(embeddings):
    queries, keys, _, bank = embeddings
    bank = bank * np.random.default_rng(1).uniform(0.5, 2.0, size=(9, 1))  # raw rows
    got = bank_lib.adversarial_negative_gradient(queries, keys, bank, 0.08).numpy()
    np.testing.assert_allclose(got, np_adco_gradient(queries, keys, bank, 0.08), rtol=1e-4,
                               atol=1e-6)
    # The step ascends the loss, every row towards the queries' mean direction.
    stepped = bank - 1e-3 * got
    assert np_moco(queries, keys, stepped, 0.08).mean() > np_moco(queries, keys, bank, 0.08).mean()


# ---------------------------------------------------------------------- one step of each
@pytest.mark.parametrize("method", by_tier(methods.METHODS))
def test_every_method_fits_and_evaluates(method):
    warmup = int("warmup_temperature" in methods.model_class(method).argument_defaults())
    model = tiny(method, warmup_steps=warmup)
    batches = [views(seed, method=method) for seed in range(3)]  # views, or views and masks
    dataset = tf.data.Dataset.from_tensor_slices(
        tuple(np.stack([b[i] for b in batches]) for i in range(len(batches[0]))))
    history = model.fit(dataset, epochs=1, verbose=0).history
    assert np.isfinite(history["loss"][0])
    assert int(model.optimizer.iterations.numpy()) == 3
    result = model.evaluate(dataset.take(1), verbose=0, return_dict=True)
    assert np.isfinite(result["loss"])
    # The warm-up is its own switch: every method that offers it ran it.
    assert model.warmup_steps == warmup
    if method != "caco":
        assert "mpp_prob" not in history and "lr" in history
        assert ("bank_lr" in history) == (method == "negative")


def test_none_is_in_batch_infonce_with_keys():
    model = tiny("none")
    view1, view2 = views()
    query1, query2, key1, key2 = pre_step(model, view1, view2)
    assert model.memory_bank is None  # no bank of its own
    history = model.fit(tf.data.Dataset.from_tensors((view1, view2)), epochs=1, verbose=0)
    expected = (np_batch_infonce(query1, key2, key2, TAU).mean()
                + np_batch_infonce(query2, key1, key1, TAU).mean())
    assert history.history["loss"][0] == pytest.approx(expected, rel=1e-4)


def test_positive_takes_the_queues_nearest_neighbour_then_enqueues():
    model = tiny("positive")
    view1, view2 = views()
    query1, query2, key1, key2 = pre_step(model, view1, view2)
    queue = _unit(model.memory_bank.rows.numpy())

    def neighbour(keys):
        return queue[np.argmax(keys @ queue.T, axis=-1)]

    history = model.fit(tf.data.Dataset.from_tensors((view1, view2)), epochs=1, verbose=0)
    expected = (np_batch_infonce(query1, neighbour(key2), key2, TAU).mean()
                + np_batch_infonce(query2, neighbour(key1), key1, TAU).mean())
    assert history.history["loss"][0] == pytest.approx(expected, rel=1e-4)
    np.testing.assert_allclose(model.memory_bank.rows.numpy()[:BATCH], key1, rtol=1e-5, atol=1e-6)
    assert int(model.memory_bank.pointer.numpy()) == BATCH


def test_moco_v2_only_enqueues_keys():
    model = tiny("moco_v2")
    bank0 = model.memory_bank.rows.numpy()
    batches = [views(seed) for seed in range(2)]
    keys, expected = [], []
    for seed, (view1, view2) in enumerate(batches):
        query1, query2, key1, key2 = pre_step(model, view1, view2)
        bank = model.memory_bank.rows.numpy()
        expected.append(np_moco(query1, key2, bank, TAU).mean()
                        + np_moco(query2, key1, bank, TAU).mean())
        history = model.fit(tf.data.Dataset.from_tensors((view1, view2)), epochs=1, verbose=0)
        assert history.history["loss"][0] == pytest.approx(expected[-1], rel=1e-4)
        keys.append(key1)
    # Rows 0..15 are the two batches' view-1 keys, FIFO; the rest and the velocity untouched.
    np.testing.assert_allclose(model.memory_bank.rows.numpy()[:2 * BATCH], np.concatenate(keys),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(model.memory_bank.rows.numpy()[2 * BATCH:], bank0[2 * BATCH:])
    np.testing.assert_array_equal(model.memory_bank.velocity.numpy(), 0.0)
    assert int(model.memory_bank.pointer.numpy()) == 2 * BATCH


def test_negative_bank_takes_the_adco_ascent_step():
    model = tiny("negative")
    view1, view2 = views()
    query1, query2, key1, key2 = pre_step(model, view1, view2)
    bank0 = model.memory_bank.rows.numpy()
    history = model.fit(tf.data.Dataset.from_tensors((view1, view2)), epochs=1, verbose=0)
    gradient = (np_adco_gradient(query1, key2, bank0, BANK_TAU)
                + np_adco_gradient(query2, key1, bank0, BANK_TAU))
    # SGD momentum from zero velocity: b - η g; the encoder's loss is MoCo's against the bank.
    np.testing.assert_allclose(model.memory_bank.velocity.numpy(), gradient, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(model.memory_bank.rows.numpy(), bank0 - BANK_LR * gradient,
                               rtol=1e-4, atol=1e-6)
    expected = np_moco(query1, key2, bank0, TAU).mean() + np_moco(query2, key1, bank0, TAU).mean()
    assert history.history["loss"][0] == pytest.approx(expected, rel=1e-4)
    assert history.history["bank_lr"][0] == pytest.approx(BANK_LR)


def test_simclr_is_nt_xent_without_keys_or_bank():
    model = tiny("simclr")
    assert model.key_encoder is None and model.memory_bank is None
    view1, view2 = views()
    query1, query2, _, _ = pre_step(model, view1, view2)
    weight0 = model.query_encoder.trainable_variables[0].numpy()
    history = model.fit(tf.data.Dataset.from_tensors((view1, view2)), epochs=1, verbose=0)
    per_anchor = np_nt_xent(np.concatenate([query1, query2]), TAU)
    expected = per_anchor[:BATCH].mean() + per_anchor[BATCH:].mean()
    assert history.history["loss"][0] == pytest.approx(expected, rel=1e-4)
    assert np.abs(model.query_encoder.trainable_variables[0].numpy() - weight0).max() > 1e-6


def test_a_warmup_gives_a_bankless_method_the_warmups_parts():
    model = tiny("simclr", warmup_steps=2)
    assert model.key_encoder is not None and model.memory_bank.size == BANK
    assert "bank_norm" not in [metric.name for metric in model.metrics]  # its own step has none


# ---------------------------------------------------------------------- configuration
def test_config_picks_the_class():
    for method, cls in methods.METHODS.items():
        assert cls.method == method and issubclass(cls, Method)
        assert issubclass(cls, ContrastiveMethod) == (method in (
            "caco", "none", "positive", "negative", "moco_v2", "simclr"))
    assert load_config(None)["method"]["name"] == "caco"
    with pytest.raises(ConfigError, match="method.name must be one of caco, negative, none, "
                                          "positive, barlow_twins, byol, dino"):
        load_config(None, ["method.name=byol2"])
    with pytest.raises(ConfigError, match=f"multicrop works with method.name {MULTI_CROP}$"):
        load_config(None, ["method.name=simclr", "data.views=multicrop"])


# ---------------------------------------------------------------------- two replicas
@pytest.mark.parametrize("method", ["none", *by_tier(["positive", "simclr"])])
def test_two_replicas_equal_one_device(method):
    """The global-batch gather and the replica offsets: two mirrored replicas step like one.
    (Eager: the same gathers without a trace per replica; tests/test_distributed.py compiles
    a mirrored step.)"""
    from test_distributed import _assert_close, _two_cpus  # one strategy for the session

    strategy = _two_cpus()
    batches = [views(seed, batch=2 * BATCH) for seed in range(2)]
    dataset = tf.data.Dataset.from_tensor_slices(
        (np.stack([b[0] for b in batches]), np.stack([b[1] for b in batches])))
    single = tiny(method, sync=True, run_eagerly=True)
    single_loss = single.fit(dataset, epochs=1, verbose=0).history["loss"][0]
    with strategy.scope():
        mirrored = tiny(method, sync=True, run_eagerly=True)
    mirrored_loss = mirrored.fit(dataset, epochs=1, verbose=0).history["loss"][0]
    assert mirrored_loss == pytest.approx(single_loss, rel=1e-5)
    for a, b in zip(single.weights, mirrored.weights):  # encoders and bank, if any
        _assert_close(b.numpy(), a.numpy(), a.path)



# ---------------------------------------------------------------------- caco-compare
def test_caco_compare_plans_cacos_ablation_in_cacos_section(tmp_path):
    """``caco-compare --methods caco,none,positive,negative`` (docs/compare.md, CaCo's
    ablation), planned on a tiny generated folder: the ablation rows get CaCo's search space
    (they read ``method.caco``), as many trials, CaCo's bank fitted alike, and every run's
    configuration loads and fits the images (the plan's check, before anything trains)."""
    from PIL import Image

    from caco_tf.cli import compare as compare_cli
    from caco_tf.comparison import runner

    rng = np.random.default_rng(0)
    for label in range(3):
        (tmp_path / "images" / f"class{label}").mkdir(parents=True)
        for index in range(40):
            Image.fromarray(rng.integers(0, 255, (16, 16, 3)).astype(np.uint8)).save(
                tmp_path / "images" / f"class{label}" / f"{index}.png")
    rows = ["caco", "none", "positive", "negative"]
    args = compare_cli.parse_args(["--config", "mnist", "--data", f"folder:{tmp_path / 'images'}",
                                   "--methods", ",".join(rows), "--trials", "3", "--seeds", "2",
                                   "--image-size", "16", "--out", str(tmp_path / "out")])
    comparison = runner.Comparison(str(tmp_path / "out"))
    plan = comparison.start(compare_cli.arguments_of(args), "caco-compare ...")
    spaces = {m: dict((key, tuple(values)) for key, values in plan["search_spaces"][m])
              for m in rows}
    assert list(spaces["caco"]) == ["train.learning_rate", "method.caco.temperature"]
    assert all(spaces[m] == spaces["caco"] for m in rows)
    # 78 tuning images fill 64 rows: CaCo's 1,024-row bank shrinks alike for every row.
    assert all(plan["fitted"][m] == ["method.caco.bank_size=64"] for m in rows)
    for method in rows:
        tried = set()
        for trial in range(3):
            config = comparison.config(method, trial, 1, True)
            assert config["method"]["name"] == method
            point = (config["train"]["learning_rate"], config["method"]["caco"]["temperature"])
            if trial == 0:  # the budget as given: configs/mnist.yaml's
                assert point == (0.03, 0.1)
            else:
                assert point[0] in spaces[method]["train.learning_rate"]
                assert point[1] in spaces[method]["method.caco.temperature"]
            assert config["method"]["caco"]["bank_size"] == 64
            tried.add(point)
        assert len(tried) == 3
    assert len([run for run in comparison.runs() if run[1] == "none"]) == 3 + 2
