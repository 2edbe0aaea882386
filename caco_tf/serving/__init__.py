"""Using a trained backbone elsewhere.

- ``export``: the TF Serving SavedModel (uint8 images in, features out, preprocessing inside);
- ``extraction``: batch feature extraction through that SavedModel, streamed to disk (no keras);
- ``torch_import``: the authors' published PyTorch checkpoints into a CaCo model.
"""
