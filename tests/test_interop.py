"""ONNX and LiteRT exports, checked by their own runtimes against the SavedModel: the offline
default's backbone and a ResNet-50 at 224 px (random weights), within 1e-4 of the features'
scale; a request of the wrong dtype or rank is refused."""

import os

import numpy as np
import pytest
import tensorflow as tf

pytest.importorskip("tf2onnx", reason="the interop extra is absent: pip install -e '.[interop]'")
pytest.importorskip("onnxruntime", reason="the interop extra is absent: pip install -e "
                                          "'.[interop]'")
pytest.importorskip("ai_edge_litert", reason="the interop extra is absent: pip install -e "
                                             "'.[interop]'")

from caco_tf import build  # noqa: E402
from caco_tf.data import augment  # noqa: E402
from caco_tf.nets import backbones  # noqa: E402
from caco_tf.serving import export, interop  # noqa: E402
from caco_tf.config import load_config  # noqa: E402


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _relative(got, expected):
    return float(np.abs(got - expected).max() / np.abs(expected).max())


def _saved_model_outputs(path, images, signature="serving_default"):
    function = tf.saved_model.load(path).signatures[signature]
    return next(iter(function(images=tf.constant(images)).values())).numpy()


@pytest.fixture(scope="module")
def default_model(tmp_path_factory):
    """The offline default's model (configs/mnist.yaml), random weights, exported three ways."""
    folder = tmp_path_factory.mktemp("interop")
    config = load_config(os.path.join(ROOT, "configs", "mnist.yaml"))
    model = build.build_model(config, steps_per_epoch=1)
    paths = {"saved_model": model.export(str(folder / "saved_model")),
             "onnx": model.export(str(folder / "backbone.onnx"), format="onnx"),
             "litert": model.export(str(folder / "backbone.tflite"), format="litert"),
             "onnx_embedding": model.export(str(folder / "embedding.onnx"), format="onnx",
                                            output="embedding"),
             "litert_embedding": model.export(str(folder / "embedding.tflite"),
                                              format="litert", output="embedding")}
    return paths


@pytest.mark.parametrize("batch", [1, 7])
@pytest.mark.slow
def test_the_defaults_backbone_gives_the_saved_models_features(default_model, batch):
    images = np.random.default_rng(batch).integers(0, 256, (batch, 28, 28, 1), np.uint8)
    expected = _saved_model_outputs(default_model["saved_model"], images)
    for runtime, path in ((interop.OnnxModel, default_model["onnx"]),
                          (interop.LiteRTModel, default_model["litert"])):
        got = runtime(path)(images)
        assert got.shape == expected.shape == (batch, 1024)
        assert _relative(got, expected) <= 1e-4, runtime.__name__
    embedding = _saved_model_outputs(default_model["saved_model"], images, "embed")
    for runtime, path in ((interop.OnnxModel, default_model["onnx_embedding"]),
                          (interop.LiteRTModel, default_model["litert_embedding"])):
        assert _relative(runtime(path)(images), embedding) <= 1e-4, runtime.__name__


def test_a_request_of_the_wrong_dtype_or_rank_is_refused(default_model):
    import onnxruntime

    images = np.zeros((2, 28, 28, 1), np.uint8)
    onnx, litert = (interop.OnnxModel(default_model["onnx"]),
                    interop.LiteRTModel(default_model["litert"]))
    for bad in (images.astype(np.float32), images[0], np.zeros((2, 32, 32, 1), np.uint8)):
        with pytest.raises(onnxruntime.capi.onnxruntime_pybind11_state.InvalidArgument):
            onnx(bad)
        with pytest.raises(ValueError, match="expected"):
            litert(bad)


@pytest.mark.slow
def test_a_resnet50_at_224_px_gives_the_saved_models_features(tmp_path):
    backbone = backbones.build_backbone("resnet50", (224, 224, 3))
    arguments = dict(image_size=224, channels=3, mean=augment.IMAGENET_MEAN,
                     std=augment.IMAGENET_STD)
    saved = export.export_saved_model(backbone, str(tmp_path / "saved"), **arguments)
    onnx = interop.export_onnx(backbone, str(tmp_path / "r50.onnx"), **arguments)
    litert = interop.export_litert(backbone, str(tmp_path / "r50.tflite"), **arguments)
    images = np.random.default_rng(0).integers(0, 256, (2, 224, 224, 3), np.uint8)
    expected = _saved_model_outputs(saved, images)
    assert _relative(interop.OnnxModel(onnx)(images), expected) <= 1e-4
    assert _relative(interop.LiteRTModel(litert)(images), expected) <= 1e-4


@pytest.mark.slow
def test_a_vit_with_resized_positions_gives_the_saved_models_features(tmp_path):
    from caco_tf.nets import vit

    # Built for 24 px, served at 32 px: the exported graph resizes the position table too.
    backbone = vit.build_vit("vit_micro_patch4", (32, 32, 3), image_size=24, drop_path=0.1)
    arguments = dict(image_size=32, channels=3, mean=augment.IMAGENET_MEAN,
                     std=augment.IMAGENET_STD)
    saved = export.export_saved_model(backbone, str(tmp_path / "saved"), **arguments)
    onnx = interop.export_onnx(backbone, str(tmp_path / "vit.onnx"), **arguments)
    litert = interop.export_litert(backbone, str(tmp_path / "vit.tflite"), **arguments)
    images = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3), np.uint8)
    expected = _saved_model_outputs(saved, images)
    normalized = ((images / 255.0 - np.asarray(augment.IMAGENET_MEAN))
                  / np.asarray(augment.IMAGENET_STD)).astype("float32")
    assert _relative(np.asarray(backbone(normalized)), expected) <= 1e-5
    assert _relative(interop.OnnxModel(onnx)(images), expected) <= 1e-4
    assert _relative(interop.LiteRTModel(litert)(images), expected) <= 1e-4


@pytest.mark.slow
def test_the_export_command_writes_each_format(tmp_path, capsys):
    from caco_tf.cli import export as export_cli
    from tiny_run import make_run

    run_dir, _ = make_run(tmp_path / "run")
    for format, name in (("onnx", "backbone.onnx"), ("litert", "backbone.tflite")):
        assert export_cli.main(["--run", run_dir, "--format", format]) == 0
        path = os.path.join(run_dir, name)
        assert f"{format}: {path}" in capsys.readouterr().out
        runtime = interop.OnnxModel if format == "onnx" else interop.LiteRTModel
        assert runtime(path)(np.zeros((3, 28, 28, 1), np.uint8)).shape == (3, 256)
