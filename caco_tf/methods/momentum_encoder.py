"""The student's embedding network and the momentum (teacher) encoder that follows it.

The embedding network is backbone → projector → L2 normalization (φ_θ of the CaCo paper, the
space of every bank, queue and health measure).  A teacher is a copy of that chain, ending in
the heads the teacher shares with the student (DINO's last layer), whose parameters follow the
student's by an EMA.
"""

import keras

from caco_tf.training import distribute
from caco_tf.training.optimizers import as_schedule


def build_encoder(backbone, projector, name, heads=()):
    """backbone → projector → L2 normalization (→ heads): the query/key encoder φ_θ."""
    return keras.Model(*_encoder_graph(backbone, projector, heads), name=name)


UNIT_LAYER = "l2_normalize"  # the embedding network's last layer: the unit projection


def _encoder_graph(backbone, projector, heads=()):
    inputs = keras.Input(backbone.input_shape[1:])
    # float32 whatever the policy: the embedding feeds the bank's logits, softmax and loss.
    outputs = keras.layers.UnitNormalization(name=UNIT_LAYER, dtype="float32")(
        projector(backbone(inputs)))
    for head in heads:
        outputs = head(outputs)
    return inputs, outputs


class MomentumEncoder(keras.Model):
    """The teacher: a structural copy of the student's chain whose parameters follow it.

    Its parameters start equal to the student's and move towards them by an EMA after every
    step (``follow``); its BatchNorm statistics are its own, as in the references (CaCo, BYOL,
    MoCo v3, DINO), which run it in training mode.  ``sync`` copies the student outright (after
    the warm-up).  A functional model: the same layers, names and saved layout as the chain.
    """

    def __init__(self, backbone, projector, momentum=0.99, name="key_encoder", heads=()):
        super().__init__(*_encoder_graph(backbone, projector, heads), name=name)
        self.momentum = as_schedule(momentum)  # m, a float or a schedule of the step

    # Its layers: the input, the backbone, the projector, the L2 normalization, the heads.
    @property
    def backbone(self):
        """The teacher's copy of the student's backbone (what its authors evaluate)."""
        return self.layers[1]

    @property
    def projector(self):
        """The teacher's copy of the student's projector."""
        return self.layers[2]

    @classmethod
    def following(cls, student, backbone, projector, momentum=0.99, heads=()):
        """A teacher built from copies of ``backbone``, ``projector`` and ``heads``, equal to
        the student's chain: ``student``, the embedding network then the heads (their weights,
        BatchNorm statistics included, in the teacher's order)."""
        encoder = cls(keras.models.clone_model(backbone, clone_function=_teacher_layer),
                      keras.models.clone_model(projector), momentum,
                      heads=[_copy_layer(head) for head in heads])
        encoder.set_weights([w for part in student for w in part.get_weights()])
        return encoder

    def follow(self, student_variables, step):
        """θ_t ← m θ_t + (1 - m) θ_s for every parameter (not the BatchNorm statistics), with
        the momentum of ``step``."""
        momentum = self.momentum(step)
        teacher = self.trainable_variables
        distribute.assign_in_sync(
            teacher, [momentum * t + (1.0 - momentum) * s
                      for t, s in zip(teacher, student_variables)])

    def sync(self, student_variables):
        """θ_t ← θ_s for every parameter."""
        for teacher, student in zip(self.trainable_variables, student_variables):
            teacher.assign(student)


def _teacher_layer(layer):
    """A copy of a backbone's layer for the teacher, without stochastic depth (DINO's and
    MoCo v3's teachers are built with drop_path_rate 0)."""
    config = layer.get_config()
    if "drop_path" in config:
        config["drop_path"] = 0.0
    return layer.__class__.from_config(config)


def _copy_layer(layer):
    """A new layer of ``layer``'s class and configuration (its own, unbuilt variables)."""
    return layer.__class__.from_config(layer.get_config())
