"""SimCLR: NT-Xent over the two views' query embeddings of the batch; no keys, no bank."""

import keras
import tensorflow as tf

from caco_tf import losses
from caco_tf.methods.base import ContrastiveMethod
from caco_tf.training import distribute


@keras.saving.register_keras_serializable(package="caco_tf")
class SimCLR(ContrastiveMethod):
    """Anchor z¹'s positive is z², the other view's query; its negatives the other 2N-2 queries
    of the global batch.  No key encoder, no bank."""

    method = "simclr"
    uses_bank = False
    uses_key_encoder = False

    def contrastive_loss(self, query1, query2, key1, key2, bank):
        embeddings = tf.concat([query1, query2], axis=0)
        per_anchor = losses.nt_xent_loss(
            embeddings, self.temperature, distribute.all_gather(embeddings),
            offset=distribute.replica_offset(tf.shape(embeddings)[0]))
        count = tf.shape(query1)[0]
        return tf.reduce_mean(per_anchor[:count]) + tf.reduce_mean(per_anchor[count:])
