"""SimCLR: NT-Xent over the two views' query embeddings of the batch; no keys, no bank."""

import keras
import tensorflow as tf

from caco_tf import losses
from caco_tf.methods.bank_warmup import warmup_settings
from caco_tf.methods.contrastive import ContrastiveMethod
from caco_tf.training import distribute
from caco_tf.settings import Setting, number


@keras.saving.register_keras_serializable(package="caco_tf")
class SimCLR(ContrastiveMethod):
    """Anchor z¹'s positive is z², the other view's query; its negatives the other 2N-2 queries
    of the global batch.  No key encoder, no bank.

    Defaults: SimCLR's ImageNet recipe (google-research/simclr ``--temperature 0.1`` at batch
    4,096).
    """

    method = "simclr"
    SETTINGS = {
        "temperature": Setting(0.1, number(0.0, low_open=True), "tau of NT-Xent",
                               search=(0.05, 0.1, 0.2)),
        **warmup_settings(epochs=0, own_bank=False, own_keys=False),
    }
    TEACHER = None
    DOCS_ROW = {"state": "–", "global batch": "NT-Xent's negatives",
                "paper": "61.9 (200 ep, b256); 69.3 (800 ep, b4096)",
                "name": "SimCLR",
                "towards": "the other view's query (NT-Xent)",
                "negatives": "the batch's other 2N-2 queries",
                "summary": "the other view's query against the batch's other queries"}

    def contrastive_loss(self, query1, query2, key1, key2, bank):
        embeddings = tf.concat([query1, query2], axis=0)
        per_anchor = losses.nt_xent_loss(
            embeddings, self.temperature, distribute.all_gather(embeddings),
            offset=distribute.replica_offset(tf.shape(embeddings)[0]))
        count = tf.shape(query1)[0]
        return tf.reduce_mean(per_anchor[:count]) + tf.reduce_mean(per_anchor[count:])
