"""DINOv2: DINO on the class tokens, iBOT on the masked patch tokens, KoLeo, Sinkhorn-Knopp."""

import dataclasses
import math
from typing import Tuple

import keras
import tensorflow as tf

from caco_tf import losses
from caco_tf.data.masks import box_masks
from caco_tf.errors import ConfigError
from caco_tf.methods.base import AuthorsViews, Crops, Method
from caco_tf.methods.dino import UNIFORM
from caco_tf.methods.momentum_encoder import UNIT_LAYER
from caco_tf.methods.state import RunningMean
from caco_tf.nets import backbones, tokens
from caco_tf.nets.layers import NormalizedDense
from caco_tf.settings import Setting, boolean, choice, integer, number, span
from caco_tf.training import distribute
from caco_tf.training.optimizers import as_schedule


def ibot_block_masks(seed, targets, rows, cols, max_patches, min_patches=4.0,
                     aspect=(0.3, 1.0 / 0.3), attempts=10):
    """``[M, rows, cols]`` boolean: for each of the M crops, blocks added until ``targets[m]``
    patches are masked, as DINOv2's ``MaskingGenerator`` (dinov2/data/masking.py) places them:
    a block of area uniform in [min_patches, min(left to mask, max_patches)] and aspect
    log-uniform in ``aspect``, sides round(√(area·a)) and round(√(area/a)) strictly inside the
    grid, its corner uniform; kept if it adds between 1 and that many patches; 10 tries a block,
    and a crop whose 10 tries all fail stops there."""
    targets = tf.cast(targets, tf.int32)
    count = tf.shape(targets)[0]
    low, high = math.log(aspect[0]), math.log(aspect[1])

    def step(index, mask, masked, done):
        remaining = tf.cast(tf.minimum(targets - masked, int(max_patches)), tf.float32)
        draws = tf.random.stateless_uniform(
            [count, attempts, 4], seed=tf.random.experimental.stateless_fold_in(seed, index))
        area = min_patches + (remaining[:, None] - min_patches) * draws[..., 0]  # random.uniform
        ratio = tf.exp(low + (high - low) * draws[..., 1])
        height, width = tf.round(tf.sqrt(area * ratio)), tf.round(tf.sqrt(area / ratio))
        fits = (width < cols) & (height < rows)
        top = tf.clip_by_value(tf.floor(draws[..., 2] * (rows - height + 1.0)), 0.0,
                               tf.maximum(rows - height, 0.0))  # random.randint(0, rows - h)
        left = tf.clip_by_value(tf.floor(draws[..., 3] * (cols - width + 1.0)), 0.0,
                                tf.maximum(cols - width, 0.0))
        boxes = box_masks(tf.cast(tf.stack([top, left, height, width], -1), tf.int32), rows, cols)
        new = tf.reduce_sum(tf.cast(boxes & ~mask[:, None], tf.int32), axis=[2, 3])
        accepted = fits & (new > 0) & (tf.cast(new, tf.float32) <= remaining[:, None])
        first = tf.argmax(tf.cast(accepted, tf.int32), axis=1, output_type=tf.int32)
        placed = tf.reduce_any(accepted, axis=1) & ~done
        chosen = tf.gather(boxes, first, batch_dims=1) & placed[:, None, None]
        masked = masked + tf.where(placed, tf.gather(new, first, batch_dims=1), 0)
        done = done | ~placed | (masked >= targets)
        return index + 1, mask | chosen, masked, done

    start = (0, tf.zeros([count, rows, cols], tf.bool), tf.zeros([count], tf.int32),
             targets <= 0)
    _, mask, _, _ = tf.while_loop(lambda i, m, n, done: (i < rows * cols)
                                  & ~tf.reduce_all(done), step, start)
    return mask


@dataclasses.dataclass(frozen=True)
class IBOTMasks:
    """DINOv2's masks of the global crops: each crop masked with ``probability``, a share of
    its patches uniform in ``ratio`` masked in blocks (``ibot_block_masks``, at most half the
    grid a block): ``[crops, rows, cols]`` per image.  DINOv2's collate (dinov2/data/collate.py)
    masks exactly int(p·B) of a GPU's B global crops, the i-th at a share uniform in the i-th of
    int(p·B) equal strata of ``ratio``, shuffled; here each crop draws alone from its image's
    seed: the same law per crop, the batch's count binomial and its shares not stratified, and
    the same masks on 1 and R replicas and on a resume."""

    probability: float = 0.5
    ratio: Tuple[float, float] = (0.1, 0.5)
    crops: int = 2
    max_share: float = 0.5  # of the grid, a block (train.py: max_num_patches 0.5 · L)

    def shape(self, rows, cols):
        return [self.crops, rows, cols]

    def draw(self, seed, batch, rows, cols):
        count = batch * self.crops
        draws = tf.random.stateless_uniform(
            [count, 2], seed=tf.random.experimental.stateless_fold_in(seed, 0))
        share = self.ratio[0] + (self.ratio[1] - self.ratio[0]) * draws[:, 1]
        most = int(rows * cols * self.ratio[1])  # float32's share may round up to the end
        targets = tf.where(draws[:, 0] < self.probability, tf.minimum(
            tf.cast(tf.floor(rows * cols * share), tf.int32), most), 0)
        mask = ibot_block_masks(tf.random.experimental.stateless_fold_in(seed, 1), targets,
                                rows, cols, self.max_share * rows * cols)
        return tf.reshape(mask, [batch, self.crops, rows, cols])

    def wording(self):  # the recipes' table (docs/getting-started.md)
        share = "half" if self.probability == 0.5 else f"{self.probability * 100:g} % of"
        return f"iBOT's block masks on {share} the global crops"


@keras.saving.register_keras_serializable(package="caco_tf")
class DINOv2(Method):
    """DINOv2 (Oquab et al. 2023), facebookresearch/dinov2 (train/ssl_meta_arch.py, loss/).

    A ViT student and its EMA teacher (0.992 to 1 on a cosine).  The teacher sees the two global
    crops whole; the student sees them with iBOT's block masks (``IBOTMasks``: half the crops,
    10-50 % of their patches, each replaced by the ViT's mask token) and the local crops.  The
    loss: DINO's cross-entropy of the class tokens' heads (the student's every crop against
    the teacher's other global crop, summed over the pairs and divided by 2 + max(2·local, 1)
    as ssl_meta_arch.py does), iBOT's on the masked patches (each masked patch of the student
    against the teacher's same patch; a crop's mean, then the mean over the global crops), and
    0.1 × KoLeo of the student's class tokens, each global crop apart.  The teacher's head
    outputs are made distributions by Sinkhorn-Knopp (3 iterations, ε the teacher temperature)
    or DINO's centering (``centering``).  iBOT has its own head (``separate_ibot_head``) or
    DINO's.  Each head: DINO's MLP, L2, a weight-normalized last layer, frozen the first epoch.
    """

    method = "dinov2"
    SETTINGS = {
        "out_dim": Setting(65536, integer(1), "K, the DINO head's prototypes "
                           "(dino.head_n_prototypes; ViT-L/14: 131,072)", trained=True, tiny=32),
        "separate_ibot_head": Setting(
            True, boolean(), "iBOT's own head (ibot.separate_head: the paper's and ViT-L/14's); "
            "false shares DINO's (the default config's)", trained=True),
        "ibot_out_dim": Setting(65536, integer(1), "iBOT's own head's prototypes "
                                "(ibot.head_n_prototypes; ViT-L/14: 131,072)", trained=True,
                                tiny=24),
        "ibot_hidden_dim": Setting(2048, integer(1), "iBOT's own head's hidden width "
                                   "(ibot.head_hidden_dim)", trained=True, tiny=16),
        "ibot_bottleneck_dim": Setting(256, integer(1), "iBOT's own head's bottleneck "
                                       "(ibot.head_bottleneck_dim)", trained=True, tiny=8),
        "student_temperature": Setting(0.1, number(0.0, low_open=True),
                                       "tau of the student (DINOLoss, iBOTPatchLoss: 0.1)"),
        "teacher_temperature": Setting(
            0.04, number(0.0, low_open=True), "tau of the teacher (teacher.warmup_teacher_temp; "
            "the recipes warm it to 0.07 over 30 epochs)", schedule="constant"),
        "centering": Setting(
            "sinkhorn_knopp", choice("sinkhorn_knopp", "centering"), "the teacher's "
            "distributions: Sinkhorn-Knopp (the paper's, ViT-L/14's) or DINO's center "
            "(train.centering, the default config's)", trained=True),
        "sinkhorn_iterations": Setting(3, integer(1), "Sinkhorn-Knopp's iterations "
                                       "(sinkhorn_knopp_teacher's n_iterations)"),
        "center_momentum": Setting(0.9, number(0.0, 1.0, high_open=True),
                                   "the centers' EMA momentum with centering (DINOLoss)"),
        "key_momentum": Setting(
            0.992, number(0.0, 1.0), "the teacher's EMA momentum at the start, to 1 on a cosine "
            "(teacher.momentum_teacher; ViT-L/14: 0.994)", schedule="cosine to 1", tiny=0.9),
        "dino_weight": Setting(1.0, number(0.0), "DINO's term (dino.loss_weight)"),
        "ibot_weight": Setting(1.0, number(0.0), "iBOT's term (ibot.loss_weight)"),
        "koleo_weight": Setting(0.1, number(0.0), "KoLeo's term (dino.koleo_loss_weight)"),
        "mask_probability": Setting(0.5, number(0.0, 1.0), "the share of global crops masked "
                                    "(ibot.mask_sample_probability)"),
        "mask_ratio": Setting([0.1, 0.5], span(0.0, 1.0), "the range of a masked crop's share "
                              "of masked patches (ibot.mask_ratio_min_max)"),
        "freeze_last_layer_epochs": Setting(
            1.0, number(0.0), "epochs the last layers stay as initialized "
            "(optim.freeze_last_layer_epochs)", in_steps="freeze_last_layer_steps"),
    }
    CONSUMES = "tokens"
    # The ViT options it needs (build_vit's; a run's model.mask_token, checked before a run).
    VIT_OPTIONS = {"mask_token": True}
    TEACHER = "momentum"
    HEADS = ("last_layer", "ibot_mlp", "ibot_last_layer")
    TEACHER_HEADS = ("last_layer",)  # iBOT's own head has its own EMA copy (ibot_teacher)
    CROPS = Crops(views=2, local=True)
    # crops.*: 2 global crops of 32-100 % of the image, 8 local crops of 5-32 % at 98 px of
    # 224 (vitl14.yaml's local_crops_size; SwAV's multi-crop views here, as the recipe's).
    AUTHORS_VIEWS = AuthorsViews("multicrop", {"multicrop.local_crops": 8,
                                               "multicrop.global_scale": [0.32, 1.0],
                                               "multicrop.local_scale": [0.05, 0.32]},
                                 local_share=98 / 224)
    PROJECTOR = dict(layers_count=3, bias=True, hidden_batchnorm=False, activation="gelu")
    DIAGNOSTICS = ("dino_loss", "ibot_loss", "koleo_loss", "teacher_entropy",
                   "patch_teacher_entropy")
    DOCS_ROW = {"state": "centers (with centering)", "global batch": "Sinkhorn-Knopp's sums, "
                "KoLeo's neighbours, the centers",
                "paper": "84.5 (ViT-L/14 on ImageNet-22k, 500 of its epochs; the released "
                         "ViT-L/14, distilled: 86.3)",
                "name": "DINOv2",
                "towards": "the EMA teacher's Sinkhorn-Knopp output, on the class token and on "
                           "its masked patches",
                "negatives": "KoLeo (the class tokens' spread)",
                "summary": "an EMA teacher's Sinkhorn-Knopp output, on the class token (DINO) "
                           "and on its masked patches (iBOT), with KoLeo's spread",
                "collapse": "the teacher's output is uniform: `teacher_entropy` (its "
                            "class-token distributions) or `patch_teacher_entropy` (its masked "
                            "patches', iBOT's) above 98 % of ln K of its head, from the fourth "
                            "epoch after the last layers thaw; Sinkhorn-Knopp makes a teacher "
                            "that gives every image one output exactly uniform"}
    COLLAPSE_ADVICE = ("lower method.dinov2.teacher_temperature or lengthen its warm-up (0.04 "
                       "to 0.07 over 30 epochs), or freeze the last layers longer "
                       "(method.dinov2.freeze_last_layer_epochs)")

    @classmethod
    def view_masks(cls, settings=None):
        settings = settings or {}
        probability = settings.get("mask_probability", cls.SETTINGS["mask_probability"].default)
        ratio = settings.get("mask_ratio", cls.SETTINGS["mask_ratio"].default)
        return (IBOTMasks(float(probability), tuple(float(r) for r in ratio)),)

    def build_heads(self):
        if not tokens.has_mask_token(self.backbone):
            raise ConfigError(f"method dinov2 puts the ViT's mask token in place of the masked "
                              f"patches, and model.backbone {self.backbone.name} has none: set "
                              f"model.mask_token true")
        self.last_layer = NormalizedDense(self.out_dim, name="last_layer")
        self.last_layer.build((None, self.embedding_dim))
        width = int(self.backbone.output_shape[-1])
        if not self.separate_ibot_head:
            self.HEADS = ("last_layer",)
            return
        # DINOv2's DINOHead for iBOT: Linear-GELU-Linear-GELU-Linear, L2, the last layer.
        self.ibot_mlp = backbones.build_mlp(width, self.ibot_hidden_dim, self.ibot_bottleneck_dim,
                                            name="ibot_mlp", **self.PROJECTOR)
        self.ibot_last_layer = NormalizedDense(self.ibot_out_dim, name="ibot_last_layer")
        self.ibot_last_layer.build((None, self.ibot_bottleneck_dim))

    def build_state(self):
        if self.separate_ibot_head:  # the teacher's copy of iBOT's head, equal to it now
            inputs = keras.Input((int(self.backbone.output_shape[-1]),))
            unit = keras.layers.UnitNormalization(dtype="float32")(
                keras.models.clone_model(self.ibot_mlp)(inputs))
            last = NormalizedDense(self.ibot_out_dim, name="ibot_last_layer")
            self.ibot_teacher = keras.Model(inputs, last(unit), name="ibot_teacher")
            self.ibot_teacher.set_weights(self.ibot_mlp.get_weights()
                                          + self.ibot_last_layer.get_weights())
            self.ibot_teacher.trainable = False  # it follows by EMA (after_step)
        if self.centering == "centering":
            self.center = RunningMean(self.out_dim, self.center_momentum)
            self.patch_center = RunningMean(
                self.ibot_out_dim if self.separate_ibot_head else self.out_dim,
                self.center_momentum, name="patch_center")

    def frozen_until(self):
        return {name: self.freeze_last_layer_steps for name in self.HEADS
                if name.endswith("last_layer")}

    # ------------------------------------------------------------------ the networks
    def _teacher_parts(self):
        """The teacher's backbone, projector, L2 and last layer (``key_encoder``'s layers)."""
        return self.key_encoder.layers[1:5]

    def _masked_first(self, masks):
        """(``[2B, cap]`` each global crop's masked patches first, ``[2B, cap]`` which are
        masked): a crop has at most int(L · the ratio's high end) masked patches (the blocks
        stop at its draw), so only those reach the heads (DINOv2 gathers the masked ones)."""
        patches = int(masks.shape[1]) * int(masks.shape[2])
        cap = max(1, int(patches * float(self.mask_ratio[1])))
        flat = tf.reshape(masks, [tf.shape(masks)[0], patches])
        order = tf.argsort(tf.cast(~flat, tf.int32), axis=1, stable=True)[:, :cap]
        return order, tf.gather(flat, order, batch_dims=1)

    def _patch_head(self, patches, teacher):
        """``[N, K]`` the iBOT head's outputs for patch tokens ``[N, D]``."""
        if self.separate_ibot_head:
            if teacher:
                return self.ibot_teacher(patches)
            return self.ibot_last_layer(losses.l2_normalize(self.ibot_mlp(patches)))
        if teacher:
            _, projector, unit, last = self._teacher_parts()
            return last(unit(projector(patches)))
        unit = self.query_encoder.get_layer(UNIT_LAYER)
        return self.last_layer(unit(self.projector(patches)))

    def _global_masks(self, masks):
        (mask,) = masks
        return tf.concat([mask[:, 0], mask[:, 1]], axis=0)  # the crops' order, as the images'

    def targets(self, crops, training, masks=()):
        """The teacher's head outputs for the two global crops, whole (one pass): the class
        tokens' (DINO) and the student's masked patches' (iBOT), before centering."""
        backbone, projector, unit, last = self._teacher_parts()
        encoded = tokens.encode(backbone, tf.concat(crops[:2], 0), training=training)
        logits = last(unit(projector(encoded.cls, training=training)))
        order, masked = self._masked_first(self._global_masks(masks))
        patches = tf.reshape(encoded.patches, [tf.shape(order)[0], -1, encoded.patches.shape[-1]])
        chosen = tf.gather(patches, order, batch_dims=1)
        width = chosen.shape[-1]
        patch_logits = self._patch_head(tf.reshape(chosen, [-1, width]), teacher=True)
        return {"logits": tf.stop_gradient(tf.cast(logits, tf.float32)),
                "patch_logits": tf.stop_gradient(tf.cast(patch_logits, tf.float32)),
                "masked": masked}

    def forward(self, crops, training, masks=()):
        """The student: the global crops masked (one pass), the local crops by size."""
        global_masks = self._global_masks(masks)
        encoded = tokens.encode(self.backbone, tf.concat(crops[:2], 0), training=training,
                                masks=global_masks)
        unit = self.query_encoder.get_layer(UNIT_LAYER)
        embeddings = tf.split(unit(self.projector(encoded.cls, training=training)), 2)
        embeddings += self._forward_by_resolution(crops[2:], self.query_encoder, training)
        logits = tf.split(self.last_layer(tf.concat(embeddings, 0)), len(embeddings))
        order, masked = self._masked_first(global_masks)
        patches = tf.reshape(encoded.patches, [tf.shape(order)[0], -1, encoded.patches.shape[-1]])
        chosen = tf.gather(patches, order, batch_dims=1)
        patch_logits = self._patch_head(tf.reshape(chosen, [-1, chosen.shape[-1]]), teacher=False)
        return {"logits": [tf.cast(s, tf.float32) for s in logits], "embeddings": embeddings,
                "cls": tf.split(tf.cast(encoded.cls, tf.float32), 2),
                "patch_logits": tf.cast(patch_logits, tf.float32), "masked": masked}

    # ------------------------------------------------------------------ the loss
    def _teacher_probabilities(self, targets, step):
        temperature = as_schedule(self.teacher_temperature)(step)
        logits, patch_logits = targets["logits"], targets["patch_logits"]
        in_use = tf.reshape(tf.cast(targets["masked"], tf.float32), [-1])
        if self.centering == "sinkhorn_knopp":  # both global crops in one plan, as DINOv2
            cls = losses.sinkhorn(logits, temperature, self.sinkhorn_iterations,
                                  distribute.global_sum)
            patch = losses.sinkhorn(patch_logits, temperature, self.sinkhorn_iterations,
                                    distribute.global_sum, rows_in_use=in_use)
        else:
            cls = losses.dino_teacher(logits, self.center.read(), temperature)
            patch = losses.dino_teacher(patch_logits, self.patch_center.read(), temperature)
        return cls, patch * in_use[:, None]

    def method_loss(self, outputs, targets, step):
        """DINO's term + iBOT's term + KoLeo's, weighed as ssl_meta_arch.py weighs them."""
        cls, patch = self._teacher_probabilities(targets, step)
        students = outputs["logits"]
        local = len(students) - 2
        # ssl_meta_arch.py divides the sum over the pairs by 2 + max(2·local, 1).
        dino = losses.dino_loss(tf.split(cls, 2), students, self.student_temperature) * (
            (2 + 2 * local) / (2 + max(2 * local, 1)))
        rows = tf.shape(targets["masked"])
        ibot = losses.ibot_patch_loss(
            tf.reshape(patch, [rows[0], rows[1], -1]),
            tf.reshape(outputs["patch_logits"], [rows[0], rows[1], -1]), targets["masked"],
            self.student_temperature)
        koleo = tf.add_n([self._koleo(tokens_of_crop) for tokens_of_crop in outputs["cls"]])
        loss = (self.dino_weight * dino + self.ibot_weight * ibot + self.koleo_weight * koleo)
        in_use = tf.reshape(tf.cast(targets["masked"], tf.float32), [-1])
        return loss, {"dino_loss": dino, "ibot_loss": ibot, "koleo_loss": koleo,
                      "teacher_entropy": _entropy(cls),
                      "patch_teacher_entropy": _entropy(patch, in_use)}

    def _koleo(self, local_tokens):
        """KoLeo of one global crop's class tokens, each one's neighbour searched in the global
        batch (DINOv2 searches each GPU's; the same on one device)."""
        count = tf.shape(local_tokens)[0]
        return losses.koleo_loss(local_tokens, candidates=distribute.all_gather(local_tokens),
                                 offset=distribute.replica_offset(count))

    def update_state(self, outputs, targets, step):
        if self.centering != "centering":
            return None
        self.center.update(targets["logits"])
        # The masked patches' mean over the global batch (DINOv2: each GPU's mean, averaged).
        in_use = tf.reshape(tf.cast(targets["masked"], tf.float32), [-1, 1])
        total = distribute.global_sum(tf.reduce_sum(targets["patch_logits"] * in_use, 0,
                                                    keepdims=True))
        count = distribute.global_sum(tf.reduce_sum(in_use))
        mean = total / tf.maximum(count, 1.0)
        moved = self.patch_center.momentum * self.patch_center.read() + (
            1.0 - self.patch_center.momentum) * mean
        distribute.assign_in_sync([self.patch_center.value],
                                  [tf.where(count > 0, moved, self.patch_center.read())])
        return None

    def after_step(self, step):
        super().after_step(step)  # the backbone, projector and DINO's last layer
        if self.separate_ibot_head:
            momentum = self.key_encoder.momentum(step)
            student = (self.ibot_mlp.trainable_variables
                       + self.ibot_last_layer.trainable_variables)
            teacher = self.ibot_teacher.weights  # the student's order: MLP, last layer
            distribute.assign_in_sync(teacher, [momentum * t + (1.0 - momentum) * s
                                                for t, s in zip(teacher, student)])

    def view_embeddings(self, outputs):
        return outputs["embeddings"][0], outputs["embeddings"][1]

    # ------------------------------------------------------------------ health
    def judged(self, epoch):
        """From the fourth epoch after the last layers thaw: the teacher starts uniform."""
        return epoch.done * epoch.steps >= self.freeze_last_layer_steps + 4 * epoch.steps

    def collapse(self, logs, epoch):
        for key, what, count in (
                ("teacher_entropy", "the teacher's class-token output", self.out_dim),
                ("patch_teacher_entropy", "the teacher's patch output",
                 self.ibot_out_dim if self.separate_ibot_head else self.out_dim)):
            entropy, uniform = float(logs.get(key, 0.0)), math.log(count)
            if entropy > UNIFORM * uniform:
                return f"{what} is uniform (entropy {entropy:.3f} of ln K = {uniform:.3f})"
        return None


def _entropy(probabilities, weights=None):
    """The mean entropy of the rows of ``probabilities`` (those of ``weights`` 1)."""
    entropy = -tf.reduce_sum(probabilities * tf.math.log(probabilities + 1e-12), axis=-1)
    if weights is None:
        return tf.reduce_mean(entropy)
    return tf.reduce_sum(entropy * weights) / tf.maximum(tf.reduce_sum(weights), 1.0)
