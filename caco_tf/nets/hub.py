"""KerasHub backbones pre-trained here (the optional extra: ``pip install "caco-tf[hub]"``).

Any KerasHub image backbone, built from its class and arguments (``model.backbone:
keras_hub:ResNetBackbone`` with ``model.backbone_arguments``; no weights are downloaded) or
from a preset directory on disk (``model.backbone: keras_hub:/path/to/preset``).  Its output (a
feature map ``[B, h, w, C]``, or tokens ``[B, N, D]`` for a transformer) is pooled into the
features every method takes: the map's average, the class token.  The way out, a trained
backbone as a KerasHub preset: ``caco_tf.serving.hub``.
"""

import os

import keras

from caco_tf.errors import ConfigError
from caco_tf.nets.vit import ClassToken

PREFIX = "keras_hub:"
INSTALL = 'pip install "caco-tf[hub]"'


def keras_hub():
    """The keras_hub module, or one line saying how to get it."""
    try:
        import keras_hub as module
    except ImportError as error:
        raise ConfigError(f"KerasHub is not installed ({error}): {INSTALL}") from None
    return module


def is_hub_backbone(name):
    return isinstance(name, str) and name.startswith(PREFIX)


def build_hub_backbone(name, input_shape, arguments=None):
    """A KerasHub backbone (``keras_hub:CLASS`` with ``arguments``, or ``keras_hub:PRESET_DIR``)
    on images ``input_shape``, pooled to features ``[B, F]``."""
    hub = keras_hub()
    target = name[len(PREFIX):]
    arguments = dict(arguments or {})
    if os.path.isdir(target):
        if arguments:
            raise ConfigError(f"model.backbone_arguments apply to a KerasHub class, not to the "
                              f"preset directory {target}")
        inner = hub.models.Backbone.from_preset(target)
    else:
        cls = getattr(hub.models, target, None)
        if not (isinstance(cls, type) and issubclass(cls, hub.models.Backbone)):
            raise ConfigError(f"model.backbone {name}: keras_hub.models has no backbone class "
                              f"{target!r} and no such preset directory exists")
        arguments.setdefault("image_shape", tuple(input_shape))
        try:
            inner = cls(**arguments)
        except (TypeError, ValueError) as error:
            message = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ConfigError(f"model.backbone_arguments for keras_hub.models.{target}: "
                              f"{message}") from None
    inputs = keras.Input(shape=tuple(input_shape), dtype="float32", name="images")
    outputs = inner(inputs)
    if len(outputs.shape) == 4:
        features = keras.layers.GlobalAveragePooling2D(name="avgpool")(outputs)
    elif len(outputs.shape) == 3:
        features = ClassToken(name="class_token")(outputs)
    else:
        raise ConfigError(f"model.backbone {name} gives outputs of shape {outputs.shape}; a "
                          f"feature map [B, h, w, C] or tokens [B, N, D] is needed")
    return keras.Model(inputs, features, name=target.replace(os.sep, "_")[-60:])
