"""Training health without labels, as small pure functions (each tested against a closed form).

- ``effective_rank`` (RankMe, Garrido et al. 2023): exp of the entropy of the normalized
  singular values of an embedding matrix; a collapsed encoder maps everything to a few
  directions and its rank falls towards 1.
- ``alignment`` and ``uniformity`` (Wang & Isola 2020) of unit embeddings: how close the two
  views of an image land, and how evenly the images spread over the sphere.
- ``histogram_usage`` and ``histogram_entropy``: how many bank rows serve as Most Probable
  Positives over an epoch, and how evenly; a bank collapse uses one or two rows for everything.
"""

import tensorflow as tf

RANK_EPSILON = 1e-7  # RankMe's ε, added to the normalized singular values


def effective_rank(embeddings):
    """RankMe: exp(-Σ_k p_k log p_k), p_k = σ_k / Σ_i σ_i + ε, σ the singular values of the
    [n, d] matrix; between 1 and min(n, d) (r for a rank-r matrix of equal singular values)."""
    singular = tf.linalg.svd(tf.cast(embeddings, tf.float32), compute_uv=False)
    p = singular / tf.maximum(tf.reduce_sum(singular), 1e-30) + RANK_EPSILON
    return tf.exp(-tf.reduce_sum(p * tf.math.log(p)))


def alignment(view1, view2):
    """E ||z¹ - z²||² over the batch, for unit embeddings of the two views (0: identical)."""
    difference = tf.cast(view1, tf.float32) - tf.cast(view2, tf.float32)
    return tf.reduce_mean(tf.reduce_sum(tf.square(difference), axis=-1))


def uniformity(embeddings, t=2.0):
    """log E exp(-t ||z_i - z_j||²) over the pairs i ≠ j of unit embeddings: 0 when all are the
    same point, lower (towards -4t) as they spread over the sphere."""
    z = tf.cast(embeddings, tf.float32)
    count = tf.shape(z)[0]
    squared = tf.maximum(2.0 - 2.0 * tf.matmul(z, z, transpose_b=True), 0.0)  # unit rows
    off_diagonal = 1.0 - tf.eye(count)
    pairs = tf.cast(count * (count - 1), tf.float32)
    # log-sum-exp over the off-diagonal pairs, minus log of their number.
    logits = -t * squared - 1e9 * (1.0 - off_diagonal)
    return tf.reduce_logsumexp(logits) - tf.math.log(tf.maximum(pairs, 1.0))


def histogram_usage(counts):
    """The fraction of bins with a count: distinct MPP rows / K for a histogram of K rows."""
    counts = tf.cast(counts, tf.float32)
    return tf.reduce_mean(tf.cast(counts > 0, tf.float32))


def histogram_entropy(counts):
    """The entropy (nats) of a histogram's distribution: log(m) for m equally used bins."""
    counts = tf.cast(counts, tf.float32)
    p = counts / tf.maximum(tf.reduce_sum(counts), 1.0)
    return -tf.reduce_sum(tf.where(p > 0, p * tf.math.log(tf.where(p > 0, p, 1.0)), 0.0))
