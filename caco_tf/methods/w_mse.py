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

    A sub-batch must hold more images than the embedding has dimensions: w centred vectors span
    at most w - 1 of them, so their covariance is singular; shrinking it towards the identity
    (``whitening_epsilon``) lets its Cholesky factor exist, but the whitened sub-batch still
    spans w - 1 dimensions, never an identity covariance.  ``check_batch`` refuses such a
    sub-batch; ``embedding_dim`` gives W-MSE a projection of its own, below
    ``model.embedding_dim``, where a shared budget's batch is too small for that embedding (the
    reference's ``--emb``, half of its w_size on CIFAR: 64 for 128).
    """

    method = "w_mse"
    SETTINGS = {
        "whitening_size": Setting(
            128, integer(2), "images per whitening sub-batch (w_size; it must divide a replica's "
            "batch and exceed the embedding's dimension)", tiny=8),
        "whitening_epsilon": Setting(
            0.0, number(0.0, 1.0, high_open=True), "shrinkage of each sub-batch's covariance "
            "towards the identity before its Cholesky factor (w_eps): stability, not a licence "
            "for sub-batches no larger than the embedding", tiny=0.1, search=(0.01, 0.03, 0.1)),
        "embedding_dim": Setting(
            0, integer(0), "D of W-MSE's own projection, the vectors it whitens (the "
            "reference's --emb; 0: model.embedding_dim): below whitening_size", passed=False,
            trained=True),
        "views": Setting(2, integer(2, 16), "K, equal views of each image, every pair of them "
                         "compared (num_samples: 4 for W-MSE 4)"),
    }
    CROPS = Crops(views="views", local=False)
    DOCS_ROW = {"state": "–", "global batch": "– (a replica's sub-batches are whitened)",
                "paper": "not in the paper",
                "name": "W-MSE",
                "towards": "the other view, both whitened over sub-batches",
                "negatives": "none (whitening)",
                "summary": "the other views (K of them: `method.w_mse.views`), all whitened "
                           "over sub-batches"}
    PROJECTOR = dict(layers_count=2, bias=True)

    @classmethod
    def projector_shape(cls, settings):
        """Its projector, out to its own ``embedding_dim`` when set."""
        own = settings.get("embedding_dim")
        return dict(cls.PROJECTOR, output_dim=own) if own else cls.PROJECTOR

    @classmethod
    def check_batch(cls, settings, replica_batch, embedding_dim):
        size = settings["whitening_size"]
        if replica_batch % size:
            return (f"method.w_mse.whitening_size {size} must divide a replica's batch "
                    f"({replica_batch} images: train.batch_size over the replicas)")
        if size > embedding_dim:
            return None
        named = "method.w_mse.embedding_dim" if settings.get("embedding_dim") else (
            "model.embedding_dim")
        wider = [w for w in range(embedding_dim + 1, replica_batch + 1) if not replica_batch % w]
        own = f"method.w_mse.embedding_dim below {size} (W-MSE's own projection)"
        advice = (f"set method.w_mse.whitening_size {wider[0]} (above {embedding_dim}, dividing "
                  f"a replica's batch of {replica_batch}) or {own}" if wider else
                  f"no sub-batch above {embedding_dim} images divides a replica's batch of "
                  f"{replica_batch}: set {own} or raise train.batch_size")
        return (f"method.w_mse.whitening_size {size} must exceed {named} ({embedding_dim}): "
                f"W-MSE whitens sub-batches of {size} images, whose {embedding_dim}x"
                f"{embedding_dim} covariance is singular (rank {size - 1} at most; "
                f"whitening_epsilon only masks it); {advice}")

    def method_loss(self, outputs, targets, step):
        return losses.w_mse_views_loss(outputs, self.whitening_size,
                                       self.whitening_epsilon), {}
