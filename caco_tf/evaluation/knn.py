"""Evaluation protocols on frozen backbone features: feature extraction and weighted kNN.

The kNN classifier is the InstDisc/MoCo monitor: cosine similarity of L2-normalized features,
the k most similar training images vote for their label with weight exp(similarity / T).
The linear protocol is in ``linear.py``; both on a run folder in ``protocols.py``.
"""

import numpy as np
import tensorflow as tf


def extract_features(backbone, dataset, normalize=True):
    """Backbone features [N, F] (and labels [N] if the dataset yields them).

    ``normalize``: L2-normalize each row (kNN); the linear protocol takes them as they are.
    """
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


def knn_votes(train_features, train_labels, test_features, k=5, temperature=0.07,
              num_classes=None, chunk=1024):
    """Each test row's class scores [M, C]: Σ over its k nearest training rows of exp(s/T).

    All features L2-normalized, so the similarity s is the cosine.
    """
    train_features = tf.convert_to_tensor(train_features, tf.float32)
    train_labels = tf.convert_to_tensor(train_labels, tf.int64)
    num_classes = int(num_classes or int(tf.reduce_max(train_labels)) + 1)
    k = min(int(k), int(train_features.shape[0]))
    votes = []
    for start in range(0, len(test_features), chunk):
        queries = tf.convert_to_tensor(test_features[start:start + chunk], tf.float32)
        similarity = tf.matmul(queries, train_features, transpose_b=True)
        top_similarity, top_index = tf.math.top_k(similarity, k=k)
        one_hot = tf.one_hot(tf.gather(train_labels, top_index), num_classes)
        weights = tf.exp(top_similarity / temperature)[..., None]
        votes.append(tf.reduce_sum(one_hot * weights, axis=1).numpy())
    return np.concatenate(votes)


def knn_predict(train_features, train_labels, test_features, k=5, temperature=0.07,
                num_classes=None, chunk=1024):
    """Weighted kNN labels for ``test_features`` (all features L2-normalized).

    Returns the predicted class of each test row, [M].  Ties go to the lower class index.
    """
    votes = knn_votes(train_features, train_labels, test_features, k, temperature,
                      num_classes, chunk)
    return np.argmax(votes, axis=-1)


def knn_accuracy(train_features, train_labels, test_features, test_labels, k=5,
                 temperature=0.07):
    """Top-1 accuracy (fraction) of :func:`knn_predict`."""
    predicted = knn_predict(train_features, train_labels, test_features, k, temperature)
    return float(np.mean(predicted == np.asarray(test_labels)))


def top_k_accuracy(scores, labels, k):
    """Fraction of rows whose label is among their k highest scores (ties: lower index first)."""
    k = min(int(k), scores.shape[-1])
    top = tf.math.top_k(tf.convert_to_tensor(scores), k=k).indices.numpy()
    return float(np.mean(np.any(top == np.asarray(labels)[:, None], axis=-1)))
