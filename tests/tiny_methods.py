"""Tiny models of every method, for the tests: a one-convolution backbone on 12×12 gray images,
an 16-wide projector to 6 dimensions, banks and queues of 32 rows, heads of 16."""

import keras
import numpy as np
import pytest

import tensorflow as tf

from caco_tf import methods
from caco_tf.nets import backbones, vit
from caco_tf.nets.layers import BatchNormalization

BATCH, BANK, SIZE = 8, 32, 12


def _tiny_settings(cls):
    """{setting: value} of a method's settings that declare a tiny value (``Setting.tiny``)."""
    return {key: setting for key, setting in cls.SETTINGS.items() if setting.tiny is not None}


# Each method's own arguments at tiny sizes (the rest: its defaults), as its settings declare.
ARGUMENTS = {method: {setting.argument or key: setting.tiny
                      for key, setting in _tiny_settings(cls).items()}
             for method, cls in methods.METHODS.items()}

# A run configuration at tiny sizes (model.projector_hidden 32, model.embedding_dim 16), every
# method's section at its settings' tiny values.
CONFIG_OVERRIDES = ["model.projector_hidden=32", "model.embedding_dim=16"] + [
    f"method.{method}.{key}={setting.tiny}"
    for method, cls in methods.METHODS.items() if cls.SETTINGS_OF is None
    for key, setting in _tiny_settings(cls).items()]


# A method of a ViT's tokens (``CONSUMES``) trains the micro ViT in the tests' configurations.
TOKEN_OVERRIDES = ["model.backbone=vit_micro_patch4"]


def overrides(method):
    """The configuration overrides a tiny run of ``method`` needs beyond ``CONFIG_OVERRIDES``
    (a ViT with the options it declares, ``VIT_OPTIONS``: DINOv2's mask token)."""
    cls = methods.model_class(method)
    options = [f"model.{key}={str(value).lower()}"
               for key, value in getattr(cls, "VIT_OPTIONS", {}).items()]
    return TOKEN_OVERRIDES + options if cls.CONSUMES == "tokens" else []


# The methods that take multi-crop (their CROPS), as a configuration's refusal lists them.
MULTI_CROP = ", ".join(name for name, cls in methods.METHODS.items() if cls.CROPS.local)

# The fast tier (pytest -m "not slow") runs the per-method tests of one method of each family:
# CaCo for the InfoNCE family, BYOL for the others; the whole suite runs every method.
FAST_METHODS = ("caco", "byol")


def by_tier(names):
    """``names`` as test parameters, all but ``FAST_METHODS`` marked slow."""
    return [name if name in FAST_METHODS else pytest.param(name, marks=pytest.mark.slow)
            for name in names]


def tiny(method, warmup_steps=0, sync=False, any_size=False, steps_per_execution=1,
         optimizer=None, run_eagerly=False, backbone=None, **arguments):
    """A compiled tiny model of ``method`` (SGD 0.1, momentum 0.9); ``arguments`` override its
    own.  ``any_size``: the backbone takes crops of every size (multi-crop).  ``backbone``:
    ``backbone(input_shape)`` builds another backbone than the one-convolution one."""
    keras.utils.set_random_seed(0)
    shape = (None, None, 1) if any_size else (SIZE, SIZE, 1)
    cls = methods.model_class(method)
    if backbone is None and cls.CONSUMES == "tokens":  # 3x3 patches of 4 px
        backbone = lambda shape: vit.build_vit(  # noqa: E731
            "vit_micro_patch4", shape, image_size=SIZE, **getattr(cls, "VIT_OPTIONS", {}))
    backbone = backbone(shape) if backbone else keras.Sequential([
        keras.Input(shape),
        keras.layers.Conv2D(4, 3, strides=2, use_bias=False),
        BatchNormalization(synchronized=sync),
        keras.layers.ReLU(),
        keras.layers.GlobalAveragePooling2D()], name="backbone")
    projector = backbones.build_mlp(backbone.output_shape[-1], 16, 6, sync_batchnorm=sync,
                                    name="projector", **cls.PROJECTOR)
    given = dict(ARGUMENTS[method], **arguments)
    model = cls(backbone, projector, warmup_steps=warmup_steps, sync_batchnorm=sync, **given)
    if callable(optimizer) and not isinstance(optimizer, keras.optimizers.Optimizer):
        optimizer = optimizer()  # built here, in the caller's strategy scope
    model.compile(optimizer=optimizer or keras.optimizers.SGD(0.1, momentum=0.9),
                  steps_per_execution=steps_per_execution, run_eagerly=run_eagerly)
    return model


def views(seed=0, batch=BATCH, crops=2, local_crops=0, local_size=8, method=None):
    """``crops`` random global views (and ``local_crops`` smaller ones) of a batch; for a
    ``method`` that declares masks (``view_masks``), its views then its masks on the micro
    ViT's 3x3 grid."""
    rng = np.random.default_rng(seed)
    kinds = methods.model_class(method).view_masks() if method else ()
    if kinds:  # its own count of views (else the caller's)
        crops = methods.model_class(method).view_count()
    drawn = tuple(kind.draw(tf.constant([seed, index], tf.int64), batch, SIZE // 4,
                            SIZE // 4).numpy() for index, kind in enumerate(kinds))
    return tuple(rng.normal(size=(batch, size, size, 1)).astype("float32")
                 for size in [SIZE] * crops + [local_size] * local_crops) + drawn
