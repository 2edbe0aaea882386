"""Evaluation of a frozen backbone, with labels (which pre-training never sees).

- ``knn``: feature extraction and weighted kNN (votes, top-k);
- ``features``: a ViT's features for the probes (``evaluation.features``);
- ``monitor``: ``KNNMonitor``, the kNN top-1 during pre-training;
- ``linear``: the linear protocol (a frozen backbone and one Dense layer, ``fit``);
- ``protocols``: kNN and linear on a run folder, on its data or the user's (``caco-evaluate``);
- ``figures``: the paper's analysis figures from a run folder (``caco-figures``).

The probes' choices are defined here, where ``caco-evaluate --help`` reads them
without importing TensorFlow.
"""

# The linear protocol's training augmentations (``linear.linear_evaluation``'s ``augment``).
AUGMENTATIONS = ("none", "imagenet", "digits")
# λ candidates (decades, as scikit-learn's LogisticRegressionCV spaces C) and folds of the
# cross-validation that picks one.  0 keeps the unregularized classifier in the running.
L2_GRID = (0.0, 1e-4, 1e-3, 1e-2, 1e-1)
L2_FOLDS = 5
# A ViT's features for the probes: its class token (the backbone's own output), the mean of its
# patch tokens (MAE's ``global_pool``) or both concatenated (DINOv2's linear evaluation).
POOLINGS = ("class", "patch_mean", "class+patch_mean")


def pooling_name(pooling):
    """``pooling`` as a file or layer name: "class+patch_mean" → "class_and_patch_mean"."""
    return pooling.replace("+", "_and_")
