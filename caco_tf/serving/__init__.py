"""Using a trained backbone elsewhere.

- ``export``: the TF Serving SavedModel (uint8 images in, features out, preprocessing inside);
- ``extraction``: batch feature extraction through that SavedModel, streamed to disk (no keras);
- ``torch_import``: the authors' published PyTorch checkpoints into a CaCo model.

``FORMATS`` is defined here, where ``caco-export --help`` reads it without TensorFlow.
"""

# What ``export.export_model`` writes: TF Serving's SavedModel, or one ONNX / LiteRT file
# (``interop``).
FORMATS = ("saved_model", "onnx", "litert")
