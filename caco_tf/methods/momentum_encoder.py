"""The query encoder φ_θ and the momentum (key) encoder that follows it."""

import keras

from caco_tf.training import distribute
from caco_tf.training.optimizers import as_schedule


def build_encoder(backbone, projector, name):
    """backbone → projector → L2 normalization: the query/key encoder φ_θ of the paper."""
    return keras.Model(*_encoder_graph(backbone, projector), name=name)


def _encoder_graph(backbone, projector):
    inputs = keras.Input(backbone.input_shape[1:])
    # float32 whatever the policy: the embedding feeds the bank's logits, softmax and loss.
    return inputs, keras.layers.UnitNormalization(name="l2_normalize", dtype="float32")(
        projector(backbone(inputs)))


def features_and_embeddings(encoder, images, training=False):
    """An encoder's backbone features and its embeddings from one pass of the backbone: the
    encoder is the chain that ``_encoder_graph`` makes (input, backbone, projector, norm)."""
    _, backbone, projector, normalize = encoder.layers
    features = backbone(images, training=training)
    return features, normalize(projector(features, training=training))


class MomentumEncoder(keras.Model):
    """The key encoder: a structural copy of the query encoder whose parameters follow it.

    Its parameters start equal to the query encoder's and move towards them by an EMA after
    every step (``follow``); its BatchNorm statistics are its own, as in the reference, which
    runs it in training mode.  ``sync`` copies the query encoder outright (after the warm-up).
    A functional model: the same layers, names and saved layout as the query encoder.
    """

    def __init__(self, backbone, projector, momentum=0.99, name="key_encoder"):
        super().__init__(*_encoder_graph(backbone, projector), name=name)
        self.momentum = as_schedule(momentum)  # m, a float or a schedule of the step

    @classmethod
    def following(cls, query_encoder, backbone, projector, momentum=0.99):
        """A key encoder built from copies of ``backbone`` and ``projector``, equal to
        ``query_encoder`` (built on them)."""
        encoder = cls(keras.models.clone_model(backbone), keras.models.clone_model(projector),
                      momentum)
        encoder.set_weights(query_encoder.get_weights())
        return encoder

    def follow(self, query_encoder, step):
        """θ_k ← m θ_k + (1 - m) θ_q for every parameter (not the BatchNorm statistics), with
        the momentum of ``step``."""
        momentum = self.momentum(step)
        keys, queries = self.trainable_variables, query_encoder.trainable_variables
        distribute.assign_in_sync(
            keys, [momentum * k + (1.0 - momentum) * q for k, q in zip(keys, queries)])

    def sync(self, query_encoder):
        """θ_k ← θ_q."""
        for key, query in zip(self.trainable_variables, query_encoder.trainable_variables):
            key.assign(query)
