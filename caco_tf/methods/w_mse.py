"""W-MSE: each view's embeddings whitened, then the two views pulled together."""

import keras

from caco_tf import losses
from caco_tf.methods.base import Crops, Method
from caco_tf.settings import Setting, integer, number


@keras.saving.register_keras_serializable(package="caco_tf")
class WMSE(Method):
    """Whitening MSE (Ermolov, Siarohin, Sangineto & Sebe, ICML 2021), as htdt/self-supervised
    does it (methods/w_mse.py, methods/whitening.py) with one whitening per step (w_iter 1):
    each view's projections split into sub-batches of ``whitening_size`` images, each
    sub-batch whitened (Cholesky: zero mean, identity covariance), then 2 - 2 cos between two
    views' whitened vectors, averaged over the images and over every pair of the ``views``
    equal views of each image (num_samples: 2, or 4 for the paper's W-MSE 4).

    No negatives and no teacher: the whitening itself keeps the embeddings from collapsing
    (a whitened batch cannot sit at one point).  The sub-batches are a replica's consecutive
    images (the batch is already shuffled), so one replica and R replicas take the same step
    when ``whitening_size`` divides every replica's batch; the reference's random regrouping
    serves only its w_iter > 1.  Head: Linear → BatchNorm → ReLU → Linear (with biases, as
    ``nn.Linear``'s), its authors' 1,024 wide and 64 (CIFAR) or 128 (ImageNet-100) out.
    """

    method = "w_mse"
    SETTINGS = {
        "whitening_size": Setting(
            128, integer(2), "images per whitening sub-batch (w_size; it must divide a replica's "
            "batch and exceed model.embedding_dim)", tiny=8),
        "whitening_epsilon": Setting(
            0.0, number(0.0, 1.0, high_open=True), "shrinkage of each sub-batch's covariance "
            "towards the identity before its Cholesky factor (w_eps)", tiny=0.1,
            search=(0.01, 0.03, 0.1)),  # above 0: any sub-batch's covariance inverts
        "views": Setting(2, integer(2, 16), "K, equal views of each image, every pair of them "
                         "compared (num_samples: 4 for W-MSE 4)"),
    }
    CROPS = Crops(views="views", local=False)
    DOCS_ROW = {"state": "–", "global batch": "– (a replica's sub-batches are whitened)",
                "paper": "not in the paper"}
    PROJECTOR = dict(layers_count=2, bias=True)

    @classmethod
    def check_batch(cls, settings, replica_batch, embedding_dim):
        size = settings["whitening_size"]
        if replica_batch % size:
            return (f"method.w_mse.whitening_size {size} must divide a replica's batch "
                    f"({replica_batch} images: train.batch_size over the replicas)")
        if size <= embedding_dim and not settings["whitening_epsilon"]:
            return (f"method.w_mse.whitening_size {size} must exceed model.embedding_dim "
                    f"({embedding_dim}) for a sub-batch's covariance to be invertible, or set "
                    f"method.w_mse.whitening_epsilon above 0")
        return None

    def method_loss(self, outputs, targets, step):
        return losses.w_mse_views_loss(outputs, self.whitening_size,
                                       self.whitening_epsilon), {}
