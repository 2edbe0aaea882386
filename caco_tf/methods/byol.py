"""BYOL: the student predicts the target network's projection of the other view."""

import keras
import tensorflow as tf

from caco_tf import losses
from caco_tf.methods.bank_warmup import BankWarmup, warmup_settings
from caco_tf.methods.base import Method
from caco_tf.nets.backbones import build_mlp
from caco_tf.settings import Setting, integer, number


@keras.saving.register_keras_serializable(package="caco_tf")
class BYOL(Method):
    """Bootstrap Your Own Latent (Grill et al. 2020), as deepmind-research/byol does it.

    The online network (backbone → projector → predictor) regresses the target network's
    projection of the other view, 2 - 2 cos(p¹, z'²) + 2 - 2 cos(p², z'¹) per image, batch
    mean (byol_experiment.py:243-250); the target is an EMA of the online backbone and
    projector, its momentum from 0.996 to 1 on a cosine (schedules.py:20-24, configs/byol.py:23);
    no negatives.  Projector and predictor: Linear → BatchNorm → ReLU → Linear, the last
    without a bias (``with_bias=False``, utils/networks.py:44; the first's bias, cancelled by
    the BatchNorm after it, is left out), 4,096 wide, output 256 (configs/byol.py:40-42).
    """

    method = "byol"
    SETTINGS = {
        "key_momentum": Setting(
            0.996, number(0.0, 1.0), "the target network's EMA momentum at the start (it rises "
            "to 1 on a cosine)", schedule="cosine to 1", tiny=0.9,
            search=(0.99, 0.996, 0.999)),
        "predictor_hidden": Setting(4096, integer(1), "the predictor's hidden width",
                                    trained=True, tiny=16),
        **warmup_settings(epochs=0, own_bank=False),
    }
    WARMUP = BankWarmup
    TEACHER = "momentum"
    HEADS = ("predictor",)
    DOCS_ROW = dict(Method.DOCS_ROW, paper="70.6 (200 ep, b4096); 74.3 (1000 ep)",
                    name="BYOL",
                    towards="the EMA target's projection, through a predictor",
                    negatives="none",
                    summary="an EMA target's projection, through a predictor")
    PROJECTOR = dict(layers_count=2, bias=False)

    def build_heads(self):
        self.predictor = build_mlp(self.embedding_dim, self.predictor_hidden,
                                   self.embedding_dim, layers_count=2, bias=False,
                                   sync_batchnorm=self.sync_batchnorm, name="predictor")

    def forward(self, crops, training):
        return [{"projection": z, "prediction": self.predictor(z, training=training)}
                for z in super().forward(crops, training)]

    def method_loss(self, outputs, targets, step):
        """Each view's prediction regresses the other view's target projection."""
        return (tf.reduce_mean(losses.regression_loss(outputs[0]["prediction"], targets[1]))
                + tf.reduce_mean(losses.regression_loss(outputs[1]["prediction"], targets[0]))
                ), {}
