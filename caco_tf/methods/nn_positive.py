"""The ablation's "Positive" row (NNCLR-like): a positive from a queue, negatives from the batch."""

import keras
import tensorflow as tf

from caco_tf import losses
from caco_tf.methods.caco import CaCo
from caco_tf.methods.contrastive import ContrastiveMethod


@keras.saving.register_keras_serializable(package="caco_tf")
class NearestNeighbourPositive(ContrastiveMethod):
    """The positive is the nearest neighbour of the other view's key in a FIFO queue of past
    keys (the bank, never trained); the negatives are the global batch's keys.  CaCo's
    ablation row: it reads CaCo's settings."""

    method = "positive"
    SETTINGS, SETTINGS_OF = CaCo.SETTINGS, "caco"  # CaCo's ablation row: its section
    BANK = True
    DOCS_ROW = {"state": "queue of keys", "global batch": "the batch's keys",
                "name": "CaCo's ablation rows",
                "full name": "the paper's Positive row (NNCLR-like)",
                "towards": "nearest neighbour of that key in a FIFO queue of past keys",
                "negatives": "the batch's other keys",
                "summary": "the paper's None, Positive and Negative rows"}

    def contrastive_loss(self, query1, query2, key1, key2, bank):
        queue = losses.l2_normalize(bank)
        return (self._batch_loss(query1, nearest_neighbour(key2, queue), key2)
                + self._batch_loss(query2, nearest_neighbour(key1, queue), key1))

    def update_bank(self, query1, query2, key1, key2, bank, step):
        self.memory_bank.enqueue(key1, bank)


def nearest_neighbour(keys, queue_unit):
    """The queue row most similar to each key (cosine), [N, D]: NNCLR's support-set lookup.

    It is CaCo's MPP rule (``losses.most_probable_positive``) applied to an untrained queue.
    """
    return tf.gather(queue_unit, losses.most_probable_positive(keys, queue_unit))
