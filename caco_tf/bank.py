"""The cooperative-adversarial memory bank (paper Sec. 4.3).

The bank M = {b_j} is a K×D variable of *raw* rows: they are L2-normalized wherever they are
used and never renormalized in place (as in the authors' code).  Its update is eq. (real_update):
the gradient of the CaCo loss with respect to the raw rows, taken through the normalization,
with every non-MPP contribution's sign flipped, so that

* the MPP row b_{j+} descends the loss (cooperative):  + η/τ (1 - p_{j+}) T_j z
* every other row ascends it (adversarial):           + η/τ p_j T_j z

with T_j = (I - b̂_j b̂_jᵀ)/‖b_j‖ the Jacobian of the normalization.
"""

import collections

import tensorflow as tf

from caco_tf import tracing  # noqa: F401  (autograph leaves caco_tf alone)

from caco_tf import losses


# XLA fuses the element-wise passes over the K×D bank (normalization and its backward pass, the
# momentum update) that otherwise each read and write it in full (docs/equations.md, "The tiled
# training form").
@tf.function(jit_compile=True, autograph=False)
def cooperative_adversarial_gradient(queries, bank, positive_index, temperature, views=1):
    """The sign-flipped CaCo gradient for the raw bank rows: a batch mean per view, views summed.

    Args:
      queries: [N, D] query embeddings with unit rows (z), ``views`` views stacked
        ([z¹; z²] for the two-view step).
      bank: [K, D] raw bank rows (b_j, any norm).
      positive_index: [N] int, the MPP index j+ of each query.
      temperature: the bank-update temperature τ.
      views: how many views ``queries`` stacks; each view's rows are averaged, views summed.

    Returns:
      [K, D] direction g such that ``bank - lr * g`` is the paper's update before momentum.
    """
    queries = tf.stop_gradient(tf.cast(queries, tf.float32))
    bank = tf.cast(bank, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(bank)  # the bank is a non-trainable variable: the tape must be told
        bank_unit = losses.l2_normalize(bank)
    logits = tf.matmul(queries, tf.stop_gradient(bank_unit), transpose_b=True) / temperature
    # d loss / d logits = p - onehot(j+).  Flipping the sign of every non-MPP entry gives
    # (p - 1) at j+ and -p elsewhere: descent for the positive, ascent for the negatives.
    positive = tf.one_hot(tf.cast(positive_index, tf.int32), tf.shape(bank)[0], dtype=tf.float32)
    flipped = (tf.nn.softmax(logits, axis=-1) - positive) * (2.0 * positive - 1.0)
    per_view = tf.cast(tf.shape(queries)[0] // views, tf.float32)
    # d loss / d b̂_j = Σ_n flipped_nj z_n / τ; back through the normalization it becomes T_j z.
    unit_gradient = tf.matmul(flipped / (temperature * per_view), queries, transpose_a=True)
    return tape.gradient(bank_unit, bank, output_gradients=unit_gradient)


@tf.function(jit_compile=True, autograph=False)
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
    "Negative" ablation (``caco_tf.methods.adversarial_negatives``).
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


# ---------------------------------------------------------------------- the tiled bank pass
# The training step takes the same update (and the loss and its gradient with respect to the
# queries) in two passes over tiles of bank rows: ``bank_statistics``, then
# ``tiled_caco_update`` (or ``tiled_caco_gradient`` under several replicas, whose gradients must
# be averaged before the momentum step).  Normalizing a tile, its products with the batch, the
# normalization's backward pass and the momentum update all run while the tile is in cache,
# instead of a dozen passes over K×D arrays (docs/equations.md, "The tiled training form").
# Tests check both passes against the closed forms and the functions above.

BankStatistics = collections.namedtuple("BankStatistics", [
    "positive_index",        # [N] j+ = argmax_j k·b̂_j, the Most Probable Positive (eq. max_prob)
    "positive_probability",  # [N] max_j p(b_j | k) at the loss's τ (eq. prob_positive)
    "nearest_index",         # [N] argmax_j z·b̂_j, the query's most similar row
    "loss_log_normalizer",   # [N] log Σ_j exp(z·b̂_j / τ)
    "bank_log_normalizer",   # [N] log Σ_j exp(z·b̂_j / τ_bank)
    "similarity",            # [K / rows per tile, N, rows per tile] z·b̂_j, tile by tile
    "mean_norm",             # mean_j ‖b_j‖ of the raw rows
])


def tile_rows(bank_size, preferred=1024):
    """Rows per tile: the largest divisor of K up to ``preferred``; K itself when that divisor
    would be under an eighth of ``preferred`` (a prime K is one tile)."""
    bank_size = int(bank_size)
    limit = min(preferred, bank_size)
    rows = next(r for r in range(limit, 0, -1) if bank_size % r == 0)
    return rows if 8 * rows >= limit else bank_size


def _tiles(matrix, rows_per_tile):
    return tf.reshape(matrix, [-1, rows_per_tile, tf.shape(matrix)[1]])


def _unit_tile(tile):
    """(b̂, 1/‖b‖) for a tile of raw rows, as ``losses.l2_normalize`` computes them."""
    squared = tf.reduce_sum(tf.square(tile), axis=-1, keepdims=True)
    inverse_norm = tf.math.rsqrt(tf.maximum(squared, 1e-12))
    return tile * inverse_norm, inverse_norm


@tf.function(jit_compile=True, autograph=False)
def bank_statistics(queries, keys, bank, temperature, bank_temperature, rows_per_tile):
    """First pass over the bank: everything the step needs from all K rows but the update.

    Args:
      queries: [N, D] unit query embeddings z.
      keys: [N, D] unit key embeddings k, row n being the key whose MPP query n is trained
        towards (for the two-view step: [k²; k¹] against [z¹; z²]).
      bank: [K, D] raw bank rows.
      temperature, bank_temperature: τ of the loss and of the bank update.
      rows_per_tile: a divisor of K (``tile_rows``).

    Returns:
      ``BankStatistics``; ties in an argmax go to the first row, as ``tf.argmax``.
    """
    queries, keys = tf.cast(queries, tf.float32), tf.cast(keys, tf.float32)
    bank = tf.cast(bank, tf.float32)
    count, size = tf.shape(queries)[0], tf.shape(bank)[0]
    rows = tf.concat([queries, keys], axis=0)
    temperatures = tf.stack([tf.cast(temperature, tf.float32),
                             tf.cast(bank_temperature, tf.float32)])

    def tile_statistics(args):
        tile, start = args
        unit, inverse_norm = _unit_tile(tile)
        similarity = tf.matmul(rows, unit, transpose_b=True)  # [2N, tile]
        best = tf.reduce_max(similarity, axis=-1)
        best_index = start + tf.argmax(similarity, axis=-1, output_type=tf.int32)
        # Σ_j exp((r·b̂_j - best) / τ) for both τ: relative to this tile's max, rescaled below.
        sums = tf.reduce_sum(tf.exp((similarity - best[:, None])[None]
                                    / temperatures[:, None, None]), axis=-1)
        return best, best_index, sums, tf.reduce_sum(1.0 / inverse_norm), similarity[:count]

    best, best_index, sums, norm_sum, similarity = tf.map_fn(
        tile_statistics, (_tiles(bank, rows_per_tile), tf.range(0, size, rows_per_tile)),
        fn_output_signature=(tf.float32, tf.int32, tf.float32, tf.float32, tf.float32))
    # From [tiles, 2N] per-tile maxima and [tiles, 2, 2N] sums to the whole bank's.
    overall = tf.reduce_max(best, axis=0)
    winner = tf.argmax(best, axis=0, output_type=tf.int32)  # the first tile holding the max
    index = tf.gather(tf.transpose(best_index), winner, batch_dims=1)
    rescaled = sums * tf.exp((best - overall)[:, None, :] / temperatures[None, :, None])
    log_normalizer = (overall[None, :] / temperatures[:, None]
                      + tf.math.log(tf.reduce_sum(rescaled, axis=0)))  # [2, 2N]
    return BankStatistics(
        positive_index=index[count:],
        positive_probability=tf.exp(overall[count:] / temperatures[0]
                                    - log_normalizer[0, count:]),
        nearest_index=index[:count],
        loss_log_normalizer=log_normalizer[0, :count],
        bank_log_normalizer=log_normalizer[1, :count],
        similarity=similarity,
        mean_norm=tf.reduce_sum(norm_sum) / tf.cast(size, tf.float32))


def _tile_gradient(tile, start, similarity, queries, statistics_of_queries, temperature,
                   bank_temperature, per_view):
    """One tile's share of Σ_j p_nj b̂_j (p at the loss's τ) and its rows' direction g_j."""
    positive_index, loss_log_normalizer, bank_log_normalizer = statistics_of_queries
    unit, inverse_norm = _unit_tile(tile)
    loss_probability = tf.exp(similarity / temperature - loss_log_normalizer[:, None])
    expected_unit = tf.matmul(loss_probability, unit)  # [N, D]
    columns = start + tf.range(tf.shape(tile)[0])
    positive = tf.cast(tf.equal(positive_index[:, None], columns[None, :]), tf.float32)
    probability = tf.exp(similarity / bank_temperature - bank_log_normalizer[:, None])
    # As in cooperative_adversarial_gradient: (p - 1) at j+, -p elsewhere, then back through
    # the normalization, T_j u = (u - b̂_j (b̂_j·u)) / ‖b_j‖.
    flipped = (probability - positive) * (2.0 * positive - 1.0)
    unit_gradient = tf.matmul(flipped / (bank_temperature * per_view), queries, transpose_a=True)
    gradient = (unit_gradient
                - unit * tf.reduce_sum(unit * unit_gradient, axis=-1, keepdims=True)
                ) * inverse_norm
    return expected_unit, gradient


def _second_pass(queries, statistics, bank, temperature, bank_temperature, views,
                 rows_per_tile, tile_step, extra_tiles, output_signature):
    queries, bank = tf.cast(queries, tf.float32), tf.cast(bank, tf.float32)
    per_view = tf.cast(tf.shape(queries)[0] // views, tf.float32)
    of_queries = (tf.cast(statistics.positive_index, tf.int32),
                  statistics.loss_log_normalizer, statistics.bank_log_normalizer)

    def tile_pass(args):
        tile, start, similarity = args[:3]
        expected_unit, gradient = _tile_gradient(tile, start, similarity, queries, of_queries,
                                                 temperature, bank_temperature, per_view)
        return (expected_unit,) + tile_step(tile, gradient, *args[3:])

    outputs = tf.map_fn(
        tile_pass, (_tiles(bank, rows_per_tile), tf.range(0, tf.shape(bank)[0], rows_per_tile),
                    statistics.similarity) + extra_tiles,
        fn_output_signature=(tf.float32,) + output_signature)
    return (tf.reduce_sum(outputs[0], axis=0),) + tuple(
        tf.reshape(tiles, tf.shape(bank)) for tiles in outputs[1:])


@tf.function(jit_compile=True, autograph=False)
def tiled_caco_update(queries, statistics, bank, velocity, temperature, bank_temperature,
                      learning_rate, momentum, views, rows_per_tile):
    """Second pass, one replica: the loss's expected unit row and the bank's momentum step.

    Per tile: p_nj = exp(z_n·b̂_j/τ - log normalizer_n), whose Σ_j p_nj b̂_j gives the loss's
    gradient (Σ_j p_nj b̂_j - b̂_{j+}) / τ with respect to z_n; the direction g_j of
    ``cooperative_adversarial_gradient`` (the mean over each view's rows of ``queries``, views
    summed); then ``momentum_step``'s v ← μ v + g and b ← b - η v for the tile's rows.

    Args:
      queries: [N, D] the unit queries given to ``bank_statistics``; statistics: its result.
      bank, velocity: [K, D] the raw bank and its momentum buffer before the step.

    Returns:
      (Σ_j p_nj b̂_j [N, D], new bank [K, D], new velocity [K, D]).
    """
    def momentum_tile(tile, gradient, tile_velocity):
        return momentum_step(tile, tile_velocity, gradient, learning_rate, momentum)

    return _second_pass(queries, statistics, bank, temperature, bank_temperature, views,
                        rows_per_tile, momentum_tile,
                        (_tiles(tf.cast(velocity, tf.float32), rows_per_tile),),
                        (tf.float32, tf.float32))


@tf.function(jit_compile=True, autograph=False)
def tiled_caco_gradient(queries, statistics, bank, temperature, bank_temperature, views,
                        rows_per_tile):
    """Second pass without the update, for replicas whose g must be averaged before it.

    Returns (Σ_j p_nj b̂_j [N, D], g [K, D]); see ``tiled_caco_update``.
    """
    return _second_pass(queries, statistics, bank, temperature, bank_temperature, views,
                        rows_per_tile, lambda tile, gradient: (gradient,), (), (tf.float32,))
