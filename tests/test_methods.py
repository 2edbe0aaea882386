"""The paper's comparison methods, Barlow Twins and VICReg (caco_tf.methods): each loss against
its closed form in NumPy, one step of each method against it with its own state's update (queue,
center, prototypes, EMA), every trainable part moving after a step, frozen heads staying, and
the phases they make."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from caco_tf import losses, methods
from caco_tf.methods.contrastive import ContrastiveMethod
from tiny_methods import BATCH, by_tier, tiny, views

# The methods outside the InfoNCE family (tests/test_ablations.py has that family's).
NEW = tuple(name for name, cls in methods.METHODS.items()
            if not issubclass(cls, ContrastiveMethod))


# ---------------------------------------------------------------------- NumPy closed forms
def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def softmax(x):
    return np.exp(log_softmax(x))


def np_regression(p, z):
    return 2 - 2 * np.sum(unit(p) * unit(z), -1)


def np_negative_cosine(p, z):
    return -np.sum(unit(p) * unit(z), -1)


def np_cross_entropy_on_diagonal(rows, candidates, tau, offset=0):
    """-log softmax(r_i·c_m/τ) at m = offset + i, rows and candidates normalized."""
    logits = unit(rows) @ unit(candidates).T / tau
    return -log_softmax(logits)[np.arange(len(rows)), offset + np.arange(len(rows))]


def np_sinkhorn(scores, epsilon, iterations, fixed=None):
    """facebookresearch/swav's distributed_sinkhorn on one device (Q is K × B)."""
    columns = scores if fixed is None else np.concatenate([fixed, scores])
    q = np.exp(columns.astype(np.float64) / epsilon).T
    count, prototypes = q.shape[1], q.shape[0]
    q /= q.sum()
    for _ in range(iterations):
        q /= q.sum(axis=1, keepdims=True)
        q /= prototypes
        q /= q.sum(axis=0, keepdims=True)
        q /= count
    return (q * count).T[-len(scores):]


def np_swapped(codes, scores, tau):
    return -np.sum(codes * log_softmax(scores / tau), -1)


def np_dino(teacher, student, center, teacher_tau, student_tau):
    return -np.sum(softmax((teacher - center) / teacher_tau) * log_softmax(student / student_tau),
                   -1)


def np_barlow(z1, z2, lam):
    def standardized(z):
        return (z - z.mean(0)) / np.sqrt(z.var(0) + 1e-5)
    c = standardized(z1).T @ standardized(z2) / len(z1)
    return np.sum((1 - np.diag(c)) ** 2) + lam * (np.sum(c ** 2) - np.sum(np.diag(c) ** 2))


def np_vicreg(z1, z2, inv, var, cov):
    total = inv * np.mean((z1 - z2) ** 2)
    for z in (z1, z2):
        z = z - z.mean(0)
        std = np.sqrt(z.var(0, ddof=1) + 1e-4)
        total += var * 0.5 * np.mean(np.maximum(0, 1 - std))
        c = z.T @ z / (len(z) - 1)
        total += cov * (np.sum(c ** 2) - np.sum(np.diag(c) ** 2)) / z.shape[1]
    return total


@pytest.fixture
def rows():
    rng = np.random.default_rng(0)
    return [rng.normal(size=(6, 5)).astype("float32") for _ in range(4)]


# ---------------------------------------------------------------------- the pure losses
def test_byol_and_simsiam_losses_match_numpy(rows):
    p, z = rows[:2]
    np.testing.assert_allclose(losses.regression_loss(p, z), np_regression(p, z), rtol=1e-5)
    np.testing.assert_allclose(losses.negative_cosine(p, z), np_negative_cosine(p, z),
                               rtol=1e-5)


def test_moco_v3_and_nnclr_losses_match_numpy(rows):
    q, k = rows[0], np.concatenate(rows[1:3])  # this replica's rows 6..11 of a global batch
    np.testing.assert_allclose(losses.moco_v3_loss(q, k, 0.5, offset=6),
                               2 * 0.5 * np_cross_entropy_on_diagonal(q, k, 0.5, 6), rtol=1e-5)
    np.testing.assert_allclose(losses.nnclr_loss(q, k, 0.1, offset=6),
                               np_cross_entropy_on_diagonal(q, k, 0.1, 6), rtol=1e-5)
    support = unit(rows[3])
    np.testing.assert_allclose(losses.nearest_neighbours(unit(q), support),
                               support[np.argmax(unit(q) @ support.T, -1)])


def test_sinkhorn_matches_swavs_and_equipartitions(rows):
    scores = np.tanh(np.concatenate(rows[:2]))  # cosine-like, [12, 5]
    codes = losses.sinkhorn(scores, 0.05, 3).numpy()
    np.testing.assert_allclose(codes, np_sinkhorn(scores, 0.05, 3), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(codes.sum(-1), 1.0, rtol=1e-5)  # each sample: a distribution
    fixed = np.tanh(rows[2])  # a queue's rows join the columns
    with_queue = losses.sinkhorn(scores, 0.05, 3, fixed_scores=fixed).numpy()
    np.testing.assert_allclose(with_queue, np_sinkhorn(scores, 0.05, 3, fixed), rtol=1e-4,
                               atol=1e-7)
    unused = losses.sinkhorn(scores, 0.05, 3, fixed_scores=fixed, fixed_in_use=False)
    np.testing.assert_allclose(unused, codes, rtol=1e-6)  # a queue not yet full counts nothing


def test_swapped_prediction_and_dino_losses_match_numpy(rows):
    codes = softmax(rows[0])
    np.testing.assert_allclose(losses.swapped_prediction_loss(codes, rows[1], 0.1),
                               np_swapped(codes, rows[1], 0.1), rtol=1e-5)
    center = rows[2][:1]
    teachers = [losses.dino_teacher(t, center, 0.04) for t in rows[:2]]
    np.testing.assert_allclose(teachers[1], softmax((rows[1] - center) / 0.04), rtol=1e-5,
                               atol=1e-7)
    students = rows[1:4]  # two global crops and a local one
    expected = np.mean([np_dino(rows[i], students[v], center, 0.04, 0.1).mean()
                        for i in (0, 1) for v in range(3) if v != i])
    assert float(losses.dino_loss(teachers, students, 0.1)) == pytest.approx(expected, rel=1e-5)


def test_barlow_twins_and_vicreg_losses_match_numpy(rows):
    z1, z2 = np.concatenate(rows[:2]), np.concatenate(rows[2:])
    assert float(losses.barlow_twins_loss(z1, z2, 0.05)) == pytest.approx(
        np_barlow(z1, z2, 0.05), rel=1e-4)
    assert float(losses.vicreg_loss(z1, z2, 25.0, 25.0, 1.0)) == pytest.approx(
        np_vicreg(z1, z2, 25.0, 25.0, 1.0), rel=1e-4)


# ---------------------------------------------------------------------- one step of each
def fit_once(model, batch):
    return model.fit(tf.data.Dataset.from_tensors(batch), epochs=1, verbose=0).history


def projections(model, crops):
    """The student's raw projections of each crop, as the first step sees them."""
    return [model.project(crop, True).numpy() for crop in crops]


def test_byol_regresses_the_targets_and_the_target_follows():
    model = tiny("byol")
    v1, v2 = views()
    z1, z2 = projections(model, (v1, v2))
    p1, p2 = (model.predictor(z, training=True).numpy() for z in (z1, z2))
    t1, t2 = (model.key_encoder(v, training=True).numpy() for v in (v1, v2))
    teacher0 = [w.numpy() for w in model.key_encoder.trainable_variables]
    history = fit_once(model, (v1, v2))
    expected = np_regression(p1, t2).mean() + np_regression(p2, t1).mean()
    assert history["loss"][0] == pytest.approx(expected, rel=1e-4)
    # θ_t ← m θ_t + (1 - m) θ_s, m = 0.9: the student's new backbone and projector.
    student = model.query_encoder.trainable_variables
    for before, teacher, now in zip(teacher0, model.key_encoder.trainable_variables, student):
        np.testing.assert_allclose(teacher.numpy(), 0.9 * before + 0.1 * now.numpy(),
                                   rtol=1e-5, atol=1e-7)


def test_simsiam_predicts_the_stop_gradient_projection():
    model = tiny("simsiam")
    assert model.key_encoder is None  # the teacher is the student, without gradient
    v1, v2 = views()
    z1, z2 = projections(model, (v1, v2))
    p1, p2 = (model.predictor(z, training=True).numpy() for z in (z1, z2))
    history = fit_once(model, (v1, v2))
    expected = 0.5 * (np_negative_cosine(p1, z2).mean() + np_negative_cosine(p2, z1).mean())
    assert history["loss"][0] == pytest.approx(expected, rel=1e-4)
    spread = unit(z1).std(0).mean() * np.sqrt(z1.shape[1])
    assert history["embedding_std"][0] == pytest.approx(spread, rel=1e-4)


def test_moco_v3_contrasts_the_queries_with_the_batchs_keys():
    model = tiny("moco_v3")
    v1, v2 = views()
    q1, q2 = (model.predictor(z, training=True).numpy() for z in projections(model, (v1, v2)))
    k1, k2 = (model.key_encoder(v, training=True).numpy() for v in (v1, v2))
    history = fit_once(model, (v1, v2))
    expected = sum(2 * 0.5 * np_cross_entropy_on_diagonal(q, k, 0.5).mean()
                   for q, k in ((q1, k2), (q2, k1)))
    assert history["loss"][0] == pytest.approx(expected, rel=1e-4)


def test_nnclr_takes_the_support_sets_neighbour_then_enqueues():
    model = tiny("nnclr")
    v1, v2 = views()
    z1, z2 = projections(model, (v1, v2))
    p1, p2 = (model.predictor(z, training=True).numpy() for z in (z1, z2))
    support = unit(model.support_set.rows.numpy())

    def neighbour(z):
        return support[np.argmax(unit(z) @ support.T, -1)]

    history = fit_once(model, (v1, v2))
    expected = 0.5 * (np_cross_entropy_on_diagonal(neighbour(z1), p2, 0.1).mean()
                      + np_cross_entropy_on_diagonal(neighbour(z2), p1, 0.1).mean())
    assert history["loss"][0] == pytest.approx(expected, rel=1e-4)
    np.testing.assert_allclose(model.support_set.rows.numpy()[:BATCH], unit(z1), rtol=1e-5,
                               atol=1e-6)
    assert int(model.support_set.pointer.numpy()) == BATCH


def test_swav_predicts_the_sinkhorn_codes_of_the_other_crops():
    model = tiny("swav", any_size=True, freeze_prototypes_steps=1)
    crops = views(local_crops=2)
    prototypes0 = model.prototypes.kernel.numpy()
    np.testing.assert_allclose(np.linalg.norm(prototypes0, axis=0), 1.0, rtol=1e-5)
    # The global crops pass the backbone together, the local crops together.
    together = [model.query_encoder(tf.concat(crops[:2], 0), training=True).numpy(),
                model.query_encoder(tf.concat(crops[2:], 0), training=True).numpy()]
    embeddings = np.split(together[0], 2) + np.split(together[1], 2)
    scores = [z @ prototypes0 for z in embeddings]
    history = fit_once(model, crops)
    expected = np.mean([np.mean([np_swapped(np_sinkhorn(scores[i], 0.05, 3), scores[v],
                                            0.1).mean() for v in range(4) if v != i])
                        for i in (0, 1)])
    assert history["loss"][0] == pytest.approx(expected, rel=1e-4)
    # Frozen for the first step (renormalized only), then trained and put back on the sphere.
    np.testing.assert_allclose(model.prototypes.kernel.numpy(), prototypes0, rtol=1e-6,
                               atol=1e-7)
    fit_once(model, crops)
    moved = model.prototypes.kernel.numpy()
    assert np.abs(moved - prototypes0).max() > 1e-6
    np.testing.assert_allclose(np.linalg.norm(moved, axis=0), 1.0, rtol=1e-5)


def test_swav_queue_fills_from_its_start_and_joins_sinkhorn_once_full():
    model = tiny("swav", queue_size=2 * BATCH, queue_start_step=1)
    batches = [views(seed) for seed in range(4)]
    embeddings = []
    for step, batch in enumerate(batches):
        together = model.query_encoder(tf.concat(batch, 0), training=True).numpy()
        embeddings.append(np.split(together, 2))
        scores = [z @ model.prototypes.kernel.numpy() for z in embeddings[-1]]
        fixed = [q.rows.numpy() @ model.prototypes.kernel.numpy() for q in model.queues]
        full = step >= 3  # filled at steps 1 and 2: used from step 3 on
        history = fit_once(model, batch)
        expected = np.mean([np_swapped(np_sinkhorn(scores[i], 0.05, 3, fixed[i] if full
                                                   else None), scores[1 - i], 0.1).mean()
                            for i in (0, 1)])
        assert history["loss"][0] == pytest.approx(expected, rel=1e-4), step
        assert bool(model.queues[0].is_full()) == (step >= 2)
    # Step 0 wrote nothing; steps 1..3 each wrote their first crop's embeddings, FIFO.
    np.testing.assert_allclose(model.queues[0].rows.numpy()[BATCH:], embeddings[2][0],
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.queues[0].rows.numpy()[:BATCH], embeddings[3][0],
                               rtol=1e-5, atol=1e-6)


def test_dino_matches_the_centered_sharpened_teacher_and_moves_the_center():
    model = tiny("dino", any_size=True, freeze_last_layer_steps=1)
    crops = views(local_crops=1)
    teacher = np.split(model.key_encoder(tf.concat(crops[:2], 0), training=True).numpy(), 2)
    student = np.split(model.last_layer(model.query_encoder(
        tf.concat(crops[:2], 0), training=True)).numpy(), 2) + [model.last_layer(
            model.query_encoder(crops[2], training=True)).numpy()]
    last0 = model.last_layer.kernel.numpy()
    history = fit_once(model, crops)
    center = np.zeros((1, 32))
    expected = np.mean([np_dino(teacher[i], student[v], center, 0.05, 0.1).mean()
                        for i in (0, 1) for v in range(3) if v != i])
    assert history["loss"][0] == pytest.approx(expected, rel=1e-4)
    np.testing.assert_allclose(model.center.value.numpy(),
                               0.1 * np.concatenate(teacher).mean(0, keepdims=True), rtol=1e-4,
                               atol=1e-6)
    np.testing.assert_array_equal(model.last_layer.kernel.numpy(), last0)  # frozen, step 1
    probabilities = softmax(np.concatenate(teacher) / 0.05)
    entropy = -np.mean(np.sum(probabilities * np.log(probabilities + 1e-12), -1))
    assert history["teacher_entropy"][0] == pytest.approx(entropy, rel=1e-3)


def test_barlow_twins_and_vicreg_losses_of_a_step():
    for method, reference in (("barlow_twins", lambda z1, z2: np_barlow(z1, z2, 0.05)),
                              ("vicreg", lambda z1, z2: np_vicreg(z1, z2, 25.0, 25.0, 1.0))):
        model = tiny(method)
        v1, v2 = views()
        z1, z2 = projections(model, (v1, v2))
        history = fit_once(model, (v1, v2))
        assert history["loss"][0] == pytest.approx(reference(z1, z2), rel=1e-4), method


# ---------------------------------------------------------------------- every part trains
@pytest.mark.parametrize("method", by_tier(methods.METHODS))
def test_every_trainable_part_moves_after_one_step(method):
    multi = methods.model_class(method).CROPS.local
    # Adam moves every variable the gradient reaches by about its rate, however small the
    # gradient (I-JEPA's encoder norms get ~1e-7 at initialization, lost in SGD's float32 step).
    model = tiny(method, any_size=multi, optimizer=lambda: keras.optimizers.Adam(1e-3))
    before = [v.numpy() for v in model.student_variables]
    assert len(before) == len(model.trainable_variables) - (
        len(model.key_encoder.trainable_variables) if model.key_encoder is not None else 0)
    fit_once(model, views(local_crops=2 if multi else 0, method=method))
    still = [v.path for v, old in zip(model.student_variables, before)
             if np.abs(v.numpy() - old).max() == 0]
    assert still == []


def test_the_phases_split_at_the_warmup_and_where_a_head_thaws():
    swav = tiny("swav", freeze_prototypes_steps=5)
    assert [(p.first_step, p.frozen) for p in swav.phases()] == [
        (0, frozenset({"prototypes"})), (5, frozenset())]
    byol = tiny("byol", warmup_steps=3)
    phases = byol.phases()
    assert [p.first_step for p in phases] == [0, 3] and phases[0].hooks is byol.warmup
    assert phases[1].on_enter is not None  # the resync
    with pytest.raises(ValueError, match="method 'dino' has no bank warm-up"):
        tiny("dino", warmup_steps=3)
    with pytest.raises(ValueError, match="method 'byol' takes 2 views"):
        fit_once(tiny("byol"), views(local_crops=1))


# ---------------------------------------------------------------------- known failures
FAILURES = {  # a setting that provokes each method's known failure, and what the monitor says
    "swav": (dict(epsilon=1.0, freeze_prototypes_steps=0), "the loss stays at"),
    "dino": (dict(teacher_temperature=10.0, freeze_last_layer_steps=0),
             "the teacher's output is uniform"),
}


@pytest.mark.parametrize("method", list(FAILURES))
def test_the_health_monitor_names_swavs_and_dinos_known_failure(method, caplog):
    """SwAV's loss stalls at ln K with codes near uniform (a large ε), DINO's teacher goes
    uniform far above τ_t ≈ 0.07: each warns in one line with what to change, from the
    fourth epoch after the head thaws."""
    from caco_tf.training import callbacks

    arguments, words = FAILURES[method]
    model = tiny(method, **arguments)
    batches = [views(seed) for seed in range(4)]
    dataset = tf.data.Dataset.from_tensor_slices(tuple(
        np.stack([batch[crop] for batch in batches]) for crop in range(2))).repeat()
    guard = callbacks.HealthMonitor(steps_per_epoch=4, batch_size=BATCH)
    model.fit(dataset, epochs=4, steps_per_epoch=4, callbacks=[guard], verbose=0)
    warnings = [r.getMessage() for r in caplog.records if "collapse" in r.getMessage()]
    assert len(warnings) == 1 and words in warnings[0], warnings
    assert warnings[0].startswith("warning: collapse after epoch 4: ")
    assert model.COLLAPSE_ADVICE in warnings[0]


@pytest.mark.slow
def test_simsiam_without_its_predictor_collapses_and_the_monitor_names_it(caplog):
    """On 512 real digits, a small ConvNet: without the predictor the projections turn
    towards one direction within 4 epochs (the monitor warns, naming the predictor); with it
    they do not."""
    import keras

    from caco_tf import build, data
    from caco_tf.training import callbacks
    from caco_tf.config import load_config

    images = data.load_offline_mnist()["train"][0][:512]
    warned = {}
    for predictor in (False, True):
        caplog.clear()
        config = load_config("mnist", [
            "method.name=simsiam", f"method.simsiam.predictor={str(predictor).lower()}",
            "method.simsiam.predictor_hidden=32", "model.widths=[8,16,16,32]",
            "model.projector_hidden=64", "model.embedding_dim=32", "train.batch_size=32",
            "train.epochs=5", "train.jit_compile=false", "train.steps_per_execution=1"])
        keras.utils.set_random_seed(0)
        model = build.build_model(config, steps_per_epoch=16)
        dataset = data.pretrain_dataset(images, 32, build.run_views(config),
                                        steps_per_epoch=16)
        guard = callbacks.HealthMonitor(steps_per_epoch=16, batch_size=32)
        model.fit(dataset, epochs=5, steps_per_epoch=16, callbacks=[guard], verbose=0)
        warned[predictor] = [r.getMessage() for r in caplog.records
                             if "collapse" in r.getMessage()]
    assert len(warned[False]) == 1 and "turn towards one direction" in warned[False][0]
    assert "method.simsiam.predictor: true" in warned[False][0]
    assert warned[True] == []
