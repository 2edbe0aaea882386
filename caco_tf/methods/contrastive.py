"""The InfoNCE family: CaCo, its ablation rows (none, positive, negative), MoCo v2 and SimCLR.

Queries z come from the embedding network and keys k from the key encoder; each view's query is
contrasted with the other view's key, so queries are stacked [z¹; z²] against keys [k²; k¹].
A method of the family gives ``contrastive_loss(query1, query2, key1, key2, bank)``: the
symmetric loss (the sum of the two views' batch means) from the queries, the keys (None without
a key encoder) and the pre-step bank (None without one); and, if it writes its bank,
``update_bank``.  Every loss is such a sum, so one learning rate means the same for all.
"""

import keras
import tensorflow as tf

from caco_tf import losses
from caco_tf.methods.bank_warmup import BankWarmup
from caco_tf.methods.base import Method
from caco_tf.methods.memory_bank import MemoryBank
from caco_tf.training import distribute


class ContrastiveMethod(Method):
    """The family's step over ``Method``'s; see the module docstring.

    ``BANK``: the method holds a bank (``memory_bank``) of ``bank_size`` rows, which its loss
    reads; ``LEARNS_BANK``: the bank takes gradient steps (its learning rate is reported).
    """

    TEACHER = "momentum"
    WARMUP = BankWarmup            # CaCo's first epoch (the reference's), the others' if asked
    TEACHER_NAME = "key encoder"  # the paper's name for the family's momentum teacher
    BANK = False
    LEARNS_BANK = False

    def build_state(self):
        if self.BANK:
            self.memory_bank = MemoryBank(self.bank_size, self.embedding_dim,
                                          getattr(self, "bank_learning_rate", 0.0),
                                          getattr(self, "bank_momentum", 0.9))

    def _create_method_trackers(self):
        self.bank_norm = keras.metrics.Mean(name="bank_norm")
        self.bank_lr_tracker = keras.metrics.Mean(name="bank_lr")

    def method_metrics(self):
        return ([self.bank_norm] if self.BANK else []) + (
            [self.bank_lr_tracker] if self.LEARNS_BANK else [])

    # ------------------------------------------------------------------ the hooks
    def targets(self, crops, training):
        """Keys [k²; k¹] (None without a key encoder)."""
        if self.TEACHER != "momentum":
            return None
        key1 = self.key_encoder(crops[0], training=training)
        key2 = self.key_encoder(crops[1], training=training)
        return tf.concat([key2, key1], 0)

    def forward(self, crops, training):
        """Queries [z¹; z²]."""
        return tf.concat([self.query_encoder(crops[0], training=training),
                          self.query_encoder(crops[1], training=training)], 0)

    def method_loss(self, queries, keys, step):
        bank = self.memory_bank.read() if self.BANK else None
        return self.contrastive_loss(*_split(queries, keys), bank), {}

    def update_state(self, queries, keys, step):
        bank = self.memory_bank.read() if self.BANK else None
        bank_lr = self.update_bank(*_split(queries, keys), bank, step)
        return {} if bank_lr is None else {"bank_lr": bank_lr}

    def view_embeddings(self, queries):
        return tf.split(queries, 2)

    def track_diagnostics(self, diagnostics):
        if self.BANK:
            self.bank_norm.update_state(self.memory_bank.mean_row_norm())
        self.bank_lr_tracker.update_state(diagnostics.get("bank_lr", 0.0))

    # ------------------------------------------------------------------ what a member gives
    def contrastive_loss(self, query1, query2, key1, key2, bank):
        """The symmetric loss; it must not change any state."""
        raise NotImplementedError

    def update_bank(self, query1, query2, key1, key2, bank, step):
        """The bank's step from the pre-step ``bank``; returns its learning rate, or None."""
        return None

    # ------------------------------------------------------------------ shared losses
    def _batch_loss(self, queries, positives, keys):
        """Mean in-batch InfoNCE of this replica's queries against the global batch's keys."""
        return tf.reduce_mean(losses.batch_infonce_loss(
            queries, positives, distribute.all_gather(keys), self.temperature,
            offset=distribute.replica_offset(tf.shape(queries)[0])))

    def _moco_loss(self, query1, query2, key1, key2, bank):
        """The other view's key against every (normalized) bank row, both views."""
        bank_unit = losses.l2_normalize(bank)
        return (tf.reduce_mean(losses.moco_loss(query1, key2, bank_unit, self.temperature))
                + tf.reduce_mean(losses.moco_loss(query2, key1, bank_unit, self.temperature)))


def _split(queries, keys):
    """(query1, query2, key1, key2) from queries [z¹; z²] and keys [k²; k¹] (or None)."""
    query1, query2 = tf.split(queries, 2)
    key2, key1 = tf.split(keys, 2) if keys is not None else (None, None)
    return query1, query2, key1, key2
