"""I-JEPA (caco_tf.methods.ijepa): its loss against NumPy, its masks (targets on the grid,
the context disjoint from them, the counts declared, a function of the seed), attention to the
context only, one step against the closed form with every trainable part moving and the target
encoder following by EMA only, the features the average of the patch tokens without a class
token, a tiny fit on the digits through the pipeline, its known collapse, and the refusal of a
ConvNet in one line."""

import os

import numpy as np
import pytest
import tensorflow as tf

from caco_tf import build, data
from caco_tf.config import load_config
from caco_tf.methods import ijepa
from tiny_methods import BATCH, SIZE, tiny


def np_ijepa_loss(predictions, targets, valid, loss):
    difference = np.abs(predictions - targets)
    per_element = (np.where(difference < 1, 0.5 * difference ** 2, difference - 0.5)
                   if loss == "smooth_l1" else difference ** 2)
    return (per_element.mean(-1) * valid).sum() / valid.sum()


@pytest.mark.parametrize("loss", ["smooth_l1", "l2"])
def test_the_loss_is_the_mean_over_the_target_slots(loss):
    rng = np.random.default_rng(0)
    predictions, targets = (rng.normal(size=(2, 4, 5, 6)).astype("float32") * 2
                            for _ in range(2))
    valid = (rng.random((2, 4, 5)) < 0.8).astype("float32")
    np.testing.assert_allclose(ijepa.ijepa_loss(predictions, targets, valid, loss),
                               np_ijepa_loss(predictions, targets, valid, loss), rtol=1e-5)
    # Every slot valid: train.py's F.smooth_l1_loss, the mean over every element.
    full = np.ones_like(valid)
    d = np.abs(predictions - targets)
    if loss == "smooth_l1":
        np.testing.assert_allclose(ijepa.ijepa_loss(predictions, targets, full, loss),
                                   np.where(d < 1, 0.5 * d * d, d - 0.5).mean(), rtol=1e-5)


def draw(kind, seed=(0, 1), batch=64, side=14):
    return kind.draw(tf.constant(seed, tf.int64), batch, side, side).numpy()


def test_the_masks_context_minus_targets_as_declared_and_seeded():
    kind = ijepa.ContextAndTargetBlocks()  # I-JEPA's: 4 targets of 15-20 %, context 85-100 %
    masks = draw(kind)
    assert masks.shape == (64, 5, 14, 14) and kind.shape(14, 14) == [5, 14, 14]
    context, targets = ~masks[:, 0], masks[:, 1:]
    cells = 14 * 14
    for image in range(64):
        for block in targets[image]:
            rows, cols = np.nonzero(block)
            # A rectangle on the grid of its declared area (its sides rounded).
            height, width = rows.max() - rows.min() + 1, cols.max() - cols.min() + 1
            assert block.sum() == height * width
            assert 0.15 * cells - height - width <= block.sum() <= 0.2 * cells + height + width
        assert not (context[image] & targets[image].any(0)).any()  # allow_overlap=False
        assert context[image].sum() > kind.min_context
    np.testing.assert_array_equal(draw(kind), masks)
    assert (draw(kind, seed=(0, 2)) != masks).any()
    # The largest block bounds the predictor's slots.
    slots = ijepa.largest_block(14, 14, kind.scale, kind.aspect)
    assert targets.reshape(64, 4, -1).sum(-1).max() <= slots


def test_a_context_too_small_is_placed_again_then_relaxed():
    kind = ijepa.ContextAndTargetBlocks(min_context=10)
    masks = draw(kind, batch=256, side=7)  # the digits' 7x7 grid
    context, taken = ~masks[:, 0], masks[:, 1:].any(1)
    sizes = context.sum((1, 2))
    assert (sizes > 10).all()
    # Most contexts keep clear of every target; the rest drop the last target's constraint.
    assert (~(context & taken).any((1, 2))).mean() > 0.5


def test_attention_to_the_marked_tokens_only_is_the_block_on_them_alone():
    model = tiny("ijepa")
    block = [layer for layer in model.backbone.layers if layer.name == "blocks_0"][0]
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(2, 9, 96)).astype("float32"))
    everyone = tf.ones([2, 9], tf.bool)
    np.testing.assert_allclose(ijepa.keyed_block(block, x, everyone), block(x), atol=1e-5)
    keys = tf.constant([[True] * 5 + [False] * 4] * 2)
    np.testing.assert_allclose(ijepa.keyed_block(block, x, keys)[:, :5], block(x[:, :5]),
                               atol=1e-5)



def test_the_predictor_is_the_official_one_on_the_gathered_context_and_targets():
    """vision_transformer.py's predictor by hand: the context's tokens gathered, embedded plus
    their positions, then one block's mask tokens plus its patches' positions, plain blocks,
    the norm and the Linear back; the fixed-size sequence with its keys gives the same."""
    model = tiny("ijepa")
    predictor = model.predictor
    rng = np.random.default_rng(3)
    context = tf.constant(rng.normal(size=(2, 9, 96)).astype("float32"))
    keys = tf.constant([[True, True, False, True, True, False, True, True, True],
                        [False, True, True, True, False, True, True, True, True]])
    index = tf.constant([[[2, 5], [0, 0]], [[0, 4], [4, 0]]], tf.int32)
    valid = tf.constant([[[1, 1], [1, 0]], [[1, 1], [1, 0]]], tf.float32)
    out = predictor(context, keys, index, valid).numpy()
    positions = predictor.positions
    for image in range(2):
        seen = np.nonzero(keys[image].numpy())[0]
        x = predictor.embed(tf.gather(context[image], seen)).numpy() + positions[seen]
        for block in range(2):
            slots = int(valid[image, block].numpy().sum())
            patches = index[image, block, :slots].numpy()
            queries = predictor.mask_token.numpy()[0] + positions[patches]
            sequence = tf.constant(np.concatenate([x, queries])[None])
            for layer in predictor.blocks:
                sequence = layer(sequence)
            expected = predictor.proj(predictor.norm(sequence))[0, len(seen):]
            np.testing.assert_allclose(out[image, block, :slots], expected, atol=1e-5)
    # Its positions: I-JEPA's get_2d_sincos_pos_embed (MAE's, without the class row).
    from caco_tf.methods.mae import mae_sincos_positions
    np.testing.assert_array_equal(positions, mae_sincos_positions(3, 3, 16)[1:])

def images_and_masks(model, seed=0):
    rng = np.random.default_rng(seed)
    image = rng.normal(size=(BATCH, SIZE, SIZE, 1)).astype("float32")
    mask = model.mask_kind.draw(tf.constant([seed, 7], tf.int64), BATCH, 3, 3)
    return image, mask


def test_one_step_is_the_closed_form_every_part_moves_and_the_target_encoder_follows():
    import keras

    # Adam: at initialization the encoder's LayerNorm scales get gradients of ~1e-7 (through
    # the predictor's 0.02-std Linears), which SGD's step leaves below float32's resolution.
    model = tiny("ijepa", key_momentum=0.9, optimizer=lambda: keras.optimizers.Adam(1e-3))
    image, mask = images_and_masks(model)
    targets = model.targets((image,), training=True, masks=(mask,))
    # The targets: the target encoder's patch tokens, layer-normed without affine, gathered.
    whole = ijepa.encode_patches(model.target_backbone, image).numpy()
    normed = (whole - whole.mean(-1, keepdims=True)) / np.sqrt(whole.var(-1, keepdims=True) + 1e-5)
    index, valid = (t.numpy() for t in model._targets_of(mask))
    np.testing.assert_allclose(targets["tokens"], np.take_along_axis(
        normed[:, None], index[..., None], axis=2), atol=1e-4)
    (out,) = model.forward((image,), training=True, masks=(mask,))
    expected = np_ijepa_loss(out["predictions"].numpy(), targets["tokens"].numpy(), valid,
                             "smooth_l1")
    student = [v.numpy() for v in model.student_variables]
    teacher = [v.numpy() for v in model.key_encoder.trainable_variables]
    # Every trainable variable is the student's or the target encoder's: the projector and
    # the class token are frozen (I-JEPA trains neither).
    assert len(student) + len(teacher) == len(model.trainable_variables)
    assert "cls_token" not in {v.name for v in model.trainable_variables}
    history = model.fit(tf.data.Dataset.from_tensors((image, mask)), epochs=1,
                        verbose=0).history
    assert history["loss"][0] == pytest.approx(expected, rel=1e-4)
    still = [v.path for v, old in zip(model.student_variables, student)
             if np.abs(v.numpy() - old).max() == 0]
    assert still == []
    # The target encoder only by EMA: 0.9 of itself and 0.1 of the student after the step.
    followed = model.query_encoder.trainable_variables
    assert len(followed) == len(teacher)
    for variable, old, new in zip(model.key_encoder.trainable_variables, teacher, followed):
        np.testing.assert_allclose(variable.numpy(), 0.9 * old + 0.1 * new.numpy(), atol=1e-6)


def test_the_features_are_the_patch_tokens_average_without_a_class_token():
    model = tiny("ijepa")
    image, _ = images_and_masks(model)
    features = model.backbone(image).numpy()
    np.testing.assert_allclose(
        features, ijepa.encode_patches(model.backbone, image).numpy().mean(1), atol=1e-5)
    cls = model.backbone.get_layer("tokens").cls_token
    cls.assign(cls + 5.0)
    np.testing.assert_allclose(model.backbone(image), features, atol=1e-6)


def test_a_saved_model_loads_with_its_features(tmp_path):
    import keras

    model = tiny("ijepa")
    image, _ = images_and_masks(model)
    path = str(tmp_path / "ijepa.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.backbone.layers[-1], ijepa.PatchMean)
    np.testing.assert_allclose(loaded.backbone(image), model.backbone(image), atol=1e-6)
    assert len(loaded.student_variables) == len(model.student_variables)


def test_its_known_collapse_is_constant_target_tokens():
    from caco_tf.training.callbacks import EpochCount, is_collapsed

    model = tiny("ijepa")
    epoch = EpochCount(5, 0, 10)
    image, mask = images_and_masks(model)
    history = model.fit(tf.data.Dataset.from_tensors((image, mask)), epochs=1,
                        verbose=0).history
    # One view: no alignment or uniformity logged (an empty mean's 0 would read as bunched).
    assert "uniformity" not in history and "alignment" not in history
    logs = {key: values[-1] for key, values in history.items()}
    assert is_collapsed(logs, model, epoch) is None
    assert "tokens are constant" in is_collapsed(dict(logs, target_std=0.001), model, epoch)
    assert "target encoder's tokens are constant" in model.collapse({"target_std": 0.005}, epoch)
    assert model.collapse({"target_std": 0.092}, epoch) is None  # the digits at start
    assert not model.judged(EpochCount(2, 0, 10)) and model.judged(epoch)


@pytest.mark.slow
def test_a_tiny_fit_on_the_digits_through_the_pipeline():
    """The offline recipe at tiny sizes: the masks come with the view, the loss is finite and
    the target tokens are far from constant."""
    import keras

    config = load_config("mnist_ijepa", [
        "method.ijepa.predictor_width=16", "method.ijepa.predictor_depth=1",
        "method.ijepa.predictor_heads=2", "train.batch_size=16", "train.epochs=2",
        "train.jit_compile=false", "train.steps_per_execution=1", "train.learning_rate=3e-3",
        "train.lr_warmup_epochs=0"])
    keras.utils.set_random_seed(0)
    images = data.load_offline_mnist()["train"][0][:64]
    views_of_run = build.run_views(config)
    model = build.build_model(config, steps_per_epoch=4, views=views_of_run)
    stream = data.pretrain_dataset(images, 16, views_of_run, steps_per_epoch=4)
    image, mask = next(iter(stream))
    assert image.shape == (16, 28, 28, 1) and mask.shape == (16, 5, 7, 7)
    history = model.fit(stream, epochs=2, steps_per_epoch=4, verbose=0).history
    assert np.isfinite(history["loss"]).all()
    assert min(history["target_std"]) > 5 * ijepa.COLLAPSED_TARGET_STD
    assert model.backbone(image).shape == (16, 96)


def test_a_convnet_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys):
    from caco_tf.cli import train

    run_dir = tmp_path / "run"
    code = train.main(["--set", "method.name=ijepa", "--run-dir", str(run_dir)])
    errors = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(errors) == 1, errors
    assert errors[0].startswith("error: method ijepa works on a Vision Transformer's patch "
                                "tokens, and model.backbone small_convnet gives none")
    assert not run_dir.exists()
    with pytest.raises(ValueError, match="method ijepa works on a Vision Transformer"):
        tiny("ijepa", backbone=lambda shape: tf.keras.Sequential(
            [tf.keras.Input(shape), tf.keras.layers.GlobalAveragePooling2D()]))


def test_the_vit_huge_recipe_plans_as_the_official_config():
    """configs/ijepa_imagenet_vit_huge14.yaml: ViT-H/14 (patch 14, width 1280, 32 blocks, 16
    heads) at 224 px, a 16x16 grid, planned without a refusal; the momentum linear to 1."""
    from caco_tf.nets import sizes
    from caco_tf.run_settings import RunSettings

    settings = RunSettings.of(load_config("ijepa_imagenet_vit_huge14"))
    assert sizes.VIT_SHAPES[settings.model.backbone] == (14, 1280, 32, 16)
    plan = build.RunPlan.of(settings, 1281167 // settings.train.batch_size)
    build.check_sizes(plan, 1281167, plan.embedding_dim)
    kinds, grid = build.view_masks(settings)
    assert grid == (16, 16) and kinds[0].count == 4 and kinds[0].min_context == 10
    section = settings.method_settings
    assert section["key_momentum"] == {"start": 0.996, "end": 1.0}
    assert (section["predictor_width"], section["predictor_depth"]) == (384, 12)


@pytest.mark.slow
def test_caco_train_runs_the_digits_recipe_to_its_knn_and_exported_features(tmp_path):
    """caco-train --config mnist_ijepa at tiny sizes: the run trains, its kNN reads the patch
    tokens' average, and the saved model and SavedModel hold that backbone (~20 s)."""
    import json

    import keras

    from caco_tf.cli import train
    from tiny_run import offline_digits

    train_path, test_path = offline_digits(tmp_path, 128, 64)
    run_dir = tmp_path / "run"
    settings = [f"data.source=npz:{train_path}", f"data.held_out=npz:{test_path}",
                "train.epochs=1", "train.batch_size=32", "train.jit_compile=false",
                "train.steps_per_execution=1", "method.ijepa.predictor_depth=1"]
    assert train.main(["--config", "mnist_ijepa", "--run-dir", str(run_dir)]
                      + [part for setting in settings for part in ("--set", setting)]) == 0
    results = json.loads((run_dir / "results.json").read_text())
    assert 10.0 < results["knn_top1"] <= 100.0 and os.path.isdir(results["saved_model"])
    model = keras.models.load_model(str(run_dir / "model.keras"))
    assert isinstance(model.backbone.layers[-1], ijepa.PatchMean)
