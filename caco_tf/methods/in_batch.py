"""The ablation's "None" row: positive and negatives from the current batch (no bank)."""

import keras

from caco_tf.methods.caco import CaCo
from caco_tf.methods.contrastive import ContrastiveMethod


@keras.saving.register_keras_serializable(package="caco_tf")
class InBatch(ContrastiveMethod):
    """In-batch InfoNCE with a momentum key encoder: query z¹'s positive is the other view's key
    k² of the same image, its negatives the other images' keys k²_j of the global batch.  CaCo's
    ablation row: it reads CaCo's settings."""

    method = "none"
    SETTINGS, SETTINGS_OF = CaCo.SETTINGS, "caco"  # CaCo's ablation row: its section
    DOCS_ROW = {"state": "–", "global batch": "the batch's keys",
                "name": "CaCo's ablation rows",
                "full name": "the paper's None row",
                "towards": "the other view's key",
                "negatives": "the batch's other keys",
                "summary": "the paper's None, Positive and Negative rows"}

    def contrastive_loss(self, query1, query2, key1, key2, bank):
        return self._batch_loss(query1, key2, key2) + self._batch_loss(query2, key1, key1)
