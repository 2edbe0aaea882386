"""The kNN monitor: weighted kNN top-1 of the backbone's features during pre-training, and the
labelled samples every kNN of a run reads (the monitor's and the end of training's)."""

import time

import keras

from caco_tf import data
from caco_tf.data import service
from caco_tf.evaluation import knn
from caco_tf.evaluation.features import pooled_backbone


class KNNMonitor(keras.callbacks.Callback):
    """Weighted kNN top-1 (%) of the backbone's features every ``every`` epochs, into the logs.

    The InstDisc/MoCo monitor: L2-normalized features of labelled training images (the
    neighbours) and of held-out images (the queries), k nearest by cosine, votes weighted by
    exp(s / T).  It writes ``logs[name]``, so History, ``HistoryJSON`` and TensorBoard placed
    after it in the callback list record it; epochs it skips have no entry (the last epoch is
    always measured).

    Args:
      train_data, test_data: batched datasets of (normalized images, labels), no augmentation
        (``caco_tf.data.eval_dataset``), or ``knn.EvalSet``s that every replica and worker of
        ``strategy`` share (each computes the features of its share; they are gathered).
      every: measure after every ``every``-th epoch.
      backbone: the model to evaluate (default: ``self.model.backbone``).
      features: a ViT's features (``evaluation.features``; ``features.pooled_backbone``).
      strategy: the run's ``tf.distribute`` strategy; under several workers every worker must
        run the monitor (its gathers are collectives).
    """

    def __init__(self, train_data, test_data, every=1, k=200, temperature=0.07,
                 name="knn_top1", backbone=None, strategy=None, features="class"):
        super().__init__()
        self.train_data, self.test_data = train_data, test_data
        self.every, self.k, self.temperature = int(every), int(k), float(temperature)
        self.name = name
        self.backbone = backbone
        self.strategy = strategy
        self.features = features
        self._pooled = None  # (backbone, its pooled model): one model, traced once
        self._epochs = None

    def on_train_begin(self, logs=None):
        self._epochs = self.params.get("epochs") if self.params else None

    def on_epoch_end(self, epoch, logs=None):
        last = self._epochs == epoch + 1
        if logs is None or ((epoch + 1) % self.every and not last):
            return
        start = time.perf_counter()
        logs[self.name] = self.measure()
        logs[f"{self.name}_seconds"] = time.perf_counter() - start  # what the curve costs

    def measure(self):
        """The kNN top-1 (%) of the current backbone."""
        backbone = self.backbone or self.model.backbone
        if self._pooled is None or self._pooled[0] is not backbone:
            self._pooled = (backbone, pooled_backbone(backbone, self.features))
        return knn.knn_of_backbone(self._pooled[1], self.train_data,
                                   self.test_data, self.k, self.temperature,
                                   strategy=self.strategy)["top1"]


def knn_monitor(settings, views, train, held_out, strategy=None):
    """The ``KNNMonitor`` of a run's ``settings`` (``RunSettings``), or None.

    Its neighbours and queries are ``evaluation.knn_monitor_memory`` and ``_queries`` when set,
    else the training images' labels against the held-out split; None when
    ``evaluation.knn_monitor_every`` is 0 or either has no labels.  It reads ``knn_sets``,
    which every replica and worker of ``strategy`` share.
    """
    evaluation = settings.evaluation
    if not evaluation.knn_monitor_every:
        return None
    memory = _monitor_source(evaluation.knn_monitor_memory, settings.data, train) or train
    queries = _monitor_source(evaluation.knn_monitor_queries, settings.data, train) or held_out
    if queries is None or not memory.has_labels:
        return None
    counts = (evaluation.knn_monitor_train_images or evaluation.knn_train_images,
              evaluation.knn_monitor_test_images or evaluation.knn_test_images)
    train_set, test_set = knn_sets(settings, views, memory, queries, counts=counts)
    return KNNMonitor(train_set, test_set, every=evaluation.knn_monitor_every,
                      k=evaluation.knn_monitor_k, temperature=evaluation.knn_monitor_temperature,
                      strategy=strategy, features=evaluation.features)


def _monitor_source(spec, data_settings, train):
    if not spec:
        return None
    from caco_tf.data import sources

    return sources.load_held_out(spec, train, channels=data_settings.channels,
                                 data_dir=data_settings.data_dir,
                                 manual_dir=data_settings.manual_dir)


def knn_sets(settings, views, train, held_out, skipped=None, counts=None):
    """``knn.EvalSet``s of the class-balanced samples of ``train`` and ``held_out`` that every
    kNN of a run reads: ``counts`` images at most of each (default
    ``evaluation.knn_train_images``, ``knn_test_images`` of ``settings``, a ``RunSettings``)."""
    evaluation, data_settings = settings.evaluation, settings.data
    classes = data.num_classes(train, held_out)
    counts = counts or (evaluation.knn_train_images, evaluation.knn_test_images)
    sets = []
    for source, count in zip((train, held_out), counts):
        chosen = data.balanced_subset(source, count, classes)

        def make(shards, batch_size, chosen=chosen):
            return service.eval_dataset(chosen, batch_size, views.normalize,
                                        data_settings.service, data_settings.image_size,
                                        data_settings.channels, skipped=skipped,
                                        shards=shards)
        sets.append(knn.EvalSet(make, len(chosen), evaluation.batch_size))
    return tuple(sets)


def knn_top1(backbone, views, settings, train, held_out, strategy=None):
    """The held-out weighted kNN top-1 (%) of ``backbone`` per a run's ``settings``
    (``RunSettings``: ``evaluation.knn_k``, ``knn_temperature``, ``features``) on the samples of
    ``knn_sets``: the number ``train.py`` reports at the end of a run."""
    skipped = data.SkippedFiles()
    result = knn.knn_of_backbone(
        pooled_backbone(backbone, settings.evaluation.features),
        *knn_sets(settings, views, train, held_out, skipped),
        settings.evaluation.knn_k, settings.evaluation.knn_temperature, strategy)
    skipped.report("kNN evaluation")
    return result["top1"]
