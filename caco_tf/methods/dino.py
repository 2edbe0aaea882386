"""DINO, ResNet variant: the student matches the teacher's centered, sharpened output."""

import math

import keras
import tensorflow as tf

from caco_tf import losses
from caco_tf.methods.base import Crops, Method
from caco_tf.methods.state import RunningMean
from caco_tf.nets.layers import NormalizedDense
from caco_tf.settings import Setting, boolean, integer, number
from caco_tf.training.optimizers import as_schedule


@keras.saving.register_keras_serializable(package="caco_tf")
class DINO(Method):
    """Self-distillation with no labels (Caron et al. 2021), the ResNet-50 variant of
    facebookresearch/dino.

    Student and teacher end in DINO's head: an MLP (Linear, GELU, no BatchNorm: 2,048 wide,
    bottleneck 256, the projector here), L2 normalization, then a weight-normalized Linear to
    K = 65,536 outputs (vision_transformer.py:257-291, ``norm_last_layer``).  The teacher, an
    EMA of the student (0.996 to 1 on a cosine), sees the two global crops; the student every
    crop; the loss is the mean over the pairs (teacher crop i, student crop v ≠ i) of the
    cross-entropy between softmax((t_i - c)/τ_t) and softmax(s_v/τ_s), τ_s 0.1, τ_t 0.04
    (the README's ResNet-50 recipe; DINO's ViT recipe warms it from 0.04 to 0.07 over 30
    epochs: a schedule here); the center c follows the teacher's batch mean over the global
    batch with momentum 0.9 (main_dino.py:363-416); the last layer is frozen during the first
    epoch (``--freeze_last_layer 1``).  DINO's per-tensor gradient clipping is not applied.
    """

    method = "dino"
    SETTINGS = {
        "out_dim": Setting(65536, integer(1), "K, the head's outputs", trained=True, tiny=32),
        "student_temperature": Setting(0.1, number(0.0, low_open=True), "tau of the student"),
        "teacher_temperature": Setting(
            0.04, number(0.0, low_open=True), "tau of the teacher (above ~0.07 training is "
            "unstable: its output goes uniform)", schedule="constant", tiny=0.05,
            search=(0.04, 0.055, 0.07)),
        "center_momentum": Setting(
            0.9, number(0.0, 1.0, high_open=True), "the center's EMA momentum"),
        "key_momentum": Setting(
            0.996, number(0.0, 1.0), "the teacher's EMA momentum at the start (it rises to 1 "
            "on a cosine)", schedule="cosine to 1", tiny=0.9),
        "freeze_last_layer_epochs": Setting(
            1.0, number(0.0), "epochs the last layer stays as initialized",
            in_steps="freeze_last_layer_steps"),
        "head_batchnorm": Setting(
            False, boolean(), "BatchNorm in the head's hidden layers (DINO's --use_bn_in_head)",
            passed=False),
    }
    TEACHER = "momentum"
    HEADS = TEACHER_HEADS = ("last_layer",)
    CROPS = Crops(views=2, local=True)
    DOCS_ROW = {"state": "center", "global batch": "the center",
                "paper": "75.3 (multi-crop, 800 ep)",
                "name": "DINO",
                "towards": "the EMA teacher's centered, sharpened output",
                "negatives": "none (centering)",
                "summary": "an EMA teacher's centered, sharpened output",
                "collapse": "the teacher's output is uniform: `teacher_entropy` above 98 % of "
                            "ln K, from the fourth epoch after the last layer thaws"}
    PROJECTOR = dict(layers_count=3, bias=True, hidden_batchnorm=False, activation="gelu")
    DIAGNOSTICS = ("teacher_entropy",)
    COLLAPSE_ADVICE = ("lower method.dino.teacher_temperature (0.04; above ~0.07 the teacher "
                       "goes uniform), or freeze the last layer longer "
                       "(method.dino.freeze_last_layer_epochs)")

    @classmethod
    def projector_shape(cls, settings):
        return dict(cls.PROJECTOR, hidden_batchnorm=settings["head_batchnorm"])

    def build_heads(self):
        self.last_layer = NormalizedDense(self.out_dim, name="last_layer")
        self.last_layer.build((None, self.embedding_dim))

    def build_state(self):
        self.center = RunningMean(self.out_dim, self.center_momentum)

    def frozen_until(self):
        return {"last_layer": self.freeze_last_layer_steps}

    def targets(self, crops, training):
        """The teacher's outputs for the two global crops (one pass, as the reference)."""
        return self._forward_by_resolution(crops[:2], self.key_encoder, training)

    def forward(self, crops, training):
        embeddings = self._forward_by_resolution(crops, self.query_encoder, training)
        # Every crop through the last layer in one call: its [D, K] kernel normalized once.
        logits = tf.split(self.last_layer(tf.concat(embeddings, 0)), len(embeddings))
        return [{"embedding": z, "logits": s} for z, s in zip(embeddings, logits)]

    def method_loss(self, outputs, targets, step):
        """The mean cross-entropy over the (teacher crop, other student crop) pairs."""
        teacher_temperature = as_schedule(self.teacher_temperature)(step)
        center = self.center.read()
        teachers = [losses.dino_teacher(t, center, teacher_temperature) for t in targets]
        loss = losses.dino_loss(teachers, [output["logits"] for output in outputs],
                                self.student_temperature)
        probabilities = tf.concat(teachers, 0)
        entropy = -tf.reduce_mean(tf.reduce_sum(
            probabilities * tf.math.log(probabilities + 1e-12), axis=-1))
        return loss, {"teacher_entropy": entropy}

    def update_state(self, outputs, targets, step):
        self.center.update(tf.concat(targets, 0))

    def view_embeddings(self, outputs):
        return outputs[0]["embedding"], outputs[1]["embedding"]

    def judged(self, epoch):
        """From the fourth epoch after the last layer thaws: the teacher starts uniform."""
        return epoch.done * epoch.steps >= self.freeze_last_layer_steps + 4 * epoch.steps

    def collapse(self, logs, epoch):
        entropy, uniform = float(logs.get("teacher_entropy", 0.0)), math.log(self.out_dim)
        if entropy > UNIFORM * uniform:
            return (f"the teacher's output is uniform (entropy {entropy:.3f} of ln K = "
                    f"{uniform:.3f})")
        return None


UNIFORM = 0.98  # of ln K: a teacher that no longer tells the images apart
