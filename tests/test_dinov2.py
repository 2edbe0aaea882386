"""DINOv2 (caco_tf.methods.dinov2): its loss on fixed arrays against NumPy (DINO's term over the
crop pairs as ssl_meta_arch.py weighs it, iBOT's on the masked patches, 0.1 x KoLeo per global
crop; Sinkhorn-Knopp's teacher or DINO's centering), iBOT's masks (the share of crops masked,
the range of their ratio, each crop its own draw from its image's seed), one step against the
closed form with every trainable part moving and the teachers following by EMA only, a tiny fit
on the digits through the pipeline, 1 against 2 replicas, its known failure, and its refusals
(a ConvNet; a ViT without a mask token) in one line."""

import math

import numpy as np
import pytest
import tensorflow as tf

from caco_tf import build, data
from caco_tf.config import load_config
from caco_tf.data import masks as masks_lib
from caco_tf.errors import ConfigError
from caco_tf.methods import dinov2
from caco_tf.nets import vit
from tiny_methods import BATCH, SIZE, tiny, views


# ---------------------------------------------------------------------- NumPy closed forms
def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def np_sinkhorn(logits, temperature, iterations=3):
    """dinov2/loss/dino_clstoken_loss.py ``sinkhorn_knopp_teacher``, one process."""
    q = np.exp(logits.astype(np.float64) / temperature).T  # K x B
    columns, prototypes = q.shape[1], q.shape[0]
    q /= q.sum()
    for _ in range(iterations):
        q /= q.sum(1, keepdims=True)
        q /= prototypes
        q /= q.sum(0, keepdims=True)
        q /= columns
    return (q * columns).T


def np_dino(teachers, students, temperature=0.1):
    """ssl_meta_arch.py: the pairs (teacher crop i, student crop v != i) summed, divided by
    2 + max(2 · local crops, 1)."""
    local = len(students) - 2
    total = sum(-(t * log_softmax(s / temperature)).sum(-1).mean()
                for i, t in enumerate(teachers) for v, s in enumerate(students) if v != i)
    return total / (2 + max(2 * local, 1))


def np_ibot(teacher, student, masked, temperature=0.1):
    """iBOTPatchLoss.forward_masked: each crop's mean over its masked patches, the mean over
    every global crop (one without masks counting 0)."""
    cross = -(teacher * log_softmax(student / temperature)).sum(-1)
    return ((cross * masked).sum(-1) / np.maximum(masked.sum(-1), 1)).mean()


def np_koleo(x, eps=1e-8):
    x = x / np.linalg.norm(x, axis=-1, keepdims=True)
    dots = x @ x.T
    np.fill_diagonal(dots, -1)
    neighbours = x[dots.argmax(1)]
    return -np.log(np.linalg.norm(x - neighbours + eps, axis=-1) + eps).mean()


def with_mask_token(shape):
    return vit.build_vit("vit_micro_patch4", shape, image_size=SIZE, mask_token=True)


@pytest.fixture(scope="module")
def arrays():
    """A batch of 4 images: the teacher's and the student's head outputs (K = 5 class-token,
    K = 6 patch prototypes), 3 masked-patch slots per global crop, 2 local crops."""
    rng = np.random.default_rng(0)
    images, cap = 4, 3
    masked = rng.random((2 * images, cap)) < 0.6
    masked[0] = False  # a crop without masks counts 0
    targets = {"logits": rng.normal(size=(2 * images, 5)).astype("float32"),
               "patch_logits": rng.normal(size=(2 * images * cap, 6)).astype("float32"),
               "masked": masked}
    outputs = {"logits": [rng.normal(size=(images, 5)).astype("float32") for _ in range(4)],
               "patch_logits": rng.normal(size=(2 * images * cap, 6)).astype("float32"),
               "cls": [rng.normal(size=(images, 7)).astype("float32") for _ in range(2)],
               "masked": masked}
    return outputs, targets


def np_total(outputs, targets, temperature, centering, local=2):
    masked = targets["masked"].astype(np.float64)
    rows, cap = masked.shape
    if centering == "sinkhorn_knopp":
        cls = np_sinkhorn(targets["logits"], temperature)
        in_use = masked.reshape(-1) > 0
        patch = np.zeros_like(targets["patch_logits"], dtype=np.float64)
        patch[in_use] = np_sinkhorn(targets["patch_logits"][in_use], temperature)
    else:  # DINO's centering, the centers at zero before the first step
        cls = np.exp(log_softmax(targets["logits"] / temperature))
        patch = np.exp(log_softmax(targets["patch_logits"] / temperature))
    dino = np_dino(np.split(cls, 2), outputs["logits"][:2 + local])
    ibot = np_ibot(patch.reshape(rows, cap, -1),
                   outputs["patch_logits"].reshape(rows, cap, -1), masked)
    koleo = sum(np_koleo(c) for c in outputs["cls"])
    return dino + ibot + 0.1 * koleo, (dino, ibot, koleo)


@pytest.mark.parametrize("centering", ["sinkhorn_knopp", "centering"])
@pytest.mark.parametrize("local", [2, 0])
def test_the_loss_is_dino_plus_ibot_plus_a_tenth_of_koleo(arrays, centering, local):
    outputs, targets = arrays
    model = tiny("dinov2", backbone=with_mask_token, out_dim=5, ibot_out_dim=6,
                 teacher_temperature=0.07, centering=centering)
    given = dict(outputs, logits=outputs["logits"][:2 + local])
    loss, diagnostics = model.method_loss(given, targets, tf.constant(0, tf.int64))
    expected, (dino, ibot, koleo) = np_total(outputs, targets, 0.07, centering, local)
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    for key, value in (("dino_loss", dino), ("ibot_loss", ibot), ("koleo_loss", koleo)):
        assert float(diagnostics[key]) == pytest.approx(value, rel=1e-5), key


def test_the_sinkhorn_teacher_over_the_masked_patches_only(arrays):
    """The patch plan's columns are the masked patches alone (n_masked_patches), the others 0;
    each masked row a distribution."""
    _, targets = arrays
    in_use = targets["masked"].reshape(-1)
    from caco_tf import losses

    plan = losses.sinkhorn(targets["patch_logits"], 0.07, 3, rows_in_use=in_use).numpy()
    np.testing.assert_allclose(plan[in_use], np_sinkhorn(targets["patch_logits"][in_use], 0.07),
                               rtol=1e-4, atol=1e-7)
    np.testing.assert_array_equal(plan[~in_use], 0.0)


# ---------------------------------------------------------------------- the masks
SEED = tf.constant([5, 11], tf.int64)


def test_the_masks_half_the_crops_with_a_ratio_in_its_range():
    kind = dinov2.IBOTMasks()
    drawn = kind.draw(SEED, 1000, 7, 7).numpy()
    assert drawn.shape == (1000, 2, 7, 7) and drawn.dtype == bool
    counts = drawn.reshape(2000, 49).sum(1)
    # Each crop masked with probability 0.5 (4.5 standard deviations of 2,000 draws).
    assert abs((counts > 0).mean() - 0.5) < 0.05
    # The targets the draws name: int(L · ratio), ratio uniform in [0.1, 0.5), or 0.
    draws = tf.random.stateless_uniform(
        [2000, 2], seed=tf.random.experimental.stateless_fold_in(SEED, 0)).numpy()
    targets = np.where(draws[:, 0] < 0.5, np.floor(49 * (0.1 + 0.4 * draws[:, 1])), 0)
    assert (counts <= targets).all() and counts.max() <= int(49 * 0.5)
    assert (counts[targets == 0] == 0).all()
    # The blocks reach their target but rarely stop short (10 failed tries; MaskingGenerator).
    assert (counts == targets)[targets > 0].mean() > 0.9
    assert 4 <= counts[targets > 0].min()
    # The two global crops of an image are drawn apart.
    assert not np.array_equal(drawn[:, 0], drawn[:, 1])


def test_a_block_is_a_rectangle_strictly_inside_the_grid():
    """Blocks of 4 patches (area uniform in [4, 4]): those that fill their bounding box are one
    block, h < rows and w < cols as _mask asks (1 x 4, 2 x 2, 4 x 1); the others (1 x 3 and
    one more patch) two blocks, or 3 when 10 tries of the last one all fail (_mask's stop)."""
    mask = dinov2.ibot_block_masks(SEED, tf.fill([500], 4), 7, 7, 24.0).numpy()
    assert set(mask.reshape(500, -1).sum(1)) <= {3, 4}
    single = 0
    for m in mask:
        rows, cols = np.nonzero(m.any(1))[0], np.nonzero(m.any(0))[0]
        height, width = rows.max() - rows.min() + 1, cols.max() - cols.min() + 1
        if height * width == 4:  # one block: a full rectangle
            single += 1
            assert (height, width) in ((1, 4), (2, 2), (4, 1))
    assert single > 250


def np_masking_generator(rng, rows, cols, target, max_patches, min_patches=4,
                         aspect=(0.3, 1 / 0.3)):
    """DINOv2's MaskingGenerator (data/masking.py) in NumPy: blocks until ``target`` patches."""
    mask = np.zeros((rows, cols), bool)
    low, high = math.log(aspect[0]), math.log(aspect[1])
    while mask.sum() < target:
        most, added = min(target - mask.sum(), max_patches), 0
        for _ in range(10):
            area = min_patches + (most - min_patches) * rng.random()  # random.uniform(a, b)
            ratio = math.exp(rng.uniform(low, high))
            h, w = int(round(math.sqrt(area * ratio))), int(round(math.sqrt(area / ratio)))
            if w < cols and h < rows:
                top, left = rng.integers(0, rows - h + 1), rng.integers(0, cols - w + 1)
                new = h * w - mask[top:top + h, left:left + w].sum()
                if 0 < new <= most:
                    mask[top:top + h, left:left + w] = True
                    added = new
            if added:
                break
        if not added:
            break
    return mask


@pytest.mark.parametrize("target", [4, 12, 24])
def test_the_blocks_follow_dinov2s_masking_generator(target):
    """The same law as the reference's sampler, by its statistics over 600 crops: the patches
    masked, how often the target is reached, and the masks' bounding boxes."""
    rng = np.random.default_rng(target)
    reference = np.stack([np_masking_generator(rng, 7, 7, target, 24) for _ in range(600)])
    ours = dinov2.ibot_block_masks(SEED, tf.fill([600], target), 7, 7, 24.0).numpy()

    def statistics(masks):
        counts = masks.reshape(len(masks), -1).sum(1)
        heights = masks.any(2).sum(1)
        return counts.mean(), (counts == target).mean(), heights.mean()

    for got, expected, tolerance in zip(statistics(ours), statistics(reference),
                                        (0.03 * target, 0.05, 0.25)):
        assert abs(got - expected) <= tolerance, (statistics(ours), statistics(reference))


def test_the_same_seed_draws_the_same_masks_per_image():
    kind = dinov2.IBOTMasks(0.5, (0.1, 0.5))
    first = kind.draw(SEED, 8, 7, 7).numpy()
    np.testing.assert_array_equal(kind.draw(SEED, 8, 7, 7).numpy(), first)
    assert not np.array_equal(kind.draw(tf.constant([5, 12], tf.int64), 8, 7, 7).numpy(), first)
    # Per image: an image's masks are its own seed's, whatever the image and its batch.
    from caco_tf.data import augment

    views_of_run = masks_lib.MaskedViews(augment.MultiCropViews(
        28, 12, 2, [0.32, 1.0], [0.1, 0.32], channels=1), (kind,), (7, 7))
    image = tf.zeros([28, 28, 1])
    alone = views_of_run.augment_image(image, SEED)[-1].numpy()
    np.testing.assert_array_equal(alone, kind.draw(
        tf.random.experimental.stateless_fold_in(SEED, masks_lib.MASK_STREAM), 1, 7, 7)[0])
    np.testing.assert_array_equal(
        views_of_run.augment_image(image + 1.0, SEED)[-1].numpy(), alone)


def test_the_method_takes_its_masks_from_its_settings():
    (kind,) = dinov2.DINOv2.view_masks({"mask_probability": 0.3, "mask_ratio": [0.2, 0.4]})
    assert kind == dinov2.IBOTMasks(0.3, (0.2, 0.4))
    assert dinov2.DINOv2.view_masks() == (dinov2.IBOTMasks(0.5, (0.1, 0.5)),)


# ---------------------------------------------------------------------- a step
def test_one_step_is_its_loss_every_part_moves_and_the_teachers_follow_by_ema():
    model = tiny("dinov2", any_size=True, backbone=with_mask_token)
    batch = tuple(tf.constant(x) for x in views(method="dinov2", local_crops=2))
    crops, masks = batch[:-1], batch[-1:]
    assert masks[0].shape == (BATCH, 2, 3, 3)
    targets = model.targets(crops, training=True, masks=masks)
    outputs = model.forward(crops, training=True, masks=masks)
    expected, _ = model.method_loss(outputs, targets, tf.constant(0, tf.int64))
    student0 = [v.numpy() for v in model.student_variables]
    teacher0 = [v.numpy() for v in model.key_encoder.trainable_variables]
    ibot0 = [v.numpy() for v in model.ibot_teacher.weights]
    assert len(student0) == len(model.trainable_variables) - len(teacher0)
    history = model.fit(tf.data.Dataset.from_tensors(batch), epochs=1, verbose=0).history
    assert history["loss"][0] == pytest.approx(float(expected), rel=1e-4)
    still = [v.path for v, old in zip(model.student_variables, student0)
             if np.abs(v.numpy() - old).max() == 0]
    assert still == []  # the backbone (its mask token too), the projector, both heads
    trained = {id(v) for v in model.student_variables}
    for part in (model.backbone, model.projector, model.last_layer, model.ibot_mlp,
                 model.ibot_last_layer):
        assert {id(v) for v in part.trainable_variables} <= trained, part.name
    assert id(model.backbone.get_layer("tokens").mask_token) in trained
    # The teachers: θ_t ← m θ_t + (1 - m) θ_s with the student after its step, nothing else.
    m = 0.9  # the tiny key_momentum
    chain = model._chain_variables(model._teacher_heads())
    for t, old, s in zip(model.key_encoder.trainable_variables, teacher0, chain):
        np.testing.assert_allclose(t.numpy(), m * old + (1 - m) * s.numpy(), atol=1e-6)
    ibot_student = model.ibot_mlp.trainable_variables + model.ibot_last_layer.trainable_variables
    for t, old, s in zip(model.ibot_teacher.weights, ibot0, ibot_student):
        np.testing.assert_allclose(t.numpy(), m * old + (1 - m) * s.numpy(), atol=1e-6)


def test_both_last_layers_are_frozen_the_first_steps():
    model = tiny("dinov2", backbone=with_mask_token, freeze_last_layer_steps=1)
    assert model.frozen_until() == {"last_layer": 1, "ibot_last_layer": 1}
    last0, ibot0 = model.last_layer.kernel.numpy(), model.ibot_last_layer.kernel.numpy()
    batch = views(method="dinov2")
    model.fit(tf.data.Dataset.from_tensors(batch), epochs=1, verbose=0)
    np.testing.assert_array_equal(model.last_layer.kernel.numpy(), last0)
    np.testing.assert_array_equal(model.ibot_last_layer.kernel.numpy(), ibot0)


def test_the_shared_head_puts_the_patches_through_dinos_head():
    model = tiny("dinov2", backbone=with_mask_token, separate_ibot_head=False,
                 centering="centering")
    assert model.HEADS == ("last_layer",) and not hasattr(model, "ibot_mlp")
    assert model.patch_center.value.shape == (1, model.out_dim)
    batch = views(method="dinov2")
    before = [v.numpy() for v in model.student_variables]
    history = model.fit(tf.data.Dataset.from_tensors(batch), epochs=1, verbose=0).history
    assert np.isfinite(history["loss"][0]) and history["ibot_loss"][0] > 0
    assert all(np.abs(v.numpy() - old).max() > 0
               for v, old in zip(model.student_variables, before))
    assert np.abs(model.center.value.numpy()).max() > 0
    assert np.abs(model.patch_center.value.numpy()).max() > 0


# ---------------------------------------------------------------------- health
def test_its_known_failure_is_a_uniform_teacher():
    from caco_tf.training.callbacks import EpochCount

    model = tiny("dinov2", backbone=with_mask_token)
    epoch = EpochCount(5, 0, 10)
    uniform, patch_uniform = math.log(model.out_dim), math.log(model.ibot_out_dim)
    assert "class-token output is uniform" in model.collapse({"teacher_entropy": uniform,
                                                              "patch_teacher_entropy": 0.0},
                                                             epoch)
    assert "patch output is uniform" in model.collapse({"teacher_entropy": 0.1,
                                                        "patch_teacher_entropy": patch_uniform},
                                                       epoch)
    assert model.collapse({"teacher_entropy": 0.5 * uniform,
                           "patch_teacher_entropy": 0.5 * patch_uniform}, epoch) is None
    # A collapsed teacher (one output for every image): Sinkhorn-Knopp makes it uniform.  The
    # logits of a unit input through unit columns: within [-1, 1].
    rng = np.random.default_rng(2)
    row = rng.uniform(-1, 1, size=(1, model.out_dim)).astype("float32")
    patch_row = rng.uniform(-1, 1, size=(1, model.ibot_out_dim)).astype("float32")
    targets = {"logits": np.repeat(row, 2 * BATCH, 0),
               "patch_logits": np.repeat(patch_row, 2 * BATCH * 4, 0),
               "masked": np.ones((2 * BATCH, 4), bool)}
    outputs = {"logits": [rng.normal(size=(BATCH, model.out_dim)).astype("float32")] * 2,
               "patch_logits": rng.normal(size=(2 * BATCH * 4, model.ibot_out_dim)).astype(
                   "float32"),
               "cls": [rng.normal(size=(BATCH, 96)).astype("float32")] * 2}
    _, diagnostics = model.method_loss(outputs, targets, tf.constant(0, tf.int64))
    logs = {key: float(value) for key, value in diagnostics.items()}
    assert "uniform" in model.collapse(logs, epoch)
    # From the fourth epoch after the last layers thaw (here at step 0).
    assert not model.judged(EpochCount(3, 10, 640)) and model.judged(EpochCount(4, 10, 640))


# ---------------------------------------------------------------------- runs
@pytest.mark.slow
def test_a_tiny_fit_on_the_digits_through_the_pipeline(tmp_path):
    """The offline recipe at tiny sizes: the masks come with the multi-crop views."""
    import keras

    config = load_config("mnist_dinov2", [
        "method.dinov2.out_dim=32", "method.dinov2.ibot_out_dim=24",
        "method.dinov2.ibot_hidden_dim=16", "method.dinov2.ibot_bottleneck_dim=8",
        "model.projector_hidden=32", "model.embedding_dim=16", "data.multicrop.local_crops=2",
        "train.batch_size=16", "train.epochs=2", "train.jit_compile=false",
        "train.steps_per_execution=1", "train.lr_warmup_epochs=0"])
    keras.utils.set_random_seed(0)
    images = data.load_offline_mnist()["train"][0][:64]
    views_of_run = build.run_views(config)
    model = build.build_model(config, steps_per_epoch=4, views=views_of_run)
    stream = data.pretrain_dataset(images, 16, views_of_run, steps_per_epoch=4)
    batch = next(iter(stream))
    assert [tuple(x.shape) for x in batch] == [(16, 28, 28, 1)] * 2 + [(16, 12, 12, 1)] * 2 + [
        (16, 2, 7, 7)]
    teacher0 = model.key_encoder.get_weights()
    history = model.fit(stream, epochs=2, steps_per_epoch=4, verbose=0).history
    for key in ("loss", "dino_loss", "ibot_loss", "koleo_loss"):
        assert np.isfinite(history[key]).all(), key
    assert any(np.abs(a - b).max() > 0 for a, b in zip(model.key_encoder.get_weights(),
                                                       teacher0))


@pytest.mark.slow
def test_one_replica_equals_two_with_dinos_centering():
    """tests/test_methods_at_scale.py runs 1 against 2 and 4 replicas at the defaults
    (Sinkhorn-Knopp); here the centering option: both centers from the global batch."""
    from test_distributed import _assert_close
    from test_methods_at_scale import _step

    kinds = dict(centering="centering", backbone=with_mask_token)
    single, single_loss = _step("dinov2", **kinds)
    mirrored, loss = _step("dinov2", 2, **kinds)
    assert loss == pytest.approx(single_loss, rel=1e-5, abs=1e-6)
    for a, b in zip(single.weights, mirrored.weights):
        _assert_close(b.numpy(), a.numpy(), f"2 replicas: {a.path}")


# ---------------------------------------------------------------------- refusals
def test_a_convnet_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys):
    from caco_tf.cli import train

    run_dir = tmp_path / "run"
    code = train.main(["--set", "method.name=dinov2", "--run-dir", str(run_dir)])
    errors = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(errors) == 1, errors
    assert errors[0].startswith("error: method dinov2 works on a Vision Transformer's patch "
                                "tokens, and model.backbone small_convnet gives none")
    assert not run_dir.exists()


def test_a_vit_without_a_mask_token_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="^method dinov2 puts the ViT's mask token in place "
                       "of the masked patches, and model.backbone vit_micro_patch4 has none: "
                       "set model.mask_token true$"):
        tiny("dinov2", backbone=lambda shape: vit.build_vit("vit_micro_patch4", shape,
                                                            image_size=SIZE))


def test_a_run_without_the_mask_token_is_refused_before_anything_is_written(tmp_path, capsys):
    from caco_tf.cli import train

    run_dir = tmp_path / "run"
    code = train.main(["--config", "mnist_dinov2", "--set", "model.mask_token=false",
                       "--run-dir", str(run_dir)])
    errors = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and errors == ["error: method dinov2 needs model.mask_token true, got "
                                    "False: set --set model.mask_token=true"], errors
    assert not run_dir.exists()
