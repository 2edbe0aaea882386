"""KerasHub backbones pre-trained here (the optional extra: ``pip install "caco-tf[hub]"``).

Any KerasHub image backbone, built from its class and arguments (``model.backbone:
keras_hub:ResNetBackbone`` with ``model.backbone_arguments``; no weights are downloaded) or
from a preset directory on disk (``model.backbone: keras_hub:/path/to/preset``).  Its output (a
feature map ``[B, h, w, C]``, or tokens ``[B, N, D]`` for a transformer) is pooled into the
features every method takes: the map's average, the class token.

``CacoBackbone`` is the class of the presets ``caco-export --format keras-hub`` writes (the way
out, ``caco_tf.serving.hub``); it is defined here, where ``keras_hub:DIR`` loads a preset
(nets never import serving), so that such a preset pre-trains again.
"""

import json
import os

import keras

from caco_tf.errors import ConfigError
from caco_tf.nets import vit

PREFIX = "keras_hub:"
INSTALL = 'pip install "caco-tf[hub]"'
# KerasHub's classes every backbone derives from: they build no network of their own.
BASE_CLASSES = ("Backbone", "FeaturePyramidBackbone")
PRESET_FILES = ("a preset directory holds config.json, metadata.json and model.weights.h5, as "
                "caco-export --format keras-hub writes them")


def keras_hub():
    """The keras_hub module, or one line saying how to get it."""
    try:
        import keras_hub as module
    except ImportError as error:
        raise ConfigError(f"KerasHub is not installed ({error}): {INSTALL}") from None
    return module


try:  # the optional extra: without it, keras_hub() says how to install it
    import keras_hub as _hub
except ImportError:
    _hub = None

if _hub is not None:
    @keras.saving.register_keras_serializable(package="caco_tf")
    class CacoBackbone(_hub.models.Backbone):
        """A caco_tf backbone as a KerasHub ``Backbone``: images → the features as a 1×1 map
        (``ImageClassifier``'s average pooling gives them back)."""

        def __init__(self, encoder, **kwargs):
            if isinstance(encoder, dict):
                encoder = keras.saving.deserialize_keras_object(encoder)
            inputs = keras.Input(shape=encoder.input_shape[1:], name="images")
            outputs = keras.layers.Reshape((1, 1, encoder.output_shape[-1]),
                                           name="features_map")(encoder(inputs))
            super().__init__(inputs=inputs, outputs=outputs, **kwargs)
            self.encoder = encoder

        def get_config(self):
            config = super().get_config()
            config["encoder"] = keras.saving.serialize_keras_object(self.encoder)
            return config


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
        inner = load_preset(target)
        check_images(inner, name, input_shape)
        model_name = inner.name  # not the path: name scopes refuse its leading "/" (or "_")
    else:
        if target in BASE_CLASSES:
            raise ConfigError(f"model.backbone {name} is KerasHub's base class of backbones, "
                              f"which builds no network: name a concrete class, e.g. "
                              f"keras_hub:ViTBackbone or keras_hub:ResNetBackbone")
        cls = getattr(hub.models, target, None)
        if not (isinstance(cls, type) and issubclass(cls, hub.models.Backbone)):
            raise ConfigError(f"model.backbone {name}: keras_hub.models has no backbone class "
                              f"{target!r} and no such preset directory exists")
        arguments.setdefault("image_shape", tuple(input_shape))
        try:
            inner = cls(**arguments)
        except (TypeError, ValueError) as error:
            raise ConfigError(f"model.backbone_arguments for keras_hub.models.{target}: "
                              f"{first_line(error)}") from None
        model_name = target
    inputs = keras.Input(shape=tuple(input_shape), dtype="float32", name="images")
    outputs = inner(inputs)
    if len(outputs.shape) == 4:
        features = keras.layers.GlobalAveragePooling2D(name="avgpool")(outputs)
    elif len(outputs.shape) == 3:
        features = vit.ClassToken(name="class_token")(outputs)
    else:
        raise ConfigError(f"model.backbone {name} gives outputs of shape {outputs.shape}; a "
                          f"feature map [B, h, w, C] or tokens [B, N, D] is needed")
    return keras.Model(inputs, features, name=model_name)


def load_preset(directory):
    """The KerasHub backbone saved in the preset ``directory``, or one line saying why it
    holds none."""
    # A CacoBackbone's encoder is made of caco_tf's layers: nets.vit's (imported above) and
    # nets.backbones', imported by the only caller (backbones.build_backbone).
    def not_a_preset(reason):
        return ConfigError(f"model.backbone {PREFIX}{directory} is not a KerasHub backbone "
                           f"preset: {reason}; {PRESET_FILES}")

    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        held = sorted(os.listdir(directory))
        if not held:
            raise not_a_preset("it is empty")
        more = ", ..." if len(held) > 4 else ""
        raise not_a_preset(f"it has no config.json, it holds {', '.join(held[:4])}{more}")
    try:
        with open(path, "rb") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as error:
        raise not_a_preset(f"its config.json cannot be read ({first_line(error)})") from None
    if not (isinstance(config, dict) and isinstance(config.get("registered_name"), str)):
        raise not_a_preset("its config.json names no KerasHub class (no registered_name)")
    try:
        return keras_hub().models.Backbone.from_preset(directory)
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise not_a_preset(first_line(error).rstrip(".")) from None


def check_images(backbone, name, input_shape):
    """One line unless ``backbone`` takes images of ``input_shape`` ([H, W, C])."""
    inputs = keras.tree.flatten(backbone.inputs)
    if len(inputs) != 1 or len(inputs[0].shape) != 4:
        raise ConfigError(f"model.backbone {name} takes no images (its inputs: "
                          f"{', '.join(str(tuple(x.shape)) for x in inputs)}); an image "
                          f"backbone is needed, of one input [B, H, W, C]")
    expected = tuple(inputs[0].shape[1:])
    if any(size is not None and size != given for size, given in zip(expected, input_shape)):
        def sizes(shape):
            return "x".join("*" if size is None else str(size) for size in shape)
        raise ConfigError(f"model.backbone {name} takes images of {sizes(expected)}, not "
                          f"{sizes(input_shape)}: set data.image_size and data.channels to "
                          f"match")


def first_line(error):
    """An exception's message's first line (its type's name when it has none)."""
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
