"""A trained backbone as a KerasHub preset (the optional extra: ``pip install "caco-tf[hub]"``;
the way in, KerasHub backbones pre-trained here: ``caco_tf.nets.hub``).

``caco-export --format keras-hub`` writes a trained backbone as a KerasHub preset
directory: ``keras_hub.models.Backbone.from_preset(DIR)`` loads it (with caco_tf installed: its
layers are caco_tf's), and a KerasHub ``ImageClassifier`` fine-tunes it.  The preset's backbone
returns the features as a 1×1 map ``[B, 1, 1, F]``, so that the classifier's average pooling
gives them back unchanged.
"""

import json
import os

# Importing it registers CacoBackbone, the preset's class, and the layers it is made of.
from caco_tf.nets import hub as hub_backbones


def export_preset(backbone, directory, preprocessing=None):
    """Write ``backbone`` as a KerasHub preset directory (config.json, model.weights.h5,
    metadata.json, and ``preprocessing.json``: the image size, channels, mean and std its
    float inputs are normalized with); the directory."""
    hub_backbones.keras_hub()
    wrapped = hub_backbones.CacoBackbone(backbone, name="caco_backbone")
    wrapped.save_to_preset(directory)
    with open(os.path.join(directory, "preprocessing.json"), "w") as handle:
        json.dump({"inputs": "float images in [0, 1], then (x - mean) / std, at image_size",
                   "load": "import caco_tf.serving.hub, then "
                           "keras_hub.models.Backbone.from_preset(this directory)",
                   **{key: list(value) if isinstance(value, tuple) else value
                      for key, value in (preprocessing or {}).items()}}, handle, indent=1)
    return directory
