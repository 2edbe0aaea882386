"""MAE (caco_tf.methods.mae): its loss against NumPy (the masked patches only, per-patch
normalized pixels with PyTorch's unbiased variance), the decoder's positions and its mask tokens
put back in grid order, one step against the closed form, every trainable part moving, a tiny
fit on the digits through the input pipeline (masks drawn with the views), its known failure,
the reconstruction figure, and the refusal of a ConvNet in one line."""

import os

import numpy as np
import pytest
import tensorflow as tf

from caco_tf import build, data
from caco_tf.config import load_config
from caco_tf.data import masks
from caco_tf.methods import mae
from caco_tf.nets import tokens
from tiny_methods import BATCH, tiny, views

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def np_targets(pixels, norm_pix):
    if not norm_pix:
        return pixels
    mean = pixels.mean(-1, keepdims=True)
    var = pixels.var(-1, ddof=1, keepdims=True)  # torch.Tensor.var: unbiased
    return (pixels - mean) / np.sqrt(var + 1e-6)


def np_mae_loss(predictions, pixels, masked, norm_pix):
    per_patch = ((predictions - np_targets(pixels, norm_pix)) ** 2).mean(-1)
    return (per_patch * masked).sum() / masked.sum()


@pytest.fixture(scope="module")
def patches():
    rng = np.random.default_rng(0)
    predictions, pixels = (rng.normal(size=(4, 9, 16)).astype("float32") for _ in range(2))
    masked = (rng.random((4, 9)) < 0.7).astype("float32")
    return predictions, pixels, masked


@pytest.mark.parametrize("norm_pix", [True, False])
def test_the_loss_is_the_mse_on_the_masked_patches_only(patches, norm_pix):
    predictions, pixels, masked = patches
    np.testing.assert_allclose(mae.masked_patch_loss(predictions, pixels, masked, norm_pix),
                               np_mae_loss(predictions, pixels, masked, norm_pix), rtol=1e-5)
    # The visible patches' predictions do not count.
    changed = np.where(masked[..., None] > 0, predictions, 1e3)
    np.testing.assert_allclose(mae.masked_patch_loss(changed, pixels, masked, norm_pix),
                               np_mae_loss(predictions, pixels, masked, norm_pix), rtol=1e-5)


def test_the_flat_reconstruction_loss_is_each_patchs_own_variance(patches):
    _, pixels, masked = patches
    targets = np_targets(pixels, True)
    flat = ((targets - targets.mean(-1, keepdims=True)) ** 2).mean(-1)
    np.testing.assert_allclose(mae.flat_patch_loss(pixels, masked),
                               (flat * masked).sum() / masked.sum(), rtol=1e-5)
    # Normalized, a patch's own mean loses (n - 1) / n of its unit unbiased variance.
    np.testing.assert_allclose(mae.flat_patch_loss(pixels, masked), 15 / 16, rtol=1e-4)


def test_the_decoders_positions_are_maes_sine_cosine_table():
    """util/pos_embed.py: the grid's first coordinate is the column (np.meshgrid(w, h)), each
    half 1-D sin | cos with ω = 1 / 10000^(k / (D/4)), and a zero row for the class token."""
    rows, cols, width = 3, 4, 16

    def one_d(positions):
        omega = 1.0 / 10000 ** (np.arange(width // 4) / (width / 4))
        out = np.outer(positions, omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    grid_w, grid_h = np.meshgrid(np.arange(cols), np.arange(rows))
    expected = np.concatenate([one_d(grid_w.ravel()), one_d(grid_h.ravel())], axis=1)
    table = mae.mae_sincos_positions(rows, cols, width)
    np.testing.assert_allclose(table[1:], expected, atol=1e-6)
    np.testing.assert_array_equal(table[0], 0.0)


@pytest.fixture(scope="module")
def model():
    return tiny("mae")


def test_the_decoder_puts_the_visible_tokens_back_in_grid_order(model):
    """The decoder's input, by hand: the mask token at every masked patch, each visible
    patch's embedded token at its own place, then the positions."""
    decoder = model.decoder
    rng = np.random.default_rng(1)
    mask = masks.random_masks(tf.constant([2, 3], tf.int64), 2, 3, 3, 0.75)
    order = model._order(mask).numpy()
    encoded = rng.normal(size=(2, 1 + model.kept, 96)).astype("float32")
    embedded = decoder.embed(encoded).numpy()
    by_hand = np.tile(decoder.mask_token.numpy(), (2, 10, 1))
    by_hand[:, 0] = embedded[:, 0]
    for b in range(2):
        for k, patch in enumerate(order[b, :model.kept]):
            by_hand[b, 1 + patch] = embedded[b, 1 + k]
    x = tf.constant(by_hand + decoder.positions[None])
    for block in decoder.blocks:
        x = block(x)
    expected = decoder.pred(decoder.norm(x))[:, 1:]
    np.testing.assert_allclose(decoder(encoded, order), expected, atol=1e-5)


def test_one_step_is_the_masked_patch_loss_and_every_part_moves():
    model = tiny("mae")
    image, mask = views(method="mae")
    assert mask.shape == (BATCH, 3, 3) and (mask.reshape(BATCH, -1).sum(1) == 9 - 2).all()
    (out,) = model.forward((tf.constant(image),), training=True, masks=(tf.constant(mask),))
    expected = np_mae_loss(out["predictions"].numpy(), tokens.patchify(image, 4).numpy(),
                           mask.reshape(BATCH, -1).astype("float32"), True)
    before = [v.numpy() for v in model.student_variables]
    assert len(before) == len(model.trainable_variables)  # the projector is frozen
    history = model.fit(tf.data.Dataset.from_tensors((image, mask)), epochs=1,
                        verbose=0).history
    assert history["loss"][0] == pytest.approx(expected, rel=1e-4)
    still = [v.path for v, old in zip(model.student_variables, before)
             if np.abs(v.numpy() - old).max() == 0]
    assert still == []


def test_its_known_failure_is_a_flat_reconstruction(model):
    from caco_tf.training.callbacks import EpochCount

    epoch = EpochCount(5, 0, 10)
    assert "reconstructions are flat" in model.collapse({"relative_loss": 1.0}, epoch)
    assert model.collapse({"relative_loss": 0.987}, epoch) is None  # the digits at epoch 3
    assert not model.judged(EpochCount(2, 0, 10)) and model.judged(epoch)
    # Only its own failure: a working MAE's class tokens have an effective rank near 1.
    from caco_tf.training.callbacks import is_collapsed

    assert is_collapsed({"relative_loss": 0.96, "rank_embedding": 1.02}, model, epoch) is None
    assert "flat" in is_collapsed({"relative_loss": 1.0, "rank_embedding": 1.02}, model, epoch)
    assert is_collapsed({"rank_embedding": 1.02}).startswith("the embeddings' effective rank")


@pytest.mark.slow
def test_a_tiny_fit_on_the_digits_through_the_pipeline_and_the_figure(tmp_path):
    """The offline recipe at tiny sizes: the masks come with the views, the loss falls."""
    import keras

    config = load_config("mnist_mae", [
        "method.mae.decoder_width=16", "method.mae.decoder_depth=1", "method.mae.decoder_heads=2",
        "train.batch_size=16", "train.epochs=2", "train.jit_compile=false",
        "train.steps_per_execution=1", "train.learning_rate=3e-3", "train.lr_warmup_epochs=0"])
    keras.utils.set_random_seed(0)
    images = data.load_offline_mnist()["train"][0][:64]
    views_of_run = build.run_views(config)
    model = build.build_model(config, steps_per_epoch=4, views=views_of_run)
    stream = data.pretrain_dataset(images, 16, views_of_run, steps_per_epoch=4)
    image, mask = next(iter(stream))
    assert image.shape == (16, 28, 28, 1) and mask.shape == (16, 7, 7)
    history = model.fit(stream, epochs=2, steps_per_epoch=4, verbose=0).history
    assert np.isfinite(history["loss"]).all() and history["loss"][1] < history["loss"][0]
    from caco_tf.evaluation import reconstruction

    path = reconstruction.reconstruction_figure(model, image[:3], mask[:3], str(tmp_path / "r.png"),
                                         views_of_run)
    assert os.path.getsize(path) > 0
    reconstructed = model.reconstruct(image[:3], mask[:3]).numpy()
    visible = ~np.repeat(np.repeat(mask[:3].numpy(), 4, 1), 4, 2)[..., None]
    np.testing.assert_allclose(reconstructed[visible], image[:3].numpy()[visible], atol=1e-6)


def test_a_convnet_is_refused_in_one_line_and_nothing_is_written(tmp_path, capsys):
    from caco_tf.cli import train

    run_dir = tmp_path / "run"
    code = train.main(["--set", "method.name=mae", "--run-dir", str(run_dir)])
    errors = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(errors) == 1, errors
    assert errors[0].startswith("error: method mae works on a Vision Transformer's patch "
                                "tokens, and model.backbone small_convnet gives none")
    assert "vit_micro_patch4" in errors[0]
    assert not run_dir.exists()
    # In Python too: the method refuses a backbone without tokens.
    with pytest.raises(ValueError, match="method mae works on a Vision Transformer"):
        tiny("mae", backbone=lambda shape: tf.keras.Sequential(
            [tf.keras.Input(shape), tf.keras.layers.GlobalAveragePooling2D()]))



def test_caco_figures_draws_an_mae_runs_reconstructions_and_refuses_another_run(tmp_path,
                                                                                capsys):
    from caco_tf.cli import figures
    from tiny_run import make_run, offline_digits

    train_path, test_path = offline_digits(tmp_path, 64, 16)
    run_dir, _ = make_run(tmp_path / "mae", overrides=[
        f"data.source=npz:{train_path}", f"data.held_out=npz:{test_path}", "method.name=mae",
        "model.backbone=vit_micro_patch4", "method.mae.decoder_width=16",
        "method.mae.decoder_depth=1", "method.mae.decoder_heads=2"])
    assert figures.main(["reconstruction", "--run", run_dir, "--count", "3"]) == 0
    assert os.path.getsize(os.path.join(run_dir, "figures", "reconstruction.png")) > 0
    capsys.readouterr()
    other, _ = make_run(tmp_path / "caco", overrides=[
        f"data.source=npz:{train_path}", f"data.held_out=npz:{test_path}"])
    assert figures.main(["reconstruction", "--run", other]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: reconstructions need a run of a "
                                                     "method that reconstructs"), errors


def test_one_view_logs_no_alignment_or_uniformity(model):
    """Never updated with one view, their empty means would log 0: to the health rule,
    embeddings bunched together (a healthy MAE run was flagged from its fourth epoch)."""
    names = {metric.name for metric in model.metrics}
    assert "loss" in names and not names & {"alignment", "uniformity"}
