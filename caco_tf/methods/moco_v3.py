"""MoCo v3, ResNet variant: a predictor on the query, the other view's keys over the batch."""

import keras
import tensorflow as tf

from caco_tf import losses
from caco_tf.methods.bank_warmup import BankWarmup, warmup_settings
from caco_tf.methods.base import Method
from caco_tf.nets.backbones import build_mlp
from caco_tf.training import distribute
from caco_tf.settings import Setting, integer, number


@keras.saving.register_keras_serializable(package="caco_tf")
class MoCoV3(Method):
    """An Empirical Study of Training Self-Supervised Vision Transformers (Chen, Xie & He
    2021), the ResNet-50 variant of facebookresearch/moco-v3.

    q = predictor(projector(backbone(x))) against the momentum encoder's keys k of the other
    view over the whole global batch (no queue): ctr(q¹, k²) + ctr(q², k¹), ctr the
    cross-entropy of q̂·k̂ᵀ/τ times 2τ (builder.py:63-96), τ = 1.0 for ResNet-50
    (main_moco.py ``--moco-t``); the momentum encoder (backbone + projector) follows by EMA from
    0.99 to 1 on a cosine (``--moco-m 0.99 --moco-m-cos``).  Projector: Linear → BatchNorm →
    ReLU → Linear → BatchNorm without scale or shift, 4,096 wide, output 256; predictor the
    same without the last BatchNorm (builder.py:36-52, :105-109).
    """

    method = "moco_v3"
    SETTINGS = {
        "temperature": Setting(1.0, number(0.0, low_open=True), "tau of the loss", tiny=0.5,
                               search=(0.2, 0.5, 1.0)),
        "key_momentum": Setting(
            0.99, number(0.0, 1.0), "the momentum encoder's EMA momentum at the start (it "
            "rises to 1 on a cosine)", schedule="cosine to 1", tiny=0.9),
        "predictor_hidden": Setting(4096, integer(1), "the predictor's hidden width",
                                    trained=True, tiny=16),
        # builder.py's MoCo_ViT: 3 projector layers (the ResNet's 2: MoCo_ResNet).
        "projector_layers": Setting(
            2, integer(2, 3), "the projector's Linear layers: 2 (ResNet-50's) or 3 (ViT's)",
            trained=True, passed=False),
        **warmup_settings(epochs=0, own_bank=False),
    }
    WARMUP = BankWarmup
    TEACHER = "momentum"
    HEADS = ("predictor",)
    DOCS_ROW = {"state": "–", "global batch": "the keys",
                "paper": "74.6 (1000 ep, b4096)",
                "name": "MoCo v3",
                "towards": "the other view's key, through a predictor",
                "negatives": "the batch's other keys",
                "summary": "the other view's key against the batch's, through a predictor"}
    PROJECTOR = dict(layers_count=2, last_batchnorm="plain")

    @classmethod
    def projector_shape(cls, settings):
        return dict(cls.PROJECTOR, layers_count=settings["projector_layers"])

    def build_heads(self):
        self.predictor = build_mlp(self.embedding_dim, self.predictor_hidden,
                                   self.embedding_dim, layers_count=2,
                                   sync_batchnorm=self.sync_batchnorm, name="predictor")

    def forward(self, crops, training):
        return [{"projection": z, "query": self.predictor(z, training=training)}
                for z in super().forward(crops, training)]

    def method_loss(self, outputs, targets, step):
        """Each view's query against the other view's keys of the global batch."""
        return self._ctr(outputs[0]["query"], targets[1]) + self._ctr(
            outputs[1]["query"], targets[0]), {}

    def _ctr(self, queries, keys):
        return tf.reduce_mean(losses.moco_v3_loss(
            queries, distribute.all_gather(keys), self.temperature,
            offset=distribute.replica_offset(tf.shape(queries)[0])))
