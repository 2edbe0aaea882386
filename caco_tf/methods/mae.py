"""MAE: a ViT encoder on 25 % of the patches, a light decoder reconstructing the rest."""

import keras
import numpy as np
import tensorflow as tf

from caco_tf.data.masks import RandomMasks, kept_count
from caco_tf.methods.base import AuthorsViews, Crops, Method
from caco_tf.nets import tokens, vit
from caco_tf.settings import Setting, boolean, integer, number

# Of the loss of predicting each masked patch's own mean (under norm_pix_loss: predicting
# zeros): at or above it the decoder predicts nothing from the visible patches (its known
# failure).  Not lower: the digits' recipe stands at 0.987 after 3 epochs and still falls.
FLAT_RECONSTRUCTION = 0.995


def masked_patch_loss(predictions, pixels, masked, norm_pix_loss=True, epsilon=1e-6):
    """MAE's loss (models_mae.py ``forward_loss``): the mean over the masked patches of the
    mean squared error between a patch's prediction and its pixels, each patch's pixels
    normalized by their own mean and (unbiased) variance with ``norm_pix_loss``.
    ``predictions``, ``pixels``: ``[B, L, p·p·C]``; ``masked``: ``[B, L]``, 1 where masked."""
    target = _normalized_patches(pixels, epsilon) if norm_pix_loss else pixels
    per_patch = tf.reduce_mean(tf.square(predictions - target), axis=-1)
    return tf.reduce_sum(per_patch * masked) / tf.reduce_sum(masked)


def flat_patch_loss(pixels, masked, norm_pix_loss=True, epsilon=1e-6):
    """``masked_patch_loss`` of the best flat reconstruction: each patch its own mean."""
    target = _normalized_patches(pixels, epsilon) if norm_pix_loss else pixels
    flat = tf.reduce_mean(target, axis=-1, keepdims=True) + tf.zeros_like(target)
    return masked_patch_loss(flat, target, masked, norm_pix_loss=False)


def _normalized_patches(pixels, epsilon):
    mean = tf.reduce_mean(pixels, axis=-1, keepdims=True)
    count = tf.cast(tf.shape(pixels)[-1], pixels.dtype)
    variance = tf.reduce_sum(tf.square(pixels - mean), -1, keepdims=True) / (count - 1.0)
    return (pixels - mean) / tf.sqrt(variance + epsilon)  # PyTorch's var: unbiased


def mae_sincos_positions(rows, cols, width):
    """``[1 + rows·cols, width]``: MAE's fixed 2-D sine-cosine table with the class token's
    row of zeros first (util/pos_embed.py ``get_2d_sincos_pos_embed(cls_token=True)``): for
    the patch at (r, c), sin(c·ω), cos(c·ω), sin(r·ω), cos(r·ω), ω_k = 10000^(-k / (width/4))
    (MAE's meshgrid puts the column first)."""
    quarter = width // 4
    omega = 1.0 / 10000.0 ** (np.arange(quarter, dtype=np.float64) / quarter)
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    c, r = c.reshape(-1, 1) * omega, r.reshape(-1, 1) * omega
    table = np.concatenate([np.sin(c), np.cos(c), np.sin(r), np.cos(r)], axis=1)
    return np.concatenate([np.zeros((1, width)), table]).astype(np.float32)


@keras.saving.register_keras_serializable(package="caco_tf")
class MAEDecoder(keras.layers.Layer):
    """MAE's decoder (models_mae.py ``forward_decoder``): the encoder's tokens to its own width
    (``decoder_embed``), a learned mask token at every masked patch, its own fixed sine-cosine
    positions, ``depth`` pre-norm blocks of ``heads`` heads, a LayerNorm, and a Linear to each
    patch's p·p·C pixels (``decoder_pred``); the class token passes through the blocks and is
    dropped at the end."""

    def __init__(self, encoder_width, width, depth, heads, patch_pixels, rows, cols, **kwargs):
        super().__init__(**kwargs)
        if width % 4:
            raise ValueError(f"the decoder's sine-cosine positions need a width divisible by 4, "
                             f"got {width}")
        self.encoder_width, self.width, self.depth, self.heads = (
            int(encoder_width), int(width), int(depth), int(heads))
        self.patch_pixels, self.rows, self.cols = int(patch_pixels), int(rows), int(cols)
        dense = dict(kernel_initializer="glorot_uniform", bias_initializer="zeros")  # MAE's xavier
        self.embed = keras.layers.Dense(self.width, name="decoder_embed", **dense)
        self.blocks = [vit.TransformerBlock(self.width, self.heads, name=f"decoder_blocks_{i}")
                       for i in range(self.depth)]
        self.norm = keras.layers.LayerNormalization(epsilon=1e-6, name="decoder_norm")
        self.pred = keras.layers.Dense(self.patch_pixels, name="decoder_pred", **dense)
        self.positions = mae_sincos_positions(self.rows, self.cols, self.width)

    def build(self, input_shape=None):
        patches = self.rows * self.cols
        self.mask_token = self.add_weight(
            shape=(1, 1, self.width), name="mask_token",
            initializer=keras.initializers.RandomNormal(stddev=0.02))
        self.embed.build((None, None, self.encoder_width))
        for block in self.blocks:
            block.build((None, 1 + patches, self.width))
        self.norm.build((None, 1 + patches, self.width))
        self.pred.build((None, 1 + patches, self.width))

    def call(self, encoded, visible_first, training=None):
        """``encoded``: ``[B, 1 + K, D]`` (the class token, the K visible patches' tokens);
        ``visible_first``: ``[B, L]`` every patch's index, visible ones first in their
        order (``_order``).  Returns ``[B, L, p·p·C]``, each patch's predicted pixels."""
        x = self.embed(encoded)
        batch, kept = tf.shape(x)[0], tf.shape(x)[1] - 1
        patches = self.rows * self.cols
        masks = tf.tile(tf.cast(self.mask_token, x.dtype), [batch, patches - kept, 1])
        # Back to grid order: patch i sits where it appears in visible_first.
        restore = tf.argsort(visible_first, axis=1, stable=True)
        grid = tf.gather(tf.concat([x[:, 1:], masks], axis=1), restore, batch_dims=1)
        x = tf.concat([x[:, :1], grid], axis=1) + tf.cast(self.positions, x.dtype)[None]
        for block in self.blocks:
            x = block(x, training=training)
        return self.pred(self.norm(x))[:, 1:]

    def get_config(self):
        return dict(super().get_config(), encoder_width=self.encoder_width, width=self.width,
                    depth=self.depth, heads=self.heads, patch_pixels=self.patch_pixels,
                    rows=self.rows, cols=self.cols)


@keras.saving.register_keras_serializable(package="caco_tf")
class MAE(Method):
    """Masked autoencoders (He et al. 2022), facebookresearch/mae.

    Of each image's L patches, 75 % are masked at random (``data.masks.RandomMasks``, drawn
    with the view); the ViT encoder sees only the visible ones (``nets.tokens.encode_visible``:
    their position embeddings added before the gather, so the blocks do a quarter of the
    work); a decoder of its own width and depth (512 wide, 8 blocks of 16 heads) puts a mask
    token at every masked patch, adds its own fixed sine-cosine positions and predicts every
    patch's pixels; the loss is the mean squared error on the masked patches only, against
    each patch's pixels normalized by their own mean and variance (``norm_pix_loss``; models_mae.py
    ``forward_loss``).  One view per image, no teacher, no projector (it stays as built: the
    health measures' embedding); the features are the class token of the whole image.
    """

    method = "mae"
    SETTINGS = {
        "mask_ratio": Setting(0.75, number(0.0, 1.0, high_open=True),
                              "the share of each image's patches masked (MAE: 0.75)"),
        "decoder_width": Setting(512, integer(4), "the decoder's token width (divisible by 4 "
                                 "and by its heads)", trained=True, tiny=16),
        "decoder_depth": Setting(8, integer(1), "the decoder's blocks", trained=True, tiny=1),
        "decoder_heads": Setting(16, integer(1), "the decoder's attention heads", trained=True,
                                 tiny=2),
        "norm_pix_loss": Setting(True, boolean(), "normalize each target patch by its own mean "
                                 "and variance (MAE's --norm_pix_loss)"),
    }
    CONSUMES = "tokens"
    HEADS = ("decoder",)
    CROPS = Crops(views=1, local=False)
    # main_pretrain.py: RandomResizedCrop(scale=(0.2, 1.0)) and a horizontal flip, nothing else.
    AUTHORS_VIEWS = AuthorsViews("crop_flip", {"crop_scale": [0.2, 1.0]})
    PROJECTOR = dict(layers_count=1, hidden_batchnorm=False)
    DIAGNOSTICS = ("relative_loss",)
    # Its projector is not trained, and the class token of a working MAE has an effective rank
    # near 1 on the digits (validation kNN 42.9 % at rank 1.02): only its own failure is judged.
    EMBEDDINGS_JUDGED = False
    DOCS_ROW = {"state": "–", "global batch": "–", "teacher": "–",
                "paper": "68.0 (ViT-B/16, 1600 ep; fine-tuned 83.6)", "name": "MAE",
                "towards": "its masked patches' normalized pixels, from the visible ones",
                "negatives": "none (reconstruction)",
                "summary": "the pixels of its masked patches, from the 25 % it sees ([Vision "
                           "Transformers](docs/vit.md))",
                "collapse": "the reconstructions are flat: `relative_loss` (the loss over that "
                            "of predicting each masked patch's own mean: zeros under "
                            "`norm_pix_loss`) at or above 0.995, from the fourth epoch"}
    COLLAPSE_ADVICE = ("lower the learning rate (train.learning_rate) or lengthen its warm-up "
                       "(train.lr_warmup_epochs), or keep fewer patches "
                       "(method.mae.mask_ratio)")

    @classmethod
    def view_masks(cls, settings=None):
        ratio = (settings or {}).get("mask_ratio", cls.SETTINGS["mask_ratio"].default)
        return (RandomMasks(float(ratio)),)

    def build_heads(self):
        # The projector is not MAE's: frozen, so no optimizer slot or gradient is asked of it.
        self.projector.trainable = False
        patch, width = tokens.patch_side(self.backbone), int(self.backbone.output_shape[-1])
        height, _, channels = self.backbone.input_shape[1:]
        self.rows = self.cols = int(height) // patch
        self.kept = kept_count(self.rows * self.cols, self.mask_ratio)
        self.decoder = MAEDecoder(width, self.decoder_width, self.decoder_depth,
                                  self.decoder_heads, patch * patch * int(channels), self.rows,
                                  self.cols, name="decoder")
        self.decoder.build()

    def _order(self, mask):
        """``[B, L]``: every patch's index, the visible ones first (each in grid order)."""
        flat = tf.cast(tf.reshape(mask, [tf.shape(mask)[0], -1]), tf.int32)
        return tf.argsort(flat, axis=1, stable=True)

    def forward(self, crops, training, masks=()):
        (images,), (mask,) = crops, masks
        order = self._order(mask)
        encoded = tokens.encode_visible(self.backbone, images, order[:, :self.kept],
                                        training=training)
        prefix = tokens.prefix_count(self.backbone)
        encoded = tf.concat([encoded[:, :1], encoded[:, prefix:]], axis=1)  # no registers
        predictions = self.decoder(encoded, order, training=training)
        pixels = tokens.patchify(images, tokens.patch_side(self.backbone))
        masked = tf.cast(tf.reshape(mask, [tf.shape(mask)[0], -1]), tf.float32)
        return [{"predictions": tf.cast(predictions, tf.float32), "pixels": pixels,
                 "masked": masked, "embedding": encoded[:, 0]}]

    def method_loss(self, outputs, targets, step):
        (out,) = outputs
        loss = masked_patch_loss(out["predictions"], out["pixels"], out["masked"],
                                 self.norm_pix_loss)
        flat = flat_patch_loss(out["pixels"], out["masked"], self.norm_pix_loss)
        return loss, {"relative_loss": tf.stop_gradient(loss / flat)}

    def view_embeddings(self, outputs):
        return None  # one view: alignment and uniformity are the two-view methods'

    def reconstruct(self, images, masks):
        """(predicted pixels ``[B, H, W, C]`` with the visible patches pasted back, in the
        images' normalized units): what the figure shows; inference mode.  Under
        ``norm_pix_loss`` each masked patch's prediction is put back in pixels with that
        patch's own mean and standard deviation, as MAE's demo notebook does."""
        (out,) = self.forward((images,), training=False, masks=(masks,))
        predictions = out["predictions"]
        if self.norm_pix_loss:  # back to pixels with each patch's own statistics, as MAE's demo
            pixels = out["pixels"]
            mean = tf.reduce_mean(pixels, -1, keepdims=True)
            count = tf.cast(tf.shape(pixels)[-1], tf.float32)
            std = tf.sqrt(tf.reduce_sum(tf.square(pixels - mean), -1, keepdims=True)
                          / (count - 1.0) + 1e-6)
            predictions = predictions * std + mean
        pasted = tf.where(out["masked"][..., None] > 0, predictions, out["pixels"])
        patch, channels = tokens.patch_side(self.backbone), int(images.shape[-1])
        return tokens.unpatchify(pasted, patch, self.rows, self.cols, channels)

    def judged(self, epoch):
        """From the fourth epoch: the decoder starts from nothing."""
        return epoch.done >= 4

    def collapse(self, logs, epoch):
        relative = float(logs.get("relative_loss", 0.0))
        if relative >= FLAT_RECONSTRUCTION:
            return (f"the reconstructions are flat: the loss is {relative:.3f} of what each "
                    f"masked patch's own mean colour gives (at or above "
                    f"{FLAT_RECONSTRUCTION}), so the decoder predicts nothing from the "
                    f"visible patches")
        return None

