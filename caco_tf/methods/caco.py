"""The CaCo model: a ``keras.Model`` whose ``train_step`` is the paper's algorithm.

One step, for a batch of images seen as two augmented views x1, x2:

1. keys k1, k2 from the momentum (key) encoder, and queries z1, z2 from the query encoder;
2. from the pre-step bank: for each image, the Most Probable Positive of the *other* view,
   j+ = argmax_j p(b_j | k) (eq. max_prob); the symmetric loss (eq. caco)
   CE(z1·B̂ᵀ/τ, j+(k2)) + CE(z2·B̂ᵀ/τ, j+(k1)) and its gradient with respect to the queries;
   the bank's cooperative-adversarial step (eq. real_update) from the same queries and bank,
   averaged over the global batch, with SGD momentum (``caco_tf.bank``'s two tiled passes);
3. the encoder descends the loss;
4. the key encoder's parameters move towards the query encoder's (EMA, cosine momentum).

Before the CaCo phase a warm-up pass (``warmup_steps``, one epoch in the configs) trains the
encoder with a MoCo-style loss against the bank while filling the bank FIFO with real key
embeddings, as the reference does; the key encoder is then re-synced to the query encoder
(``ContrastiveMethod``, which holds the template of the step, the encoders, the bank and the
Keras plumbing).
"""

import keras
import tensorflow as tf

from caco_tf import bank as bank_lib
from caco_tf import health, losses
from caco_tf.methods.base import Contrast, ContrastiveMethod, _crops


@keras.saving.register_keras_serializable(package="caco_tf")
class CaCo(ContrastiveMethod):
    """Cooperative-adversarial contrastive learning (Wang et al., CaCo).

    Arguments: ``ContrastiveMethod``'s.  ``bank_size`` is K (positives and negatives share
    the bank); with ``multi_crop`` the batches hold two global crops then local crops
    (``caco_tf.data.augment.MultiCropViews``) and ``train_step`` is ``multicrop_train_step``;
    the backbone must then accept every crop size (input shape (None, None, C)).
    """

    method = "caco"
    learns_bank = True
    supports_multi_crop = True

    def _create_method_trackers(self):
        self.contrast_top1 = keras.metrics.Mean(name="contrast_top1")
        self.positive_probability = keras.metrics.Mean(name="mpp_prob")
        self.distinct_positives = keras.metrics.Mean(name="distinct_mpp")
        self.positive_histogram = PositiveHistogram(self.memory_bank.size, name="mpp_histogram")

    def method_metrics(self):
        return [self.contrast_top1, self.positive_probability, self.distinct_positives,
                self.positive_histogram]

    # ------------------------------------------------------------------ the algorithm
    def train_step(self, data):
        """The paper's step (``ContrastiveMethod.train_step``, with step 2 ``contrast``), or
        ``multicrop_train_step`` for multi-crop batches."""
        if self.multi_crop:
            return self.multicrop_train_step(data)
        return super().train_step(data)

    def contrast(self, queries, keys, step):
        """Step 2, everything that touches the K×D bank, in two passes over its tiles.

        From the pre-step bank: the MPPs j+ of ``keys`` [k²; k¹] (eq. max_prob), the symmetric
        loss of ``queries`` [z¹; z²] (eq. caco) and its gradient with respect to them, and the
        bank's cooperative-adversarial momentum step (eq. real_update), assigned on every
        replica.
        """
        bank = self.memory_bank.read()
        statistics = self.memory_bank.statistics(queries, keys, bank, self.temperature,
                                                 self.bank_temperature)
        loss, positive_unit = self._caco_loss(queries, bank, statistics)
        expected_unit, bank_lr = self.memory_bank.cooperative_adversarial_step(
            queries, statistics, bank, self.temperature, self.bank_temperature, step)
        # d loss / d z_n = (2 / N) (Σ_j p_nj b̂_j - b̂_{j+}) / τ.
        count = tf.cast(tf.shape(queries)[0], tf.float32)
        query_gradient = (expected_unit - positive_unit) * (2.0 / (count * self.temperature))
        return Contrast(loss, query_gradient, bank_lr, statistics)

    def evaluation_loss(self, queries, keys):
        bank = self.memory_bank.read()
        statistics = self.memory_bank.statistics(queries, keys, bank, self.temperature,
                                                 self.bank_temperature)
        return self._caco_loss(queries, bank, statistics)[0], statistics

    def multicrop_train_step(self, data):
        """The CaCo step over multi-crop batches (SwAV's protocol, as the reference does it).

        ``data`` holds the two global crops, then any number of local crops.  MPP indices come
        from the key embeddings of the two global crops only: each global crop's query is
        trained against the other global crop's MPP, each local crop's query against the MPPs
        of both global crops.  The loss is the two-view loss over the global pairs (a sum, as
        ``train_step``'s) plus twice the mean over the local pairs: twice the reference's
        (mean over global pairs + mean over local pairs), so that with no local crop this step
        is exactly the two-view step.  The bank's gradient weights the same pairs the same way,
        from the pre-step queries and bank.  Warm-up and evaluation use the global crops.
        """
        crops = _crops(data)
        global1, global2, local = crops[0], crops[1], crops[2:]
        step = self.optimizer.iterations
        learning_rate = self._encoder_learning_rate()

        keys = self._keys(global1, global2, training=True)
        bank = self.memory_bank.read()
        bank_unit = losses.l2_normalize(bank)

        with tf.GradientTape() as tape:
            query1 = self.query_encoder(global1, training=True)
            query2 = self.query_encoder(global2, training=True)
            local_queries = tf.concat(
                [tf.concat([query, query], 0) for query in
                 (self.query_encoder(crop, training=True) for crop in local)], 0) if local \
                else None
            queries = tf.concat([query1, query2], 0)
            statistics = self.memory_bank.statistics(
                tf.stop_gradient(queries), keys, bank, self.temperature, self.bank_temperature)
            positive_index = statistics.positive_index
            # Every local crop's query, once against each global crop's MPP: [2 L N] pairs.
            local_positives = tf.tile(positive_index, [len(local)])
            loss = 2.0 * tf.reduce_mean(losses.caco_loss(queries, bank_unit, positive_index,
                                                         self.temperature))
            if local:
                loss += 2.0 * tf.reduce_mean(losses.caco_loss(
                    local_queries, bank_unit, local_positives, self.temperature))
        self._descend(tape, loss)

        gradient = bank_lib.cooperative_adversarial_gradient(
            queries, bank, positive_index, self.bank_temperature, views=2)
        if local:
            gradient += 2.0 * bank_lib.cooperative_adversarial_gradient(
                local_queries, bank, local_positives, self.bank_temperature)
        bank_lr = self.memory_bank.momentum_step(bank, gradient, step, tf.shape(query1)[0])
        self.key_encoder.follow(self.query_encoder, step)

        self._track(Contrast(loss, None, bank_lr, statistics), learning_rate)
        self._track_views(query1, query2)
        self._probe_step(data, global1)
        return self._logs()

    def _warmup_diagnostics(self, query1, query2, key1, key2, bank):
        """The CaCo step's diagnostics during the warm-up, against the bank it read."""
        return self.memory_bank.statistics(tf.concat([query1, query2], 0),
                                           tf.concat([key2, key1], 0), bank, self.temperature,
                                           self.bank_temperature)

    # ------------------------------------------------------------------ pieces of a step
    def _caco_loss(self, queries, bank, statistics):
        """Eq. (caco), symmetrized, from the bank statistics of queries stacked [z¹; z²].

        ℓ_n = log Σ_j exp(z_n·b̂_j/τ) - z_n·b̂_{j+}/τ; the loss is the sum over the two views
        of each view's mean, i.e. twice the mean over the stack.  Returns (loss, b̂_{j+} [N, D]).
        """
        positive_unit = losses.l2_normalize(tf.gather(bank, statistics.positive_index))
        per_query = (statistics.loss_log_normalizer
                     - tf.reduce_sum(queries * positive_unit, axis=-1) / self.temperature)
        return 2.0 * tf.reduce_mean(per_query), positive_unit

    def _track_diagnostics(self, statistics):
        """The MPP diagnostics, from the ``BankStatistics`` of the step's stacked views."""
        positive_index = statistics.positive_index
        self.contrast_top1.update_state(tf.reduce_mean(tf.cast(
            tf.equal(statistics.nearest_index, positive_index), tf.float32)))
        self.positive_probability.update_state(
            tf.reduce_mean(statistics.positive_probability))
        # How many bank rows serve as someone's positive (a collapse shows up here first).
        used = tf.math.unsorted_segment_max(
            tf.ones_like(positive_index), positive_index, self.memory_bank.size)
        self.distinct_positives.update_state(tf.reduce_sum(tf.maximum(used, 0)))
        self.positive_histogram.update_state(positive_index)
        self.bank_norm.update_state(statistics.mean_norm)


class PositiveHistogram(keras.metrics.Metric):
    """How often each bank row is a Most Probable Positive since the last reset (an epoch):
    ``mpp_usage``, the rows used / K, and ``mpp_entropy``, the entropy (nats) of the counts
    (``caco_tf.health``).  A bank that collapses onto one or two rows shows here first."""

    def __init__(self, bank_size, name="mpp_histogram", **kwargs):
        super().__init__(name=name, **kwargs)
        self.bank_size = int(bank_size)
        self.counts = self.add_variable(shape=(self.bank_size,), initializer="zeros",
                                        name="counts", aggregation="sum")

    def update_state(self, positive_index):
        positive_index = tf.reshape(tf.cast(positive_index, tf.int32), [-1])
        self.counts.assign_add(tf.math.unsorted_segment_sum(
            tf.ones_like(positive_index, tf.float32), positive_index, self.bank_size))

    def result(self):
        return {"mpp_usage": health.histogram_usage(self.counts),
                "mpp_entropy": health.histogram_entropy(self.counts)}

    def reset_state(self):
        self.counts.assign(tf.zeros_like(self.counts))

