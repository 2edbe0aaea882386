"""Evaluation protocols on frozen backbone features: feature extraction and weighted kNN.

The kNN classifier is the InstDisc/MoCo monitor: cosine similarity of L2-normalized features,
the k most similar training images vote for their label with weight exp(similarity / T).
The linear protocol is in ``linear.py``; both on a run folder in ``protocols.py``.
"""

import numpy as np
import tensorflow as tf

from caco_tf import tracing  # noqa: F401  (autograph leaves caco_tf alone)

from caco_tf.training import distribute, peers


def extract_features(backbone, dataset, normalize=True, strategy=None):
    """Backbone features [N, F] (and labels [N] if the dataset yields them).

    ``normalize``: L2-normalize each row (kNN); the linear protocol takes them as they are.
    ``dataset``: batches of (images[, labels]), or an ``EvalSet`` whose shares every replica and
    worker of ``strategy`` computes (``distributed_features``).
    """
    if isinstance(dataset, EvalSet):
        if strategy is not None and (strategy.num_replicas_in_sync > 1
                                     or distribute.is_multi_worker(strategy)):
            return distributed_features(backbone, dataset, strategy, normalize)
        dataset = dataset.make((1, 0), dataset.batch_size)
    features, labels = [], []
    for batch in dataset:
        images, batch_labels = batch if isinstance(batch, tuple) else (batch, None)
        batch_features = tf.cast(backbone(images, training=False), tf.float32)
        if normalize:
            batch_features = tf.math.l2_normalize(batch_features, axis=-1)
        features.append(batch_features.numpy())
        if batch_labels is not None:
            labels.append(np.asarray(batch_labels))
    features = np.concatenate(features)
    return (features, np.concatenate(labels)) if labels else features


class EvalSet:
    """Labelled evaluation images that several input pipelines can share.

    ``make(shards, batch_size)``: batches of (normalized images, labels) of share
    ``shards = (count, index)``, in order; ``count``: the images in the set (before bad files
    are dropped); ``batch_size``: the global batch.  Each share's pipeline is built once and
    read again at every measurement (a monitor measures every few epochs).
    """

    def __init__(self, make, count, batch_size):
        self._make, self.count, self.batch_size = make, int(count), int(batch_size)
        self._made = {}

    def make(self, shards, batch_size):
        key = (tuple(shards), int(batch_size))
        if key not in self._made:
            self._made[key] = self._make(*key)
        return self._made[key]


def distributed_features(backbone, eval_set, strategy, normalize=True):
    """``extract_features`` of an ``EvalSet`` with every replica and worker of ``strategy`` on its
    share, gathered on every worker: (features [N, F], labels [N]), in no fixed order.

    Each input pipeline (worker) reads and decodes only its share; every pipeline runs the same
    number of steps (shorter shares are padded with label -1 rows, dropped after the gather),
    so that the gathers' collectives line up.
    """
    pipelines = distribute.num_workers(strategy)
    replicas = strategy.num_replicas_in_sync
    local_replicas = max(1, replicas // pipelines)
    per_replica = max(1, eval_set.batch_size // replicas)
    share = -(-eval_set.count // pipelines)
    steps = -(-(-(-share // per_replica)) // local_replicas)  # per pipeline, whole steps

    def dataset_fn(context):
        shards = (context.num_input_pipelines, context.input_pipeline_id)
        real = eval_set.make(shards, per_replica).map(lambda images, labels: (
            images, tf.cast(labels, tf.int64)))
        images_spec = real.element_spec[0]
        padding = tf.data.Dataset.from_tensors((
            tf.zeros([per_replica] + images_spec.shape[1:].as_list(), images_spec.dtype),
            tf.fill([per_replica], tf.constant(-1, tf.int64)))).repeat()
        return real.concatenate(padding).take(steps * local_replicas)

    batches = strategy.distribute_datasets_from_function(dataset_fn)
    features, labels = [], []
    iterator = iter(batches)
    for _ in range(steps):
        peers.progress()  # each gather is a wait on every worker: the watchdog times each
        batch_features, batch_labels = _gathered_features(backbone, strategy, normalize,
                                                          next(iterator))
        features.append(batch_features.numpy())
        labels.append(batch_labels.numpy())
    features, labels = np.concatenate(features), np.concatenate(labels)
    real = labels >= 0
    return features[real], labels[real]


@tf.function(autograph=False)
def _gathered_features(backbone, strategy, normalize, batch):
    """One step of ``distributed_features``: every replica's (features, labels), gathered.
    Module-level, so traced once per backbone, strategy and batch shape rather than at every
    pass (the kNN monitor makes two passes an epoch)."""
    def replica_features(images, labels):
        features = tf.cast(backbone(images, training=False), tf.float32)
        if normalize:
            features = tf.math.l2_normalize(features, axis=-1)
        return features, labels

    features, labels = strategy.run(replica_features, args=batch)
    return strategy.gather(features, axis=0), strategy.gather(labels, axis=0)


def knn_votes(train_features, train_labels, test_features, k=5, temperature=0.07,
              num_classes=None, chunk=1024, train_block=16384):
    """Each test row's class scores [M, C]: Σ over its k nearest training rows of exp(s/T).

    All features L2-normalized, so the similarity s is the cosine.  By blocks: ``chunk`` test
    rows at a time against ``train_block`` training rows at a time, keeping a running top k, so
    memory is O(chunk × (k + train_block)) beyond the features themselves.  Ties go to the
    lower training index, as one ``top_k`` over a whole row.
    """
    train_features = tf.convert_to_tensor(train_features, tf.float32)
    train_labels = tf.convert_to_tensor(train_labels, tf.int64)
    num_classes = int(num_classes or int(tf.reduce_max(train_labels)) + 1)
    count = int(train_features.shape[0])
    k = min(int(k), count)
    votes = []
    for start in range(0, len(test_features), chunk):
        queries = tf.convert_to_tensor(test_features[start:start + chunk], tf.float32)
        top_similarity, top_index = None, None
        for block in range(0, count, train_block):
            similarity = tf.matmul(queries, train_features[block:block + train_block],
                                   transpose_b=True)
            block_similarity, block_index = tf.math.top_k(
                similarity, k=min(k, int(similarity.shape[1])))
            block_index += block
            if top_similarity is not None:  # earlier (lower-index) rows first: they win ties
                block_similarity = tf.concat([top_similarity, block_similarity], axis=1)
                block_index = tf.concat([top_index, block_index], axis=1)
                block_similarity, keep = tf.math.top_k(block_similarity, k=k)
                block_index = tf.gather(block_index, keep, batch_dims=1)
            top_similarity, top_index = block_similarity, block_index
        one_hot = tf.one_hot(tf.gather(train_labels, top_index), num_classes)
        weights = tf.exp(top_similarity / temperature)[..., None]
        votes.append(tf.reduce_sum(one_hot * weights, axis=1).numpy())
    return np.concatenate(votes)


def knn_predict(train_features, train_labels, test_features, k=5, temperature=0.07,
                num_classes=None, chunk=1024, train_block=16384):
    """Weighted kNN labels for ``test_features`` (all features L2-normalized).

    Returns the predicted class of each test row, [M].  Ties go to the lower class index.
    """
    votes = knn_votes(train_features, train_labels, test_features, k, temperature,
                      num_classes, chunk, train_block)
    return np.argmax(votes, axis=-1)


def knn_accuracy(train_features, train_labels, test_features, test_labels, k=5,
                 temperature=0.07):
    """Top-1 accuracy (fraction) of :func:`knn_predict`."""
    predicted = knn_predict(train_features, train_labels, test_features, k, temperature)
    return float(np.mean(predicted == np.asarray(test_labels)))


def knn_of_backbone(backbone, train_data, test_data, k, temperature, strategy=None,
                    num_classes=None):
    """Weighted kNN of a backbone: each held-out image of ``test_data`` is voted for by its k
    nearest training images of ``train_data`` (cosine of L2-normalized features).

    ``train_data``, ``test_data``: batches of (normalized images, labels), or ``EvalSet``s that
    the replicas and workers of ``strategy`` share.  Returns {"top1", "top5" (%),
    "train_images", "test_images"}: what the end of training, the monitor and
    ``caco-evaluate knn`` report.
    """
    train_features, train_labels = extract_features(backbone, train_data, strategy=strategy)
    test_features, test_labels = extract_features(backbone, test_data, strategy=strategy)
    votes = knn_votes(train_features, train_labels, test_features, k, temperature,
                      num_classes=num_classes)
    return {"top1": 100.0 * top_k_accuracy(votes, test_labels, 1),
            "top5": 100.0 * top_k_accuracy(votes, test_labels, 5),
            "train_images": len(train_labels), "test_images": len(test_labels)}


def top_k_accuracy(scores, labels, k):
    """Fraction of rows whose label is among their k highest scores (ties: lower index first)."""
    k = min(int(k), scores.shape[-1])
    top = tf.math.top_k(tf.convert_to_tensor(scores), k=k).indices.numpy()
    return float(np.mean(np.any(top == np.asarray(labels)[:, None], axis=-1)))
