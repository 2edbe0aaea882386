"""VICReg: invariance between the views, variance and decorrelation within each."""

import keras

from caco_tf import losses
from caco_tf.methods.bank_warmup import BankWarmup, warmup_settings
from caco_tf.methods.base import Method
from caco_tf.training import distribute
from caco_tf.settings import Setting, number


@keras.saving.register_keras_serializable(package="caco_tf")
class VICReg(Method):
    """Variance-Invariance-Covariance Regularization (Bardes, Ponce & LeCun 2022), as
    facebookresearch/vicreg does it.

    λ·MSE(z¹, z²) on this replica's rows + μ·variance + ν·covariance over the global batch
    (gathered with gradient): variance ½ Σ_views mean_d relu(1 - √(Var z_d + 1e-4)),
    covariance Σ_views Σ_{i≠j} Cov(z)_ij² / D, with λ, μ, ν = 25, 25, 1
    (main_vicreg.py:194-220).  Expander: three Linear layers, BatchNorm and ReLU after the
    first two, 8,192 wide (main_vicreg.py:223-232).
    """

    method = "vicreg"
    SETTINGS = {
        "invariance_weight": Setting(25.0, number(0.0), "lambda, the invariance term's weight",
                                     search=(10.0, 25.0, 50.0)),
        "variance_weight": Setting(25.0, number(0.0), "mu, the variance term's weight"),
        "covariance_weight": Setting(1.0, number(0.0), "nu, the covariance term's weight"),
        **warmup_settings(epochs=0, own_bank=False, own_keys=False),
    }
    WARMUP = BankWarmup
    DOCS_ROW = {"state": "–", "global batch": "variance, covariance",
                "paper": "not in the paper (73.2, its authors')",
                "name": "VICReg",
                "towards": "invariance, with variance and covariance terms",
                "negatives": "none (variance)"}
    PROJECTOR = dict(layers_count=3)
    # The D x D matrix it estimates from the global batch: from no more images than D it is
    # rank-deficient, which caco_tf.build.plan_run warns of at start.
    BATCH_MATRIX = "covariance"

    def method_loss(self, outputs, targets, step):
        return losses.vicreg_loss(outputs[0], outputs[1], self.invariance_weight,
                                  self.variance_weight, self.covariance_weight,
                                  distribute.all_gather), {}
