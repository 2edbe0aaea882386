"""The kNN monitor: weighted kNN top-1 of the backbone's features during pre-training, and the
labelled samples every kNN of a run reads (the monitor's and the end of training's)."""

import keras

from caco_tf import data
from caco_tf.data import service
from caco_tf.evaluation import knn


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
      strategy: the run's ``tf.distribute`` strategy; under several workers every worker must
        run the monitor (its gathers are collectives).
    """

    def __init__(self, train_data, test_data, every=1, k=200, temperature=0.07,
                 name="knn_top1", backbone=None, strategy=None):
        super().__init__()
        self.train_data, self.test_data = train_data, test_data
        self.every, self.k, self.temperature = int(every), int(k), float(temperature)
        self.name = name
        self.backbone = backbone
        self.strategy = strategy
        self._epochs = None

    def on_train_begin(self, logs=None):
        self._epochs = self.params.get("epochs") if self.params else None

    def on_epoch_end(self, epoch, logs=None):
        last = self._epochs == epoch + 1
        if logs is None or ((epoch + 1) % self.every and not last):
            return
        logs[self.name] = self.measure()

    def measure(self):
        """The kNN top-1 (%) of the current backbone."""
        return knn.knn_of_backbone(self.backbone or self.model.backbone, self.train_data,
                                   self.test_data, self.k, self.temperature,
                                   strategy=self.strategy)["top1"]


def knn_monitor(settings, views, train, held_out, strategy=None):
    """The ``KNNMonitor`` of a run's ``settings`` (``RunSettings``): training labels against
    the held-out split, or None.

    None when ``evaluation.knn_monitor_every`` is 0 or the data has no labelled held-out split.
    It reads ``knn_sets``, which every replica and worker of ``strategy`` share.
    """
    every = settings.evaluation.knn_monitor_every
    if not every or held_out is None or not train.has_labels:
        return None
    train_set, test_set = knn_sets(settings, views, train, held_out)
    return KNNMonitor(train_set, test_set, every=every, k=settings.evaluation.knn_monitor_k,
                      temperature=settings.evaluation.knn_monitor_temperature,
                      strategy=strategy)


def knn_sets(settings, views, train, held_out, skipped=None):
    """``knn.EvalSet``s of the class-balanced samples of ``train`` and ``held_out`` that every
    kNN of a run reads (``evaluation.knn_train_images``, ``knn_test_images`` of ``settings``, a
    ``RunSettings``)."""
    evaluation, data_settings = settings.evaluation, settings.data
    classes = data.num_classes(train, held_out)
    sets = []
    for source, count in ((train, evaluation.knn_train_images),
                          (held_out, evaluation.knn_test_images)):
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
    (``RunSettings``: ``evaluation.knn_k``, ``knn_temperature``) on the samples of
    ``knn_sets``: the number ``train.py`` reports at the end of a run."""
    skipped = data.SkippedFiles()
    result = knn.knn_of_backbone(
        backbone, *knn_sets(settings, views, train, held_out, skipped),
        settings.evaluation.knn_k, settings.evaluation.knn_temperature, strategy)
    skipped.report("kNN evaluation")
    return result["top1"]
