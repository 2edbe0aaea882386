"""``data.views_on_device``: the pipeline crops, the train step colours; the same views and the
same step as the CPU path for the same seeds."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from caco_tf import build, data
from caco_tf.data import augment
from caco_tf.methods.caco import CaCo
from caco_tf.nets import backbones
from caco_tf.config import ConfigError, load_config

BATCH = 4


def jpeg_source(folder, count=6):
    """Generated RGB JPEGs of two shapes (a colour gradient and noise), with a corrupt one."""
    rng = np.random.default_rng(0)
    paths = []
    for index in range(count):
        height, width = (30, 40) if index % 2 else (40, 30)
        ramp = np.linspace(0, 255, width)[None, :, None] * rng.uniform(0.3, 1, 3)
        pixels = np.clip(ramp + rng.normal(0, 30, (height, width, 3)), 0, 255)
        path = str(folder / f"{index}.jpg")
        Image.fromarray(pixels.astype(np.uint8)).save(path, quality=90)
        paths.append(path)
    (folder / "bad.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")  # skipped on both paths
    return data.FileSource(np.asarray(paths + [str(folder / "bad.jpg")]))


# A blur of at most 0.6 pixels: radius 2, two branches to compile instead of six.
BLUR = (0.1, 0.6)


@pytest.mark.slow
def test_the_views_coloured_in_a_compiled_step_are_the_pipelines(tmp_path):
    source = jpeg_source(tmp_path)
    views = augment.AsymmetricViews(size=16, blur_sigma=BLUR)
    on_device = augment.ColourOnDevice(views)
    colour = tf.function(on_device.colour, jit_compile=True)  # as in an XLA train step

    def batches(views):
        return list(data.pretrain_dataset(source, BATCH, views, seed=3,
                                          skipped=data.SkippedFiles()).take(2))

    for finished, shipped in zip(batches(views), batches(on_device)):
        assert shipped[0]["pixels"].shape == (BATCH, 16, 16, 3)
        assert shipped[0]["draws"].shape == (BATCH, 11)
        for cpu, device in zip(finished, colour(shipped)):
            np.testing.assert_allclose(device.numpy(), cpu.numpy(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", [tf.uint8, tf.float32])
@pytest.mark.slow
def test_multicrop_views_of_uint8_and_float_images(dtype):
    views = augment.MultiCropViews(size=12, local_size=8, local_crops=2, blur_sigma=BLUR)
    on_device = augment.ColourOnDevice(views)
    images = tf.random.stateless_uniform([3, 20, 24, 3], seed=[1, 2])  # [0, 1] floats
    images = tf.cast(images * 255, tf.uint8) if dtype == tf.uint8 else images
    seeds = tf.random.experimental.stateless_split(tf.constant([5, 6], tf.int64), 3)
    shipped = [on_device.augment_image(image, seed) for image, seed in zip(images, seeds)]
    batch = tf.nest.map_structure(lambda *views: tf.stack(views), *shipped)
    coloured = tf.function(on_device.colour, jit_compile=True)(batch)
    assert [view.shape[1] for view in coloured] == [12, 12, 8, 8]
    for index, (image, seed) in enumerate(zip(images, seeds)):
        for cpu, device in zip(views.augment_image(image, seed), coloured):
            np.testing.assert_allclose(device[index].numpy(), cpu.numpy(), atol=1e-5, rtol=0)


def tiny_caco(views_on_device=None):
    keras.utils.set_random_seed(0)
    backbone = keras.Sequential([
        keras.Input((16, 16, 3)), keras.layers.Conv2D(4, 3, strides=2),
        keras.layers.GlobalAveragePooling2D()], name="backbone")
    model = CaCo(backbone, backbones.build_projector(4, hidden_dim=8, output_dim=6),
                 bank_size=8, temperature=0.1, key_momentum=0.9)
    model.views_on_device = views_on_device
    model.compile(optimizer=keras.optimizers.SGD(0.1), jit_compile=False)  # XLA: the test above
    return model


@pytest.mark.slow
def test_a_step_on_shipped_views_is_the_step_on_finished_views():
    images = np.random.default_rng(0).integers(0, 256, (8, 20, 20, 3), np.uint8)
    views = augment.AsymmetricViews(size=16, blur_sigma=BLUR)
    on_device = augment.ColourOnDevice(views)
    histories, models = [], []
    for pipeline_views, model in ((views, tiny_caco()), (on_device, tiny_caco(on_device))):
        dataset = data.pretrain_dataset(images, BATCH, pipeline_views, seed=0)
        histories.append(model.fit(dataset, steps_per_epoch=1, epochs=1, verbose=0).history)
        models.append(model)
    assert histories[1]["loss"] == pytest.approx(histories[0]["loss"], rel=1e-5)
    for cpu, device in zip(models[0].query_encoder.weights, models[1].query_encoder.weights):
        np.testing.assert_allclose(device.numpy(), cpu.numpy(), rtol=1e-4, atol=1e-6)


def test_the_setting_is_off_by_default_and_refused_where_it_cannot_apply():
    assert load_config(None)["data"]["views_on_device"] is False
    colour = ["data.views=asymmetric", "data.channels=3", "data.image_size=32"]
    config = load_config(None, colour + ["data.views_on_device=true"])
    assert isinstance(build.run_views(config), augment.ColourOnDevice)
    assert isinstance(build.build_model(config, steps_per_epoch=1).views_on_device,
                      augment.ColourOnDevice)
    assert not isinstance(build.run_views(load_config(None, colour)), augment.ColourOnDevice)
    with pytest.raises(ConfigError, match="^data.views_on_device applies to the colour views"):
        load_config(None, ["data.views_on_device=true"])
    with pytest.raises(ConfigError, match="^data.views_on_device cannot run data.extra_layers"):
        load_config(None, colour + ["data.views_on_device=true",
                                    "data.extra_layers=[{layer: RandomContrast, factor: 0.2}]"])
