"""Vision Transformers (caco_tf.nets.vit) and the optimizer of their recipes: the position
embeddings' resize against PyTorch's bicubic and a NumPy closed form, MoCo v3's sine-cosine
table, a whole forward pass and the class token's attention computed by hand, DINO's
thresholded maps, AdamW against torch.optim.AdamW (scheduled decay, groups, clipping), the
exports checked by their runtimes, and the configuration's one-line refusals."""

import math
import os

import keras
import numpy as np
import pytest

from caco_tf import keras_compat
from caco_tf.config import ConfigError, load_config
from caco_tf.nets import backbones, vit
from caco_tf.training import optimizers

TINY = vit.ViTShape(patch=4, width=8, depth=2, heads=2)


def _keys(t, a=-0.75):
    """Keys' cubic convolution kernel (PyTorch's bicubic A)."""
    t = abs(t)
    if t <= 1:
        return (a + 2) * t ** 3 - (a + 3) * t ** 2 + 1
    if t < 2:
        return a * t ** 3 - 5 * a * t ** 2 + 8 * a * t - 4 * a
    return 0.0


def _resize_closed_form(table, size):
    """A g0×g0×D table resized to size×size as DINO does: source position (i + ½)·g0/(size +
    0.1) - ½, four taps, indices clamped to the edge."""
    g0 = table.shape[0]
    matrix = np.zeros((size, g0))
    for i in range(size):
        x = (i + 0.5) * g0 / (size + 0.1) - 0.5
        for j in range(math.floor(x) - 1, math.floor(x) + 3):
            matrix[i, min(max(j, 0), g0 - 1)] += _keys(x - j)
    return np.einsum("ri,ijd,cj->rcd", matrix, table, matrix)


@pytest.mark.parametrize("size", [2, 3, 4, 6, 7])
def test_learned_positions_resize_as_dino_does(size):
    tokens = vit.Tokens(grid=4, width=3)
    tokens.build((None, 4, 4, 3))
    table = np.random.default_rng(size).normal(size=(4, 4, 3)).astype("float32")
    tokens.pos_embed.assign(np.concatenate([np.zeros((1, 1, 3)), table.reshape(1, 16, 3)], 1))
    got = np.asarray(tokens.patch_positions(size, size)).reshape(size, size, 3)
    if size == 4:  # the size it was built for: the table itself, as DINO returns it
        np.testing.assert_array_equal(got, table)
        return
    np.testing.assert_allclose(got, _resize_closed_form(table.astype(np.float64), size),
                               atol=1e-5)
    torch = pytest.importorskip("torch")
    factor = (size + vit.DINO_SCALE_OFFSET) / 4  # vision_transformer.py's interpolate call
    expected = torch.nn.functional.interpolate(
        torch.tensor(table).permute(2, 0, 1)[None], scale_factor=(factor, factor),
        mode="bicubic")[0].permute(1, 2, 0).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_sincos_positions_are_moco_v3s_table():
    rows = cols = 3
    width = 8
    omega = 1.0 / 10000.0 ** (np.arange(width // 4) / (width // 4))
    # moco-v3 vits.py: meshgrid(w, h) ('ij'), flattened; the first halves from the outer index.
    outer, inner = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    outer, inner = outer.reshape(-1, 1) * omega, inner.reshape(-1, 1) * omega
    expected = np.concatenate([np.sin(outer), np.cos(outer), np.sin(inner), np.cos(inner)], 1)
    got = np.asarray(vit.sincos_position_embedding(rows, cols, width))
    np.testing.assert_allclose(got, expected, atol=1e-6)


def _layer_norm(x, layer):
    gamma, beta = (w.numpy().astype(np.float64) for w in layer.weights)
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-6) * gamma + beta


def _dense(x, layer):
    kernel, bias = (w.numpy().astype(np.float64) for w in layer.weights)
    return x @ kernel + bias


def _attention_by_hand(x, block, heads):
    qkv = _dense(_layer_norm(x, block.norm1), block.attn_qkv)
    batch, count, _ = qkv.shape
    qkv = qkv.reshape(batch, count, 3, heads, -1)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    logits = np.einsum("bnhd,bmhd->bhnm", q, k) / math.sqrt(q.shape[-1])
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    mixed = np.einsum("bhnm,bmhd->bnhd", weights, v).reshape(batch, count, -1)
    return weights, _dense(mixed, block.attn_proj)


def _gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def test_a_forward_pass_and_the_class_attention_computed_by_hand():
    keras.utils.set_random_seed(0)
    model = vit.build_vit(TINY, (8, 8, 1))
    images = np.random.default_rng(0).normal(size=(2, 8, 8, 1))
    patch_embed, tokens, blocks, norm = vit.vit_blocks(model)
    kernel, bias = (w.numpy().astype(np.float64) for w in patch_embed.weights)
    # Patches row by row, each flattened as the kernel's (row, column, channel) order.
    patches = images.reshape(2, 2, 4, 2, 4, 1).transpose(0, 1, 3, 2, 4, 5).reshape(2, 4, 16)
    x = patches @ kernel.reshape(16, TINY.width) + bias
    cls, positions = tokens.cls_token.numpy(), tokens.pos_embed.numpy()
    x = np.concatenate([np.repeat(cls, 2, 0), x], 1) + positions
    _, attended = _attention_by_hand(x, blocks[0], TINY.heads)
    x = x + attended
    x = x + _dense(_gelu(_dense(_layer_norm(x, blocks[0].norm2), blocks[0].mlp_fc1)),
                   blocks[0].mlp_fc2)
    weights, _ = _attention_by_hand(x, blocks[1], TINY.heads)
    expected = weights[:, :, 0, 1:].reshape(2, TINY.heads, 2, 2)
    got = np.asarray(vit.class_attention(model, images.astype("float32")))
    np.testing.assert_allclose(got, expected, atol=1e-5)
    # The features: the class token after the last block and the norm.
    _, attended = _attention_by_hand(x, blocks[1], TINY.heads)
    x = x + attended
    x = x + _dense(_gelu(_dense(_layer_norm(x, blocks[1].norm2), blocks[1].mlp_fc1)),
                   blocks[1].mlp_fc2)
    features = _layer_norm(x, norm)[:, 0]
    np.testing.assert_allclose(np.asarray(model(images.astype("float32"))), features,
                               atol=1e-5)


def test_the_thresholded_map_keeps_the_smallest_set_holding_the_fraction():
    attention = np.array([[0.05, 0.3], [0.5, 0.15]])
    np.testing.assert_array_equal(vit.smallest_fraction_mask(attention, 0.6),
                                  [[0, 1], [1, 0]])
    np.testing.assert_array_equal(vit.smallest_fraction_mask(attention, 0.5), [[0, 0], [1, 0]])
    # DINO's rule on a random map: the ascending cumulative share above 1 - t.
    values = np.random.default_rng(1).random((3, 4, 5))
    for head in values:
        flat = head.reshape(-1) / head.sum()
        order = np.argsort(flat)
        kept = np.zeros(flat.size)
        kept[order] = np.cumsum(flat[order]) > 1 - 0.6
        np.testing.assert_array_equal(vit.smallest_fraction_mask(head, 0.6).reshape(-1), kept)


def test_crops_of_another_size_pass_with_resized_positions():
    model = vit.build_vit(TINY, (None, None, 1), image_size=8, drop_path=0.1)
    for size in (8, 12, 4):
        images = np.random.default_rng(size).normal(size=(3, size, size, 1)).astype("float32")
        assert model(images).shape == (3, TINY.width)
        assert vit.class_attention(model, images).shape == (3, 2, size // 4, size // 4)


def test_moco_v3s_frozen_patch_projection_is_left_out_of_training():
    model = vit.build_vit(TINY, (8, 8, 1), positions="sincos", frozen_patch_embedding=True)
    for network in (model, keras.models.clone_model(model)):  # a teacher is a clone
        trained = {w.path for w in network.trainable_weights}
        assert not any("patch_embed" in path for path in trained)
    assert not any("pos_embed" in w.path for w in model.weights)  # fixed, not a weight


def test_a_seeded_default_vit_draws_the_weights_it_drew_before_its_init_was_a_setting():
    """The untrained baselines measured before ``model.vit_init`` (``--untrained --seed S``)
    stay the same network: the default init draws its seeds in the order it always did.
    The figures: this build at ee0dfd9, before the setting."""
    keras.utils.set_random_seed(0)
    model = vit.build_vit("vit_micro_patch4", (28, 28, 1))
    assert float(np.sum(model.weights[0].numpy().astype(np.float64))) == pytest.approx(
        -0.137736, abs=1e-5)  # the patch kernel
    total = sum(float(np.sum(np.abs(w.numpy().astype(np.float64)))) for w in model.weights)
    assert total == pytest.approx(7361.561051, rel=1e-6)


def test_maes_xavier_init_sets_each_kernel_as_a_linear_of_its_fan_in_and_fan_out():
    """MAE's initialize_weights: xavier-uniform on every Linear and on the patch convolution
    viewed as a Linear [D, p·p·C]: bound sqrt(6 / (fan_in + fan_out)), std bound / sqrt(3)."""
    shape, built = vit.ViTShape(patch=4, width=96, depth=1, heads=3), {}
    for init, patch_bound in (("xavier", math.sqrt(6 / (16 + 96))), ("trunc_normal", 0.04)):
        keras.utils.set_random_seed(0)
        model = built[init] = vit.build_vit(shape, (28, 28, 1), positions="sincos", init=init)
        kernel = model.get_layer("patch_embed").proj.kernel.numpy()
        assert kernel.shape == (4, 4, 1, 96) and np.abs(kernel).max() <= patch_bound
        if init == "xavier":
            np.testing.assert_allclose(kernel.std(), patch_bound / math.sqrt(3), rtol=0.05)
            block = model.get_layer("blocks_0")
            for dense, (fan_in, fan_out) in ((block.attn_qkv, (96, 288)),
                                             (block.mlp_fc2, (384, 96))):
                bound = math.sqrt(6 / (fan_in + fan_out))
                weights = dense.kernel.numpy()
                assert np.abs(weights).max() <= bound
                np.testing.assert_allclose(weights.std(), bound / math.sqrt(3), rtol=0.05)
        else:
            np.testing.assert_allclose(kernel.std(), 0.02 * 0.88, rtol=0.1)  # truncated at 2σ
    config = load_config(None, ["model.backbone=vit_micro_patch4", "model.pool_grid=1",
                                "model.vit_init=xavier"])
    assert config["model"]["vit_init"] == "xavier"
    copy = keras.models.clone_model(built["xavier"])  # a teacher: its configuration keeps it
    assert copy.get_layer("patch_embed").init == copy.get_layer("blocks_0").init == "xavier"


def test_a_vit_saves_and_loads_with_the_same_features(tmp_path):
    model = vit.build_vit(TINY, (None, None, 1), image_size=8, drop_path=0.2)
    path = str(tmp_path / "vit.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    images = np.random.default_rng(0).normal(size=(2, 12, 12, 1)).astype("float32")
    np.testing.assert_allclose(np.asarray(loaded(images)), np.asarray(model(images)), atol=1e-6)


def test_the_flops_count_vit_s16_at_224_px():
    # 4.6 GMACs (DINO's and timm's figure for ViT-S/16), counted as 2 FLOPs each.
    assert vit.flops_per_image("vit_small_patch16", 224) == pytest.approx(9.2e9, rel=0.01)


# ------------------------------------------------------------------ AdamW against PyTorch
def test_adamw_matches_torch_with_scheduled_decay_groups_and_clipping():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    start = {"kernel": rng.normal(size=(3, 4)), "bias": rng.normal(size=(4,))}
    gradients = [{k: rng.normal(size=v.shape) * 3 for k, v in start.items()} for _ in range(6)]
    total, warmup, clip = 6, 2, 1.0
    learning_rate = optimizers.WarmupCosine(0.01, total, warmup, final_value=1e-3)
    decay = optimizers.WarmupCosine(0.04, total, final_value=0.4)

    variables = [keras.Variable(start[k], dtype="float32", name=k) for k in ("kernel", "bias")]
    optimizer = optimizers.AdamW(learning_rate=learning_rate, weight_decay=decay,
                                 decay_rank1=False, clip_tensor_norm=clip)
    optimizer.build(variables)
    for step in gradients:
        optimizer.apply([step["kernel"].astype("float32"), step["bias"].astype("float32")],
                        variables)

    params = {k: torch.tensor(v, requires_grad=True) for k, v in start.items()}
    reference = torch.optim.AdamW([{"params": [params["kernel"]]},
                                   {"params": [params["bias"]], "weight_decay": 0.0}])
    for index, step in enumerate(gradients):
        for group in reference.param_groups:  # main_dino.py's per-iteration assignments
            group["lr"] = float(learning_rate(index))
        reference.param_groups[0]["weight_decay"] = float(decay(index))
        for name, param in params.items():
            param.grad = torch.tensor(step[name])
            norm = param.grad.norm(2)  # DINO's utils.clip_gradients
            if clip / (norm + 1e-6) < 1:
                param.grad.mul_(clip / (norm + 1e-6))
        reference.step()
    for variable, name in zip(variables, ("kernel", "bias")):
        np.testing.assert_allclose(variable.numpy(), params[name].detach().numpy(), rtol=1e-5,
                                   atol=1e-6)


def test_the_adamw_recipe_is_built_from_the_configuration():
    optimizer = optimizers.build_encoder_optimizer(
        512, 100, 10, optimizer="adamw", weight_decay=0.04, weight_decay_end=0.4,
        decay_biases_and_norms=False, clip_gradient_norm=3.0, final_learning_rate=1e-6,
        adamw_beta2=0.95)
    assert isinstance(optimizer, optimizers.AdamW)
    assert float(optimizer.learning_rate) == 0.0  # the warm-up's first step
    assert optimizer._learning_rate.base_value == pytest.approx(1e-3)  # 5e-4 x 512/256
    assert float(optimizer.current_weight_decay()) == pytest.approx(0.04)
    restored = optimizers.AdamW.from_config(optimizer.get_config())
    assert float(restored.decoupled_weight_decay(100)) == pytest.approx(0.4)
    assert (restored.decay_rank1, restored.clip_tensor_norm) == (False, 3.0)
    assert (restored.beta_1, restored.beta_2) == (0.9, 0.95)  # MAE's betas


# ------------------------------------------------------------------ the configuration
@pytest.mark.parametrize("overrides, message", [
    (["model.backbone=vit_micro_patch4", "model.pool_grid=2"], "model.pool_grid must be 1 with model.backbone "
                                          "vit_micro_patch4"),
    (["model.drop_path=0.1"], r"model.drop_path applies to the vit_\* backbones"),
    (["model.position_embedding=sincos"], r"model.position_embedding applies to the vit_\*"),
    (["model.vit_init=xavier"], r"model.vit_init applies to the vit_\* backbones"),
    (["train.weight_decay_end=0.4"], "train.weight_decay_end needs train.optimizer adamw"),
    (["train.adamw_beta2=0.95"], "train.adamw_beta2 needs train.optimizer adamw, got "
                                 "train.optimizer auto"),
    (["model.backbone=vit_small_patch16", "model.pool_grid=1", "data.views=asymmetric",
      "data.image_size=8"], "data.image_size 8 is too small for model.backbone "
                            "vit_small_patch16"),
])
def test_vit_settings_out_of_place_are_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_every_vit_name_is_a_backbone_of_the_configuration():
    for name in vit.VIT_PRESETS:
        config = load_config(None, [f"model.backbone={name}", "model.pool_grid=1",
                                    "data.views=asymmetric", "data.image_size=32"])
        assert config["model"]["backbone"] == name
        assert name in backbones.BACKBONE_NAMES


# ------------------------------------------------------------------ DINO and MoCo v3 on a ViT
def _tiny_vit(drop_path):
    return lambda shape: vit.build_vit(TINY, shape, image_size=12, drop_path=drop_path)


def _adamw():
    return optimizers.AdamW(learning_rate=1e-3, weight_decay=optimizers.WarmupCosine(
        0.04, 4, final_value=0.4), decay_rank1=False, clip_tensor_norm=0.5)


# DINO's first gradients on the tiny ViT are ~1e-7, mostly rounding, which a clip would scale
# up to its norm: its row runs unclipped.
CLIPS = {"moco_v3": 0.05, "dino": 0.0}


# A ViT is a backbone, not a method family: the fast tier has a replica row per family.
@pytest.mark.slow
@pytest.mark.parametrize("method", ["moco_v3", "dino"])
def test_a_vit_trains_alike_on_one_two_and_four_replicas(method):
    from test_methods_at_scale import _step
    from tiny_methods import tiny

    # Without stochastic depth: each replica draws its own drop masks.  SGD with DINO's
    # per-tensor clipping: clipping each replica's share instead of the sum would show (Adam's
    # steps barely depend on the gradient's scale, and amplify the rounding of the keys'
    # biases, whose gradient is 0 in exact arithmetic).
    arguments = dict(backbone=_tiny_vit(0.0), optimizer=lambda: optimizers.LARS(
        0.1, momentum=0.9, layer_adaptation=False, clip_tensor_norm=CLIPS[method]))
    multi = method == "dino"
    initial = [w.numpy() for w in tiny(method, sync=True, any_size=multi, **arguments).weights]
    single, single_loss = _step(method, **arguments)
    for replicas in (2, 4):
        mirrored, loss = _step(method, replicas, **arguments)
        assert loss == pytest.approx(single_loss, rel=1e-5, abs=1e-6), replicas
        # The step's moves agree to 0.1 % of the largest move: rounding in another order when
        # the batch splits is amplified in weights whose gradient is 0 in exact arithmetic (the
        # keys' biases; the last LayerNorm's shift before the projector's BatchNorm).
        moves = [(a.numpy() - start, b.numpy() - start)
                 for a, b, start in zip(single.weights, mirrored.weights, initial)]
        largest = max(np.abs(one).max() for one, _ in moves)
        for (one, many), weight in zip(moves, single.weights):
            np.testing.assert_allclose(many, one, rtol=0, atol=1e-3 * largest,
                                       err_msg=f"{replicas} replicas: {weight.path}")


DROP = 0.2


@pytest.mark.slow
@pytest.mark.parametrize("method", ["dino", "moco_v3"])
def test_a_vit_stopped_by_sigterm_resumes_bit_for_bit(method, tmp_path):
    from caco_tf.training import interrupts
    from test_methods_at_scale import STEPS, _train

    arguments = dict(backbone=_tiny_vit(DROP), optimizer=_adamw)
    uninterrupted, logs = _train(method, str(tmp_path / "uninterrupted"), **arguments)
    folder = str(tmp_path / "stopped")
    with pytest.raises(interrupts.Interrupted, match="stopped by SIGTERM"):
        _train(method, folder, stop_after=STEPS + 1, **dict(arguments, optimizer=_adamw))
    resumed, resumed_logs = _train(method, folder, **dict(arguments, optimizer=_adamw))
    assert resumed_logs == logs
    student, teacher = ({layer.rate for layer in keras_compat.nested_layers(network)
                         if isinstance(layer, vit.DropPath)}
                        for network in (resumed.backbone, resumed.key_encoder))
    assert (student, teacher) == ({0.0, DROP}, {0.0})  # the teacher never drops a path
    for a, b in zip(uninterrupted.weights + uninterrupted.optimizer.variables,
                    resumed.weights + resumed.optimizer.variables):
        np.testing.assert_array_equal(b.numpy(), a.numpy(), err_msg=a.path)


# ------------------------------------------------------------------ caco-figures attention
@pytest.mark.slow
def test_the_attention_command_writes_each_images_maps_and_a_sheet(tmp_path, capsys):
    from PIL import Image

    from caco_tf.cli import figures
    from tiny_run import make_run

    run, _ = make_run(tmp_path / "run", overrides=[
        "model.backbone=vit_micro_patch4", "model.pool_grid=1", "data.views=asymmetric"])
    folder = tmp_path / "images"
    folder.mkdir()
    for index, size in enumerate((28, 40, 64)):
        Image.fromarray(np.random.default_rng(index).integers(
            0, 256, (size, size + 5, 3), np.uint8)).save(folder / f"image{index}.png")
    assert figures.main(["attention", "--run", run, "--images", str(folder)]) == 0
    written = sorted(os.listdir(os.path.join(run, "figures", "attention")))
    assert written == ["attention_sheet.png"] + [f"image{i}_attention.png" for i in range(3)]
    assert "figure:" in capsys.readouterr().out

    convnet, _ = make_run(tmp_path / "convnet")
    assert figures.main(["attention", "--run", convnet, "--images", str(folder)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "attention maps need a ViT run" in error


def test_attention_maps_upsample_each_patch_and_hold_the_fraction():
    from caco_tf.evaluation.attention import attention_maps

    model = vit.build_vit(TINY, (8, 8, 1))
    images = np.random.default_rng(0).normal(size=(2, 8, 8, 1)).astype("float32")
    maps, masks = attention_maps(model, images, TINY.patch)
    attention = np.asarray(vit.class_attention(model, images))
    assert maps.shape == masks.shape == (2, TINY.heads, 8, 8)
    np.testing.assert_allclose(maps[:, :, ::4, ::4], attention)  # one patch, 4x4 pixels
    kept = (masks[:, :, ::4, ::4] * attention).sum(axis=(2, 3))
    assert np.all(kept / attention.sum(axis=(2, 3)) >= 0.6)


@pytest.mark.slow  # an XLA compile of a DINO step on two crop sizes: ~40 s here
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_a_vit_step_compiles_with_xla_under_mixed_precision(policy):
    from tiny_methods import tiny, views

    keras.mixed_precision.set_global_policy(policy)
    try:
        model = tiny("dino", any_size=True, backbone=lambda shape: vit.build_vit(
            TINY, shape, image_size=12, drop_path=0.1), optimizer=_adamw)
        model.compile(optimizer=_adamw(), jit_compile=True)
        batch = views(crops=2, local_crops=2)
        import tensorflow as tf
        loss = model.fit(tf.data.Dataset.from_tensors(batch).repeat(2), epochs=1,
                         verbose=0).history["loss"][-1]
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert np.isfinite(loss)
    assert model.backbone.get_layer("blocks_0").compute_dtype == policy.split("_")[1]
