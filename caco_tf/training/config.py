"""Run configuration: defaults as data, YAML files on top, ``--set key=value`` on top of that.

Every key a run accepts is listed in ``DEFAULTS``; an unknown key or a value of the wrong type
is a ``ConfigError`` with a one-line message, never a traceback deep inside training.
"""

import copy

import yaml

from caco_tf.errors import ConfigError

__all__ = ["DEFAULTS", "ConfigError", "changed_settings", "load_config", "parse_assignment"]

STRATEGIES = ("auto", "default", "mirrored", "multiworker")
# caco.method: CaCo or one of the paper's ablation rows / baselines (caco_tf.methods).
METHODS = ("caco", "none", "positive", "negative", "moco_v2", "simclr")


# `None` means "derived" (documented beside the key); any other value fixes the key's type.
DEFAULTS = {
    "name": "mnist",
    "data": {
        # mnist | mnist_validation (tuning split) | npz:PATH | folder:PATH | tfds:NAME[:SPLIT]
        "source": "mnist",
        "data_dir": "",            # TFDS data_dir ("": TFDS's default, ~/tensorflow_datasets)
        "manual_dir": "",          # TFDS manual_dir (imagenet2012's tar files)
        # Labelled held-out images for every kNN and evaluation ("": the source's own held-out
        # split): folder:PATH | npz:PATH | tfds:NAME:SPLIT | tfrecord:GLOB
        "held_out": "",
        "image_size": 28,          # the views' (global crops') size
        "channels": 1,             # 1 | 3; images are converted to it when decoded
        # digits | asymmetric (the paper's two views; alias: cifar, imagenet) | multicrop
        "views": "digits",
        "crop_scale": [0.2, 1.0],  # asymmetric views: RandomResizedCrop area range
        "blur_sigma": [0.1, 2.0],  # colour views: Gaussian blur σ range, pixels of the view
        "multicrop": {             # views: multicrop (SwAV's 2×224 + 6×96)
            "local_size": 96,
            "local_crops": 6,
            "global_scale": [0.14, 1.0],
            "local_scale": [0.05, 0.14],
        },
        "seed": 0,
    },
    "model": {
        "backbone": "small_convnet",  # small_convnet | cifar_resnet18 | resnet50
        "widths": None,            # small_convnet's 4 conv widths (None: 32, 64, 128, 256)
        # Features: 1 = global average pooling (F = last width); g > 1 = the mean of each cell of
        # a g×g grid over the last feature map, flattened (F = g²·width; keeps coarse layout).
        "pool_grid": 1,
        "projector_hidden": 2048,
        "embedding_dim": 256,
        "sync_batchnorm": None,    # None: synchronized BatchNorm exactly when replicas > 1
    },
    "caco": {
        "bank_size": 65536,        # K
        "temperature": 0.08,       # τ of the encoder loss
        "bank_temperature": 0.08,  # τ of the bank update
        "bank_lr": 3.0,
        "bank_momentum": 0.9,
        "key_momentum": 0.99,      # rises to 1.0 on a cosine over training
        "warmup_epochs": 1,        # MoCo-style pass that fills the bank with real keys
        "warmup_min_steps": 0,     # ...lasting at least this many steps (the EMA must follow)
        "warmup_temperature": 0.2,
        "resync_after_warmup": True,  # key encoder ← query encoder when the warm-up ends
        # caco | none | positive | negative (the paper's ablation rows) | moco_v2 | simclr
        "method": "caco",
    },
    "train": {
        "epochs": 200,
        "batch_size": 256,
        "optimizer": "auto",       # auto (paper: sgd below batch 1024, lars from 1024) | sgd | lars
        "learning_rate": None,     # None: 0.03·batch/256 (sgd) or 0.3·batch/256 (lars)
        "weight_decay": 1e-4,
        "momentum": 0.9,
        "lr_warmup_epochs": 0,
        "seed": 0,
        "jit_compile": False,
        "precision": "float32",    # float32 | mixed_float16 | mixed_bfloat16 (keras policy)
        # After the last epoch, re-estimate the backbone's BatchNorm statistics on this many
        # un-augmented training images, an even sample (0: off, the paper's protocol;
        # callbacks.PreciseBatchNorm).  Training itself is unchanged.
        "precise_bn_images": 0,
        # A resume whose settings change the schedules (epochs, batch size, learning rates,
        # warm-up): refuse (the default) | rescale (re-plan the rest over the new length).
        "on_schedule_change": "refuse",
        "stop_on_collapse": False,  # stop (keeping the last good checkpoint) on a collapse
    },
    "distribute": {
        "strategy": "auto",        # auto | default | mirrored | multiworker (caco_tf.distribute)
    },
    "evaluation": {
        "knn_k": 5,
        "knn_temperature": 0.07,
        "batch_size": 500,
        # kNN monitor during pre-training (caco_tf.callbacks.KNNMonitor), logged as knn_top1:
        # training images' labels against the held-out split, every N epochs (0: off).
        "knn_monitor_every": 5,
        "knn_monitor_k": 200,
        "knn_monitor_temperature": 0.07,
        # Every kNN (monitor, end of run) reads class-balanced samples of at most this many
        # training and held-out images.
        "knn_train_images": 50000,
        "knn_test_images": 10000,
        # Effective rank (RankMe) of the embeddings and features, each epoch, on this many
        # un-augmented training images (0: off).
        "health_images": 1024,
        # A Dense head on stop-gradient backbone features, trained beside the encoder on
        # labelled batches (probe_top1; CaCo(online_probe_classes)); it never changes the
        # encoder.  Needs a labelled training source (its labels reach the probe only).
        "online_probe": False,
    },
}

# Keys whose default is None, with the type a given value must have.
_DERIVED_TYPES = {("train", "learning_rate"): float, ("model", "sync_batchnorm"): bool,
                  ("model", "widths"): list}


def _check_type(path, value, default):
    expected = _DERIVED_TYPES.get(tuple(path), type(default))
    name = ".".join(path)
    if value is None and default is None:
        return None
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is bool and not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}")
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise ConfigError(f"{name} must be of type {expected.__name__}, got {value!r}")
    return value


def _merge(base, override, path=()):
    for key, value in override.items():
        where = path + (key,)
        if key not in base:
            known = ", ".join(sorted(base))
            raise ConfigError(f"unknown config key '{'.'.join(where)}' (known here: {known})")
        if isinstance(base[key], dict):
            if not isinstance(value, dict):
                raise ConfigError(f"{'.'.join(where)} must be a mapping of settings")
            _merge(base[key], value, where)
        else:
            base[key] = _check_type(where, value, DEFAULTS_FLAT[where])


def _flatten(tree, path=()):
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, path + (key,)))
        else:
            flat[path + (key,)] = value
    return flat


DEFAULTS_FLAT = _flatten(DEFAULTS)


def changed_settings(old, new):
    """``["key: old -> new", ...]`` for every flattened key whose value differs."""
    old_flat, new_flat = _flatten(old), _flatten(new)
    return [f"{'.'.join(key)}: {old_flat.get(key)!r} -> {new_flat.get(key)!r}"
            for key in sorted(set(old_flat) | set(new_flat))
            if old_flat.get(key) != new_flat.get(key)]


def parse_assignment(text):
    """'caco.bank_lr=0.3' → {'caco': {'bank_lr': 0.3}} (the value is read as YAML)."""
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


def load_config(path=None, assignments=()):
    """Defaults, then the YAML file at ``path``, then each ``key=value`` assignment."""
    config = copy.deepcopy(DEFAULTS)
    if path is not None:
        try:
            with open(path) as handle:
                loaded = yaml.safe_load(handle) or {}
        except OSError as error:
            raise ConfigError(f"cannot read config {path}: {error.strerror}") from None
        except yaml.YAMLError as error:
            raise ConfigError(f"config {path} is not valid YAML: {error}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config {path} must be a mapping of settings")
        _merge(config, loaded)
    for assignment in assignments:
        _merge(config, parse_assignment(assignment))
    _validate(config)
    return config


def _validate(config):
    positive = [("train", "epochs"), ("train", "batch_size"), ("caco", "bank_size"),
                ("caco", "temperature"), ("caco", "bank_temperature"), ("model", "embedding_dim"),
                ("evaluation", "knn_k"), ("data", "image_size"), ("data", "channels"),
                ("evaluation", "knn_monitor_k"), ("evaluation", "knn_monitor_temperature"),
                ("model", "pool_grid")]
    for section, key in positive:
        if config[section][key] <= 0:
            raise ConfigError(f"{section}.{key} must be positive, got {config[section][key]}")
    for section, key in [("train", "precise_bn_images"), ("evaluation", "knn_monitor_every")]:
        if config[section][key] < 0:
            raise ConfigError(f"{section}.{key} must be 0 (off) or positive")
    if not 0 <= config["caco"]["warmup_epochs"] < config["train"]["epochs"]:
        raise ConfigError("caco.warmup_epochs must be at least 0 and below train.epochs")
    choices = {("train", "precision"): ("float32", "mixed_float16", "mixed_bfloat16"),
               ("distribute", "strategy"): STRATEGIES, ("caco", "method"): METHODS}
    for (section, key), allowed in choices.items():
        if config[section][key] not in allowed:
            raise ConfigError(f"{section}.{key} must be one of {', '.join(allowed)}, got "
                              f"{config[section][key]!r}")
    if config["train"]["optimizer"] not in ("auto", "sgd", "lars"):
        raise ConfigError(f"train.optimizer must be auto, sgd or lars, got "
                          f"{config['train']['optimizer']!r}")
    if config["caco"]["method"] != "caco" and config["data"]["views"] == "multicrop":
        raise ConfigError(f"caco.method {config['caco']['method']} takes two views; "
                          f"data.views multicrop works with caco.method caco only")
    _validate_data(config["data"])


VIEWS = ("digits", "asymmetric", "cifar", "imagenet", "multicrop")


def _validate_data(data):
    if data["views"] not in VIEWS:
        raise ConfigError(f"data.views must be one of {', '.join(VIEWS)}, got {data['views']!r}")
    if data["channels"] not in (1, 3):
        raise ConfigError(f"data.channels must be 1 or 3, got {data['channels']}")
    ranges = {"data.crop_scale": (data["crop_scale"], 1.0),
              "data.multicrop.global_scale": (data["multicrop"]["global_scale"], 1.0),
              "data.multicrop.local_scale": (data["multicrop"]["local_scale"], 1.0),
              "data.blur_sigma": (data["blur_sigma"], None)}
    for name, (value, upper) in ranges.items():
        numbers = len(value) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        if not numbers or not 0 <= value[0] <= value[1] or (upper and value[1] > upper) or (
                upper and value[1] <= 0):
            bound = f" at most {upper}" if upper else ""
            raise ConfigError(f"{name} must be [low, high] with 0 <= low <= high{bound}, got "
                              f"{value!r}")
    if data["multicrop"]["local_size"] <= 0 or data["multicrop"]["local_crops"] < 0:
        raise ConfigError("data.multicrop.local_size must be positive and local_crops >= 0")
