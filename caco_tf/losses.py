"""Contrastive losses as small pure functions (solo-learn style).

Symbols follow the paper: ``z`` is a query embedding, ``k`` a key embedding, ``b_j`` a row of
the memory bank and ``j+`` the index of the Most Probable Positive (MPP).  All embeddings
passed here are already L2-normalized, except where a docstring says "raw".
"""

import tensorflow as tf

from caco_tf import tracing  # noqa: F401  (autograph leaves caco_tf alone)


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


# ---------------------------------------------------------------------- the comparison methods
# Each loss below is per row ([N]) or a scalar, from float32 embeddings; ``global_sum`` adds a
# quantity over every replica of the global batch (``caco_tf.training.distribute.global_sum``;
# the identity on one device), so the same function is the loss of one device and of R replicas.


def _identity(value):
    return value


def regression_loss(predictions, targets):
    """BYOL's ‖p̂ - ẑ'‖² = 2 - 2 cos(p, z') per row, [N]; no gradient through the targets."""
    predictions = l2_normalize(tf.cast(predictions, tf.float32))
    targets = tf.stop_gradient(l2_normalize(tf.cast(targets, tf.float32)))
    return 2.0 - 2.0 * tf.reduce_sum(predictions * targets, axis=-1)


def negative_cosine(predictions, targets):
    """SimSiam's D(p, z) = -cos(p, sg(z)) per row, [N]."""
    predictions = l2_normalize(tf.cast(predictions, tf.float32))
    targets = tf.stop_gradient(l2_normalize(tf.cast(targets, tf.float32)))
    return -tf.reduce_sum(predictions * targets, axis=-1)


def embedding_spread(embeddings):
    """The per-dimension standard deviation of the unit embeddings, averaged, ×√D: 1 for unit
    vectors spread evenly over the sphere, 0 for a single point (SimSiam's collapse measure)."""
    unit = l2_normalize(tf.cast(embeddings, tf.float32))
    return tf.reduce_mean(tf.math.reduce_std(unit, axis=0)) * tf.sqrt(
        tf.cast(tf.shape(unit)[-1], tf.float32))


def moco_v3_loss(queries, keys, temperature, offset=0):
    """MoCo v3's ctr(q, k) per query, [N]: the cross-entropy of q̂_i·k̂_m/τ over every key m of
    the global batch (``keys`` [M, D], gathered), the positive at m = offset + i, times 2τ.
    No gradient through the keys."""
    queries = l2_normalize(tf.cast(queries, tf.float32))
    keys = tf.stop_gradient(l2_normalize(tf.cast(keys, tf.float32)))
    labels = offset + tf.range(tf.shape(queries)[0], dtype=tf.int32)
    logits = tf.matmul(queries, keys, transpose_b=True) / temperature
    return 2.0 * temperature * tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits)


def nnclr_loss(neighbours, predictions, temperature, offset=0):
    """NNCLR's loss per row, [N]: the cross-entropy of n̂_i·p̂_m/τ over every prediction m of the
    global batch (``predictions`` [M, D], gathered, with gradient), the positive at m =
    offset + i; ``neighbours`` [N, D] are the support set's nearest neighbours (no gradient)."""
    neighbours = tf.stop_gradient(l2_normalize(tf.cast(neighbours, tf.float32)))
    predictions = l2_normalize(tf.cast(predictions, tf.float32))
    labels = offset + tf.range(tf.shape(neighbours)[0], dtype=tf.int32)
    logits = tf.matmul(neighbours, predictions, transpose_b=True) / temperature
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)


def nearest_neighbours(embeddings, support_unit):
    """The support-set row most similar to each embedding (cosine), [N, D]: NNCLR's lookup."""
    return tf.gather(support_unit, most_probable_positive(embeddings, support_unit))


def sinkhorn(scores, epsilon, iterations, global_sum=_identity, fixed_scores=None,
             fixed_in_use=True, rows_in_use=None):
    """SwAV's codes for ``scores`` [N, K] (prototype scores of this replica's rows of the
    global batch): the equipartitioned transport plan of Sinkhorn-Knopp, [N, K], each row a
    distribution over the K prototypes (facebookresearch/swav main_swav.py
    ``distributed_sinkhorn``).

    Q = exp(s/ε) over the B columns of the global batch, then ``iterations`` times: every
    prototype's row scaled to mass 1/K, every sample's column to mass 1/B; returned ×B.
    ``fixed_scores`` [M, K]: rows that every replica holds alike (SwAV's queue), counted once
    among the B columns when ``fixed_in_use`` (a boolean tensor); their codes are not
    returned.  ``rows_in_use`` [N] (0 or 1): only these rows are columns of the plan, the others'
    codes are 0 (DINOv2's Sinkhorn-Knopp over the masked patches alone).  No gradient.
    """
    scores = tf.stop_gradient(tf.cast(scores, tf.float32))
    plan = tf.exp(scores / epsilon)
    if rows_in_use is not None:  # a fixed shape, the rows out of use weighing 0
        plan = plan * tf.cast(rows_in_use, tf.float32)[:, None]
    if fixed_scores is None:
        fixed, in_use = tf.zeros([0, tf.shape(scores)[1]]), 0.0
    else:  # fixed rows out of use weigh 0 (a shape that does not change: XLA needs it)
        in_use = tf.cast(fixed_in_use, tf.float32)
        fixed = tf.exp(tf.stop_gradient(tf.cast(fixed_scores, tf.float32)) / epsilon) * in_use
    own = (tf.cast(tf.shape(plan)[0], tf.float32) if rows_in_use is None
           else tf.reduce_sum(tf.cast(rows_in_use, tf.float32)))
    columns = global_sum(own) + in_use * tf.cast(
        tf.shape(fixed)[0], tf.float32)
    prototypes = tf.cast(tf.shape(plan)[1], tf.float32)
    total = global_sum(tf.reduce_sum(plan)) + tf.reduce_sum(fixed)
    plan, fixed = plan / total, fixed / total
    for _ in range(int(iterations)):
        rows = global_sum(tf.reduce_sum(plan, axis=0)) + tf.reduce_sum(fixed, axis=0)
        plan, fixed = plan / rows / prototypes, fixed / rows / prototypes
        plan = tf.math.divide_no_nan(plan, tf.reduce_sum(plan, axis=1, keepdims=True)) / columns
        fixed = fixed / tf.maximum(tf.reduce_sum(fixed, axis=1, keepdims=True), 1e-30) / columns
    return plan * columns


def swapped_prediction_loss(codes, scores, temperature):
    """SwAV's -Σ_k q_k log softmax(s/τ)_k per row, [N]: the scores of one crop predict the
    codes of another (no gradient through the codes)."""
    return -tf.reduce_sum(tf.stop_gradient(codes) * tf.nn.log_softmax(
        tf.cast(scores, tf.float32) / temperature, axis=-1), axis=-1)


def dino_teacher(teacher_logits, center, teacher_temperature):
    """DINO's teacher distribution per row, [N, K]: P_t = softmax((t - c)/τ_t), its output
    centered and sharpened, no gradient (facebookresearch/dino main_dino.py ``DINOLoss``)."""
    return tf.stop_gradient(tf.nn.softmax(
        (tf.cast(teacher_logits, tf.float32) - center) / teacher_temperature, axis=-1))


def dino_loss(teacher_probabilities, student_logits, student_temperature):
    """DINO's loss, a scalar: the mean over the pairs (teacher crop i, student crop v ≠ i) of
    the rows' mean cross-entropy -Σ_k P_t(k) log P_s(k), P_s = softmax(s/τ_s); the lists hold
    one [N, K] tensor per crop, the teacher's the global crops, which are also the student's
    first (main_dino.py ``DINOLoss``).  Each crop's softmax is taken once, not once per pair:
    at K = 65,536 a softmax is a pass over the whole [N, K] output."""
    log_students = [tf.nn.log_softmax(tf.cast(s, tf.float32) / student_temperature, axis=-1)
                    for s in student_logits]
    terms = [-tf.reduce_mean(tf.reduce_sum(teacher * log_students[v], axis=-1))
             for i, teacher in enumerate(teacher_probabilities)
             for v in range(len(log_students)) if v != i]
    return tf.add_n(terms) / len(terms)


def standardize(z, global_sum=_identity, epsilon=1e-5):
    """Every dimension of ``z`` [N, D] to zero mean and unit variance over the global batch
    (biased variance, as BatchNorm without scale and shift in training mode)."""
    z = tf.cast(z, tf.float32)
    count = global_sum(tf.cast(tf.shape(z)[0], tf.float32))
    mean = global_sum(tf.reduce_sum(z, axis=0)) / count
    variance = global_sum(tf.reduce_sum(tf.square(z - mean), axis=0)) / count
    return (z - mean) * tf.math.rsqrt(variance + epsilon)


def barlow_twins_loss(z1, z2, redundancy_weight, global_sum=_identity):
    """Barlow Twins' Σ_i (1 - C_ii)² + λ Σ_{i≠j} C_ij², a scalar: C = ẑ¹ᵀẑ² / B, the
    cross-correlation of the two views' embeddings standardized over the global batch of B
    (facebookresearch/barlowtwins main.py)."""
    count = global_sum(tf.cast(tf.shape(z1)[0], tf.float32))
    c = global_sum(tf.matmul(standardize(z1, global_sum), standardize(z2, global_sum),
                             transpose_a=True)) / count
    diagonal = tf.linalg.diag_part(c)
    on = tf.reduce_sum(tf.square(1.0 - diagonal))
    off = tf.reduce_sum(tf.square(c)) - tf.reduce_sum(tf.square(diagonal))
    return on + redundancy_weight * off


def vicreg_loss(z1, z2, invariance_weight, variance_weight, covariance_weight,
                gather=_identity):
    """VICReg's λ s + μ v + ν c, a scalar (facebookresearch/vicreg main_vicreg.py): s the mean
    squared difference of the two views (this replica's rows); over the global batch
    (``gather`` concatenates every replica's rows, with gradient), v = Σ_views ½ mean_d
    relu(1 - √(Var z_d + 1e-4)) and c = Σ_views Σ_{i≠j} Cov(z)_ij² / D, Var and Cov unbiased."""
    z1, z2 = tf.cast(z1, tf.float32), tf.cast(z2, tf.float32)
    invariance = tf.reduce_mean(tf.square(z1 - z2))
    variance = covariance = 0.0
    for z in (gather(z1), gather(z2)):
        z = z - tf.reduce_mean(z, axis=0)
        count, dim = tf.cast(tf.shape(z)[0], tf.float32), tf.cast(tf.shape(z)[1], tf.float32)
        std = tf.sqrt(tf.reduce_sum(tf.square(z), axis=0) / (count - 1.0) + 1e-4)
        variance += 0.5 * tf.reduce_mean(tf.nn.relu(1.0 - std))
        cov = tf.matmul(z, z, transpose_a=True) / (count - 1.0)
        covariance += (tf.reduce_sum(tf.square(cov))
                       - tf.reduce_sum(tf.square(tf.linalg.diag_part(cov)))) / dim
    return (invariance_weight * invariance + variance_weight * variance
            + covariance_weight * covariance)


def whiten(z, group_size, epsilon=0.0):
    """W-MSE's whitening of ``z`` [N, D] in consecutive groups of ``group_size`` rows (N a
    multiple of it), each group to zero mean and identity covariance: (z - mean) L⁻ᵀ with
    L Lᵀ = (1 - ε) Cov + ε I, Cov unbiased (htdt/self-supervised's Whitening2d)."""
    z = tf.cast(z, tf.float32)
    dim = tf.shape(z)[-1]
    groups = tf.reshape(z, [-1, group_size, dim])
    centered = groups - tf.reduce_mean(groups, axis=1, keepdims=True)
    covariance = tf.matmul(centered, centered, transpose_a=True) / (group_size - 1.0)
    identity = tf.broadcast_to(tf.eye(dim), tf.shape(covariance))
    factor = tf.linalg.cholesky((1.0 - epsilon) * covariance + epsilon * identity)
    inverse = tf.linalg.triangular_solve(factor, identity, lower=True)  # L⁻¹
    return tf.reshape(tf.matmul(centered, inverse, transpose_b=True), tf.shape(z))


def w_mse_loss(z1, z2, group_size, epsilon=0.0):
    """W-MSE's loss, a scalar: the mean over rows of 2 - 2 cos(w¹, w²), w each view whitened
    in groups of ``group_size`` (``whiten``; htdt/self-supervised's norm_mse_loss)."""
    return w_mse_views_loss([z1, z2], group_size, epsilon)


def w_mse_views_loss(views, group_size, epsilon=0.0):
    """W-MSE's loss over K views of the same images: ``w_mse_loss``'s term averaged over the
    K(K-1)/2 pairs of views, each view whitened once (the reference's num_samples; W-MSE 4)."""
    white = [l2_normalize(whiten(z, group_size, epsilon)) for z in views]
    pairs = [(i, j) for i in range(len(white)) for j in range(i + 1, len(white))]
    return tf.add_n([tf.reduce_mean(2.0 - 2.0 * tf.reduce_sum(white[i] * white[j], axis=-1))
                     for i, j in pairs]) / len(pairs)


def koleo_loss(embeddings, epsilon=1e-8, candidates=None, offset=0):
    """DINOv2's KoLeo regularizer, a scalar (the Kozachenko-Leonenko entropy estimate of
    Sablayrolles et al. 2019): -mean_i log(‖x_i - x_nn(i)‖ + ε) over the L2-normalized rows x
    of ``embeddings`` [N, D], nn(i) the other row of largest inner product (dinov2/loss/
    koleo_loss.py, per replica as there).  It pushes each row away from its nearest one.
    ``candidates`` [M, D]: where the neighbours are searched (the gathered global batch), row i
    of ``embeddings`` being its row ``offset + i``; by default ``embeddings`` themselves."""
    x = l2_normalize(tf.cast(embeddings, tf.float32))
    pool = x if candidates is None else l2_normalize(tf.cast(candidates, tf.float32))
    own = tf.one_hot(offset + tf.range(tf.shape(x)[0]), tf.shape(pool)[0])
    dots = tf.where(own > 0, -1.0, tf.matmul(x, pool, transpose_b=True))  # never oneself
    # The neighbour is chosen without gradient (an argmax); the distance carries it.
    neighbours = tf.gather(pool, tf.argmax(tf.stop_gradient(dots), axis=1))
    # PyTorch's PairwiseDistance adds its ε to the difference before the norm.
    distances = tf.norm(x - neighbours + epsilon, axis=-1)
    return -tf.reduce_mean(tf.math.log(distances + epsilon))


def ibot_patch_loss(teacher_probabilities, student_logits, masks, student_temperature):
    """iBOT's masked-patch loss as DINOv2 weighs it, a scalar: per image, the mean over its
    masked patches of -Σ_k P_t(k) log softmax(s/τ_s)_k; then the mean over every image of the
    batch, one with no masked patch counting 0 (dinov2/loss/ibot_patch_loss.py
    ``forward_masked``).  ``teacher_probabilities``, ``student_logits``: [B, N, K] (the
    patches' head outputs); ``masks``: [B, N], True where the student's patch was masked."""
    log_students = tf.nn.log_softmax(tf.cast(student_logits, tf.float32) / student_temperature,
                                     axis=-1)
    teacher = tf.stop_gradient(tf.cast(teacher_probabilities, tf.float32))
    cross = -tf.reduce_sum(teacher * log_students, axis=-1)
    masks = tf.cast(masks, tf.float32)
    per_image = tf.reduce_sum(cross * masks, axis=-1) / tf.maximum(
        tf.reduce_sum(masks, axis=-1), 1.0)
    return tf.reduce_mean(per_image)
