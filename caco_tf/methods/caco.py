"""The CaCo model: a ``keras.Model`` whose step is the paper's algorithm.

One step, for a batch of images seen as two augmented views x1, x2 (``Method._step``):

1. keys k1, k2 from the momentum (key) encoder, stacked [k²; k¹];
2. queries z1, z2 from the query encoder, stacked [z¹; z²]; from the pre-step bank, for each
   image, the Most Probable Positive of the *other* view, j+ = argmax_j p(b_j | k) (eq.
   max_prob); the symmetric loss (eq. caco) CE(z1·B̂ᵀ/τ, j+(k2)) + CE(z2·B̂ᵀ/τ, j+(k1)) and its
   exact gradient with respect to the queries; the bank's cooperative-adversarial step (eq.
   real_update) from the same queries and bank, averaged over the global batch, with SGD
   momentum (``caco_tf.bank``'s two tiled passes);
3. the encoder descends the loss;
4. the key encoder's parameters move towards the query encoder's (EMA, cosine momentum).

Multi-crop (SwAV's protocol, as the reference does it): the MPPs come from the keys of the two
global crops; each local crop's query is trained against the MPPs of both.

Before the CaCo phase the bank warm-up (``bank_warmup``, one epoch in the configs) trains the
encoder with a MoCo-style loss against the bank while filling it FIFO with real key embeddings,
as the reference does; the key encoder is then re-synced to the query encoder.
"""

import keras
import tensorflow as tf

from caco_tf import bank as bank_lib
from caco_tf import health, losses
from caco_tf.methods.bank_warmup import warmup_settings
from caco_tf.methods.base import Crops, Objective
from caco_tf.methods.contrastive import ContrastiveMethod
from caco_tf.settings import Setting, integer, number


@keras.saving.register_keras_serializable(package="caco_tf")
class CaCo(ContrastiveMethod):
    """Cooperative-adversarial contrastive learning (Wang et al., CaCo).

    Defaults: the authors' ImageNet recipe (the paper and its reference code,
    ``/work/shared/notes/reference-code.md``).  ``bank_size`` is K (positives and negatives
    share the bank); with ``multi_crop`` the batches hold two global crops then local crops
    (``caco_tf.data.augment.MultiCropViews``) and the backbone must accept every crop size
    (input shape (None, None, C)).
    """

    method = "caco"
    SETTINGS = {
        "bank_size": Setting(
            65536, integer(1), "K, the bank's rows (positives and negatives share them)",
            trained=True, tiny=32, rows=True),
        "temperature": Setting(0.08, number(0.0, low_open=True), "tau of the encoder's loss",
                               tiny=0.1, search=(0.04, 0.08, 0.16)),
        "bank_temperature": Setting(
            0.08, number(0.0, low_open=True), "tau of the bank's update", tiny=0.2),
        "bank_lr": Setting(3.0, number(0.0), "the bank's learning rate (cosine-decayed)",
                           schedule="cosine to 0", argument="bank_learning_rate", tiny=0.5),
        "bank_momentum": Setting(
            0.9, number(0.0, 1.0, high_open=True), "the SGD momentum of the bank's update"),
        "key_momentum": Setting(
            0.99, number(0.0, 1.0), "the key encoder's EMA momentum at the start (it rises to "
            "1 on a cosine)", schedule="cosine to 1", tiny=0.9),
        **warmup_settings(epochs=1),
    }
    BANK = True
    LEARNS_BANK = True
    CROPS = Crops(views=2, local=True)
    DOCS_ROW = {"state": "bank (trained)", "global batch": "the bank's gradient",
                "paper": "70.9 / 71.3 / 72.0 (200 ep, b256/1024/4096); 74.1 / 75.3 "
                         "(800 ep, b1024/4096); 75.7 (multi-crop, b2048)",
                "name": "CaCo",
                "full name": "CaCo, the paper's Positive+Negative",
                "towards": "the bank's Most Probable Positive",
                "negatives": "the other bank rows",
                "summary": "the bank's Most Probable Positive against the other rows; the bank "
                           "learns too",
                "collapse": "the MPPs used fewer than 2 % of the rows the epoch could use "
                            "(min(K, its 2N assignments))"}
    EXACT_GRADIENT = True
    COLLAPSE_ADVICE = ("lengthen the warm-up (method.caco.warmup_epochs, "
                       "method.caco.warmup_min_steps) so that the key encoder follows before the "
                       "resync, raise method.caco.bank_lr if it is far below 0.3, or raise "
                       "method.caco.temperature")

    def _create_method_trackers(self):
        super()._create_method_trackers()
        self.contrast_top1 = keras.metrics.Mean(name="contrast_top1")
        self.positive_probability = keras.metrics.Mean(name="mpp_prob")
        self.distinct_positives = keras.metrics.Mean(name="distinct_mpp")
        self.positive_histogram = PositiveHistogram(self.memory_bank.size, name="mpp_histogram")

    def method_metrics(self):
        return [self.contrast_top1, self.positive_probability, self.distinct_positives,
                self.positive_histogram] + super().method_metrics()

    # ------------------------------------------------------------------ the algorithm
    def forward(self, crops, training):
        """Queries [z¹; z²] of the global crops; with local crops, also every local crop's
        query twice, [zˡ; zˡ], once for each global crop's MPP."""
        queries = super().forward(crops, training)
        if len(crops) == 2:
            return queries
        local = [self.query_encoder(crop, training=training) for crop in crops[2:]]
        return queries, tf.concat([tf.concat([query, query], 0) for query in local], 0)

    def objective(self, outputs, keys, step):
        """Steps 2 and 3, everything that touches the K×D bank, in two passes over its tiles.

        From the pre-step bank: the MPPs j+ of ``keys`` [k²; k¹] (eq. max_prob), the symmetric
        loss of the queries [z¹; z²] (eq. caco) and its gradient with respect to them, and the
        bank's cooperative-adversarial momentum step (eq. real_update), assigned on every
        replica.  Local crops add twice the mean over their pairs, to the loss and to the
        bank's gradient (twice the reference's mean over global pairs + mean over local pairs,
        so that without local crops this is exactly the two-view step).
        """
        queries, local = outputs if isinstance(outputs, tuple) else (outputs, None)
        bank = self.memory_bank.read()
        statistics = self.memory_bank.statistics(queries, keys, bank, self.temperature,
                                                 self.bank_temperature)
        loss, positive_unit = self._caco_loss(queries, bank, statistics)
        if local is None:
            expected_unit, bank_lr = self.memory_bank.cooperative_adversarial_step(
                queries, statistics, bank, self.temperature, self.bank_temperature, step)
        else:
            expected_unit, gradient = bank_lib.tiled_caco_gradient(
                queries, statistics, bank, self.temperature, self.bank_temperature, 2,
                self.memory_bank.tile_rows)
            local_loss, local_gradient, bank_gradient = self._local_crops(
                local, bank, statistics.positive_index)
            loss += local_loss
            bank_lr = self.memory_bank.momentum_step(bank, gradient + bank_gradient, step,
                                                     tf.shape(queries)[0] // 2)
        # d loss / d z_n = (2 / N) (Σ_j p_nj b̂_j - b̂_{j+}) / τ.
        count = tf.cast(tf.shape(queries)[0], tf.float32)
        query_gradient = (expected_unit - positive_unit) * (2.0 / (count * self.temperature))
        gradients = query_gradient if local is None else (query_gradient, local_gradient)
        return Objective(loss, gradients, {"statistics": statistics, "bank_lr": bank_lr})

    def update_state(self, outputs, keys, step):
        """Nothing: the bank stepped in ``objective``, in the same pass as the loss."""

    def _local_crops(self, local, bank, positive_index):
        """The local crops' share: twice the mean CE against both global crops' MPPs, its
        gradient with respect to the local queries, and the bank's sign-flipped gradient."""
        positives = tf.tile(positive_index, [tf.shape(local)[0] // tf.shape(positive_index)[0]])
        bank_unit = losses.l2_normalize(bank)
        with tf.GradientTape() as tape:
            tape.watch(local)
            loss = 2.0 * tf.reduce_mean(losses.caco_loss(local, bank_unit, positives,
                                                         self.temperature))
        bank_gradient = 2.0 * bank_lib.cooperative_adversarial_gradient(
            local, bank, positives, self.bank_temperature)
        return loss, tape.gradient(loss, local), bank_gradient

    def method_loss(self, outputs, keys, step):
        """The loss without any update (evaluation), from the global crops."""
        queries = outputs[0] if isinstance(outputs, tuple) else outputs
        bank = self.memory_bank.read()
        statistics = self.memory_bank.statistics(queries, keys, bank, self.temperature,
                                                 self.bank_temperature)
        return self._caco_loss(queries, bank, statistics)[0], {"statistics": statistics}

    def warmup_diagnostics(self, query1, query2, key1, key2, bank):
        """The CaCo step's diagnostics during the warm-up, against the bank it read."""
        return {"statistics": self.memory_bank.statistics(
            tf.concat([query1, query2], 0), tf.concat([key2, key1], 0), bank,
            self.temperature, self.bank_temperature)}

    def view_embeddings(self, outputs):
        return super().view_embeddings(outputs[0] if isinstance(outputs, tuple) else outputs)

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

    def track_diagnostics(self, diagnostics):
        """The MPP diagnostics, from the ``BankStatistics`` of the step's stacked views."""
        statistics = diagnostics["statistics"]
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
        self.bank_lr_tracker.update_state(diagnostics.get("bank_lr", 0.0))

    def collapse(self, logs, epoch):
        """The positives crowd onto a few bank rows: under 2 % of what the epoch could use
        (min(K, its 2 MPP assignments an image))."""
        if "mpp_usage" not in logs or not epoch.images:
            return None
        rows = float(logs["mpp_usage"]) * self.memory_bank.size
        usable = min(self.memory_bank.size, 2 * epoch.images)
        if rows < COLLAPSE_USAGE * usable:
            return f"the positives use {rows:.0f} of {usable} bank rows"
        return None


COLLAPSE_USAGE = 0.02  # distinct MPP rows / min(K, MPP assignments of the epoch)


def scaled_warmups(declared, epochs, methods, written=()):
    """``key=value`` assignments that scale the bank warm-ups of ``methods`` (CaCo's, and any
    method's that has one) to a budget of ``epochs`` (caco-compare's ``--epochs``).

    A warm-up is the share of the run its configuration ``declared`` states (``warmup_epochs``
    of its ``train.epochs``): at ``epochs`` it is the nearest whole number of epochs (a half
    rounds up), kept below them (0, no warm-up, at 1 epoch), as a schedule's shape is kept
    when its length changes.  A warm-up the user assigned (``written``: their ``key=value``
    assignments) is theirs and stays; one that does not change needs no assignment.  CaCo's 1
    of 8 epochs at 1 epoch: ``["method.caco.warmup_epochs=0"]``."""
    from caco_tf.config import settings_section

    given = {assignment.split("=", 1)[0].strip() for assignment in written}
    length = declared["train"]["epochs"]
    scaled = []
    for section in dict.fromkeys(settings_section(method) for method in methods):
        key = f"method.{section}.warmup_epochs"
        warmup = declared["method"][section].get("warmup_epochs", 0)
        if not warmup or key in given:
            continue
        nearest = (2 * warmup * epochs + length) // (2 * length)  # round half up, exactly
        value = min(nearest, epochs - 1)
        if value != warmup:
            scaled.append(f"{key}={value}")
    return scaled


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
