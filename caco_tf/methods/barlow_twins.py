"""Barlow Twins: the two views' cross-correlation driven to the identity."""

import keras

from caco_tf import losses
from caco_tf.methods.bank_warmup import BankWarmup, warmup_settings
from caco_tf.methods.base import Method
from caco_tf.training import distribute
from caco_tf.settings import Setting, number


@keras.saving.register_keras_serializable(package="caco_tf")
class BarlowTwins(Method):
    """Barlow Twins (Zbontar et al. 2021), as facebookresearch/barlowtwins does it.

    The two views' projections, each standardized over the global batch, give the
    cross-correlation C = ẑ¹ᵀẑ²/B (summed over replicas); the loss Σ_i (1 - C_ii)² +
    λ Σ_{i≠j} C_ij², λ 0.0051 (main.py:207-221, ``--lambd``).  Projector: three Linear layers
    without bias, BatchNorm and ReLU after the first two, 8,192 wide (main.py:195-202).  No
    teacher, no state; the loss is not scaled (the code since 2021-06: ``--lambd 0.0051``).
    """

    method = "barlow_twins"
    SETTINGS = {
        "redundancy_weight": Setting(
            0.0051, number(0.0), "lambda, the weight of the off-diagonal terms (about 40 / D "
            "for a D-dimensional projection)", tiny=0.05,
            search=(0.0051, 0.02, 0.05)),
        **warmup_settings(epochs=0, own_bank=False, own_keys=False),
    }
    WARMUP = BankWarmup
    DOCS_ROW = {"state": "–", "global batch": "standardization, cross-correlation",
                "paper": "not in the paper (73.2, its authors')",
                "name": "Barlow Twins",
                "towards": "an identity cross-correlation between the two views",
                "negatives": "none (decorrelation)"}
    PROJECTOR = dict(layers_count=3)
    # The D x D matrix it estimates from the global batch: from no more images than D it is
    # rank-deficient, which caco_tf.build.plan_run warns of at start.
    BATCH_MATRIX = "cross-correlation"

    def method_loss(self, outputs, targets, step):
        return losses.barlow_twins_loss(outputs[0], outputs[1], self.redundancy_weight,
                                        distribute.global_sum), {}
