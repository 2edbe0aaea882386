"""MoCo v2 (symmetrized): the other view's key against a FIFO queue of past keys."""

import keras
import tensorflow as tf

from caco_tf.methods.base import ContrastiveMethod


@keras.saving.register_keras_serializable(package="caco_tf")
class MoCoV2(ContrastiveMethod):
    """Query z¹'s positive is the other view's key k²; its negatives every row of a FIFO queue
    of past view-1 keys (the bank, written after each step and never trained)."""

    method = "moco_v2"

    def contrastive_loss(self, query1, query2, key1, key2, bank):
        return self._moco_loss(query1, query2, key1, key2, bank)

    def update_bank(self, query1, query2, key1, key2, bank, step):
        self.memory_bank.enqueue(key1, bank)
        return tf.constant(0.0)
