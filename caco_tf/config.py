"""Run configuration: defaults as data, YAML files on top, ``--set key=value`` on top of that.

Every key a run accepts is listed in ``DEFAULTS``; an unknown key or a value of the wrong type
is a ``ConfigError`` with a one-line message, never a traceback deep inside training.
"""

import copy

import yaml


class ConfigError(ValueError):
    """A configuration problem the user can fix."""


# `None` means "derived" (documented beside the key); any other value fixes the key's type.
DEFAULTS = {
    "name": "mnist",
    "data": {
        "source": "mnist",         # mnist | mnist_validation (tuning split) | npz:PATH
        "image_size": 28,
        "channels": 1,
        "views": "digits",         # the two-view augmentation (caco_tf.augment)
        "seed": 0,
    },
    "model": {
        "backbone": "small_convnet",  # small_convnet | cifar_resnet18 | resnet50
        "projector_hidden": 2048,
        "embedding_dim": 256,
        "sync_batchnorm": False,
    },
    "caco": {
        "bank_size": 65536,        # K
        "temperature": 0.08,       # τ of the encoder loss
        "bank_temperature": 0.08,  # τ of the bank update
        "bank_lr": 3.0,
        "bank_momentum": 0.9,
        "key_momentum": 0.99,      # rises to 1.0 on a cosine over training
        "warmup_epochs": 1,        # MoCo-style pass that fills the bank with real keys
        "warmup_temperature": 0.2,
        "resync_after_warmup": True,  # key encoder ← query encoder when the warm-up ends
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
    },
    "evaluation": {
        "knn_k": 5,
        "knn_temperature": 0.07,
        "batch_size": 500,
    },
}

# Keys whose default is None, with the type a given value must have.
_DERIVED_TYPES = {("train", "learning_rate"): float}


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
                ("evaluation", "knn_k"), ("data", "image_size"), ("data", "channels")]
    for section, key in positive:
        if config[section][key] <= 0:
            raise ConfigError(f"{section}.{key} must be positive, got {config[section][key]}")
    if not 0 <= config["caco"]["warmup_epochs"] < config["train"]["epochs"]:
        raise ConfigError("caco.warmup_epochs must be at least 0 and below train.epochs")
    if config["train"]["optimizer"] not in ("auto", "sgd", "lars"):
        raise ConfigError(f"train.optimizer must be auto, sgd or lars, got "
                          f"{config['train']['optimizer']!r}")
