"""The paper's ablation (Table positive_nega) and two baselines, as ``CaCo`` subclasses.

``caco.method`` picks the class (``model_class``); everything else (encoders, optimizer and
schedules, views, bank size, τ, key-encoder EMA, warm-up) is the run's configuration, so the
rows differ only in where a query's positive and negatives come from.  For the query z¹ of
view 1 (view 2 is symmetric; k is the momentum encoder's key, "batch" the global batch):

========  ================================  ============================  ==================
method    positive                          negatives                     bank
========  ================================  ============================  ==================
none      k² of the same image              the batch's other keys k²_j   unused
positive  k²'s nearest neighbour in queue   the batch's other keys k²_j   FIFO queue of k¹
negative  k² of the same image              every bank row                adversarial (AdCo)
caco      the MPP of k² in the bank         the other bank rows           co-op.-adversarial
moco_v2   k² of the same image              every queue row               FIFO queue of k¹
simclr    z² (the other view's query)       the other 2N-2 queries        unused, no keys
========  ================================  ============================  ==================

Methods with a bank keep the MoCo-style warm-up pass that fills it FIFO (``CaCo.warmup_step``);
methods without one skip it and train with their own loss from the first step.  Every loss is
the sum of the two views' batch means, as CaCo's, so one learning rate means the same for all.
"""

import tensorflow as tf

from caco_tf import bank as bank_lib
from caco_tf import config as config_lib
from caco_tf import distribute
from caco_tf import losses
from caco_tf.model import CaCo, _views


class _Ablation(CaCo):
    """A two-view method on CaCo's encoders: subclasses give the loss and the bank's update."""

    method = None
    uses_bank = True         # False: no warm-up pass (nothing to fill), the bank is left alone
    uses_key_encoder = True  # False: no keys, no EMA update (SimCLR)
    learns_bank = False      # True: the bank takes gradient steps (``bank_lr`` is reported)

    def __init__(self, *args, **kwargs):
        if kwargs.get("multi_crop"):
            raise ValueError(f"caco.method {self.method!r} takes two views, not multi-crop")
        super().__init__(*args, **kwargs)
        if not self.uses_bank:
            self.warmup_steps = 0
            self._bank_ready = True

    @property
    def metrics(self):
        # The MPP diagnostics describe CaCo's bank only; the rest (loss, lr, a probe) stay.
        unused = [self.contrast_top1, self.positive_probability, self.distinct_positives]
        if not self.uses_bank:
            unused.append(self.bank_norm)
        if not self.learns_bank:
            unused.append(self.bank_lr_tracker)
        return [m for m in super().metrics if all(m is not u for u in unused)]

    # ------------------------------------------------------------------ what subclasses give
    def contrastive_loss(self, query1, query2, key1, key2, bank):
        """The symmetric loss from the queries, the keys (None without a key encoder) and the
        pre-step bank; it must not change any state (``test_step`` uses it too)."""
        raise NotImplementedError

    def update_bank(self, query1, query2, key1, key2, bank, step):
        """The bank's step after the encoder's; returns the bank learning rate used (0: none)."""
        return tf.constant(0.0)

    # ------------------------------------------------------------------ the steps
    def train_step(self, data):
        view1, view2 = _views(data)
        step = self.optimizer.iterations
        learning_rate = self._encoder_learning_rate()  # this step's, before the update
        key1, key2 = self._method_keys(view1, view2, training=True)
        bank = tf.convert_to_tensor(self.bank)
        loss, query1, query2 = self._encoder_step(
            view1, view2, lambda query1, query2: self.contrastive_loss(
                query1, query2, key1, key2, bank))
        bank_lr = self.update_bank(query1, query2, key1, key2, bank, step)
        if self.uses_key_encoder:
            self._update_key_encoder(step)
        self._track_step(loss, learning_rate, bank_lr)
        self._probe_step(data, view1)
        return distribute.reducible({m.name: m.result() for m in self.metrics})

    def test_step(self, data):
        """The method's loss without any update (encoders in inference mode)."""
        view1, view2 = _views(data)
        key1, key2 = self._method_keys(view1, view2, training=False)
        query1 = self.query_encoder(view1, training=False)
        query2 = self.query_encoder(view2, training=False)
        loss = self.contrastive_loss(query1, query2, key1, key2, tf.convert_to_tensor(self.bank))
        bank_lr = (self.bank_learning_rate(self.optimizer.iterations) if self.learns_bank
                   else tf.constant(0.0))
        self._track_step(loss, self._encoder_learning_rate(), bank_lr)
        self._probe_step(data, view1, learn=False)
        return distribute.reducible({m.name: m.result() for m in self.metrics})

    def _method_keys(self, view1, view2, training):
        if not self.uses_key_encoder:
            return None, None
        return self._keys(view1, view2, training=training)

    def _track_step(self, loss, learning_rate, bank_lr):
        self.loss_tracker.update_state(loss)
        self.lr_tracker.update_state(learning_rate)
        self.bank_lr_tracker.update_state(bank_lr)
        self.bank_norm.update_state(tf.reduce_mean(tf.norm(self.bank, axis=-1)))

    # ------------------------------------------------------------------ shared pieces
    def _batch_loss(self, queries, positives, keys):
        """Mean in-batch InfoNCE of this replica's queries against the global batch's keys."""
        return tf.reduce_mean(losses.batch_infonce_loss(
            queries, positives, distribute.all_gather(keys), self.temperature,
            offset=replica_offset(tf.shape(queries)[0])))

    def _moco_loss(self, query1, query2, key1, key2, bank):
        """The other view's key against every (normalized) bank row, both views."""
        bank_unit = losses.l2_normalize(bank)
        return (tf.reduce_mean(losses.moco_loss(query1, key2, bank_unit, self.temperature))
                + tf.reduce_mean(losses.moco_loss(query2, key1, bank_unit, self.temperature)))

    def _enqueue_keys(self, key1, bank):
        """FIFO write of one key per image of the global batch, as the warm-up pass does."""
        new_bank, new_pointer = bank_lib.enqueue(
            bank, distribute.all_gather(key1), tf.convert_to_tensor(self.bank_pointer))
        distribute.assign_in_sync([self.bank, self.bank_pointer], [new_bank, new_pointer])


class InBatch(_Ablation):
    """"None": positive and negatives from the current batch (the other view's keys)."""

    method = "none"
    uses_bank = False

    def contrastive_loss(self, query1, query2, key1, key2, bank):
        return self._batch_loss(query1, key2, key2) + self._batch_loss(query2, key1, key1)


class NearestNeighbourPositive(_Ablation):
    """"Positive" (NNCLR-like): the positive is the nearest neighbour of the other view's key in
    a FIFO queue of past keys (the bank, never trained); negatives are the batch's keys."""

    method = "positive"

    def contrastive_loss(self, query1, query2, key1, key2, bank):
        queue = losses.l2_normalize(bank)
        return (self._batch_loss(query1, nearest_neighbour(key2, queue), key2)
                + self._batch_loss(query2, nearest_neighbour(key1, queue), key1))

    def update_bank(self, query1, query2, key1, key2, bank, step):
        self._enqueue_keys(key1, bank)
        return tf.constant(0.0)


class AdversarialNegatives(_Ablation):
    """"Negative" (AdCo-like): the positive is the other view's key; the bank holds only
    negatives and ascends the loss (``bank.adversarial_negative_gradient``, with the run's bank
    learning rate, momentum and temperature)."""

    method = "negative"
    learns_bank = True

    def contrastive_loss(self, query1, query2, key1, key2, bank):
        return self._moco_loss(query1, query2, key1, key2, bank)

    def update_bank(self, query1, query2, key1, key2, bank, step):
        gradient = (
            bank_lib.adversarial_negative_gradient(query1, key2, bank, self.bank_temperature)
            + bank_lib.adversarial_negative_gradient(query2, key1, bank, self.bank_temperature))
        return self._bank_step(bank, gradient, step, tf.shape(query1)[0])


class MoCoV2(_Ablation):
    """MoCo v2 (symmetrized): the other view's key against a FIFO queue of past keys."""

    method = "moco_v2"

    def contrastive_loss(self, query1, query2, key1, key2, bank):
        return self._moco_loss(query1, query2, key1, key2, bank)

    def update_bank(self, query1, query2, key1, key2, bank, step):
        self._enqueue_keys(key1, bank)
        return tf.constant(0.0)


class SimCLR(_Ablation):
    """SimCLR: NT-Xent over the 2N query embeddings of the batch; no keys, no bank."""

    method = "simclr"
    uses_bank = False
    uses_key_encoder = False

    def contrastive_loss(self, query1, query2, key1, key2, bank):
        embeddings = tf.concat([query1, query2], axis=0)
        per_anchor = losses.nt_xent_loss(
            embeddings, self.temperature, distribute.all_gather(embeddings),
            offset=replica_offset(tf.shape(embeddings)[0]))
        count = tf.shape(query1)[0]
        return tf.reduce_mean(per_anchor[:count]) + tf.reduce_mean(per_anchor[count:])


METHODS = {"caco": CaCo, "none": InBatch, "positive": NearestNeighbourPositive,
           "negative": AdversarialNegatives, "moco_v2": MoCoV2, "simclr": SimCLR}
assert tuple(METHODS) == config_lib.METHODS  # the config validates names without TensorFlow


def model_class(method):
    """The model class for ``caco.method`` (constructor arguments as ``CaCo``'s)."""
    if method not in METHODS:
        raise config_lib.ConfigError(f"caco.method must be one of {', '.join(METHODS)}, got "
                                     f"{method!r}")
    return METHODS[method]


def nearest_neighbour(keys, queue_unit):
    """The queue row most similar to each key (cosine), [N, D]: NNCLR's support-set lookup.

    It is CaCo's MPP rule (``losses.most_probable_positive``) applied to an untrained queue.
    """
    return tf.gather(queue_unit, losses.most_probable_positive(keys, queue_unit))


def replica_offset(local_count):
    """This replica's first row in a global batch gathered with ``distribute.all_gather``."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return 0
    return tf.cast(context.replica_id_in_sync_group, tf.int32) * tf.cast(local_count, tf.int32)
