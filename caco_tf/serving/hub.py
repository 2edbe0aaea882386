"""A trained backbone as a KerasHub preset (the optional extra: ``pip install "caco-tf[hub]"``;
the way in, KerasHub backbones pre-trained here: ``caco_tf.nets.hub``).

``caco-export --format keras-hub`` writes a trained backbone as a KerasHub preset
directory: ``keras_hub.models.Backbone.from_preset(DIR)`` loads it (with caco_tf installed: its
layers are caco_tf's), and a KerasHub ``ImageClassifier`` fine-tunes it.  The preset's backbone
returns the features as a 1×1 map ``[B, 1, 1, F]``, so that the classifier's average pooling
gives them back unchanged.
"""

import os

import keras

# A preset's backbone is made of these modules' layers: importing them registers the classes.
from caco_tf.nets import backbones, vit
from caco_tf.nets.hub import keras_hub

REGISTERED = (backbones, vit)

try:  # the optional extra: without it, every function above says how to install it
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


def export_preset(backbone, directory, preprocessing=None):
    """Write ``backbone`` as a KerasHub preset directory (config.json, model.weights.h5,
    metadata.json, and ``preprocessing.json``: the image size, channels, mean and std its
    float inputs are normalized with); the directory."""
    import json

    keras_hub()
    wrapped = CacoBackbone(backbone, name="caco_backbone")
    wrapped.save_to_preset(directory)
    with open(os.path.join(directory, "preprocessing.json"), "w") as handle:
        json.dump({"inputs": "float images in [0, 1], then (x - mean) / std, at image_size",
                   "load": "import caco_tf.serving.hub, then "
                           "keras_hub.models.Backbone.from_preset(this directory)",
                   **{key: list(value) if isinstance(value, tuple) else value
                      for key, value in (preprocessing or {}).items()}}, handle, indent=1)
    return directory
