"""NNCLR: the positive is the nearest neighbour of the projection in a support set."""

import keras
import tensorflow as tf

from caco_tf import losses
from caco_tf.methods.bank_warmup import BankWarmup, warmup_settings
from caco_tf.methods.base import Method
from caco_tf.methods.state import Queue
from caco_tf.nets.backbones import build_mlp
from caco_tf.training import distribute
from caco_tf.settings import Setting, integer, number


@keras.saving.register_keras_serializable(package="caco_tf")
class NNCLR(Method):
    """With a Little Help from My Friends (Dwibedi et al. 2021); no official code: as
    solo-learn (solo/methods/nnclr.py, solo/losses/nnclr.py) and the paper's text.

    Each view's unit projection ẑ looks up its nearest neighbour NN(ẑ) in a support set Q (a
    FIFO queue of past view-1 projections); NN(ẑ¹) is contrasted with the other view's
    predictions p² of the global batch (cross-entropy over n̂·p̂ᵀ/τ, the own image's the
    positive), symmetrized: ½ ℓ(NN(ẑ¹), p²) + ½ ℓ(NN(ẑ²), p¹).  Projector: three Linear layers,
    each followed by BatchNorm, ReLU except after the last (2,048, output 256); predictor:
    Linear → BatchNorm → ReLU → Linear, 4,096 wide (the paper, quoted by lightly's heads.py);
    τ 0.1, support set 98,304 (the paper; unverified, no official code).
    """

    method = "nnclr"
    SETTINGS = {
        "temperature": Setting(0.1, number(0.0, low_open=True), "tau of the loss",
                               search=(0.05, 0.1, 0.2)),
        "queue_size": Setting(98304, integer(1), "the support set's rows", trained=True,
                              tiny=32, rows=True),
        "predictor_hidden": Setting(4096, integer(1), "the predictor's hidden width",
                                    trained=True, tiny=16),
        **warmup_settings(epochs=0, own_bank=False, own_keys=False),
    }
    WARMUP = BankWarmup
    HEADS = ("predictor",)
    DOCS_ROW = {"state": "support set", "global batch": "the predictions, the queue's writes",
                "paper": "70.7 (200 ep, b4096); 72.9 / 74.9 (800 ep, b1024/4096); "
                         "75.6 (multi-crop)",
                "name": "NNCLR",
                "towards": "the nearest neighbour of its projection in a support-set queue",
                "negatives": "the batch's other predictions",
                "summary": "the nearest neighbour of its projection in a support set"}
    PROJECTOR = dict(layers_count=3, last_batchnorm="affine")

    def build_heads(self):
        self.predictor = build_mlp(self.embedding_dim, self.predictor_hidden,
                                   self.embedding_dim, layers_count=2, bias=True,
                                   sync_batchnorm=self.sync_batchnorm, name="predictor")

    def build_state(self):
        self.support_set = Queue(self.queue_size, self.embedding_dim, random=True,
                                 name="support_set")

    def forward(self, crops, training):
        return [{"projection": z, "prediction": self.predictor(z, training=training)}
                for z in super().forward(crops, training)]

    def method_loss(self, outputs, targets, step):
        support = losses.l2_normalize(self.support_set.read())
        neighbour1, neighbour2 = (losses.nearest_neighbours(embedding, support)
                                  for embedding in self.view_embeddings(outputs))
        return 0.5 * (self._contrast(neighbour1, outputs[1]["prediction"])
                      + self._contrast(neighbour2, outputs[0]["prediction"])), {}

    def _contrast(self, neighbours, predictions):
        return tf.reduce_mean(losses.nnclr_loss(
            neighbours, distribute.all_gather(predictions), self.temperature,
            offset=distribute.replica_offset(tf.shape(neighbours)[0])))

    def update_state(self, outputs, targets, step):
        self.support_set.enqueue(self.view_embeddings(outputs)[0])
