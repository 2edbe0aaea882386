"""Import the authors' PyTorch CaCo checkpoints (``checkpoint_*.pth.tar``) into a CaCo model.

The reference code (maple-research-lab/CaCo) saves ``{'epoch', 'arch', 'state_dict',
'optimizer', 'Memory_Bank', ...}``.  ``state_dict`` is the DistributedDataParallel-wrapped
model: ``module.encoder_q.*`` and ``module.encoder_k.*``, each a torchvision ResNet (conv1,
bn1, layer1.0.conv1 … layer4.2.bn3, downsample.0/.1) whose ``fc`` is the projector
``fc.0`` … ``fc.6`` (Linear, BatchNorm1d, ReLU, Linear, BatchNorm1d, ReLU, Linear, no biases).
``Memory_Bank`` holds the bank ``W`` [D, K] and its SGD momentum ``v`` [D, K].

Our layers carry the torch names with '.' → '_' (``caco_tf.backbones``), so the mapping is by
name.  Layouts: conv kernels OIHW → HWIO, Linear weights [out, in] → Dense kernels [in, out],
the bank [D, K] → [K, D]; BatchNorm weight/bias/running_mean/running_var are copied exactly
(``num_batches_tracked`` has no keras counterpart and is ignored).  Every tensor is checked
(missing, unexpected, wrong shape) before anything is assigned, so a failed import leaves the
model untouched; problems are a :class:`CheckpointError` naming the key.

torch is needed only to read the file (:func:`load_checkpoint`) and is imported there, so
``caco_tf`` imports without it; the rest works on any mapping of arrays.
"""

import os
import re

import keras
import numpy as np

# The authors' input normalization (torchvision ``Normalize``) is the views' own.
from caco_tf.data.augment import IMAGENET_MEAN, IMAGENET_STD  # noqa: F401
from caco_tf.errors import CheckpointError

#: torch's BatchNorm eps (the checkpoint does not store it; the reference uses the default).
TORCH_BN_EPSILON = 1e-5
#: Training-set sizes of the data sources the published checkpoints were trained on.
TRAIN_SET_SIZES = {"tfds:imagenet2012": 1281167}

_IGNORED_SUFFIXES = (".num_batches_tracked",)


def load_checkpoint(path, trust_pickle=False):
    """Read a ``.pth.tar`` on the CPU; returns the checkpoint dict (torch tensors inside).

    ``torch.load(weights_only=True)`` refuses pickled code; ``trust_pickle=True`` lifts that,
    for files from a source you trust only.
    """
    try:
        import torch  # the optional extra: pip install "caco-tf[torch]"
    except ImportError:
        raise CheckpointError('reading a PyTorch checkpoint needs torch: '
                              'pip install "caco-tf[torch]"') from None
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=not trust_pickle)
    except Exception as error:  # torch raises many types, with paragraphs of advice
        raise CheckpointError(f"cannot read {path} as a PyTorch checkpoint: "
                              f"{_load_failure(error)}") from None
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f"{path} holds a {type(checkpoint).__name__}, not a checkpoint dict")
    return checkpoint


def _load_failure(error):
    """The one line of a ``torch.load`` failure that says what is wrong with the file."""
    text = str(error).strip()
    refused = re.search(r"WeightsUnpickler error:\s*(.+)", text)
    if refused:  # weights_only refused the pickle: say what it met, not torch's whole advice
        reason = refused.group(1).split(" was not an allowed global")[0].strip()
        if reason.startswith("Unsupported operand"):
            return f"not a torch.save file ({reason[0].lower() + reason[1:]})"
        if "global" in reason.lower():
            reason += " (if you trust the file: trust_pickle=True, --trust-pickle)"
        return reason
    return text.splitlines()[0] if text else type(error).__name__


def _to_numpy(value):
    if hasattr(value, "detach"):  # a torch tensor; NumPy has no bfloat16, so widen floats
        value = value.detach().cpu()
        value = (value.float() if value.is_floating_point() else value).numpy()
    return np.asarray(value)


def _section(checkpoint, name):
    """``checkpoint[name]`` with a DataParallel ``module.`` prefix removed; also the prefix."""
    section = checkpoint.get(name)
    if not isinstance(section, dict):
        raise CheckpointError(f"the checkpoint has no {name!r} dict (its keys: "
                              f"{', '.join(map(str, checkpoint))})")
    prefix = "module." if section and all(k.startswith("module.") for k in section) else ""
    return {key[len(prefix):]: value for key, value in section.items()}, prefix


def checkpoint_sizes(checkpoint):
    """The sizes the model must be built with: ``projector_hidden``, ``embedding_dim``,
    ``bank_size`` (K), read from ``encoder_q.fc.0``, ``encoder_q.fc.6`` and ``Memory_Bank.W``."""
    state, prefix = _section(checkpoint, "state_dict")
    bank, _ = _section(checkpoint, "Memory_Bank")
    shapes = {}
    for where, source, key in (("state_dict", state, "encoder_q.fc.0.weight"),
                               ("state_dict", state, "encoder_q.fc.6.weight"),
                               ("Memory_Bank", bank, "W")):
        if key not in source:
            name = prefix + key if where == "state_dict" else f"Memory_Bank.{key}"
            raise CheckpointError(f"the checkpoint lacks {name!r} (not a CaCo checkpoint "
                                  "with a 3-layer projector?)")
        shapes[key] = tuple(_to_numpy(source[key]).shape)
        if len(shapes[key]) != 2:
            raise CheckpointError(f"{key!r} has shape {shapes[key]}, expected a matrix")
    return {"projector_hidden": shapes["encoder_q.fc.0.weight"][0],
            "embedding_dim": shapes["encoder_q.fc.6.weight"][0],
            "bank_size": shapes["W"][1]}


# --------------------------------------------------------------------- layout conversions
def _conv_kernel(weight):
    """torch Conv2d weight [out, in, kh, kw] (OIHW) → keras Conv2D kernel [kh, kw, in, out]."""
    return np.transpose(weight, (2, 3, 1, 0))


def _transpose(weight):
    """torch Linear weight [out, in] → Dense kernel [in, out]; the bank [D, K] → [K, D]."""
    return np.transpose(weight)


def _identity(value):
    return value


def _torch_shape(variable, convert):
    """The torch shape whose conversion gives ``variable``'s shape."""
    shape = tuple(variable.shape)
    if convert is _conv_kernel:
        return (shape[3], shape[2], shape[0], shape[1])
    if convert is _transpose:
        return shape[::-1]
    return shape


def _layer_targets(layer, torch_name):
    """``{torch parameter name: (keras variable, conversion)}`` for one parameterized layer."""
    if isinstance(layer, keras.layers.BatchNormalization):
        if layer.epsilon != TORCH_BN_EPSILON:
            raise CheckpointError(f"layer {layer.name}: BatchNorm epsilon {layer.epsilon} is "
                                  f"not torch's {TORCH_BN_EPSILON}, the statistics would not "
                                  "carry over")
        if not (layer.scale and layer.center):
            raise CheckpointError(f"layer {layer.name}: an affine-free BatchNorm has no torch "
                                  "weight/bias to take")
        return {f"{torch_name}.weight": (layer.gamma, _identity),
                f"{torch_name}.bias": (layer.beta, _identity),
                f"{torch_name}.running_mean": (layer.moving_mean, _identity),
                f"{torch_name}.running_var": (layer.moving_variance, _identity)}
    if isinstance(layer, (keras.layers.Conv2D, keras.layers.Dense)):
        convert = _conv_kernel if isinstance(layer, keras.layers.Conv2D) else _transpose
        targets = {f"{torch_name}.weight": (layer.kernel, convert)}
        if layer.use_bias:
            targets[f"{torch_name}.bias"] = (layer.bias, _identity)
        return targets
    raise CheckpointError(f"layer {layer.name} ({type(layer).__name__}) has no torch mapping")


def encoder_targets(encoder, prefix):
    """Torch names → keras variables for one encoder (backbone → projector → L2 norm).

    The backbone's layers are the torchvision module names with '.' → '_' (``layer1_0_conv1``
    ← ``layer1.0.conv1``); the projector's ``fc_0`` … ``fc_6`` are the ResNet's ``fc``.
    """
    backbone, projector = [layer for layer in encoder.layers if isinstance(layer, keras.Model)]
    targets = {}
    for model, module in ((backbone, prefix), (projector, f"{prefix}.fc")):
        for layer in model.layers:
            if layer.weights:
                torch_name = layer.name.replace("_", ".")
                if model is projector:  # fc_0 → fc.0
                    torch_name = torch_name[len("fc."):]
                targets.update(_layer_targets(layer, f"{module}.{torch_name}"))
    return targets


def import_checkpoint(model, checkpoint):
    """Copy a PyTorch CaCo checkpoint into ``model`` (a ``caco_tf.methods.caco.CaCo``).

    Sets the query and key encoders (backbone, projector, BatchNorm statistics), the bank
    (``Memory_Bank.W``ᵀ) and its momentum (``Memory_Bank.v``ᵀ).  The model must have been built
    with :func:`checkpoint_sizes`.  Returns ``{'epoch', 'arch', 'tensors'}``.

    Raises:
      CheckpointError: naming the first missing, unexpected or wrongly shaped key, or an
        ``arch`` other than the model's backbone.  Nothing is assigned then.
    """
    state, prefix = _section(checkpoint, "state_dict")
    bank, bank_prefix = _section(checkpoint, "Memory_Bank")
    arch = checkpoint.get("arch")
    if arch is not None and arch != model.backbone.name:
        raise CheckpointError(f"the checkpoint's 'arch' is {arch!r}, the model's backbone is "
                              f"{model.backbone.name!r}")

    sources = [(state, prefix, {**encoder_targets(model.query_encoder, "encoder_q"),
                                **encoder_targets(model.key_encoder, "encoder_k")}),
               (bank, "Memory_Bank." + bank_prefix,
                {"W": (model.memory_bank.rows, _transpose),
                 "v": (model.memory_bank.velocity, _transpose)})]
    # Shapes first: a different architecture then shows as its first differing layer, not as
    # the first layer it lacks.  Then missing and unexpected keys.  Assign only if all is well.
    assignments = []
    for tensors, shown_prefix, targets in sources:
        for key, (variable, convert) in targets.items():
            if key not in tensors:
                continue
            value = _to_numpy(tensors[key]).astype(np.float32)
            expected = _torch_shape(variable, convert)
            if value.shape != expected:
                raise CheckpointError(
                    f"{shown_prefix + key!r} has shape {value.shape}, the "
                    f"{model.backbone.name} CaCo model expects {expected}")
            assignments.append((variable, convert(value)))
    for tensors, shown_prefix, targets in sources:
        missing = [key for key in targets if key not in tensors]
        if missing:
            raise CheckpointError(f"the checkpoint lacks {shown_prefix + missing[0]!r}, which "
                                  f"the {model.backbone.name} CaCo model needs "
                                  f"({len(missing)} such keys)")
        unexpected = [key for key in tensors
                      if key not in targets and not key.endswith(_IGNORED_SUFFIXES)]
        if unexpected:
            raise CheckpointError(f"unexpected key {shown_prefix + unexpected[0]!r} in the "
                                  f"checkpoint: no layer of the {model.backbone.name} CaCo model "
                                  f"takes it ({len(unexpected)} such keys)")

    for variable, value in assignments:
        variable.assign(value)
    epoch = checkpoint.get("epoch")
    return {"epoch": None if epoch is None else int(epoch), "arch": arch,
            "tensors": len(assignments)}


def resume_point(config, epoch, steps_per_epoch):
    """(our epoch, optimizer step) that continue the authors' ``epoch`` finished CaCo epochs.

    The reference fills its bank in a separate pass before epoch 0; our runs count that pass
    as ``method.caco.warmup_epochs`` of ``train.epochs``, so E of theirs is warmup_epochs + E of
    ours.
    """
    ours = min(config["method"]["caco"]["warmup_epochs"] + epoch, config["train"]["epochs"])
    return ours, ours * steps_per_epoch


# --------------------------------------------------------------------- ViT checkpoints
# DINO's and MoCo v3's ViTs are timm's layout: cls_token, pos_embed, patch_embed.proj,
# blocks.N.{norm1, attn.qkv, attn.proj, norm2, mlp.fc1, mlp.fc2}, norm; nets.vit names its
# layers after them.
_VIT_PARTS = {"norm1": "norm1", "attn_qkv": "attn.qkv", "attn_proj": "attn.proj",
              "norm2": "norm2", "mlp_fc1": "mlp.fc1", "mlp_fc2": "mlp.fc2"}
# DINOv2's blocks add LayerScale's ls1.gamma and ls2.gamma; its tokens register_tokens and
# mask_token (facebookresearch/dinov2 vision_transformer.py and layers/).
_LAYER_SCALES = ("ls1", "ls2")
#: Where each published ViT checkpoint keeps the backbone: (section, key prefix, whose).
VIT_LAYOUTS = (
    (None, "", "DINO's backbone file (dino_*_pretrain.pth: the teacher's backbone)"),
    ("teacher", "backbone.", "DINO's full checkpoint (the teacher's backbone, as DINO evaluates)"),
    ("state_dict", "module.base_encoder.", "MoCo v3's checkpoint (the base encoder)"),
)
_DINOV2_FILE = "DINOv2's backbone file (dinov2_*_pretrain.pth)"
_DINOV2_FULL = "DINOv2's training checkpoint (the teacher's backbone)"
# DINOv2 chunks its blocks for FSDP (block_chunks > 0): blocks.<chunk>.<block>.* in its files.
_CHUNKED_BLOCK = re.compile(r"^blocks\.\d+\.(\d+)\.")


def vit_backbone_state(checkpoint):
    """``(tensors, key prefix, what it is)``: the ViT backbone's tensors of a DINO or MoCo v3
    checkpoint (``VIT_LAYOUTS``), without the prefix; ``None`` when it holds no ViT."""
    for section, prefix, what in VIT_LAYOUTS:
        tensors = checkpoint if section is None else checkpoint.get(section)
        if isinstance(tensors, dict) and f"{prefix}cls_token" in tensors:
            shown = prefix if section is None else f"{section}.{prefix}"
            tensors = {_CHUNKED_BLOCK.sub(r"blocks.\1.", key[len(prefix):]): value
                       for key, value in tensors.items() if key.startswith(prefix)}
            if is_dinov2(tensors):  # the same places, DINOv2's additions inside
                what = _DINOV2_FILE if section is None else _DINOV2_FULL
            return tensors, shown, what
    return None


def is_dinov2(tensors):
    """Whether a ViT's tensors are DINOv2's layout (its mask token, LayerScale or registers)."""
    return any(key in tensors for key in ("mask_token", "register_tokens", "blocks.0.ls1.gamma"))


def vit_settings_of(tensors, image_size=None):
    """The model settings (``--set`` lines) a DINOv2-layout backbone needs beside its preset:
    LayerScale, the registers, the mask token and the position table's image side when it is not
    ``image_size``, read from the tensors; DINOv2's resize of that table by its hub's rule
    (checkpoints with registers: no offset, antialiased; without: DINO's)."""
    if not is_dinov2(tensors):
        return []
    settings = []
    if "blocks.0.ls1.gamma" in tensors:  # the value starts the scales only; the file's replace it
        settings.append("model.layer_scale=1e-05")
    if "register_tokens" in tensors:
        count = _to_numpy(tensors["register_tokens"]).shape[1]
        settings += [f"model.registers={count}", "model.interpolate_offset=0.0",
                     "model.interpolate_antialias=true"]
    if "mask_token" in tensors:
        settings.append("model.mask_token=true")
    if "pos_embed" in tensors and "patch_embed.proj.weight" in tensors:
        positions = _to_numpy(tensors["pos_embed"]).shape[1] - 1
        grid = int(round(positions ** 0.5))
        side = grid * _to_numpy(tensors["patch_embed.proj.weight"]).shape[-1]
        if grid * grid == positions and side != image_size:
            settings.append(f"model.position_table_size={side}")
    return settings


def vit_preset_of(tensors, shown_prefix=""):
    """The ``nets.vit`` preset the tensors fit (patch, width and blocks read from them);
    ``shown_prefix``: where they sit in the checkpoint, for the error messages."""
    from caco_tf.nets import vit

    shown = shown_prefix + "patch_embed.proj.weight"
    if "patch_embed.proj.weight" not in tensors:
        raise CheckpointError(f"the checkpoint lacks {shown!r}, which a ViT backbone needs (its "
                              f"patch size and width are read from it)")
    patch_weight = _to_numpy(tensors["patch_embed.proj.weight"])
    if patch_weight.ndim != 4:
        raise CheckpointError(f"{shown!r} has shape {patch_weight.shape}, expected [width, "
                              f"channels, patch, patch]")
    width, patch = patch_weight.shape[0], patch_weight.shape[-1]
    depth = len({key.split(".")[1] for key in tensors if key.startswith("blocks.")})
    for name, shape in vit.VIT_PRESETS.items():
        if (shape.patch, shape.width, shape.depth) == (patch, width, depth):
            return name
    raise CheckpointError(f"no ViT of patch {patch}, width {width} and {depth} blocks here "
                          f"(nets.vit.VIT_PRESETS)")


def vit_targets(backbone):
    """Torch names → (keras variable, conversion) for a ``nets.vit`` backbone."""
    from caco_tf.nets import vit

    patch_embed, tokens, blocks, norm = vit.vit_blocks(backbone)
    targets = {"patch_embed.proj.weight": (patch_embed.proj.kernel, _conv_kernel),
               "patch_embed.proj.bias": (patch_embed.proj.bias, _identity),
               "cls_token": (tokens.cls_token, _identity),
               "norm.weight": (norm.gamma, _identity), "norm.bias": (norm.beta, _identity)}
    if tokens.positions == "learned":
        targets["pos_embed"] = (tokens.pos_embed, _identity)
    if tokens.registers:
        targets["register_tokens"] = (tokens.register_tokens, _identity)
    if tokens.has_mask_token:
        targets["mask_token"] = (tokens.mask_token, _identity)
    for index, block in enumerate(blocks):
        if block.layer_scale:
            for scale in _LAYER_SCALES:
                targets[f"blocks.{index}.{scale}.gamma"] = (getattr(block, scale).gamma,
                                                            _identity)
        for ours, theirs in _VIT_PARTS.items():
            layer = getattr(block, ours)
            if isinstance(layer, keras.layers.LayerNormalization):
                pairs = ((layer.gamma, "weight", _identity), (layer.beta, "bias", _identity))
            else:
                pairs = ((layer.kernel, "weight", _transpose), (layer.bias, "bias", _identity))
            for variable, kind, convert in pairs:
                targets[f"blocks.{index}.{theirs}.{kind}"] = (variable, convert)
    return targets


def import_vit_backbone(backbones, tensors, shown_prefix):
    """Copy a ViT checkpoint's backbone tensors into every model of ``backbones`` (the
    student's and the teacher's).  Every tensor is checked first (shape, missing, unexpected;
    MoCo v3's fixed sine-cosine ``pos_embed`` against the one computed here); returns the
    number of tensors."""
    from caco_tf.nets import vit

    targets = vit_targets(backbones[0])
    tokens = vit.vit_blocks(backbones[0])[1]
    missing = [key for key in targets if key not in tensors]
    if missing:
        raise CheckpointError(f"the checkpoint lacks {shown_prefix + missing[0]!r}, which the "
                              f"{backbones[0].name} backbone needs ({len(missing)} such keys)")
    expected_extra = set() if tokens.positions == "learned" else {"pos_embed"}
    unexpected = [key for key in tensors if key not in targets and key not in expected_extra
                  and not key.startswith("head.")]  # the head: the method's, not imported
    if unexpected:
        raise CheckpointError(f"unexpected key {shown_prefix + unexpected[0]!r} in the "
                              f"checkpoint: no layer of the {backbones[0].name} backbone takes "
                              f"it ({len(unexpected)} such keys)")
    values = {}
    for key, (variable, convert) in targets.items():
        value = _to_numpy(tensors[key]).astype(np.float32)
        if value.shape != _torch_shape(variable, convert):
            raise CheckpointError(f"{shown_prefix + key!r} has shape {value.shape}, the "
                                  f"{backbones[0].name} backbone expects "
                                  f"{_torch_shape(variable, convert)}")
        values[key] = convert(value)
    if "pos_embed" in expected_extra:
        given = _to_numpy(tensors["pos_embed"]).astype(np.float32)[0, 1:]
        computed = np.asarray(tokens.patch_positions(tokens.grid, tokens.grid))
        if given.shape != computed.shape or np.abs(given - computed).max() > 1e-5:
            raise CheckpointError(f"{shown_prefix}pos_embed is not the sine-cosine table of "
                                  f"a {tokens.grid}x{tokens.grid} grid: build the model with "
                                  f"model.position_embedding learned")
    for backbone in backbones:
        for key, (variable, _) in vit_targets(backbone).items():
            variable.assign(values[key])
    return len(values)
