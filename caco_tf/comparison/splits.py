"""The splits of a comparison, carved once and written as split files (``split:PATH.json``,
``caco_tf.data.sources.split_file``), so that every run reads exactly its images.

- **test**: the source's own held-out split (MNIST's, a folder's ``val/``, ...), else a
  stratified ``test_fraction`` of its images; measured once per seed, it chooses nothing;
- **validation**: a stratified ``validation_fraction`` of the training images, on which each
  method's trials are judged; **tune**: the training images without it (the trials train on
  them);
- **train**: every training image (the chosen settings train on them, once per seed);
- **few labels**: ``per_class`` images of each class of **train**, which the few-label linear
  protocol trains on; ``draws`` of them (``few_labels_0``, ``few_labels_1``, ...), each drawn
  by its own generator, and a run's few-label figure is the mean over the draws.  A plan
  written before the draws holds one, ``few_labels`` (``few_label_names``).

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


def few_label_names(per_class, draws):
    """The names of a comparison's few-label splits, one per label draw: ``few_labels_0`` to
    ``few_labels_<draws - 1>``; ``draws`` None (a plan written before the draws): its one
    ``few_labels``; none without few labels (``per_class`` 0)."""
    if not per_class:
        return []
    if draws is None:
        return ["few_labels"]
    return [f"few_labels_{draw}" for draw in range(draws)]


def few_label_draws(labels, per_class, draws, seed):
    """``draws`` few-label subsets of ``labels`` (``few_labels``), draw d by a generator seeded
    with [``seed``, d] (the carving passes the comparison's seed + 2): each ``per_class``
    images of each class."""
    return [few_labels(labels, per_class, [seed, draw]) for draw in range(draws)]


def carve(train_labels, held_out_labels, validation_fraction, test_fraction, per_class, seed,
          draws=None):
    """{split name: (part, positions)} of a source with ``train_labels`` and, when it has a
    labelled held-out split, ``held_out_labels`` (else None: the test split is carved).
    ``draws``: the number of few-label draws (``few_label_names``; None: one, ``few_labels``,
    as a plan written before the draws carved it)."""
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
    if per_class and draws is None:
        splits["few_labels"] = ("train", everything[few_labels(labels, per_class, seed + 2)])
    elif per_class:
        for name, chosen in zip(few_label_names(per_class, draws),
                                few_label_draws(labels, per_class, draws, seed + 2)):
            splits[name] = ("train", everything[chosen])
    return splits
