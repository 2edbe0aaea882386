"""Tests for caco_tf.optimizers (CPU, seeded, fast)."""

import copy
import math
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from caco_tf.training.optimizers import (  # noqa: E402
    LARS,
    CosineMomentum,
    WarmupCosine,
    build_encoder_optimizer,
    paper_learning_rate,
)

SHAPES = {"kernel": (5, 3), "conv": (3, 3, 2, 4), "bias": (4,)}
TOL = dict(rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------
# NumPy references (float64)
# --------------------------------------------------------------------------
def numpy_lars(params, grads_per_step, lrs, momentum, wd, eta):
    """MoCo v3 LARS: decay + trust ratio on rank>1 params only."""
    p = {k: v.astype(np.float64).copy() for k, v in params.items()}
    mu = {k: np.zeros_like(v) for k, v in p.items()}
    for grads, lr in zip(grads_per_step, lrs):
        for k in p:
            g = grads[k].astype(np.float64)
            if p[k].ndim > 1:
                g = g + wd * p[k]
                pn, gn = np.linalg.norm(p[k]), np.linalg.norm(g)
                q = eta * pn / gn if (pn > 0 and gn > 0) else 1.0
                g = g * q
            mu[k] = momentum * mu[k] + g
            p[k] = p[k] - lr * mu[k]
    return p


def numpy_torch_sgd(params, grads_per_step, lrs, momentum, wd):
    """torch.optim.SGD(momentum, weight_decay), dampening 0, no nesterov."""
    p = {k: v.astype(np.float64).copy() for k, v in params.items()}
    buf = {k: None for k in p}
    for grads, lr in zip(grads_per_step, lrs):
        for k in p:
            d_p = grads[k].astype(np.float64) + wd * p[k]
            buf[k] = d_p.copy() if buf[k] is None else momentum * buf[k] + d_p
            p[k] = p[k] - lr * buf[k]
    return p


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------
def make_params(seed=0):
    rng = np.random.default_rng(seed)
    return {
        k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()
    }


def make_grads(n_steps, random, seed=1):
    rng = np.random.default_rng(seed)
    if not random:
        g = {
            k: rng.normal(size=s).astype(np.float32)
            for k, s in SHAPES.items()
        }
        return [g] * n_steps
    return [
        {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()}
        for _ in range(n_steps)
    ]


def run_keras(opt, params, grads_per_step, use_tf_function=False):
    variables = {k: keras.Variable(v, name=k) for k, v in params.items()}
    keys = list(variables)
    var_list = [variables[k] for k in keys]
    opt.build(var_list)

    def step(grads):
        opt.apply(grads, var_list)

    if use_tf_function:
        step = tf.function(step)
    for grads in grads_per_step:
        step([tf.constant(grads[k]) for k in keys])
    return {k: variables[k].numpy() for k in keys}


def assert_dicts_close(actual, expected):
    for k in expected:
        np.testing.assert_allclose(actual[k], expected[k], err_msg=k, **TOL)


# --------------------------------------------------------------------------
# LARS
# --------------------------------------------------------------------------
@pytest.mark.parametrize("random_grads", [False, True])
def test_lars_matches_numpy_reference(random_grads):
    params = make_params()
    grads = make_grads(3, random_grads)
    # Large eta / lr / wd so every term changes the result well above 1e-6.
    hp = dict(momentum=0.9, wd=0.05, eta=0.02)
    lr = 0.5
    opt = LARS(
        learning_rate=lr,
        momentum=hp["momentum"],
        weight_decay=hp["wd"],
        trust_coefficient=hp["eta"],
    )
    out = run_keras(opt, params, grads)
    ref = numpy_lars(params, grads, [lr] * 3, **hp)
    assert_dicts_close(out, ref)
    # Sanity: the update is non-trivial, and differs from plain torch-SGD.
    for k in params:
        assert np.max(np.abs(out[k] - params[k])) > 1e-3
    sgd = numpy_torch_sgd(params, grads, [lr] * 3, hp["momentum"], hp["wd"])
    assert not np.allclose(out["kernel"], sgd["kernel"], atol=1e-3)
    assert not np.allclose(out["bias"], sgd["bias"], atol=1e-3)


def test_lars_with_schedule_in_tf_function():
    params = make_params(2)
    grads = make_grads(3, True, seed=3)
    schedule = WarmupCosine(base_value=1.0, total_steps=6, warmup_steps=2)
    opt = LARS(learning_rate=schedule, weight_decay=0.01, trust_coefficient=0.05)
    out = run_keras(opt, params, grads, use_tf_function=True)
    lrs = [float(schedule(i)) for i in range(3)]
    assert lrs[0] == 0.0 and lrs[1] == pytest.approx(0.5)
    ref = numpy_lars(params, grads, lrs, momentum=0.9, wd=0.01, eta=0.05)
    assert_dicts_close(out, ref)
    assert int(opt.iterations.numpy()) == 3


def test_lars_bias_gets_no_weight_decay():
    params = make_params()
    zero = [{k: np.zeros(s, np.float32) for k, s in SHAPES.items()}] * 2
    out = run_keras(LARS(learning_rate=1.0, weight_decay=0.1), params, zero)
    np.testing.assert_array_equal(out["bias"], params["bias"])
    # Kernels do decay (towards zero).
    assert np.linalg.norm(out["kernel"]) < np.linalg.norm(params["kernel"])


@pytest.mark.parametrize("random_grads", [False, True])
def test_sgd_mode_matches_torch_sgd(random_grads):
    params = make_params(4)
    grads = make_grads(3, random_grads, seed=5)
    lr, m, wd = 0.1, 0.9, 0.05
    opt = LARS(
        learning_rate=lr, momentum=m, weight_decay=wd, layer_adaptation=False
    )
    out = run_keras(opt, params, grads)
    ref = numpy_torch_sgd(params, grads, [lr] * 3, m, wd)
    assert_dicts_close(out, ref)
    # Weight decay really reaches the bias in this mode.
    no_wd = numpy_torch_sgd(params, grads, [lr] * 3, m, 0.0)
    assert not np.allclose(out["bias"], no_wd["bias"], atol=1e-4)


def test_coupled_decay_not_forwarded_to_base():
    opt = LARS(learning_rate=0.1, weight_decay=0.05)
    assert opt.weight_decay is None  # no decoupled decay from the base class
    assert opt.coupled_weight_decay == 0.05


def test_exclude_from_weight_decay_is_honoured():
    params = make_params()
    zero = [{k: np.zeros(s, np.float32) for k, s in SHAPES.items()}]
    opt = LARS(learning_rate=1.0, weight_decay=0.1, layer_adaptation=False)
    opt.exclude_from_weight_decay(var_names=["conv"])
    out = run_keras(opt, params, zero)
    np.testing.assert_array_equal(out["conv"], params["conv"])
    np.testing.assert_allclose(out["kernel"], 0.9 * params["kernel"], **TOL)


def test_trust_ratio_is_one_for_zero_norms():
    lr, wd, eta = 0.5, 0.1, 0.001
    rng = np.random.default_rng(7)
    g = rng.normal(size=(3, 4)).astype(np.float32)
    p = rng.normal(size=(3, 4)).astype(np.float32)
    params = {"zero_p": np.zeros((3, 4), np.float32), "zero_g": p,
              "both": np.zeros((3, 4), np.float32)}
    grads = {"zero_p": g, "zero_g": (-wd * p).astype(np.float32),
             "both": np.zeros((3, 4), np.float32)}
    variables = {k: keras.Variable(v, name=k) for k, v in params.items()}
    keys = list(variables)
    opt = LARS(learning_rate=lr, weight_decay=wd, trust_coefficient=eta)
    opt.build([variables[k] for k in keys])
    opt.apply([tf.constant(grads[k]) for k in keys],
              [variables[k] for k in keys])
    out = {k: variables[k].numpy() for k in keys}
    for v in out.values():
        assert np.all(np.isfinite(v))
    # ||p|| = 0 -> q = 1: unscaled step (eta would shrink it 1000x).
    np.testing.assert_allclose(out["zero_p"], -lr * g, **TOL)
    # ||g + wd p|| = 0 -> q = 1, and the (zero) update leaves p unchanged.
    np.testing.assert_allclose(out["zero_g"], p, **TOL)
    np.testing.assert_array_equal(out["both"], 0.0)


def test_lars_rejects_bad_hyperparameters():
    with pytest.raises(ValueError):
        LARS(learning_rate=0.1, momentum=1.5)
    with pytest.raises(ValueError):
        LARS(learning_rate=0.1, weight_decay=-1.0)


def test_lars_config_round_trip():
    schedule = WarmupCosine(2.0, total_steps=100, warmup_steps=10,
                            final_value=0.1)
    opt = LARS(learning_rate=schedule, momentum=0.8, weight_decay=3e-4,
               trust_coefficient=0.01, layer_adaptation=False, name="enc",
               clipnorm=1.0)
    cfg = opt.get_config()
    assert cfg["weight_decay"] == 3e-4
    clone = LARS.from_config(copy.deepcopy(cfg))  # from_config mutates
    assert clone.get_config() == cfg
    assert isinstance(clone._learning_rate, WarmupCosine)
    assert clone._learning_rate.get_config() == schedule.get_config()
    assert clone.weight_decay is None
    assert (clone.momentum, clone.coupled_weight_decay, clone.trust_coefficient,
            clone.layer_adaptation, clone.clipnorm, clone.name) == (
                0.8, 3e-4, 0.01, False, 1.0, "enc")
    # Generic Keras (de)serialisation through the registered name.
    clone2 = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
    assert isinstance(clone2, LARS)
    assert clone2.get_config() == cfg

    const = LARS(learning_rate=0.25)
    assert LARS.from_config(const.get_config()).get_config() == \
        const.get_config()


# --------------------------------------------------------------------------
# Schedules
# --------------------------------------------------------------------------
def _closed_form(step, base, total, warmup, final):
    step = min(step, total)
    if step < warmup:
        return base * step / warmup
    t = (step - warmup) / max(1, total - warmup)
    return final + (base - final) * 0.5 * (1 + math.cos(math.pi * t))


def test_warmup_cosine_values():
    base, total, warmup, final = 1.2, 110, 10, 0.01
    s = WarmupCosine(base, total_steps=total, warmup_steps=warmup,
                     final_value=final)
    expected = {0: 0.0, 5: 0.6, 10: base, 60: (base + final) / 2,
                110: final, 500: final}
    for step, value in expected.items():
        assert float(s(step)) == pytest.approx(value, abs=1e-6), step
        assert value == pytest.approx(
            _closed_form(step, base, total, warmup, final), abs=1e-9)
    for step in (3, 37, 99):
        assert float(s(step)) == pytest.approx(
            _closed_form(step, base, total, warmup, final), abs=1e-6)


def test_warmup_cosine_no_warmup_and_tensor_steps():
    s = WarmupCosine(0.3, total_steps=8)
    assert float(s(0)) == pytest.approx(0.3)
    fn = tf.function(lambda step: s(step))
    out = fn(tf.constant(4, tf.int64))
    assert out.dtype == tf.float32
    assert float(out) == pytest.approx(0.15, abs=1e-6)
    assert float(fn(tf.constant(8, tf.int64))) == pytest.approx(0.0, abs=1e-7)


def test_warmup_cosine_validation():
    with pytest.raises(ValueError):
        WarmupCosine(0.1, total_steps=0)
    with pytest.raises(ValueError):
        WarmupCosine(0.1, total_steps=10, warmup_steps=11)


def test_cosine_momentum_values():
    m = CosineMomentum(0.99, total_steps=1000)
    assert float(m(0)) == pytest.approx(0.99, abs=1e-7)
    assert float(m(500)) == pytest.approx(0.995, abs=1e-7)
    assert float(m(1000)) == pytest.approx(1.0, abs=1e-7)
    assert float(m(5000)) == pytest.approx(1.0, abs=1e-7)
    assert float(m(250)) == pytest.approx(
        1 - 0.01 * (math.cos(math.pi / 4) + 1) / 2, abs=1e-7)
    assert float(tf.function(m)(tf.constant(500))) == pytest.approx(
        0.995, abs=1e-7)


def test_schedule_config_round_trip():
    for s in (WarmupCosine(0.6, 200, 20, 0.001), CosineMomentum(0.996, 300)):
        clone = type(s).from_config(s.get_config())
        assert clone.get_config() == s.get_config()
        generic = keras.optimizers.schedules.deserialize(
            keras.optimizers.schedules.serialize(s))
        assert type(generic) is type(s)
        for step in (0, 17, 150, 300):
            assert float(generic(step)) == pytest.approx(float(s(step)))


# --------------------------------------------------------------------------
# Paper recipe
# --------------------------------------------------------------------------
def test_paper_learning_rate():
    assert paper_learning_rate(256) == ("sgd", pytest.approx(0.03))
    assert paper_learning_rate(512) == ("sgd", pytest.approx(0.06))
    assert paper_learning_rate(1024) == ("lars", pytest.approx(1.2))
    assert paper_learning_rate(4096) == ("lars", pytest.approx(4.8))
    assert paper_learning_rate(256, "LARS") == ("lars", pytest.approx(0.3))
    assert paper_learning_rate(4096, "sgd") == ("sgd", pytest.approx(0.48))
    with pytest.raises(ValueError):
        paper_learning_rate(256, "adam")


@pytest.mark.parametrize("kind", ["sgd", "lars", "adamw"])
def test_a_sparse_gradient_steps_as_its_dense_twin(kind):
    # A gathered weight (KerasHub's ViT position embedding) gets IndexedSlices, rows repeated.
    rows, indices = np.arange(12, dtype=np.float32).reshape(3, 4), [0, 2, 0]
    sparse = tf.IndexedSlices(tf.constant(rows), tf.constant(indices), tf.constant([5, 4]))
    dense = tf.math.unsorted_segment_sum(rows, indices, 5)
    start = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    stepped = []
    for gradient in (sparse, dense):
        optimizer = build_encoder_optimizer(256, 10, 0, optimizer=kind, learning_rate=0.1,
                                            clip_gradient_norm=5.0)
        variable = keras.Variable(start)
        optimizer.build([variable])
        for _ in range(2):
            optimizer.apply([gradient], [variable])
        stepped.append(variable.numpy())
    np.testing.assert_allclose(stepped[0], stepped[1], **TOL)
    assert np.abs(stepped[0] - start).max() > 0


def test_build_encoder_optimizer():
    opt = build_encoder_optimizer(256, total_steps=100, warmup_steps=10)
    assert isinstance(opt, LARS) and not opt.layer_adaptation
    assert opt._learning_rate.base_value == pytest.approx(0.03)
    assert (opt._learning_rate.total_steps,
            opt._learning_rate.warmup_steps) == (100, 10)
    assert opt.coupled_weight_decay == 1e-4 and opt.momentum == 0.9

    opt = build_encoder_optimizer(4096, total_steps=100, warmup_steps=10,
                                  weight_decay=1e-5, momentum=0.95)
    assert opt.layer_adaptation
    assert opt._learning_rate.base_value == pytest.approx(4.8)
    assert float(opt._learning_rate(10)) == pytest.approx(4.8, rel=1e-6)
    assert (opt.coupled_weight_decay, opt.momentum) == (1e-5, 0.95)

    opt = build_encoder_optimizer(4096, 100, 10, optimizer="sgd",
                                  learning_rate=0.7)
    assert not opt.layer_adaptation
    assert opt._learning_rate.base_value == pytest.approx(0.7)

    with pytest.raises(ValueError):
        build_encoder_optimizer(256, 100, 10, optimizer="adam")
    with pytest.raises(ValueError, match="needs the adamw optimizer"):
        build_encoder_optimizer(256, 100, 10, weight_decay_end=0.4)
