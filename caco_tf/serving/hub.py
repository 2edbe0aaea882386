"""A trained backbone as a KerasHub preset (the optional extra: ``pip install "caco-tf[hub]"``;
the way in, KerasHub backbones pre-trained here: ``caco_tf.nets.hub``).

``caco-export --format keras-hub`` writes a trained backbone as a KerasHub preset directory,
of one of two classes (``--keras-hub-class``):

- ``dinov2`` (a ViT's default): KerasHub's own ``DINOV2Backbone`` with the ViT's weights, which
  ``keras_hub.models.Backbone.from_preset(DIR)`` loads without caco_tf; its output's first token
  (the class token after the final LayerNorm) is the ViT's features, at the run's image size.
- ``caco`` (every other backbone's, and a ViT's on request): ``CacoBackbone``, caco_tf's layers
  inside (caco_tf must be installed to load it), which returns the features as a 1×1 map
  ``[B, 1, 1, F]`` so that an ``ImageClassifier``'s average pooling gives them back unchanged.
"""

import json
import os

import numpy as np

# Importing it registers CacoBackbone, the preset's class, and the layers it is made of.
from caco_tf.nets import hub as hub_backbones
from caco_tf.errors import UserError

HUB_CLASSES = ("auto", "dinov2", "caco")
#: The DINOV2Backbone preset's features against the ViT's, checked before it is written.
DINOV2_TOLERANCE = 1e-5


def is_caco_vit(backbone):
    """Whether ``backbone`` is a ViT ``nets.vit.build_vit`` built (a DINOV2Backbone can hold it)."""
    from caco_tf.nets import vit

    return vit.is_vit_backbone(backbone)


def export_preset(backbone, directory, preprocessing=None, hub_class="caco"):
    """Write ``backbone`` as a KerasHub preset directory (config.json, model.weights.h5,
    metadata.json, and ``preprocessing.json``: the image size, channels, mean and std its
    float inputs are normalized with); the directory.  ``hub_class``: ``caco``
    (``CacoBackbone``), ``dinov2`` (``DINOV2Backbone``, a ViT only) or ``auto`` (``dinov2``
    for a ViT, else ``caco``)."""
    hub_backbones.keras_hub()
    if hub_class not in HUB_CLASSES:
        raise UserError(f"the KerasHub class must be one of {', '.join(HUB_CLASSES)}, got "
                        f"{hub_class!r}")
    if hub_class == "auto":
        hub_class = "dinov2" if is_caco_vit(backbone) else "caco"
    if hub_class == "dinov2":
        return export_dinov2_preset(backbone, directory, preprocessing)
    wrapped = hub_backbones.CacoBackbone(backbone, name="caco_backbone")
    wrapped.save_to_preset(directory)
    _write_preprocessing(directory, preprocessing, {
        "load": "import caco_tf.serving.hub, then keras_hub.models.Backbone.from_preset(this "
                "directory)"})
    return directory


def export_dinov2_preset(backbone, directory, preprocessing=None):
    """Write a caco_tf ViT as a KerasHub ``DINOV2Backbone`` preset (``nets.hub.dinov2_from_vit``)
    at ``preprocessing``'s image size, after checking its features against the ViT's there."""
    preprocessing = dict(preprocessing or {})
    if not is_caco_vit(backbone):
        raise UserError(f"a DINOV2Backbone preset holds a caco_tf ViT (model.backbone vit_*), "
                        f"not {backbone.name}: --keras-hub-class caco writes caco-tf's own "
                        f"preset class")
    if "image_size" not in preprocessing or "channels" not in preprocessing:
        raise UserError("a DINOV2Backbone preset is made for one image size: pass image_size "
                        "and channels (the run's preprocessing)")
    size, channels = int(preprocessing["image_size"]), int(preprocessing["channels"])
    theirs = hub_backbones.dinov2_from_vit(backbone, size, channels)
    images = np.random.default_rng(0).normal(size=(2, size, size, channels)).astype("float32")
    expected = np.asarray(backbone(images, training=False))
    got = np.asarray(theirs({"images": images}, training=False))[:, 0]
    gap = float(np.abs(got - expected).max() / max(np.abs(expected).max(), 1e-12))
    if not gap <= DINOV2_TOLERANCE:  # a layout the mapping missed: never write a wrong preset
        raise UserError(f"the DINOV2Backbone's features differ from the ViT's by {gap:.2g} "
                        f"(relative), above {DINOV2_TOLERANCE:g}: --keras-hub-class caco "
                        f"writes caco-tf's own preset class")
    theirs.save_to_preset(directory)
    _write_preprocessing(directory, preprocessing, {
        "load": "keras_hub.models.Backbone.from_preset(this directory); caco_tf is not needed",
        "features": "outputs[:, 0]: the class token after the final LayerNorm",
        "checked": f"the ViT's features at {size} px to {gap:.2g} (relative) before writing",
        "other_sizes": "from_preset(..., image_shape=...) resizes the position table with "
                       "TensorFlow's bicubic (KerasHub's); the same as the ViT's own resize "
                       "only with model.interpolate_offset 0 and model.interpolate_antialias "
                       "true"})
    return directory


def _write_preprocessing(directory, preprocessing, notes):
    with open(os.path.join(directory, "preprocessing.json"), "w") as handle:
        json.dump({"inputs": "float images in [0, 1], then (x - mean) / std, at image_size",
                   **notes,
                   **{key: list(value) if isinstance(value, tuple) else value
                      for key, value in (preprocessing or {}).items()}}, handle, indent=1)
