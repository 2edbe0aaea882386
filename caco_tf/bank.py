"""The cooperative-adversarial memory bank (paper Sec. 4.3).

The bank M = {b_j} is a K×D variable of *raw* rows: they are L2-normalized wherever they are
used and never renormalized in place (as in the authors' code).  Its update is eq. (real_update):
the gradient of the CaCo loss with respect to the raw rows, taken through the normalization,
with every non-MPP contribution's sign flipped, so that

* the MPP row b_{j+} descends the loss (cooperative):  + η/τ (1 - p_{j+}) T_j z
* every other row ascends it (adversarial):           + η/τ p_j T_j z

with T_j = (I - b̂_j b̂_jᵀ)/‖b_j‖ the Jacobian of the normalization.
"""

import tensorflow as tf

from caco_tf import losses


# XLA fuses the element-wise passes over the K×D bank (normalization and its backward pass, the
# momentum update) that otherwise each read and write it in full; see README "Performance".
@tf.function(jit_compile=True)
def cooperative_adversarial_gradient(queries, bank, positive_index, temperature, views=1,
                                     similarity=None):
    """The sign-flipped CaCo gradient for the raw bank rows: a batch mean per view, views summed.

    Args:
      queries: [N, D] query embeddings with unit rows (z), ``views`` views stacked
        ([z¹; z²] for the two-view step).
      bank: [K, D] raw bank rows (b_j, any norm).
      positive_index: [N] int, the MPP index j+ of each query.
      temperature: the bank-update temperature τ.
      views: how many views ``queries`` stacks; each view's rows are averaged, views summed.
      similarity: [N, K] z·b̂_jᵀ if the caller has it (the loss's forward pass does), so that
        the bank is not multiplied by the queries a second time.

    Returns:
      [K, D] direction g such that ``bank - lr * g`` is the paper's update before momentum.
    """
    queries = tf.stop_gradient(tf.cast(queries, tf.float32))
    bank = tf.cast(bank, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(bank)  # the bank is a non-trainable variable: the tape must be told
        bank_unit = losses.l2_normalize(bank)
    if similarity is None:
        similarity = tf.matmul(queries, bank_unit, transpose_b=True)
    logits = tf.stop_gradient(tf.cast(similarity, tf.float32)) / temperature
    # d loss / d logits = p - onehot(j+).  Flipping the sign of every non-MPP entry gives
    # (p - 1) at j+ and -p elsewhere: descent for the positive, ascent for the negatives.
    positive = tf.one_hot(tf.cast(positive_index, tf.int32), tf.shape(bank)[0], dtype=tf.float32)
    flipped = (tf.nn.softmax(logits, axis=-1) - positive) * (2.0 * positive - 1.0)
    per_view = tf.cast(tf.shape(queries)[0] // views, tf.float32)
    # d loss / d b̂_j = Σ_n flipped_nj z_n / τ; back through the normalization it becomes T_j z.
    unit_gradient = tf.matmul(flipped / (temperature * per_view), queries, transpose_a=True)
    return tape.gradient(bank_unit, bank, output_gradients=unit_gradient)


@tf.function(jit_compile=True)
def momentum_step(bank, velocity, gradient, learning_rate, momentum):
    """SGD with momentum as PyTorch does it (no dampening, no weight decay).

    v ← μ v + g ;  b ← b - η v.  Returns (new_bank, new_velocity).
    """
    bank, velocity, gradient = (tf.cast(x, tf.float32) for x in (bank, velocity, gradient))
    velocity = momentum * velocity + gradient
    return bank - learning_rate * velocity, velocity


def enqueue(bank, rows, pointer):
    """FIFO write of ``rows`` at ``pointer`` (wrapping), as MoCo's queue and the warm-up fill do.

    Returns (new_bank, new_pointer).
    """
    size = tf.shape(bank)[0]
    count = tf.shape(rows)[0]
    indices = tf.math.floormod(pointer + tf.range(count), size)
    bank = tf.tensor_scatter_nd_update(bank, indices[:, None], tf.cast(rows, bank.dtype))
    return bank, tf.math.floormod(pointer + count, size)


def adversarial_negative_gradient(queries, keys, bank, temperature):
    """AdCo's bank update: every row is a negative and ascends the InfoNCE loss, [K, D].

    With the other view's key k as the positive and the bank as the negatives (eq. infonce),
    p_j = exp(z·b̂_j/τ) / (exp(z·k/τ) + Σ_i exp(z·b̂_i/τ)) and ∂ℓ/∂b_j = (1/τ) p_j T_j z; the
    bank maximizes ℓ (eq. adco), so the returned direction g = -(1/τ) mean_n p_nj T_j z_n makes
    ``bank - lr * g`` the ascent step (every row moves towards the queries).  Used by the
    "Negative" ablation (``caco_tf.ablations``).
    """
    queries = tf.stop_gradient(tf.cast(queries, tf.float32))
    keys = tf.stop_gradient(tf.cast(keys, tf.float32))
    bank = tf.convert_to_tensor(bank, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(bank)
        logits = losses.bank_logits(queries, losses.l2_normalize(bank), temperature)
    positive = tf.reduce_sum(queries * keys, axis=-1, keepdims=True) / temperature
    # The positive's logit is in the softmax's denominator but has no bank row.
    probs = tf.nn.softmax(tf.concat([positive, logits], axis=-1), axis=-1)[:, 1:]
    batch = tf.cast(tf.shape(queries)[0], tf.float32)
    return tape.gradient(logits, bank, output_gradients=-probs / batch)
