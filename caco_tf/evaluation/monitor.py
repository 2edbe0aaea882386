"""The kNN monitor: weighted kNN top-1 of the backbone's features during pre-training."""

import keras

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
        backbone = self.backbone or self.model.backbone
        train_features, train_labels = knn.extract_features(backbone, self.train_data,
                                                            strategy=self.strategy)
        test_features, test_labels = knn.extract_features(backbone, self.test_data,
                                                          strategy=self.strategy)
        return 100.0 * knn.knn_accuracy(train_features, train_labels, test_features,
                                        test_labels, self.k, self.temperature)
