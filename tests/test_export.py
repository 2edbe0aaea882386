"""The exported backbone: TF Serving layout, its three signatures and their preprocessing,
loading without keras, saved_model_cli, and the batch feature-extraction CLI."""

import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

from caco_tf.nets import backbones
from caco_tf.data import images as image_ops
from caco_tf.serving import export
from caco_tf.methods.momentum_encoder import build_encoder
import launch


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEAN, STD = 0.5, 0.25
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH="")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A small ConvNet (28×28×1) and its query encoder, exported once for the whole module."""
    keras.utils.set_random_seed(0)
    backbone = backbones.build_backbone("small_convnet", (28, 28, 1))
    embedder = build_encoder(backbone, backbones.build_projector(256, 64, 32), "query_encoder")
    directory = tmp_path_factory.mktemp("export")
    path = export.export_backbone(backbone, str(directory), image_size=28, channels=1,
                                  mean=MEAN, std=STD, embedder=embedder)
    images = np.random.default_rng(0).integers(0, 256, size=(3, 28, 28, 1), dtype=np.uint8)
    return types.SimpleNamespace(
        path=path, directory=directory, backbone=backbone, embedder=embedder, images=images,
        loaded=tf.saved_model.load(path))


def keras_features(exported, images):
    """What evaluation computes: the backbone on (x / 255 - mean) / std."""
    return np.asarray(exported.backbone((images.astype("float32") / 255.0 - MEAN) / STD,
                                        training=False))


# --- layout, loading without keras, saved_model_cli ----------------------------------------------


@pytest.mark.slow
def test_saved_model_loads_without_keras_and_serves_three_signatures(exported, tmp_path):
    path = exported.path
    assert path == os.path.join(str(exported.directory), "backbone", "1")
    assert os.path.exists(os.path.join(path, "saved_model.pb"))
    assert os.path.isdir(os.path.join(path, "variables"))
    np.save(tmp_path / "images.npy", exported.images)
    # A process that imports neither keras nor caco_tf: what a plain TF user does.  (TF 2.21
    # itself loads a few keras.src utility modules on import; the restored graph needs none.)
    script = f"""
import sys, numpy as np, tensorflow as tf
model = tf.saved_model.load({path!r})
images = np.load({str(tmp_path / 'images.npy')!r})
png = [tf.io.encode_png(image).numpy() for image in images]
np.savez({str(tmp_path / 'out.npz')!r},
         features=model.signatures['serving_default'](images=tf.constant(images))['features'],
         embedding=model.signatures['embed'](images=tf.constant(images))['embedding'],
         from_bytes=model.signatures['serve_bytes'](image_bytes=tf.constant(png))['features'])
assert 'caco_tf' not in sys.modules
"""
    result = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True,
                            text=True, timeout=120, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    out = np.load(tmp_path / "out.npz")
    expected = keras_features(exported, exported.images)
    assert out["features"].shape == (3, 256)
    np.testing.assert_allclose(out["features"], expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["from_bytes"], expected, rtol=1e-5, atol=1e-5)
    embedding = exported.embedder((exported.images / 255.0 - MEAN) / STD, training=False)
    assert out["embedding"].shape == (3, 32)
    np.testing.assert_allclose(out["embedding"], np.asarray(embedding), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(out["embedding"], axis=1), 1.0, atol=1e-5)


def saved_model_cli(*args):
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    return subprocess.run([cli, *args], env=ENV, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_saved_model_cli_shows_the_signatures(exported):
    result = saved_model_cli("show", "--all", "--dir", exported.path)
    assert result.returncode == 0, result.stderr[-2000:]
    listing = result.stdout
    for name in ("signature_def['serving_default']", "signature_def['embed']",
                 "signature_def['serve_bytes']"):
        assert name in listing
    listing = " ".join(listing.split())  # the indentation is saved_model_cli's business
    for tensor in ("inputs['images'] tensor_info: dtype: DT_UINT8 shape: (-1, -1, -1, 1)",
                   "inputs['image_bytes'] tensor_info: dtype: DT_STRING shape: (-1)",
                   "outputs['features'] tensor_info: dtype: DT_FLOAT shape: (-1, 256)",
                   "outputs['embedding'] tensor_info: dtype: DT_FLOAT shape: (-1, 32)"):
        assert tensor in listing


@pytest.mark.slow
def test_saved_model_cli_run_gives_the_keras_features(exported, tmp_path):
    np.save(tmp_path / "images.npy", exported.images)
    result = saved_model_cli(
        "run", "--dir", exported.path, "--tag_set", "serve", "--signature_def",
        "serving_default", "--inputs", f"images={tmp_path / 'images.npy'}",
        "--outdir", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr[-2000:]
    features = np.load(tmp_path / "out" / "features.npy")
    np.testing.assert_allclose(features, keras_features(exported, exported.images),
                               rtol=1e-5, atol=1e-5)


# --- preprocessing -------------------------------------------------------------------------------

def test_images_at_the_model_size_are_only_normalized():
    images = np.random.default_rng(1).integers(0, 256, size=(2, 8, 8, 3), dtype=np.uint8)
    mean, std = [0.1, 0.2, 0.3], [0.5, 0.25, 0.2]
    out = image_ops.preprocess(images, 8, mean, std).numpy()
    np.testing.assert_allclose(out, (images / 255.0 - mean) / std, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("height, width", [(64, 96), (96, 64)])
def test_other_sizes_resize_the_shorter_side_then_center_crop(height, width):
    # Model size 28, crop 0.875: the shorter side goes to 32 (here a factor of 2, the longer
    # to 48) and the centre 28×28 is kept, i.e. the centre 56×56 of the input: make exactly
    # that square white on black, and the crop must come out white.
    images = np.zeros((1, height, width, 1), np.uint8)
    top, left = (height - 56) // 2, (width - 56) // 2
    images[:, top:top + 56, left:left + 56] = 255
    out = image_ops.preprocess(images, 28, MEAN, STD).numpy()
    assert out.shape == (1, 28, 28, 1)
    # Its outermost ring blends with the black just outside (antialiased bilinear).
    np.testing.assert_allclose(out[0, 1:-1, 1:-1], (1.0 - MEAN) / STD, atol=1e-5)
    assert out[0, 0].max() > (0.5 - MEAN) / STD


def test_imagenet_images_with_a_256_shorter_side_are_only_center_cropped_to_224():
    # Resize 256 → 256 is the identity, so the output is exactly the centre 224×224 window;
    # any other resize target would resample the random pixels.
    images = tf.random.stateless_uniform([1, 256, 341, 3], seed=[0, 1])
    out = image_ops.resize_and_center_crop(images, 224)
    np.testing.assert_allclose(out, images[:, 16:240, 58:282], atol=1e-5)


def test_export_rejects_statistics_of_the_wrong_length(exported, tmp_path):
    with pytest.raises(ValueError, match="mean must be a scalar or one value per channel"):
        export.export_backbone(exported.backbone, str(tmp_path), 28, 1, mean=[0.1, 0.2, 0.3],
                               std=0.25)


# --- bad input -----------------------------------------------------------------------------------

SPEC = "TensorSpec(shape=(None, None, None, 1), dtype=tf.uint8, name='images')"
EXPECTED = "expected uint8 images [batch, height, width, 1]; got shape"


@pytest.mark.parametrize("images, message", [
    (tf.zeros([2, 28, 28, 1], tf.float32), "was expected to be a uint8 tensor"),
    (tf.zeros([28, 28, 1], tf.uint8), f"{EXPECTED}] [28 28 1]"),
    (tf.zeros([2, 28, 28, 3], tf.uint8), f"{EXPECTED}] [2 28 28 3]"),
    (np.zeros([28, 28, 1], np.uint8), SPEC),  # NumPy input: the binding checks the shape
    (np.zeros([2, 28, 28, 3], np.uint8), SPEC),
], ids=["dtype", "rank", "channels", "numpy rank", "numpy channels"])
def test_bad_images_fail_naming_the_expected_input(exported, images, message):
    for signature in ("serving_default", "embed"):
        with pytest.raises((TypeError, tf.errors.InvalidArgumentError)) as error:
            exported.loaded.signatures[signature](images=images)
        assert message in str(error.value)


def test_check_images_rejects_any_other_rank_or_channel_count():
    check = tf.function(lambda images: export.check_images(images, 1),
                        input_signature=[tf.TensorSpec(None, tf.uint8)])
    for shape in ([2, 8, 8, 3], [8, 8, 1], [1, 2, 8, 8, 1]):
        with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(EXPECTED)):
            check(tf.zeros(shape, tf.uint8))
    assert check(tf.zeros([2, 8, 8, 1], tf.uint8)).shape == (2, 8, 8, 1)


def test_serve_bytes_decodes_every_format_and_names_undecodable_bytes(exported):
    from PIL import Image  # a matplotlib dependency; TF cannot encode GIF or BMP

    digit = exported.images[0]
    rgb = np.repeat(digit, 3, axis=-1)

    def encoded(fmt, array):
        buffer = io.BytesIO()
        Image.fromarray(array).save(buffer, format=fmt)
        return buffer.getvalue()

    files = [tf.io.encode_png(digit).numpy(), encoded("BMP", rgb), encoded("GIF", rgb[..., 0]),
             tf.io.encode_png(np.concatenate([rgb, np.full_like(digit, 7)], -1)).numpy()]
    serve_bytes = exported.loaded.signatures["serve_bytes"]
    features = serve_bytes(image_bytes=tf.constant(files))["features"].numpy()
    np.testing.assert_allclose(features, np.repeat(keras_features(exported, digit[None]), 4, 0),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Unknown image file format"):
        serve_bytes(image_bytes=tf.constant([files[0], b"not an image"]))


# --- the feature-extraction CLI ------------------------------------------------------------------

def load_cli():
    spec = importlib.util.spec_from_file_location(
        "extract_features", os.path.join(ROOT, "export", "extract_features.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def image_folder(exported, tmp_path):
    """Two classes of digits as grayscale PNG, RGB PNG, RGBA PNG, GIF and a larger JPEG, plus
    one corrupt file and an unlabelled image at the top level."""
    from PIL import Image

    digits = exported.images
    folder = tmp_path / "images"
    (folder / "a").mkdir(parents=True)
    (folder / "b").mkdir()

    def write(path, data):
        (folder / path).write_bytes(data.numpy() if hasattr(data, "numpy") else data)

    write("a/0_gray.png", tf.io.encode_png(digits[0]))
    write("a/1_rgb.png", tf.io.encode_png(np.repeat(digits[1], 3, -1)))
    write("a/2_broken.png", b"\x89PNG\r\n\x1a\n truncated")
    write("b/0_rgba.png", tf.io.encode_png(np.concatenate(
        [np.repeat(digits[2], 3, -1), np.zeros_like(digits[2])], -1)))
    write("b/1_large.jpg", tf.io.encode_jpeg(np.repeat(np.repeat(digits[0], 2, 0), 3, 1)))
    Image.fromarray(digits[2, ..., 0]).save(folder / "b" / "2_digit.gif")
    write("top.png", tf.io.encode_png(digits[1]))
    write("b/notes.txt", b"not an image: passed over, with a warning")
    return folder


@pytest.mark.slow
def test_extract_features_from_an_image_folder(exported, image_folder, tmp_path):
    out = tmp_path / "features"
    result = launch.run(
        [sys.executable, "export/extract_features.py", "--model", str(exported.directory /
         "backbone"), "--images", str(image_folder), "--out", str(out), "--batch-size", "2"],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: passed over 1 file of another type than .jpg .jpeg .png "
                        f".bmp .gif .webp .tif .tiff under {image_folder} "
                        f"({image_folder / 'b' / 'notes.txt'})",
                        f"warning: skipped 1 unreadable image file(s): "
                        f"{image_folder / 'a' / '2_broken.png'}"]
    assert f"features: {out / 'features.npy'} [6, 256]" in result.stdout
    assert f"7/7 [{'=' * 30}]" in result.stderr  # the progress bar's last state

    paths = (out / "paths.txt").read_text().splitlines()
    assert paths == [str(image_folder / name) for name in
                     ("top.png", "a/0_gray.png", "a/1_rgb.png", "b/0_rgba.png", "b/1_large.jpg",
                      "b/2_digit.gif")]
    assert json.loads((out / "classes.json").read_text()) == ["a", "b"]
    np.testing.assert_array_equal(np.load(out / "labels.npy"), [-1, 0, 0, 1, 1, 1])
    features = np.load(out / "features.npy")
    np.testing.assert_allclose(features[[0, 1, 2, 3, 5]],
                               keras_features(exported, exported.images[[1, 0, 1, 2, 2]]),
                               rtol=1e-5, atol=1e-5)
    jpeg = (image_folder / "b" / "1_large.jpg").read_bytes()
    from_bytes = exported.loaded.signatures["serve_bytes"](image_bytes=tf.constant([jpeg]))
    np.testing.assert_allclose(features[4], from_bytes["features"][0], rtol=1e-5, atol=1e-5)


def test_extract_embeddings_from_an_npz(exported, tmp_path, capsys):
    images = np.random.default_rng(2).integers(0, 256, size=(7, 28, 28), dtype=np.uint8)
    np.savez_compressed(tmp_path / "digits.npz", images=images, labels=np.arange(7) % 3)
    out = tmp_path / "embedded"
    assert load_cli().main(["--model", exported.path, "--npz", str(tmp_path / "digits.npz"),
                            "--out", str(out), "--batch-size", "3", "--signature", "embed",
                            "--quiet"]) == 0
    expected = exported.embedder((images[..., None] / 255.0 - MEAN) / STD, training=False)
    np.testing.assert_allclose(np.load(out / "features.npy"), np.asarray(expected), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_array_equal(np.load(out / "labels.npy"), np.arange(7) % 3)
    assert (out / "paths.txt").read_text().splitlines() == [
        f"{tmp_path / 'digits.npz'}#{i}" for i in range(7)]
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("source, message", [
    ("empty", "error: no images (.jpg .jpeg .png .bmp .gif .webp .tif .tiff) under {path} "
              "(1 file of another type)"),
    ("missing", "error: not a readable folder: {path}"),
    ("corrupt", "warning: passed over 1 file of another type than .jpg .jpeg .png .bmp .gif "
                ".webp .tif .tiff under {path} ({path}/readme.txt)\n"
                "error: none of the 1 images could be read"),
])
def test_extract_features_rejects_an_empty_missing_or_unreadable_folder(
        exported, tmp_path, capsys, source, message):
    path = tmp_path / source
    if source != "missing":
        path.mkdir()
        (path / "readme.txt").write_text("no images here")
    if source == "corrupt":
        (path / "broken.jpg").write_bytes(b"\xff\xd8 not really a JPEG")
    code = load_cli().main(["--model", exported.path, "--images", str(path),
                            "--out", str(tmp_path / "out"), "--quiet"])
    assert code == 2
    assert capsys.readouterr().err.strip() == message.format(path=path)


def test_extract_features_rejects_a_missing_model_or_signature(exported, tmp_path, capsys):
    images = tmp_path / "npz.npz"
    np.savez(images, images=exported.images)
    cli = load_cli()
    assert cli.main(["--model", str(tmp_path / "nothing"), "--npz", str(images),
                     "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == f"error: no SavedModel at {tmp_path / 'nothing'}"
    exported_plain = export.export_backbone(exported.backbone, str(tmp_path / "plain"), 28, 1,
                                            MEAN, STD)
    assert cli.main(["--model", exported_plain, "--npz", str(images), "--out",
                     str(tmp_path / "out"), "--signature", "embed"]) == 2
    assert "has no signature 'embed' (it has: serve_bytes, serving_default)" in \
        capsys.readouterr().err


def test_extract_features_from_an_unlabelled_npy(exported, tmp_path):
    np.save(tmp_path / "digits.npy", exported.images)
    out = tmp_path / "features"
    assert load_cli().main(["--model", exported.path, "--npz", str(tmp_path / "digits.npy"),
                            "--out", str(out), "--quiet"]) == 0
    np.testing.assert_allclose(np.load(out / "features.npy"),
                               keras_features(exported, exported.images), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.load(out / "labels.npy"), [-1, -1, -1])
    assert json.loads((out / "classes.json").read_text()) == []


def test_extract_features_rejects_float_or_label_mismatched_npz(exported, tmp_path, capsys):
    path = tmp_path / "data.npz"
    cli = load_cli()
    np.savez(path, images=np.zeros((2, 28, 28, 1), np.float32))
    assert cli.main(["--model", exported.path, "--npz", str(path), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: images in {path} are float32 [2, 28, 28, 1]; expected uint8 "
        "[N, height, width] or [N, height, width, channels]")
    np.savez(path, images=exported.images, labels=[0, 1])
    assert cli.main(["--model", exported.path, "--npz", str(path), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {path} has 2 labels for 3 images"
