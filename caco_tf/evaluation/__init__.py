"""Evaluation of a frozen backbone, with labels (which pre-training never sees).

- ``knn``: feature extraction and weighted kNN (votes, top-k);
- ``monitor``: ``KNNMonitor``, the kNN top-1 during pre-training;
- ``linear``: the linear protocol (a frozen backbone and one Dense layer, ``fit``);
- ``protocols``: kNN and linear on a run folder, on its data or the user's (``caco-evaluate``);
- ``figures``: the paper's analysis figures from a run folder (``caco-figures``).
"""
