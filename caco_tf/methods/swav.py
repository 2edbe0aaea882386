"""SwAV: each crop predicts the prototype codes that Sinkhorn-Knopp assigns the other crops."""

import math

import keras
import tensorflow as tf

from caco_tf import losses
from caco_tf.methods.base import Crops, Method
from caco_tf.methods.state import Queue
from caco_tf.training import distribute
from caco_tf.settings import Setting, integer, number


@keras.saving.register_keras_serializable(package="caco_tf")
class SwAV(Method):
    """Swapping Assignments between Views (Caron et al. 2020), as facebookresearch/swav does it.

    Every crop's unit embedding ẑ scores the K unit prototypes C, s = ẑ Cᵀ; the two global
    crops' scores give codes q = Sinkhorn(s) over the global batch (ε 0.05, 3 iterations,
    main_swav.py:354-376), and every other crop's scores predict them: the mean over the pairs
    (global crop i, crop v ≠ i) of -Σ_k q_ik log softmax(s_v/τ)_k, τ 0.1 (main_swav.py:287-315).
    The prototypes are renormalized after every step and frozen for the first epoch
    (``--freeze_prototypes_niters``); an optional queue of past embeddings (``--queue_length``,
    ``--epoch_queue_starts``) joins Sinkhorn's columns once full.  Projector: Linear →
    BatchNorm → ReLU → Linear, 2,048 wide, output 128 (src/resnet50.py:205-217).
    """

    method = "swav"
    SETTINGS = {
        "num_prototypes": Setting(3000, integer(1), "K, the prototypes", trained=True, tiny=10),
        "temperature": Setting(0.1, number(0.0, low_open=True), "tau of the prediction"),
        "epsilon": Setting(0.05, number(0.0, low_open=True),
                           "Sinkhorn's entropy weight (lower it, e.g. 0.03, if the loss stalls "
                           "at ln K)", search=(0.03, 0.05, 0.1)),
        "sinkhorn_iterations": Setting(3, integer(1), "Sinkhorn-Knopp's iterations"),
        "queue_size": Setting(0, integer(0), "rows of the queue of past embeddings kept for each "
                              "global crop (0: none; 3,840 at batch 256)", trained=True,
                              rows=True),
        "queue_start_epoch": Setting(15.0, number(0.0), "the epoch the queue starts filling",
                                     in_steps="queue_start_step"),
        "freeze_prototypes_epochs": Setting(
            1.0, number(0.0), "epochs the prototypes stay as initialized",
            in_steps="freeze_prototypes_steps"),
    }
    HEADS = ("prototypes",)
    CROPS = Crops(views=2, local=True)
    DOCS_ROW = {"state": "queues (optional)", "global batch": "Sinkhorn's sums",
                "teacher": "the stop-gradient student",
                "paper": "69.1 (200 ep); 71.8 (800 ep); 75.3 (multi-crop)",
                "name": "SwAV",
                "towards": "the other crops' Sinkhorn codes over learned prototypes",
                "negatives": "none (balanced codes)",
                "collapse": "the loss stays above 98 % of ln K (uniform codes predicted "
                            "uniformly), from the fourth epoch after the prototypes thaw (it "
                            "starts at ln K)"}
    PROJECTOR = dict(layers_count=2, bias=True)
    COLLAPSE_ADVICE = ("lower method.swav.epsilon (0.03), freeze the prototypes longer "
                       "(method.swav.freeze_prototypes_epochs), start the queue later or shorten "
                       "it, or soften the views")

    def build_heads(self):
        self.prototypes = keras.layers.Dense(self.num_prototypes, use_bias=False,
                                             name="prototypes")
        self.prototypes.build((None, self.embedding_dim))
        self.prototypes.kernel.assign(losses.l2_normalize(self.prototypes.kernel, axis=0))

    def build_state(self):
        self.queues = [Queue(self.queue_size, self.embedding_dim, name=f"queue_{crop}")
                       for crop in range(2)] if self.queue_size else []

    def frozen_until(self):
        return {"prototypes": self.freeze_prototypes_steps}

    def forward(self, crops, training):
        embeddings = self._forward_by_resolution(crops, self.query_encoder, training)
        return [{"embedding": z, "scores": self.prototypes(z)} for z in embeddings]

    def method_loss(self, outputs, targets, step):
        """Swapped prediction, averaged over the (global crop, other crop) pairs."""
        scores = [output["scores"] for output in outputs]
        loss = 0.0
        for crop in range(2):
            codes = losses.sinkhorn(scores[crop], self.epsilon, self.sinkhorn_iterations,
                                    distribute.global_sum, *self._queue_scores(crop))
            others = [v for v in range(len(scores)) if v != crop]
            loss += tf.add_n([tf.reduce_mean(losses.swapped_prediction_loss(
                codes, scores[v], self.temperature)) for v in others]) / len(others)
        return loss / 2.0, {}

    def _queue_scores(self, crop):
        """(the queue's scores, whether they count): once the queue is full."""
        if not self.queues:
            return None, True
        queue = self.queues[crop]
        return tf.stop_gradient(self.prototypes(queue.read())), queue.is_full()

    def update_state(self, outputs, targets, step):
        for crop, queue in enumerate(self.queues):
            queue.enqueue(outputs[crop]["embedding"], when=step >= self.queue_start_step)

    def after_step(self, step):
        """The prototypes back on the unit sphere (as SwAV does before every step)."""
        kernel = self.prototypes.kernel
        distribute.assign_in_sync([kernel], [losses.l2_normalize(kernel, axis=0)])

    def view_embeddings(self, outputs):
        return outputs[0]["embedding"], outputs[1]["embedding"]

    def judged(self, epoch):
        """From the fourth epoch after the prototypes thaw: the loss starts at ln K and can
        sit near it for an epoch or two before it falls (the offline digits, K = 100)."""
        return epoch.done * epoch.steps >= self.freeze_prototypes_steps + 4 * epoch.steps

    def collapse(self, logs, epoch):
        uniform = math.log(self.num_prototypes)
        if "loss" in logs and float(logs["loss"]) > STALLED * uniform:
            return (f"the loss stays at {float(logs['loss']):.3f}, near ln K = {uniform:.3f} "
                    f"(codes and predictions uniform)")
        return None


STALLED = 0.98  # of ln K: the loss of uniform codes predicted uniformly
