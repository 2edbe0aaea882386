"""SimSiam: BYOL without a momentum encoder, the stop-gradient doing the target's work."""

import keras
import tensorflow as tf

from caco_tf import losses
from caco_tf.methods.bank_warmup import BankWarmup, warmup_settings
from caco_tf.methods.base import Method
from caco_tf.nets.backbones import build_mlp
from caco_tf.settings import Setting, boolean, integer


@keras.saving.register_keras_serializable(package="caco_tf")
class SimSiam(Method):
    """Exploring Simple Siamese Representation Learning (Chen & He 2021), as
    facebookresearch/simsiam does it.

    Each view's prediction p = h(z) is drawn to the other view's projection without gradient:
    -½ cos(p¹, sg(z²)) - ½ cos(p², sg(z¹)) (main_simsiam.py:191, builder.py:61).  Projector:
    three Linear layers, BatchNorm after each, the last without scale or shift
    (builder.py:28-36); predictor: a 512-wide bottleneck, Linear → BatchNorm → ReLU → Linear
    (builder.py:39-42, ``--pred-dim 512``).  ``predictor: false`` drops the predictor, which
    makes SimSiam collapse (its paper's Table 1): the health monitor names it.
    """

    method = "simsiam"
    SETTINGS = {
        "predictor_hidden": Setting(512, integer(1), "the predictor's bottleneck width",
                                    trained=True, tiny=16, search=(64, 128, 512)),
        "predictor": Setting(True, boolean(), "the predictor (without it SimSiam collapses)",
                             trained=True),
        **warmup_settings(epochs=0, own_bank=False, own_keys=False),
    }
    WARMUP = BankWarmup
    DOCS_ROW = dict(Method.DOCS_ROW, teacher="the stop-gradient student",
                    paper="70.0 (200 ep, b256); 71.3 (800 ep)",
                    name="SimSiam",
                    towards="its other view's projection, through a predictor, without "
                            "gradient",
                    negatives="none",
                    summary="its other view's projection without gradient, through a "
                            "predictor",
                    collapse="the projections turn towards one direction: `embedding_std` (the "
                             "mean per-dimension spread of the unit projections, ×√D: 1 when "
                             "they spread evenly) below 0.85 with `uniformity` above −1.0; on "
                             "the digits, 0.92–0.99 and below −1.9 with the predictor, 0.81 and "
                             "−0.69 without it by epoch 4")
    HEADS = ("predictor",)
    PROJECTOR = dict(layers_count=3, last_batchnorm="plain")
    DIAGNOSTICS = ("embedding_std",)
    COLLAPSE_ADVICE = ("keep the predictor (method.simsiam.predictor: true), lower the learning "
                       "rate, or soften the views")

    def build_heads(self):
        self.predictor = build_mlp(
            self.embedding_dim, self.predictor_hidden, self.embedding_dim, layers_count=2,
            bias=True, sync_batchnorm=self.sync_batchnorm, name="predictor") if self.predictor \
            else keras.layers.Identity(name="predictor")

    def forward(self, crops, training):
        return [{"projection": z, "prediction": self.predictor(z, training=training)}
                for z in super().forward(crops, training)]

    def method_loss(self, outputs, targets, step):
        """The stop-gradient student is the teacher: each prediction against the other
        view's projection."""
        first, second = outputs[0], outputs[1]
        loss = 0.5 * (tf.reduce_mean(losses.negative_cosine(first["prediction"],
                                                            second["projection"]))
                      + tf.reduce_mean(losses.negative_cosine(second["prediction"],
                                                              first["projection"])))
        spread = losses.embedding_spread(first["projection"])  # its collapse measure
        return loss, {"embedding_std": tf.stop_gradient(spread)}
