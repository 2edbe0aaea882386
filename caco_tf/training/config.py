"""Run configuration: defaults as data, YAML files on top, ``--set key=value`` on top of that.

Every key a run accepts is listed in ``DEFAULTS``; an unknown key or a value of the wrong type
is a ``ConfigError`` with a one-line message, never a traceback deep inside training.
"""

import copy
import os

import yaml

from caco_tf.errors import ConfigError
from caco_tf.nets.sizes import DOWNSAMPLING, feature_map_size, smallest_image

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
        # Keras preprocessing layers appended to every view, on [0, 1] pixels, e.g.
        # [{layer: RandomContrast, factor: 0.2, value_range: [0, 1]}] (augment.WithLayers).
        "extra_layers": [],
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
        # The warm-up pass for methods without a bank too (none, simclr): a fair ablation.
        "warmup_every_method": False,
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
        # Save the resume state inside an epoch every N minutes (0: at epoch ends only), so a
        # hard kill loses at most that much; a ResNet-50 state with a 65,536-row bank (501 MiB)
        # took 2.7 s to save on 2 Xeon cores (BENCHMARKS.md): 0.45 % of the time at 10 minutes.
        "checkpoint_every_minutes": 10.0,
    },
    "distribute": {
        "strategy": "auto",        # auto | default | mirrored | multiworker (training.distribute)
        # Multi-worker runs: a collective that waits longer than this for a peer (a hung or
        # paused machine) ends every worker that waits, with one line (0: wait forever).
        "collective_timeout_seconds": 600.0,
    },
    "evaluation": {
        "knn_k": 5,
        "knn_temperature": 0.07,
        "batch_size": 500,
        # kNN monitor during pre-training (evaluation.monitor.KNNMonitor), logged as knn_top1:
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


def shipped_configs():
    """{name: path} of the configurations the package ships (the checkout's ``configs/``, which
    a wheel carries as ``caco_tf/configs``)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # caco_tf/
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


def load_config(path=None, assignments=()):
    """Defaults, then the YAML file at ``path`` (a path, or a shipped configuration's name:
    ``config_path``), then each ``key=value`` assignment."""
    config = copy.deepcopy(DEFAULTS)
    if path is not None:
        path = config_path(path)
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


# ---------------------------------------------------------------------------- validation
class Rule:
    """What one key accepts: ``check(value)`` and the words that say it (``allowed``)."""

    def __init__(self, check, allowed):
        self.check, self.allowed = check, allowed


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def integer(low=None, high=None):
    words = ("an integer" + (f" >= {low}" if low is not None else "")
             + (f" and <= {high}" if high is not None else ""))
    return Rule(lambda v: _is_int(v) and (low is None or v >= low)
                and (high is None or v <= high), words)


def number(low=None, high=None, low_open=False, high_open=False):
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {high:g}")

    def check(v):
        return _is_number(v) and v == v and (
            low is None or (v > low if low_open else v >= low)) and (
            high is None or (v < high if high_open else v <= high))
    return Rule(check, "a number " + " and ".join(parts) if parts else "a number")


def choice(*values):
    return Rule(lambda v: v in values, "one of " + ", ".join(str(v) for v in values))


def boolean():
    return Rule(lambda v: isinstance(v, bool), "true or false")


def optional(rule, meaning):
    return Rule(lambda v: v is None or rule.check(v), f"{rule.allowed}, or null ({meaning})")


def span(low, high=None, positive_low=False):
    """[low, high] with bounds, as the crop scales and blur range."""
    bound = f" <= {high:g}" if high is not None else ""
    first = "0 < low" if positive_low else "0 <= low"

    def check(v):
        return (isinstance(v, list) and len(v) == 2 and all(_is_number(x) for x in v)
                and (v[0] > low if positive_low else v[0] >= low) and v[0] <= v[1]
                and (high is None or v[1] <= high))
    return Rule(check, f"[low, high] with {first} <= high{bound}")


def text(pattern_words, check=lambda v: True):
    return Rule(lambda v: isinstance(v, str) and check(v), pattern_words)


def _source(value, held_out=False):
    kind, _, rest = value.partition(":")
    if held_out:
        return value == "" or (kind in ("folder", "npz", "tfrecord") and bool(rest)) or (
            kind == "tfds" and rest.count(":") == 1 and all(rest.split(":")))
    return value in ("mnist", "mnist_validation") or (
        kind in ("npz", "folder", "tfrecord", "tfds") and bool(rest))


BACKBONES = tuple(DOWNSAMPLING)
VIEWS = ("digits", "asymmetric", "cifar", "imagenet", "multicrop")

# Every key of DEFAULTS: what it accepts.  A test checks that none is missing.
RULES = {
    "name": text("a non-empty name without '/'", lambda v: bool(v) and "/" not in v),
    "data.source": text("mnist, mnist_validation, npz:PATH, folder:PATH, tfds:NAME[:SPLIT] or "
                        "tfrecord:GLOB", _source),
    "data.data_dir": text("a folder path, or '' (TFDS's default)"),
    "data.manual_dir": text("a folder path, or '' (TFDS's default)"),
    "data.held_out": text("'', folder:PATH, npz:PATH, tfds:NAME:SPLIT or tfrecord:GLOB",
                          lambda v: _source(v, held_out=True)),
    "data.image_size": integer(1, 4096),
    "data.channels": choice(1, 3),
    "data.views": choice(*VIEWS),
    "data.crop_scale": span(0.0, 1.0, positive_low=True),
    "data.blur_sigma": span(0.0),
    "data.extra_layers": Rule(lambda v: isinstance(v, list) and all(
        isinstance(e, dict) and isinstance(e.get("layer"), str) for e in v),
        "a list of {layer: NAME, ...arguments} mappings"),
    "data.multicrop.local_size": integer(1, 4096),
    "data.multicrop.local_crops": integer(0, 64),
    "data.multicrop.global_scale": span(0.0, 1.0, positive_low=True),
    "data.multicrop.local_scale": span(0.0, 1.0, positive_low=True),
    "data.seed": integer(0),
    "model.backbone": choice(*BACKBONES),
    "model.widths": optional(Rule(lambda v: isinstance(v, list) and len(v) == 4 and all(
        _is_int(w) and w >= 1 for w in v), "4 positive integers"), "small_convnet's 32, 64, "
        "128, 256"),
    "model.pool_grid": integer(1, 16),
    "model.projector_hidden": integer(1),
    "model.embedding_dim": integer(1),
    "model.sync_batchnorm": optional(boolean(), "exactly when replicas > 1"),
    "caco.bank_size": integer(1),
    "caco.temperature": number(0.0, low_open=True),
    "caco.bank_temperature": number(0.0, low_open=True),
    "caco.bank_lr": number(0.0),
    "caco.bank_momentum": number(0.0, 1.0, high_open=True),
    "caco.key_momentum": number(0.0, 1.0),
    "caco.warmup_epochs": integer(0),
    "caco.warmup_min_steps": integer(0),
    "caco.warmup_temperature": number(0.0, low_open=True),
    "caco.resync_after_warmup": boolean(),
    "caco.warmup_every_method": boolean(),
    "caco.method": choice(*METHODS),
    "train.epochs": integer(1),
    "train.batch_size": integer(1),
    "train.optimizer": choice("auto", "sgd", "lars"),
    "train.learning_rate": optional(number(0.0, low_open=True), "the paper's rule from the "
                                    "batch"),
    "train.weight_decay": number(0.0),
    "train.momentum": number(0.0, 1.0, high_open=True),
    "train.lr_warmup_epochs": integer(0),
    "train.seed": integer(0),
    "train.jit_compile": boolean(),
    "train.precision": choice("float32", "mixed_float16", "mixed_bfloat16"),
    "train.precise_bn_images": integer(0),
    "train.on_schedule_change": choice("refuse", "rescale"),
    "train.stop_on_collapse": boolean(),
    "train.checkpoint_every_minutes": number(0.0),
    "distribute.strategy": choice(*STRATEGIES),
    "distribute.collective_timeout_seconds": number(0.0),
    "evaluation.knn_k": integer(1),
    "evaluation.knn_temperature": number(0.0, low_open=True),
    "evaluation.batch_size": integer(1),
    "evaluation.knn_monitor_every": integer(0),
    "evaluation.knn_monitor_k": integer(1),
    "evaluation.knn_monitor_temperature": number(0.0, low_open=True),
    "evaluation.knn_train_images": integer(1),
    "evaluation.knn_test_images": integer(1),
    "evaluation.health_images": integer(0),
    "evaluation.online_probe": boolean(),
}


# One line per key: what it does (the documentation's configuration reference is generated
# from DEFAULTS, RULES and this table; a test checks that every key has its line).
HELP = {
    "name": "the run's name: its default folder is runs/<name>",
    "data.source": "the training images; labels, where a source has them, serve evaluation "
                   "only",
    "data.data_dir": "where TFDS keeps prepared data sets ('': ~/tensorflow_datasets)",
    "data.manual_dir": "where TFDS finds manually downloaded files (imagenet2012's archives)",
    "data.held_out": "labelled held-out images for every kNN and evaluation ('': the source's "
                     "own held-out split, if any)",
    "data.image_size": "the side of the (global) views and of the exported model's input",
    "data.channels": "1 or 3: every image is converted to it when decoded",
    "data.views": "the augmentation: digits (offline MNIST), asymmetric (the paper's two "
                  "views; cifar and imagenet are aliases) or multicrop",
    "data.crop_scale": "asymmetric views: the RandomResizedCrop area range",
    "data.blur_sigma": "colour views: the Gaussian blur's sigma range, in pixels of the view",
    "data.extra_layers": "Keras preprocessing layers appended to every view, on its [0, 1] "
                         "pixels: [{layer: RandomContrast, factor: 0.2, value_range: [0, 1]}] "
                         "(a Keras layer's name or a dotted path, then its arguments)",
    "data.multicrop.local_size": "multicrop: the side of the local crops",
    "data.multicrop.local_crops": "multicrop: local crops per image",
    "data.multicrop.global_scale": "multicrop: the global crops' area range",
    "data.multicrop.local_scale": "multicrop: the local crops' area range",
    "data.seed": "the seed of the order of the images and of every view",
    "model.backbone": "the encoder's backbone (images to pooled features)",
    "model.widths": "small_convnet's four convolution widths",
    "model.pool_grid": "1: global average pooling; g: the mean of each cell of a gxg grid over "
                       "the last feature map, flattened",
    "model.projector_hidden": "the projection MLP's hidden width",
    "model.embedding_dim": "D, the embedding's (and the bank rows') dimension",
    "model.sync_batchnorm": "BatchNorm statistics over all replicas",
    "caco.bank_size": "K, the bank's rows (positives and negatives share them)",
    "caco.temperature": "tau of the encoder's loss",
    "caco.bank_temperature": "tau of the bank's update",
    "caco.bank_lr": "the bank's learning rate (cosine-decayed)",
    "caco.bank_momentum": "the SGD momentum of the bank's update",
    "caco.key_momentum": "the key encoder's EMA momentum at the start (it rises to 1 on a "
                         "cosine)",
    "caco.warmup_epochs": "epochs of the MoCo-style pass that fills the bank with real keys",
    "caco.warmup_min_steps": "the least steps that warm-up lasts (the EMA must follow the "
                             "query encoder before the resync)",
    "caco.warmup_temperature": "tau of the warm-up's loss",
    "caco.resync_after_warmup": "copy the query encoder into the key encoder when the warm-up "
                                "ends",
    "caco.warmup_every_method": "run the warm-up for the methods without a bank too (a fair "
                                "ablation)",
    "caco.method": "caco, or the paper's ablation rows (none, positive, negative) and baselines "
                   "(moco_v2, simclr)",
    "train.epochs": "epochs, warm-up included",
    "train.batch_size": "the global batch, split over the replicas",
    "train.optimizer": "auto: SGD below a batch of 1,024, LARS from it (the paper's rule)",
    "train.learning_rate": "the encoder's peak learning rate",
    "train.weight_decay": "the encoder's (coupled, PyTorch-style) weight decay",
    "train.momentum": "the encoder optimizer's momentum",
    "train.lr_warmup_epochs": "epochs of the learning rate's linear warm-up",
    "train.seed": "the seed of the weights' initialization",
    "train.jit_compile": "compile the train step with XLA",
    "train.precision": "the Keras dtype policy (the bank, logits and loss stay float32)",
    "train.precise_bn_images": "re-estimate the backbone's BatchNorm statistics on this many "
                               "un-augmented images after the last epoch (0: off)",
    "train.on_schedule_change": "what a resume does when epochs, batch size, learning rates or "
                                "warm-up changed: refuse, or rescale the rest of the run",
    "train.stop_on_collapse": "stop the run on a collapse (the last good checkpoint stays)",
    "train.checkpoint_every_minutes": "save the resume state inside an epoch every N minutes, "
                                      "so a hard kill loses at most that (0: at epoch ends only)",
    "distribute.strategy": "auto: mirrored when several GPUs are visible, else one device",
    "distribute.collective_timeout_seconds": "multi-worker runs: seconds a worker waits for "
                                             "its peers at a collective before it stops with "
                                             "one line, exit status 75 (0: forever)",
    "evaluation.knn_k": "neighbours of the end-of-run kNN and caco-evaluate knn",
    "evaluation.knn_temperature": "the vote temperature of that kNN",
    "evaluation.batch_size": "the batch of every evaluation pass",
    "evaluation.knn_monitor_every": "the kNN monitor during training, every N epochs (0: off)",
    "evaluation.knn_monitor_k": "the monitor's neighbours",
    "evaluation.knn_monitor_temperature": "the monitor's vote temperature",
    "evaluation.knn_train_images": "every kNN reads a class-balanced sample of at most this "
                                   "many training images",
    "evaluation.knn_test_images": "... and of at most this many held-out images",
    "evaluation.health_images": "un-augmented training images the effective ranks are "
                                "measured on each epoch (0: off)",
    "evaluation.online_probe": "a linear probe trained beside the encoder on labelled batches "
                               "(probe_top1); it never changes the encoder",
}


def _validate(config):
    flat = {".".join(key): value for key, value in _flatten(config).items()}
    for key, rule in RULES.items():
        if not rule.check(flat[key]):
            raise ConfigError(f"{key} must be {rule.allowed}, got {flat[key]!r}")
    train, caco, model, data = config["train"], config["caco"], config["model"], config["data"]
    if caco["warmup_epochs"] >= train["epochs"]:
        raise ConfigError(f"caco.warmup_epochs must be below train.epochs "
                          f"({train['epochs']}), got {caco['warmup_epochs']}")
    if train["lr_warmup_epochs"] > train["epochs"]:
        raise ConfigError(f"train.lr_warmup_epochs must be at most train.epochs "
                          f"({train['epochs']}), got {train['lr_warmup_epochs']}")
    if caco["method"] != "caco" and data["views"] == "multicrop":
        raise ConfigError(f"caco.method {caco['method']} takes two views; "
                          f"data.views multicrop works with caco.method caco only")
    if model["widths"] is not None and model["backbone"] != "small_convnet":
        raise ConfigError(f"model.widths applies to small_convnet only, not to "
                          f"model.backbone {model['backbone']}")
    _check_image_sizes(data, model)


def _check_image_sizes(data, model):
    """Images too small for the backbone's downsampling are refused before anything is built:
    the last feature map must hold the ``model.pool_grid`` cells."""

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
