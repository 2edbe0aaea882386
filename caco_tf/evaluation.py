"""Evaluation protocols on frozen backbone features.

The kNN classifier is the InstDisc/MoCo monitor: cosine similarity of L2-normalized features,
the k most similar training images vote for their label with weight exp(similarity / T).
"""

import numpy as np
import tensorflow as tf


def extract_features(backbone, dataset):
    """L2-normalized backbone features [N, F] (and labels [N] if the dataset yields them)."""
    features, labels = [], []
    for batch in dataset:
        images, batch_labels = batch if isinstance(batch, tuple) else (batch, None)
        features.append(tf.math.l2_normalize(backbone(images, training=False), axis=-1).numpy())
        if batch_labels is not None:
            labels.append(np.asarray(batch_labels))
    features = np.concatenate(features)
    return (features, np.concatenate(labels)) if labels else features


def knn_predict(train_features, train_labels, test_features, k=5, temperature=0.07,
                num_classes=None, chunk=1024):
    """Weighted kNN labels for ``test_features`` (all features L2-normalized).

    Returns the predicted class of each test row, [M].  Ties go to the lower class index.
    """
    train_features = tf.convert_to_tensor(train_features, tf.float32)
    train_labels = tf.convert_to_tensor(train_labels, tf.int64)
    num_classes = int(num_classes or int(tf.reduce_max(train_labels)) + 1)
    k = min(int(k), int(train_features.shape[0]))
    predictions = []
    for start in range(0, len(test_features), chunk):
        queries = tf.convert_to_tensor(test_features[start:start + chunk], tf.float32)
        similarity = tf.matmul(queries, train_features, transpose_b=True)
        top_similarity, top_index = tf.math.top_k(similarity, k=k)
        votes = tf.one_hot(tf.gather(train_labels, top_index), num_classes)
        weights = tf.exp(top_similarity / temperature)[..., None]
        predictions.append(tf.argmax(tf.reduce_sum(votes * weights, axis=1), axis=-1).numpy())
    return np.concatenate(predictions)


def knn_accuracy(train_features, train_labels, test_features, test_labels, k=5,
                 temperature=0.07):
    """Top-1 accuracy (fraction) of :func:`knn_predict`."""
    predicted = knn_predict(train_features, train_labels, test_features, k, temperature)
    return float(np.mean(predicted == np.asarray(test_labels)))
