"""The splits of a comparison, carved once and written as split files (``split:PATH.json``,
``caco_tf.data.sources.split_file``), so that every run reads exactly its images.

- **test**: the source's own held-out split (MNIST's, a folder's ``val/``, ...), else a
  stratified ``test_fraction`` of its images; measured once per seed, it chooses nothing;
- **validation**: a stratified ``validation_fraction`` of the training images, on which each
  method's trials are judged; **tune**: the training images without it (the trials train on
  them);
- **train**: every training image (the chosen settings train on them, once per seed);
- **few labels**: ``per_class`` images of each class of **train**, which the few-label linear
  protocol trains on.

Every split is drawn by a generator seeded with the comparison's seed and is disjoint from the
splits it must not meet (tests/test_comparison.py).  Labels reach evaluation only.
"""

import numpy as np


def stratified(labels, fraction, seed):
    """(kept, carved): positions of ``labels``, ``fraction`` of each class carved (at least one
    of any class with two images or more), both sorted."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    carved = []
    for label in np.unique(labels):
        positions = np.flatnonzero(labels == label)
        count = int(round(fraction * len(positions)))
        count = min(max(count, 1 if len(positions) > 1 else 0), len(positions) - 1)
        carved.extend(rng.permutation(positions)[:count])
    carved = np.sort(np.asarray(carved, np.int64))
    kept = np.setdiff1d(np.arange(len(labels)), carved)
    return kept, carved


def few_labels(labels, per_class, seed):
    """Positions of ``per_class`` images of each class (all of a class with fewer), sorted."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    chosen = [rng.permutation(np.flatnonzero(labels == label))[:per_class]
              for label in np.unique(labels)]
    return np.sort(np.concatenate(chosen)).astype(np.int64) if chosen else np.zeros(0, np.int64)


def carve(train_labels, held_out_labels, validation_fraction, test_fraction, per_class, seed):
    """{split name: (part, positions)} of a source with ``train_labels`` and, when it has a
    labelled held-out split, ``held_out_labels`` (else None: the test split is carved)."""
    everything = np.arange(len(train_labels))
    if held_out_labels is None:
        everything, test = stratified(train_labels, test_fraction, seed)
        splits = {"test": ("train", test)}
    else:
        splits = {"test": ("held_out", np.arange(len(held_out_labels)))}
    labels = np.asarray(train_labels)[everything]
    tune, validation = stratified(labels, validation_fraction, seed + 1)
    splits.update(train=("train", everything), tune=("train", everything[tune]),
                  validation=("train", everything[validation]))
    if per_class:
        splits["few_labels"] = ("train", everything[few_labels(labels, per_class, seed + 2)])
    return splits
