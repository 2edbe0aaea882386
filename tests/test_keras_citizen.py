"""A CaCo model behaves like any Keras model: save and load (every method, training continuing
exactly), export, summary, and the README's example running with warnings as errors."""

import os
import re
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from caco_tf import build, methods
from caco_tf.config import load_config
from tiny_methods import CONFIG_OVERRIDES, by_tier, overrides

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = CONFIG_OVERRIDES + ["method.caco.warmup_epochs=1", "train.batch_size=8", "train.epochs=3",
                           "evaluation.online_probe=false"]


def _batches(count, seed=0, method=None):
    """``count`` batches of 8: two views, or the views and masks a method of masks takes."""
    x = np.random.default_rng(seed).random((count, 8, 28, 28, 1)).astype("float32")
    kinds = methods.model_class(method).view_masks() if method else ()
    if kinds:
        crops = (x, x[:, ::-1])[:methods.model_class(method).view_count()]
        return tf.data.Dataset.from_tensor_slices((*crops, *(kind.draw(
            tf.constant([seed, i], tf.int64), count * 8, 7, 7).numpy().reshape(
                count, 8, *kind.shape(7, 7)) for i, kind in enumerate(kinds))))
    return tf.data.Dataset.from_tensor_slices((x, x[:, ::-1]))


def _state(model):
    values = {v.path: v.numpy() for v in model.weights}
    values.update({f"optimizer/{i}": v.numpy() for i, v in enumerate(model.optimizer.variables)})
    return values


@pytest.mark.parametrize("method", by_tier(methods.METHODS))
def test_save_load_round_trips_and_training_continues_exactly(method, tmp_path):
    keras.utils.set_random_seed(0)
    config = load_config(None, TINY + overrides(method) + [f"method.name={method}"])
    model = build.build_model(config, steps_per_epoch=2)
    model.run_eagerly = True  # the state saved and restored is the same; no trace per model
    # CaCo: into its own phase (step 3 > 2); SwAV and DINO: past their frozen heads' epoch.
    model.fit(_batches(3, method=method), epochs=1, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded) is type(model)
    loaded.run_eagerly = True
    networks = ("backbone", "projector")  # their layers' generated names may differ
    assert ({k: v for k, v in loaded.get_config().items() if k not in networks}
            == {k: v for k, v in model.get_config().items() if k not in networks})
    before, restored = _state(model), _state(loaded)
    assert before.keys() == restored.keys()
    for name in before:  # student, teacher, bank, queues, center, optimizer, step
        np.testing.assert_array_equal(restored[name], before[name], err_msg=name)
    step = _batches(1, seed=1, method=method)
    model.fit(step, epochs=1, verbose=0)
    loaded.fit(step, epochs=1, verbose=0)
    after, continued = _state(model), _state(loaded)
    for name in after:
        np.testing.assert_array_equal(continued[name], after[name], err_msg=name)
    assert int(loaded.optimizer.iterations.numpy()) == 4


@pytest.mark.parametrize("method", list(methods.METHODS))
def test_every_method_is_rebuilt_from_its_config(method):
    config = load_config(None, TINY + overrides(method) + [f"method.name={method}"])
    model = build.build_model(config, steps_per_epoch=2)
    registered = keras.saving.get_registered_name(type(model))
    assert registered == f"caco_tf>{type(model).__name__}"
    clone = type(model).from_config(model.get_config())
    assert type(clone) is type(model) and clone.warmup_steps == model.warmup_steps
    assert [v.shape for v in clone.weights] == [v.shape for v in model.weights]


@pytest.mark.slow
def test_export_writes_the_serving_saved_model_or_names_the_call(tmp_path):
    from caco_tf.serving import export

    config = load_config(None, TINY)
    model = build.build_model(config, steps_per_epoch=2)
    path = model.export(str(tmp_path / "exported"))
    served = tf.saved_model.load(path)
    assert set(served.signatures) == {"serving_default", "serve_bytes", "embed"}
    images = np.random.default_rng(0).integers(0, 256, (3, 40, 36, 1), dtype=np.uint8)
    reference = export.export_backbone(model.backbone, str(tmp_path / "reference"), 28, 1,
                                       0.1307, 0.3081, embedder=model.query_encoder)
    expected = tf.saved_model.load(reference).signatures["serving_default"](
        images=tf.constant(images))["features"].numpy()
    got = served.signatures["serving_default"](images=tf.constant(images))["features"].numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    layout = model.export(str(tmp_path / "serving"), serving_layout=True, version=3)
    assert layout == str(tmp_path / "serving" / "backbone" / "3")
    with pytest.raises(ValueError, match="takes no input_signature"):
        model.export(str(tmp_path / "signature"), input_signature=[None])


def test_summary_names_the_parts_and_the_bank():
    config = load_config(None, TINY + ["evaluation.online_probe=true"])
    model = build.build_model(config, steps_per_epoch=2, num_classes=10)
    lines = []
    model.summary(print_fn=lines.append)
    text = "\n".join(lines)
    for part in ("backbone", "projector", "key encoder", "bank", "online probe"):
        assert re.search(rf"^{part} ", text, re.M), part
    assert "K × D = 32 × 16 rows" in text  # the tiny bank (tiny_methods.CONFIG_OVERRIDES)


@pytest.mark.slow
def test_the_readmes_example_runs_with_warnings_as_errors(tmp_path, monkeypatch):
    """The README's Python example, at tiny sizes: only its configuration line is changed."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    example = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    original = 'caco_tf.load_config("configs/mnist.yaml")'
    assert original in example
    # 512 of the offline digits to train on and 256 held out: the example's steps, fewer of them.
    from tiny_run import offline_digits
    train, held_out = offline_digits(tmp_path, 512, 256)
    overrides = TINY + ["train.epochs=2", "train.batch_size=128", "method.caco.bank_size=256",
                        "evaluation.knn_monitor_every=0", "train.jit_compile=false",
                        "model.widths=[8,16,16,32]", f"data.source=npz:{train}",
                        f"data.held_out=npz:{held_out}"]
    example = example.replace(original, f"caco_tf.load_config("
                                        f"{os.path.join(ROOT, 'configs', 'mnist.yaml')!r}, "
                                        f"{overrides!r})")
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # Python shows DeprecationWarnings only to __main__'s own code, not a user's: Keras'
        # saving raises one of NumPy 2's from its own internals.
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        exec(compile(example, "README.md", "exec"), {})
    assert os.path.exists(tmp_path / "caco.keras")
    assert os.path.exists(tmp_path / "backbone" / "saved_model.pb")


@pytest.mark.slow
def test_a_caco_composed_by_hand_saves_loads_and_exports(tmp_path):
    """As a Keras user composes it, without build_model: fit, .keras round trip, then
    model.export gives a SavedModel of what the backbone takes (float images); with the
    preprocessing given, one of uint8 images."""
    from caco_tf.nets import backbones

    keras.utils.set_random_seed(0)
    backbone = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Conv2D(4, 3),
                                 keras.layers.GlobalAveragePooling2D()], name="tiny_backbone")
    caco = methods.model_class("caco")
    model = caco(backbone, backbones.build_projector(4, hidden_dim=16, output_dim=8),
                 bank_size=32)
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    model.fit(_batches(1), epochs=1, verbose=0)
    model.save(tmp_path / "caco.keras")
    loaded = keras.models.load_model(tmp_path / "caco.keras")
    images = np.random.default_rng(1).random((3, 28, 28, 1)).astype("float32")

    served = tf.saved_model.load(loaded.export(str(tmp_path / "float")))
    np.testing.assert_allclose(served.signatures["serving_default"](
        images=tf.constant(images))["features"], model.backbone(images), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(served.signatures["embed"](images=tf.constant(images))[
        "embedding"], model.query_encoder(images), rtol=1e-5, atol=1e-6)

    pixels = (images * 255).astype("uint8")
    uint8 = tf.saved_model.load(loaded.export(str(tmp_path / "uint8"), image_size=28,
                                              channels=1, mean=0.0, std=1.0))
    np.testing.assert_allclose(uint8.signatures["serving_default"](images=tf.constant(pixels))[
        "features"], model.backbone(pixels / 255.0), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="onnx export needs the model's preprocessing"):
        loaded.export(str(tmp_path / "m.onnx"), format="onnx")
