"""Using a trained backbone elsewhere.

- ``export``: the TF Serving SavedModel (uint8 images in, features out, preprocessing inside);
- ``extraction``: batch feature extraction through that SavedModel, streamed to disk (no keras);
- ``torch_import``: the authors' published PyTorch checkpoints into a CaCo model;
- ``hub``: KerasHub backbones pre-trained here, and trained backbones as KerasHub presets.

``FORMATS`` is defined here, where ``caco-export --help`` reads it without TensorFlow.
"""

# What ``export.export_model`` writes: TF Serving's SavedModel, one ONNX / LiteRT file
# (``interop``), or a KerasHub preset directory (``hub``, the optional extra).
FORMATS = ("saved_model", "onnx", "litert", "keras-hub")
