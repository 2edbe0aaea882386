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


def caco_loss(queries, bank_unit, positive_index, temperature):
    """Eq. (caco): -log p(b_{j+} | z) per query, [N].

    The bank is the sole source of positives and negatives; its gradient is not taken here
    (the bank has its own cooperative-adversarial update, see ``caco_tf.bank``).
    """
    return tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=positive_index,
        logits=bank_logits(queries, tf.stop_gradient(bank_unit), temperature))


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


def batch_infonce_loss(queries, positives, candidates, temperature, offset=0):
    """InfoNCE (eq. infonce) whose negatives are the current batch's keys, [N].

    Query z_i is scored against every candidate c_m (the global batch's keys of the other view,
    [M, D]) as z_i·c_m/τ, except at its own image m = offset + i, where the logit is z_i·z_i⁺/τ
    with the given positive; the loss is -log of that entry's softmax.  With the own keys as
    positives (z_i⁺ = c_{offset+i}) this is in-batch InfoNCE with a momentum key encoder (the
    ablation's "None" row); with the nearest neighbour from a queue of past keys as z_i⁺ it is
    the "Positive" (NNCLR-like) row.  ``offset``: this replica's first row in the global batch.
    Positives and candidates carry no gradient (they come from the key encoder).
    """
    queries = tf.cast(queries, tf.float32)
    positives = tf.stop_gradient(tf.cast(positives, tf.float32))
    candidates = tf.stop_gradient(tf.cast(candidates, tf.float32))
    labels = offset + tf.range(tf.shape(queries)[0], dtype=tf.int32)
    own = tf.one_hot(labels, tf.shape(candidates)[0], dtype=tf.float32)
    positive = tf.reduce_sum(queries * positives, axis=-1, keepdims=True) / temperature
    logits = bank_logits(queries, candidates, temperature) * (1.0 - own) + positive * own
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)


def nt_xent_loss(embeddings, temperature, candidates=None, offset=0):
    """SimCLR's NT-Xent per anchor, [2N], over the query embeddings of both views.

    ``embeddings`` = [z¹; z²]: view 1's N rows, then view 2's.  Anchor a's positive is the other
    view of its image (a ± N); every other candidate except itself is a negative:
    ℓ_a = -log exp(z_a·z_{a±N}/τ) / Σ_{m≠a} exp(z_a·z_m/τ).  ``candidates``: the embeddings of
    the global batch (replica r's [z¹; z²] block at rows offset..offset+2N), default the
    embeddings themselves; gradients flow through both.
    """
    embeddings = tf.cast(embeddings, tf.float32)
    candidates = embeddings if candidates is None else tf.cast(candidates, tf.float32)
    count = tf.shape(embeddings)[0]
    anchor = tf.range(count, dtype=tf.int32)
    labels = offset + tf.math.floormod(anchor + count // 2, count)
    itself = tf.one_hot(offset + anchor, tf.shape(candidates)[0], dtype=tf.float32)
    # A large negative rather than -inf keeps the masked logits' gradients finite (as SimCLR).
    logits = bank_logits(embeddings, candidates, temperature) - 1e9 * itself
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
