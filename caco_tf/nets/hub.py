"""KerasHub backbones pre-trained here (the optional extra: ``pip install "caco-tf[hub]"``).

Any KerasHub image backbone, built from its class and arguments (``model.backbone:
keras_hub:ResNetBackbone`` with ``model.backbone_arguments``; no weights are downloaded) or
from a preset directory on disk (``model.backbone: keras_hub:/path/to/preset``).  Its output (a
feature map ``[B, h, w, C]``, or tokens ``[B, N, D]`` for a transformer) is pooled into the
features every method takes: the map's average, the class token.

``CacoBackbone`` is the class of the presets ``caco-export --format keras-hub`` writes (the way
out, ``caco_tf.serving.hub``); it is defined here, where ``keras_hub:DIR`` loads a preset
(nets never import serving), so that such a preset pre-trains again.

KerasHub's ``DINOV2Backbone`` both ways: a preset of it (``keras_hub:DIR``) becomes caco_tf's
own ViT with its weights (``vit_from_dinov2``: multi-crop's other crop sizes, stochastic depth,
the attention maps, continued pre-training from DINOv2's weights), and a caco_tf ViT becomes a
``DINOV2Backbone`` (``dinov2_from_vit``), which loads without caco_tf.  One table maps the two
(``_dinov2_pairs``); the features, our class token, are its output's first token.
"""

import json
import os

import keras
import numpy as np

from caco_tf.errors import ConfigError
from caco_tf.nets import vit
from caco_tf.nets.sizes import preset_class

PREFIX = "keras_hub:"
INSTALL = 'pip install "caco-tf[hub]"'
# KerasHub's classes every backbone derives from: they build no network of their own.
BASE_CLASSES = ("Backbone", "FeaturePyramidBackbone")
PRESET_FILES = ("a preset directory holds config.json, metadata.json and model.weights.h5, as "
                "caco-export --format keras-hub writes them")


def keras_hub():
    """The keras_hub module, or one line saying how to get it."""
    try:
        import keras_hub as module
    except ImportError as error:
        raise ConfigError(f"KerasHub is not installed ({error}): {INSTALL}") from None
    return module


try:  # the optional extra: without it, keras_hub() says how to install it
    import keras_hub as _hub
except ImportError:
    _hub = None

if _hub is not None:
    @keras.saving.register_keras_serializable(package="caco_tf")
    class CacoBackbone(_hub.models.Backbone):
        """A caco_tf backbone as a KerasHub ``Backbone``: images → the features as a 1×1 map
        (``ImageClassifier``'s average pooling gives them back)."""

        def __init__(self, encoder, **kwargs):
            if isinstance(encoder, dict):
                encoder = keras.saving.deserialize_keras_object(encoder)
            inputs = keras.Input(shape=encoder.input_shape[1:], name="images")
            outputs = keras.layers.Reshape((1, 1, encoder.output_shape[-1]),
                                           name="features_map")(encoder(inputs))
            super().__init__(inputs=inputs, outputs=outputs, **kwargs)
            self.encoder = encoder

        def get_config(self):
            config = super().get_config()
            config["encoder"] = keras.saving.serialize_keras_object(self.encoder)
            return config


DINOV2 = "DINOV2Backbone"


def _dinov2_pairs(ours, theirs):
    """``[(our variable, their variables, to theirs, to ours)]`` for a caco_tf ViT ``ours`` and
    a ``DINOV2Backbone`` ``theirs`` of the same shape (``to theirs``: our value → their values,
    ``to ours`` the way back): every weight of both but their position tables
    (``position_embeddings``, ``interpolated_position_embeddings``) and what one side lacks
    (LayerScale, the mask token)."""
    patch_embed, tokens, blocks, norm = vit.vit_blocks(ours)
    embeddings = theirs.embeddings
    width, heads = tokens.width, blocks[0].heads
    same = (lambda value: [value], lambda values: values[0])

    def split(shape):  # our q|k|v outputs (part, head, channel) → theirs, one Dense per part
        return (lambda value: [part.reshape(shape) for part in np.split(value, 3, axis=-1)],
                lambda values: np.concatenate([v.reshape(*shape[:-2], width) for v in values],
                                              axis=-1))

    pairs = [(patch_embed.proj.kernel, [embeddings.patch_embeddings.projection.kernel], *same),
             (patch_embed.proj.bias, [embeddings.patch_embeddings.projection.bias], *same),
             (tokens.cls_token, [embeddings.cls_token], *same),
             (norm.gamma, [theirs.layernorm.gamma], *same),
             (norm.beta, [theirs.layernorm.beta], *same)]
    if tokens.registers:
        pairs.append((tokens.register_tokens, [embeddings.register_tokens], *same))
    if tokens.has_mask_token and embeddings.use_mask_token:
        pairs.append((tokens.mask_token, [embeddings.mask_token], *same))
    for block, layer in zip(blocks, theirs.encoder.layers):
        attention = layer.attention.attention  # Keras' MultiHeadAttention
        parts = [attention.query_dense, attention.key_dense, attention.value_dense]
        output = attention.output_dense
        pairs += [(block.norm1.gamma, [layer.norm1.gamma], *same),
                  (block.norm1.beta, [layer.norm1.beta], *same),
                  (block.attn_qkv.kernel, [p.kernel for p in parts], *split((width, heads, -1))),
                  (block.attn_qkv.bias, [p.bias for p in parts], *split((heads, -1))),
                  (block.attn_proj.kernel, [output.kernel],
                   lambda value: [value.reshape(heads, -1, width)],
                   lambda values: values[0].reshape(width, width)),
                  (block.attn_proj.bias, [output.bias], *same),
                  (block.norm2.gamma, [layer.norm2.gamma], *same),
                  (block.norm2.beta, [layer.norm2.beta], *same),
                  (block.mlp_fc1.kernel, [layer.mlp.fc1.kernel], *same),
                  (block.mlp_fc1.bias, [layer.mlp.fc1.bias], *same),
                  (block.mlp_fc2.kernel, [layer.mlp.fc2.kernel], *same),
                  (block.mlp_fc2.bias, [layer.mlp.fc2.bias], *same)]
        if block.layer_scale:
            pairs += [(block.ls1.gamma, [layer.layer_scale1.lambda1], *same),
                      (block.ls2.gamma, [layer.layer_scale2.lambda1], *same)]
    return pairs


def dinov2_from_vit(backbone, image_size, channels):
    """A KerasHub ``DINOV2Backbone`` with ``backbone``'s (a caco_tf ViT's) weights, on
    ``image_size`` px images: its output's first token is ``backbone``'s features there.

    Its position table is ours resized for that size (the table itself at the built size), and
    made for that size, so that KerasHub resizes nothing; a ViT without LayerScale gets scales
    of one; no dropout, no stochastic depth (to fine-tune with them, set them on loading)."""
    patch_embed, tokens, blocks, _ = vit.vit_blocks(backbone)
    size = (int(image_size), int(image_size))
    theirs = keras_hub().models.DINOV2Backbone(
        patch_size=patch_embed.patch, num_layers=len(blocks), hidden_dim=tokens.width,
        num_heads=blocks[0].heads, intermediate_dim=int(tokens.width * blocks[0].mlp_ratio),
        layer_scale_init_value=blocks[0].layer_scale or 1.0,
        num_register_tokens=tokens.registers, use_mask_token=tokens.has_mask_token,
        image_shape=(*size, int(channels)), position_embedding_shape=(*size, int(channels)),
        antialias_in_interpolation=tokens.interpolate_antialias, data_format="channels_last",
        dtype="float32")  # float32 whatever the global policy: the weights as trained
    for ours, their_variables, to_theirs, _ in _dinov2_pairs(backbone, theirs):
        for their, value in zip(their_variables, to_theirs(np.asarray(ours))):
            their.assign(value)
    grid = int(image_size) // patch_embed.patch
    table = np.concatenate([np.asarray(tokens.class_position(), np.float32)[0],
                            np.asarray(tokens.patch_positions(grid, grid), np.float32)])[None]
    theirs.embeddings.position_embeddings.assign(table)
    theirs.embeddings.interpolated_position_embeddings.assign(table)
    return theirs


def vit_from_dinov2(directory, input_shape, image_size=None, drop_path=0.0, vit_options=None):
    """caco_tf's ViT with the weights of the KerasHub ``DINOV2Backbone`` preset in
    ``directory``: the same features (its output's first token) at the preset's image size.

    The position table is the one the preset uses at its image size; other crop sizes resize it
    without DINO's offset, antialiased as the preset says (KerasHub's TensorFlow bicubic with
    antialias is PyTorch's antialiased bicubic).  ``vit_options``: ``mask_token`` and
    ``drop_path_uniform`` only (the others are the preset's); ``drop_path``: the run's."""
    theirs = load_preset(directory)
    config = theirs.get_config()
    options = dict(vit_options or {})
    fixed = sorted(set(options) - {"mask_token", "drop_path_uniform"})
    if fixed:
        raise ConfigError(f"model.{fixed[0]} is the DINOV2Backbone preset's own "
                          f"({PREFIX}{directory}): remove it")

    def refuse(what):
        return ConfigError(f"the DINOV2Backbone preset {PREFIX}{directory} has {what}, which "
                           f"caco_tf's ViT has no counterpart for")
    if config["use_swiglu_ffn"]:
        raise refuse("a SwiGLU feed-forward network (DINOv2's ViT-g)")
    if config["intermediate_dim"] % config["hidden_dim"]:
        raise refuse(f"an MLP of {config['intermediate_dim']} for a width of "
                     f"{config['hidden_dim']}")
    if config.get("data_format", "channels_last") != "channels_last":
        raise refuse("channels-first images")
    shape = vit.ViTShape(config["patch_size"], config["hidden_dim"], config["num_layers"],
                         config["num_heads"])
    name = next((key for key, value in vit.VIT_PRESETS.items() if value == shape), shape)
    preset_shape = tuple(config["image_shape"])
    if input_shape[-1] != preset_shape[-1]:
        raise ConfigError(f"model.backbone {PREFIX}{directory} takes images of "
                          f"{preset_shape[-1]} channels, not {input_shape[-1]}: set "
                          f"data.channels to match")
    ours = vit.build_vit(
        name, tuple(input_shape), image_size=preset_shape[0], drop_path=drop_path,
        layer_scale=config["layer_scale_init_value"] or 1.0,
        registers=config["num_register_tokens"],
        mask_token=bool(options.get("mask_token", config["use_mask_token"])),
        interpolate_offset=0.0, interpolate_antialias=config["antialias_in_interpolation"],
        drop_path_uniform=bool(options.get("drop_path_uniform", False)))
    vit.vit_blocks(ours)[1].pos_embed.assign(
        np.asarray(theirs.embeddings.interpolated_position_embeddings))
    for variable, their_variables, _, to_ours in _dinov2_pairs(ours, theirs):
        variable.assign(to_ours([np.asarray(their) for their in their_variables]))
    return ours


def is_hub_backbone(name):
    return isinstance(name, str) and name.startswith(PREFIX)


def build_hub_backbone(name, input_shape, arguments=None, image_size=None, drop_path=0.0,
                       vit_options=None):
    """A KerasHub backbone (``keras_hub:CLASS`` with ``arguments``, or ``keras_hub:PRESET_DIR``)
    on images ``input_shape``, pooled to features ``[B, F]``; a ``DINOV2Backbone`` preset
    becomes caco_tf's ViT (``vit_from_dinov2``, with ``drop_path`` and ``vit_options``)."""
    hub = keras_hub()
    target = name[len(PREFIX):]
    arguments = dict(arguments or {})
    if os.path.isdir(target):
        if arguments:
            raise ConfigError(f"model.backbone_arguments apply to a KerasHub class, not to the "
                              f"preset directory {target}")
        if preset_class(target) == DINOV2:
            return vit_from_dinov2(target, input_shape, image_size, drop_path, vit_options)
        inner = load_preset(target)
        check_images(inner, name, input_shape)
        model_name = inner.name  # not the path: name scopes refuse its leading "/" (or "_")
    else:
        if target in BASE_CLASSES:
            raise ConfigError(f"model.backbone {name} is KerasHub's base class of backbones, "
                              f"which builds no network: name a concrete class, e.g. "
                              f"keras_hub:ViTBackbone or keras_hub:ResNetBackbone")
        cls = getattr(hub.models, target, None)
        if not (isinstance(cls, type) and issubclass(cls, hub.models.Backbone)):
            raise ConfigError(f"model.backbone {name}: keras_hub.models has no backbone class "
                              f"{target!r} and no such preset directory exists")
        arguments.setdefault("image_shape", tuple(input_shape))
        try:
            inner = cls(**arguments)
        except (TypeError, ValueError) as error:
            raise ConfigError(f"model.backbone_arguments for keras_hub.models.{target}: "
                              f"{first_line(error)}") from None
        model_name = target
    inputs = keras.Input(shape=tuple(input_shape), dtype="float32", name="images")
    outputs = inner(inputs)
    if len(outputs.shape) == 4:
        features = keras.layers.GlobalAveragePooling2D(name="avgpool")(outputs)
    elif len(outputs.shape) == 3:
        features = vit.ClassToken(name="class_token")(outputs)
    else:
        raise ConfigError(f"model.backbone {name} gives outputs of shape {outputs.shape}; a "
                          f"feature map [B, h, w, C] or tokens [B, N, D] is needed")
    return keras.Model(inputs, features, name=model_name)


def load_preset(directory):
    """The KerasHub backbone saved in the preset ``directory``, or one line saying why it
    holds none."""
    # A CacoBackbone's encoder is made of caco_tf's layers: nets.vit's (imported above) and
    # nets.backbones', imported by the only caller (backbones.build_backbone).
    def not_a_preset(reason):
        return ConfigError(f"model.backbone {PREFIX}{directory} is not a KerasHub backbone "
                           f"preset: {reason}; {PRESET_FILES}")

    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        held = sorted(os.listdir(directory))
        if not held:
            raise not_a_preset("it is empty")
        more = ", ..." if len(held) > 4 else ""
        raise not_a_preset(f"it has no config.json, it holds {', '.join(held[:4])}{more}")
    try:
        with open(path, "rb") as handle:
            config = json.load(handle)
    except (OSError, ValueError) as error:
        raise not_a_preset(f"its config.json cannot be read ({first_line(error)})") from None
    if not (isinstance(config, dict) and isinstance(config.get("registered_name"), str)):
        raise not_a_preset("its config.json names no KerasHub class (no registered_name)")
    try:
        return keras_hub().models.Backbone.from_preset(directory)
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise not_a_preset(first_line(error).rstrip(".")) from None


def check_images(backbone, name, input_shape):
    """One line unless ``backbone`` takes images of ``input_shape`` ([H, W, C])."""
    inputs = keras.tree.flatten(backbone.inputs)
    if len(inputs) != 1 or len(inputs[0].shape) != 4:
        raise ConfigError(f"model.backbone {name} takes no images (its inputs: "
                          f"{', '.join(str(tuple(x.shape)) for x in inputs)}); an image "
                          f"backbone is needed, of one input [B, H, W, C]")
    expected = tuple(inputs[0].shape[1:])
    if any(size is not None and size != given for size, given in zip(expected, input_shape)):
        def sizes(shape):
            return "x".join("*" if size is None else str(size) for size in shape)
        raise ConfigError(f"model.backbone {name} takes images of {sizes(expected)}, not "
                          f"{sizes(input_shape)}: set data.image_size and data.channels to "
                          f"match")


def first_line(error):
    """An exception's message's first line (its type's name when it has none)."""
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
