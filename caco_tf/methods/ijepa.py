"""I-JEPA: from a context block, a predictor guesses an EMA encoder's tokens of target blocks."""

import dataclasses
from typing import Tuple

import keras
import numpy as np
import tensorflow as tf

from caco_tf.data.masks import block_boxes, box_masks
from caco_tf.methods.base import AuthorsViews, Crops, Method
from caco_tf.methods.mae import mae_sincos_positions
from caco_tf.nets import tokens, vit
from caco_tf.settings import Setting, choice, integer, number, span
from caco_tf.training import distribute

# The standard deviation across images of the layer-normed target tokens, per patch and
# dimension, averaged: at or below it the target encoder gives every image the same tokens
# (at most position-dependent, which the predictor learns from the positions alone), I-JEPA's
# representation collapse.  configs/mnist_ijepa.yaml stands at 0.092 at initialization and
# 0.094 after 3 epochs (its black background is the same in every digit); random images, 0.87.
COLLAPSED_TARGET_STD = 0.01

# The context block's placements tried per relaxation (multiblock.py's timeout of 20).
CONTEXT_TRIES = 20


def ijepa_loss(predictions, targets, valid, loss="smooth_l1"):
    """I-JEPA's loss (train.py ``loss_fn``: ``F.smooth_l1_loss(z, h)``, β = 1, the mean over every
    predicted token's every dimension; ``"l2"``: the paper's squared distance, the same mean):
    ``predictions``, ``targets`` ``[..., T, D]``, ``valid`` ``[..., T]`` 1 for a slot that holds
    a target patch (a block smaller than its slots leaves the rest out); the mean over the
    global batch's target patches."""
    difference = tf.abs(predictions - targets)
    if loss == "smooth_l1":
        per_element = tf.where(difference < 1.0, 0.5 * tf.square(difference), difference - 0.5)
    else:
        per_element = tf.square(difference)
    per_token = tf.reduce_mean(per_element, axis=-1)
    # Over the global batch: each replica's loss alike, so R replicas take one device's step.
    count = tf.stop_gradient(distribute.global_sum(tf.reduce_sum(valid)))
    return distribute.global_sum(tf.reduce_sum(per_token * valid)) / tf.maximum(count, 1.0)


def context_and_target_masks(seed, batch, rows, cols, count, scale, aspect, context_scale,
                             min_context):
    """``[batch, 1 + count, rows, cols]`` boolean: [0] True where a patch is hidden from the
    context encoder, [1:] the ``count`` target blocks (True inside).

    As multiblock.py's ``MaskCollator`` with ``allow_overlap=False``: the target blocks
    (``block_boxes``: area ``scale``·L, ``aspect``), then a square context block (area
    ``context_scale``·L) less every target block; a context of ``min_context`` patches or fewer
    (at most a quarter of the grid's, for small grids) is placed again (``CONTEXT_TRIES``
    times), then the constraint relaxed by the last target block, and so on, as the
    collator's ``tries``."""
    min_context = min(int(min_context), rows * cols // 4)
    target_seed, context_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    targets = box_masks(block_boxes(target_seed, batch, count, rows, cols, scale, aspect),
                        rows, cols)
    boxes = box_masks(block_boxes(context_seed, batch, CONTEXT_TRIES, rows, cols,
                                  context_scale, (1.0, 1.0)), rows, cols)
    candidates = []
    for relaxed in range(count + 1):  # the collator keeps the first count - tries constraints
        kept = count - relaxed
        taken = (tf.reduce_any(targets[:, :kept], axis=1) if kept
                 else tf.zeros([batch, rows, cols], tf.bool))
        candidates.append(boxes & ~taken[:, None])
    candidates = tf.concat(candidates, axis=1)  # [B, (count + 1)·tries, rows, cols]
    sizes = tf.reduce_sum(tf.cast(candidates, tf.int32), axis=[2, 3])
    fits = sizes > min_context
    first = tf.argmax(tf.cast(fits, tf.int32), axis=1, output_type=tf.int32)
    # None fits (a grid too small for min_context): the unconstrained box.
    chosen = tf.where(tf.reduce_any(fits, axis=1), first, count * CONTEXT_TRIES)
    context = tf.gather(candidates, chosen, batch_dims=1)
    return tf.concat([~context[:, None], targets], axis=1)


@dataclasses.dataclass(frozen=True)
class ContextAndTargetBlocks:
    """I-JEPA's masks (``context_and_target_masks``): ``[1 + count, rows, cols]`` per image.
    Each image draws its own block sizes (the official collator draws one size per batch)."""

    count: int = 4
    scale: Tuple[float, float] = (0.15, 0.2)
    aspect: Tuple[float, float] = (0.75, 1.5)
    context_scale: Tuple[float, float] = (0.85, 1.0)
    min_context: int = 10

    def shape(self, rows, cols):
        return [1 + self.count, rows, cols]

    def draw(self, seed, batch, rows, cols):
        return context_and_target_masks(seed, batch, rows, cols, self.count, self.scale,
                                        self.aspect, self.context_scale, self.min_context)

    def wording(self):  # the recipes' table (docs/getting-started.md)
        return f"a context block and {self.count} target block{'s' * (self.count != 1)}"


def largest_block(rows, cols, scale, aspect, samples=401):
    """The most patches a ``block_boxes`` block of ``scale`` and ``aspect`` covers (its sides
    scanned over both ranges): the predictor's slots per target block."""
    area = np.linspace(scale[0], scale[1], samples)[:, None] * rows * cols
    ratio = np.linspace(aspect[0], aspect[1], samples)[None, :]
    height = np.clip(np.round(np.sqrt(area * ratio)), 1, rows)
    width = np.clip(np.round(np.sqrt(area / ratio)), 1, cols)
    return int((height * width).max())


def keyed_block(block, x, keys, training=None):
    """``vit.TransformerBlock``'s ``call`` with attention to the tokens ``keys`` marks only
    (``[B, N]`` booleans): a token it leaves out changes no other token, so the blocks run on a
    fixed-size sequence exactly as on the marked tokens alone."""
    heads, width = block.heads, block.width
    head_width = width // heads
    batch, count = tf.shape(x)[0], tf.shape(x)[1]
    qkv = tf.reshape(block.attn_qkv(block.norm1(x)), (batch, count, 3, heads, head_width))
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    logits = tf.cast(tf.einsum("bnhd,bmhd->bhnm", q, k) * (head_width ** -0.5), tf.float32)
    logits = tf.where(keys[:, None, None, :], logits, -1e9)
    weights = tf.cast(tf.nn.softmax(logits, axis=-1), v.dtype)
    mixed = tf.reshape(tf.einsum("bhnm,bmhd->bnhd", weights, v), (batch, count, width))
    attended = block.attn_proj(mixed)
    if block.layer_scale:
        attended = block.ls1(attended)
    x = x + block.drop(attended, training=training)
    hidden = block.mlp_fc2(block.mlp_act(block.mlp_fc1(block.norm2(x))))
    if block.layer_scale:
        hidden = block.ls2(hidden)
    return x + block.drop(hidden, training=training)


def patch_sequence(backbone, images):
    """``[B, L, D]``: the patch tokens with their positions, without the class token (and
    registers): I-JEPA's ViT has none."""
    sequence, _, _ = tokens.embedded(backbone, images)
    return sequence[:, tokens.prefix_count(backbone):]


def encode_patches(backbone, images, keys=None, training=None):
    """``[B, L, D]``: every patch token after the blocks and the final norm, attending to the
    patches ``keys`` marks only (``[B, L]``; None: all of them)."""
    _, _, blocks, norm = vit.vit_blocks(backbone)
    x = patch_sequence(backbone, images)
    for block in blocks:
        x = block(x, training=training) if keys is None else keyed_block(block, x, keys,
                                                                        training)
    return norm(x)


@keras.saving.register_keras_serializable(package="caco_tf")
class PatchTokens(keras.layers.Layer):
    """``[B, prefix + L, D]`` → ``[B, L, D]``: the patch tokens, the class token (and any
    registers) left out."""

    def __init__(self, prefix, **kwargs):
        super().__init__(**kwargs)
        self.prefix = int(prefix)

    def call(self, sequence):
        return sequence[:, self.prefix:]

    def compute_output_shape(self, input_shape):
        count = None if input_shape[1] is None else input_shape[1] - self.prefix
        return (input_shape[0], count, input_shape[2])

    def get_config(self):
        return dict(super().get_config(), prefix=self.prefix)


@keras.saving.register_keras_serializable(package="caco_tf")
class PatchMean(keras.layers.Layer):
    """``[B, L, D]`` → ``[B, D]``: the average of the last layer's patch tokens, I-JEPA's
    pooled feature (its linear evaluation average-pools them: no class token)."""

    def call(self, patches):
        return tf.reduce_mean(patches, axis=1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[2])


def patch_mean_backbone(backbone):
    """The ViT ``backbone`` (its own layers and weights) without its class token, its features
    the average of its patch tokens; a backbone that already ends so is returned as it is."""
    if isinstance(backbone.layers[-1], PatchMean):
        return backbone
    patch_embed, tokens_layer, blocks, norm = vit.vit_blocks(backbone)
    inputs = keras.Input(backbone.input_shape[1:], dtype="float32", name="images")
    x = PatchTokens(tokens.prefix_count(backbone), name="patch_tokens")(
        tokens_layer(patch_embed(inputs)))
    for block in blocks:
        x = block(x)
    return keras.Model(inputs, PatchMean(name="patch_mean")(norm(x)), name=backbone.name)


def _spread_across_images(whole):
    """The standard deviation over the global batch's images of ``whole`` ``[B, L, D]``, per
    patch and dimension, averaged."""
    count = tf.shape(whole)[0]
    mean = distribute.global_mean(tf.reduce_mean(whole, axis=0), count)
    square = distribute.global_mean(tf.reduce_mean(tf.square(whole), axis=0), count)
    return tf.reduce_mean(tf.sqrt(tf.maximum(square - tf.square(mean), 0.0)))


def _freeze_unused_tokens(backbone):
    """The class token (and any registers or mask token) never enter I-JEPA's sequence: out of
    the trainable variables, so the optimizer and the EMA leave them alone."""
    tokens_layer = backbone.get_layer("tokens")
    for name in ("cls_token", "register_tokens", "mask_token"):
        if getattr(tokens_layer, name, None) is not None:
            getattr(tokens_layer, name).trainable = False


@keras.saving.register_keras_serializable(package="caco_tf")
class IJEPAPredictor(keras.layers.Layer):
    """I-JEPA's predictor (vision_transformer.py ``VisionTransformerPredictor``): the context
    tokens to its own width (``predictor_embed``) plus its fixed sine-cosine positions, then for
    each target block a learned mask token plus that block's patches' positions appended,
    ``depth`` pre-norm blocks of ``heads`` heads, a LayerNorm, and a Linear back to the
    encoder's width (``predictor_proj``) at the mask tokens.  Each target block is its own
    sequence (the official repeats the context per block)."""

    def __init__(self, encoder_width, width, depth, heads, rows, cols, **kwargs):
        super().__init__(**kwargs)
        if width % 4:
            raise ValueError(f"the predictor's sine-cosine positions need a width divisible "
                             f"by 4, got {width}")
        self.encoder_width, self.width, self.depth, self.heads = (
            int(encoder_width), int(width), int(depth), int(heads))
        self.rows, self.cols = int(rows), int(cols)
        self.embed = keras.layers.Dense(self.width, name="predictor_embed",
                                        kernel_initializer=vit._truncated_normal())
        self.blocks = [vit.TransformerBlock(self.width, self.heads, name=f"predictor_blocks_{i}")
                       for i in range(self.depth)]
        self.norm = keras.layers.LayerNormalization(epsilon=1e-6, name="predictor_norm")
        self.proj = keras.layers.Dense(self.encoder_width, name="predictor_proj",
                                       kernel_initializer=vit._truncated_normal())
        # get_2d_sincos_pos_embed(cls_token=False): MAE's table without its class row.
        self.positions = mae_sincos_positions(self.rows, self.cols, self.width)[1:]

    def build(self, input_shape=None):
        self.mask_token = self.add_weight(shape=(1, 1, self.width), name="mask_token",
                                          initializer=vit._truncated_normal())
        self.embed.build((None, None, self.encoder_width))
        for block in self.blocks:
            block.build((None, None, self.width))
        self.norm.build((None, None, self.width))
        self.proj.build((None, None, self.width))

    def call(self, context, context_keys, target_index, target_valid, training=None):
        """``context``: ``[B, L, D]`` the context encoder's tokens at every patch, of which
        ``context_keys`` (``[B, L]``) marks the context's; ``target_index``, ``target_valid``:
        ``[B, M, T]`` each target block's patches and which slots hold one.  Returns
        ``[B, M, T, D]``, the predicted target tokens."""
        shape = tf.shape(target_index)
        batch, blocks, slots = shape[0], shape[1], shape[2]
        patches = self.rows * self.cols
        positions = tf.cast(self.positions, context.dtype)
        x = self.embed(context) + positions[None]
        x = tf.reshape(tf.repeat(x[:, None], blocks, axis=1), [-1, patches, self.width])
        queries = tf.cast(self.mask_token, x.dtype) + tf.gather(positions, target_index)
        x = tf.concat([x, tf.reshape(queries, [-1, slots, self.width])], axis=1)
        keys = tf.concat([
            tf.reshape(tf.repeat(context_keys[:, None], blocks, axis=1), [-1, patches]),
            tf.reshape(target_valid > 0, [-1, slots])], axis=1)
        for block in self.blocks:
            x = keyed_block(block, x, keys, training)
        out = self.proj(self.norm(x[:, patches:]))
        return tf.reshape(out, [batch, blocks, slots, self.encoder_width])

    def get_config(self):
        return dict(super().get_config(), encoder_width=self.encoder_width, width=self.width,
                    depth=self.depth, heads=self.heads, rows=self.rows, cols=self.cols)


@keras.saving.register_keras_serializable(package="caco_tf")
class IJEPA(Method):
    """Image-based joint-embedding predictive architecture (Assran et al. 2023),
    facebookresearch/ijepa.

    One view per image.  Its masks (``ContextAndTargetBlocks``, drawn with the view): M = 4
    target blocks (15-20 % of the patches each, aspect 0.75-1.5) and a square context block
    (85-100 %) less the target blocks.  The context encoder, the student ViT without its class
    token, sees the context's patches only (the others left out of its attention); the target
    encoder, an EMA of it (0.996 → 1, linear over the run in the official code), sees the whole
    image, its tokens layer-normed without affine (``F.layer_norm``) and each target block's
    gathered; a narrow predictor (its own width and depth) takes the context tokens and a
    positioned mask token per target patch; the loss is the smooth L1 between its outputs and
    the target tokens (train.py's ``F.smooth_l1_loss``; the paper writes an L2).  No projector
    is trained (it stays as built: the health measures' embedding).  The backbone's features,
    for every evaluation, are the average of its last layer's patch tokens
    (``patch_mean_backbone``), as I-JEPA's linear evaluation pools them.
    """

    method = "ijepa"
    SETTINGS = {
        "predictor_width": Setting(384, integer(4), "the predictor's token width, divisible by 4 "
                                   "and by its heads (pred_emb_dim: 384 for ViT-H/14)",
                                   trained=True, tiny=16),
        "predictor_depth": Setting(12, integer(1), "the predictor's blocks (pred_depth: 12 for "
                                   "ViT-H/14)", trained=True, tiny=1),
        "predictor_heads": Setting(16, integer(1), "the predictor's attention heads (the "
                                   "official init_model gives it the encoder's: ViT-H's 16)",
                                   trained=True, tiny=2),
        "target_blocks": Setting(4, integer(1), "M, the target blocks per image "
                                 "(num_pred_masks)"),
        "target_scale": Setting([0.15, 0.2], span(0.0, 1.0, positive_low=True),
                                "each target block's share of the patches (pred_mask_scale)"),
        "target_aspect": Setting([0.75, 1.5], span(0.0, positive_low=True),
                                 "each target block's height / width (aspect_ratio)"),
        "context_scale": Setting([0.85, 1.0], span(0.0, 1.0, positive_low=True),
                                 "the square context block's share of the patches, before the "
                                 "target blocks are removed (enc_mask_scale)"),
        "min_context": Setting(10, integer(0), "the context keeps more patches than this, or "
                               "is placed again (min_keep)"),
        "key_momentum": Setting(
            0.996, number(0.0, 1.0), "the target encoder's EMA momentum at the start (ema: "
            "0.996 to 1.0, linear over the run in train.py's momentum_scheduler: give "
            "{start: 0.996, end: 1.0}; a bare number rises to 1 on a cosine)",
            schedule="cosine to 1", tiny=0.9),
        "loss": Setting("smooth_l1", choice("smooth_l1", "l2"), "smooth_l1: the released "
                        "train.py's F.smooth_l1_loss; l2: the paper's squared distance"),
    }
    CONSUMES = "tokens"
    TEACHER = "momentum"
    TEACHER_NAME = "target encoder"
    HEADS = ("predictor",)
    CROPS = Crops(views=1, local=False)
    # make_transforms as its configs call it: RandomResizedCrop(scale=(0.3, 1.0)), no flip,
    # colour or blur.
    AUTHORS_VIEWS = AuthorsViews("crop", {"crop_scale": [0.3, 1.0]})
    PROJECTOR = dict(layers_count=1, hidden_batchnorm=False)
    DIAGNOSTICS = ("target_std",)
    DOCS_ROW = {"state": "–", "global batch": "–",
                "paper": "79.3 (ViT-H/14, 300 ep)",
                "name": "I-JEPA",
                "towards": "the EMA target encoder's tokens of its target blocks, from the "
                           "context block",
                "negatives": "none (the EMA target)",
                "summary": "an EMA target encoder's tokens of 4 target blocks, predicted from a "
                           "context block",
                "collapse": "the target encoder's tokens are constant: `target_std` (the "
                            "standard deviation across images of the layer-normed target "
                            "tokens, per patch and dimension, averaged) at or below 0.01, from "
                            "the fourth epoch (`configs/mnist_ijepa.yaml`: 0.092 at "
                            "initialization, 0.094 after 3 epochs; its black background is the "
                            "same in every digit)"}
    COLLAPSE_ADVICE = ("raise the target encoder's momentum (method.ijepa.key_momentum), lower "
                       "the learning rate (train.learning_rate) or lengthen its warm-up "
                       "(train.lr_warmup_epochs)")

    @classmethod
    def view_masks(cls, settings=None):
        given = {key: setting.default for key, setting in cls.SETTINGS.items()}
        given.update(settings or {})
        return (ContextAndTargetBlocks(
            int(given["target_blocks"]), tuple(given["target_scale"]),
            tuple(given["target_aspect"]), tuple(given["context_scale"]),
            int(given["min_context"])),)

    def build_parts(self, backbone, projector):
        if tokens.has_tokens(backbone):  # else the base refuses it in one line
            backbone = patch_mean_backbone(backbone)
        super().build_parts(backbone, projector)

    def build_heads(self):
        # The projector is not I-JEPA's: frozen, so no optimizer slot or gradient is asked of it.
        self.projector.trainable = False
        _freeze_unused_tokens(self.backbone)
        patch, width = tokens.patch_side(self.backbone), int(self.backbone.output_shape[-1])
        self.rows = self.cols = int(self.backbone.input_shape[1]) // patch
        (kind,) = self.view_masks({key: getattr(self, key) for key in self.SETTINGS})
        self.mask_kind = kind
        self.target_slots = largest_block(self.rows, self.cols, kind.scale, kind.aspect)
        self.predictor = IJEPAPredictor(width, self.predictor_width, self.predictor_depth,
                                        self.predictor_heads, self.rows, self.cols,
                                        name="predictor")
        self.predictor.build()

    def momentum_teacher(self, momentum):
        teacher = super().momentum_teacher(momentum)
        # Its projector copy is not followed either (the student's is frozen).
        teacher.projector.trainable = False
        self.target_backbone = teacher.backbone
        _freeze_unused_tokens(self.target_backbone)
        return teacher

    def _targets_of(self, mask):
        """(``[B, M, T]`` each target block's patch indices, its slots' validity)."""
        blocks = tf.reshape(mask[:, 1:], [tf.shape(mask)[0], self.mask_kind.count, -1])
        # A stable sort puts each block's patches first, in grid order.
        order = tf.argsort(tf.cast(~blocks, tf.int32), axis=-1, stable=True)
        index = order[..., :self.target_slots]
        sizes = tf.reduce_sum(tf.cast(blocks, tf.int32), axis=-1, keepdims=True)
        valid = tf.cast(tf.range(self.target_slots)[None, None] < sizes, tf.float32)
        return index, valid

    def targets(self, crops, training, masks=()):
        """The target encoder's layer-normed tokens of each target block (pre-step)."""
        (images,), (mask,) = crops, masks
        whole = encode_patches(self.target_backbone, images, training=training)
        whole = tf.cast(whole, tf.float32)
        mean, variance = tf.nn.moments(whole, axes=[-1], keepdims=True)
        whole = (whole - mean) * tf.math.rsqrt(variance + 1e-5)  # F.layer_norm, no affine
        index, valid = self._targets_of(mask)
        return {"tokens": tf.stop_gradient(tf.gather(whole, index, batch_dims=1)),
                "valid": valid,
                "std": _spread_across_images(whole)}

    def forward(self, crops, training, masks=()):
        (images,), (mask,) = crops, masks
        context_keys = ~tf.reshape(mask[:, 0], [tf.shape(mask)[0], -1])
        context = encode_patches(self.backbone, images, context_keys, training=training)
        index, valid = self._targets_of(mask)
        predictions = self.predictor(context, context_keys, index, valid, training=training)
        return [{"predictions": tf.cast(predictions, tf.float32)}]

    def method_loss(self, outputs, targets, step):
        (out,) = outputs
        loss = ijepa_loss(out["predictions"], targets["tokens"], targets["valid"], self.loss)
        return loss, {"target_std": targets["std"]}

    def view_embeddings(self, outputs):
        return None  # one view: alignment and uniformity are the two-view methods'

    def judged(self, epoch):
        """From the fourth epoch: the predictor starts from nothing."""
        return epoch.done >= 4

    def collapse(self, logs, epoch):
        spread = float(logs.get("target_std", 1.0))
        if spread <= COLLAPSED_TARGET_STD:
            return (f"the target encoder's tokens are constant: their standard deviation "
                    f"across images is {spread:.4f} (at or below {COLLAPSED_TARGET_STD}; "
                    f"layer-normed tokens have 1 across their dimensions), so the targets no "
                    f"longer depend on the image")
        return None
