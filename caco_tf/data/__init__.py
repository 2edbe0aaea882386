"""Images in, view batches out: sources, the tf.data pipelines, the views and image decoding.

- ``sources``: where images (and, for evaluation only, labels) come from: ``load_source``;
- ``pipeline``: ``pretrain_dataset`` (endless view batches, sharded per worker, bad files
  skipped and counted) and ``eval_dataset`` (un-augmented, in order);
- ``augment``: the views (``DigitViews``, ``AsymmetricViews``, ``MultiCropViews``);
- ``images``: decoding, channel conversion, resize and centre crop, shared with serving.
"""

import importlib

# Evaluation's and serving's centre crop: the shorter side is resized to round(S / this), then
# cropped to S×S (256 → 224 for ImageNet).  Used by ``images``; defined here, without
# TensorFlow, for ``caco-export --help``.
DEFAULT_CROP_FRACTION = 0.875

# Names re-exported from the submodules, each loaded on first use (PEP 562), so importing one
# submodule (``images`` for serving) does not import the others (``pipeline`` needs keras).
_EXPORTS = {
    "images": ["to_unit_float"],
    "pipeline": ["SkippedFiles", "StreamPosition", "distribute", "epoch_order", "eval_dataset",
                 "listed_unreadable", "looks_complete", "pretrain_dataset"],
    "sources": ["IMAGE_EXTENSIONS", "MNIST_TRAIN", "SOURCES", "ArraySource", "DataError",
                "FileSource", "RecordSource", "Selection", "Source", "TFDSSource",
                "balanced_subset", "class_indices", "convert_array_channels", "describe_inputs",
                "folder_source",
                "load_held_out", "passed_over",
                "load_numpy", "load_offline_mnist", "load_offline_mnist_validation",
                "load_source", "num_classes", "split_folders", "tfds_source",
                "tfrecord_source"],
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name):
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
