"""Contrastive losses as small pure functions (solo-learn style).

Symbols follow the paper: ``z`` is a query embedding, ``k`` a key embedding, ``b_j`` a row of
the memory bank and ``j+`` the index of the Most Probable Positive (MPP).  All embeddings
passed here are already L2-normalized, except where a docstring says "raw".
"""

import tensorflow as tf


def l2_normalize(x, axis=-1):
    """Unit rows; the epsilon keeps an all-zero row finite instead of NaN."""
    return tf.math.l2_normalize(x, axis=axis, epsilon=1e-12)


def bank_logits(queries, bank_unit, temperature):
    """z·b̂_jᵀ/τ for every query and bank row: [N, K] (float32 even under mixed precision)."""
    return tf.matmul(tf.cast(queries, tf.float32), tf.cast(bank_unit, tf.float32),
                     transpose_b=True) / temperature


def most_probable_positive(keys, bank_unit):
    """Eq. (max_prob): j+ = argmax_j p(b_j | k), [N] int32, computed without gradient.

    The softmax is monotonic in the logits, so the argmax of k·b̂_j is the argmax of p and no
    temperature is needed.
    """
    logits = tf.stop_gradient(bank_logits(keys, bank_unit, 1.0))
    return tf.argmax(logits, axis=-1, output_type=tf.int32)


def max_positive_probability(keys, bank_unit, temperature):
    """max_j p(b_j | k) (eq. prob_positive), the quantity plotted in the paper's Fig. prob_acc."""
    probs = tf.nn.softmax(bank_logits(tf.stop_gradient(keys), bank_unit, temperature), axis=-1)
    return tf.reduce_max(probs, axis=-1)


def caco_loss(queries, bank_unit, positive_index, temperature):
    """Eq. (caco): -log p(b_{j+} | z) per query, [N].

    The bank is the sole source of positives and negatives; its gradient is not taken here
    (the bank has its own cooperative-adversarial update, see ``caco_tf.bank``).
    """
    logits = bank_logits(queries, tf.stop_gradient(bank_unit), temperature)
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=positive_index, logits=logits)


def moco_loss(queries, keys, negatives_unit, temperature):
    """InfoNCE (eq. infonce) with the other view's key as positive and bank rows as negatives, [N].

    Used for the bank warm-up pass (τ=0.2 in the reference) and for the MoCo v2 baseline.
    """
    queries = tf.cast(queries, tf.float32)
    keys = tf.stop_gradient(tf.cast(keys, tf.float32))
    positive = tf.reduce_sum(queries * keys, axis=-1, keepdims=True) / temperature
    negatives = bank_logits(queries, tf.stop_gradient(negatives_unit), temperature)
    logits = tf.concat([positive, negatives], axis=-1)
    labels = tf.zeros(tf.shape(queries)[:1], dtype=tf.int32)
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)


def contrast_accuracy(queries, bank_unit, positive_index):
    """Fraction of queries whose most similar bank row is their MPP (the 'contrast top-1')."""
    predicted = tf.argmax(bank_logits(queries, bank_unit, 1.0), axis=-1, output_type=tf.int32)
    return tf.reduce_mean(tf.cast(tf.equal(predicted, positive_index), tf.float32))
