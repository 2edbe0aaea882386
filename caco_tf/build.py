"""From a configuration to objects: the data sources, the views and the compiled model of a run,
its checks against the data, its evaluation batches and callbacks, and a run folder's model
rebuilt from its ``config.yaml`` and checkpoint.

Both the pre-training run (``caco_tf.pretrain``) and the tools that read a finished run (the
evaluation CLI, the figures, the export) build through here, so they build the same model.
"""

import collections
import logging
import os

import tensorflow as tf

from caco_tf import data
from caco_tf.data import DEFAULT_CROP_FRACTION, augment, sources
from caco_tf.methods import model_class
from caco_tf.nets import backbones
from caco_tf.training import callbacks, optimizers
from caco_tf.training.config import ConfigError, load_config, upgrade_saved_config
from caco_tf.training.run_folder import RunFolder


def load_data(config):
    """The training source and the labelled held-out source, if any: ``data.held_out`` when
    set, else the source's own held-out split (``sources.load_source``).

    The encoder never sees labels; they serve evaluation only (kNN, the online probe)."""
    settings = config["data"]
    train, held_out = sources.load_source(
        settings["source"], channels=settings["channels"], data_dir=settings["data_dir"],
        manual_dir=settings["manual_dir"])
    if settings["held_out"]:
        held_out = sources.load_held_out(
            settings["held_out"], train, channels=settings["channels"],
            data_dir=settings["data_dir"], manual_dir=settings["manual_dir"])
    return train, held_out


def warmup_steps(config, steps_per_epoch):
    """Steps of the MoCo-style warm-up that fills the bank: ``method.warmup_epochs`` epochs,
    and at least ``method.warmup_min_steps`` (the key encoder's EMA needs a few hundred steps to
    follow the query encoder before the resync, however few steps an epoch has)."""
    method = config["method"]
    return max(method["warmup_epochs"] * steps_per_epoch, method["warmup_min_steps"])


def build_views(config):
    """The views ``data.views`` names (``caco_tf.data.augment``), at the configured sizes, with
    ``data.extra_layers`` appended to every view."""
    views = _named_views(config)
    extra = config["data"]["extra_layers"]
    if not extra:
        return views
    views = augment.WithLayers(views, [augment.keras_layer(e) for e in extra])
    recipes = getattr(views, "recipes", None)
    views.check_shapes(sorted({r.size for r in recipes}) if recipes
                       else [config["data"]["image_size"]], config["data"]["channels"])
    return views


def _named_views(config):
    settings = config["data"]
    name, size, channels = settings["views"], settings["image_size"], settings["channels"]
    if name == "digits":
        return augment.DigitViews()
    if name in ("asymmetric", "cifar", "imagenet"):  # the last two: the configs' names
        return augment.AsymmetricViews(size, channels, scale=settings["crop_scale"],
                                       blur_sigma=settings["blur_sigma"])
    if name == "multicrop":
        crops = settings["multicrop"]
        return augment.MultiCropViews(
            size, crops["local_size"], crops["local_crops"], crops["global_scale"],
            crops["local_scale"], channels=channels, blur_sigma=settings["blur_sigma"])
    raise ConfigError(f"data.views must be digits, asymmetric or multicrop, got {name!r}")


def build_model(config, steps_per_epoch, num_replicas=1, num_classes=None):
    """The model ``method.name`` names, compiled with the paper's optimizer and schedules.

    Build it inside the strategy's scope.  BatchNorm is synchronized over the replicas (as in
    the reference) unless ``model.sync_batchnorm`` says otherwise.  ``num_classes``: the
    online probe's, when ``evaluation.online_probe`` is on (without it, no probe: a rebuilt
    model still loads a probed run's checkpoint, the probe's weights left aside).
    """
    model_config, caco, train = config["model"], config["method"], config["train"]
    size, channels = config["data"]["image_size"], config["data"]["channels"]
    sync = model_config["sync_batchnorm"]
    sync = num_replicas > 1 if sync is None else sync
    multi_crop = config["data"]["views"] == "multicrop"
    # Multi-crop feeds crops of two sizes: the backbone takes any size.
    backbone = backbones.build_backbone(
        model_config["backbone"], (None, None, channels) if multi_crop else (size, size, channels),
        sync_batchnorm=sync, widths=model_config["widths"], pool_grid=model_config["pool_grid"])
    projector = backbones.build_projector(
        backbone.output_shape[-1], model_config["projector_hidden"],
        model_config["embedding_dim"], sync_batchnorm=sync)
    total_steps = train["epochs"] * steps_per_epoch
    # method.name: CaCo or an ablation row / baseline, same arguments (caco_tf.methods).
    model = model_class(caco["name"])(
        backbone, projector,
        bank_size=caco["bank_size"],
        temperature=caco["temperature"],
        bank_temperature=caco["bank_temperature"],
        bank_learning_rate=optimizers.WarmupCosine(caco["bank_lr"], total_steps),
        bank_momentum=caco["bank_momentum"],
        key_momentum=optimizers.CosineMomentum(caco["key_momentum"], total_steps),
        warmup_steps=warmup_steps(config, steps_per_epoch),
        warmup_temperature=caco["warmup_temperature"],
        resync_after_warmup=caco["resync_after_warmup"],
        online_probe_classes=num_classes if config["evaluation"]["online_probe"] else None,
        multi_crop=multi_crop, warmup_every_method=caco["warmup_every_method"],
        preprocessing=preprocessing(config), run_settings=config)
    model.compile(
        optimizer=optimizers.build_encoder_optimizer(
            train["batch_size"], total_steps, train["lr_warmup_epochs"] * steps_per_epoch,
            optimizer=train["optimizer"], learning_rate=train["learning_rate"],
            weight_decay=train["weight_decay"], momentum=train["momentum"]),
        jit_compile=use_xla(train["jit_compile"], num_replicas),
        steps_per_execution=train["steps_per_execution"])
    return model


def use_xla(jit_compile, num_replicas):
    """``train.jit_compile``, except for several replicas on CPUs.

    XLA has no cross-device collectives on CPU ("Collectives are not yet implemented for CPU
    devices when compiling with XLA"), so such a run (logical CPU devices, CPU-only workers)
    compiles its step without XLA, with a warning; on GPUs the setting is kept.
    """
    if jit_compile and num_replicas > 1 and not tf.config.list_physical_devices("GPU"):
        logging.getLogger(__name__).warning(
            "train.jit_compile ignored: XLA has no collectives across CPU replicas (%d here)",
            num_replicas)
        return False
    return jit_compile


def preprocessing(config):
    """How images reach the backbone (``ContrastiveMethod.preprocessing``): the size,
    channels and normalization the views use, and evaluation's centre crop."""
    views = build_views(config)
    as_list = (lambda v: [float(x) for x in v] if isinstance(v, (tuple, list)) else float(v))
    return {"image_size": config["data"]["image_size"], "channels": config["data"]["channels"],
            "mean": as_list(views.mean), "std": as_list(views.std),
            "crop_fraction": DEFAULT_CROP_FRACTION}


def check_sizes(config, num_images, replicas=1):
    """Refuse, in one line, a batch, bank or warm-up that the data set or the replicas cannot
    hold: before anything is built."""
    batch, bank = config["train"]["batch_size"], config["method"]["bank_size"]
    if batch > num_images:
        raise data.DataError(f"train.batch_size {batch} is larger than the data set "
                             f"({num_images} images)")
    if batch % replicas:
        raise ConfigError(f"train.batch_size {batch} must split evenly over the {replicas} "
                          f"replicas: use a multiple of {replicas}")
    # One pass writes one key per image of its full batches: the bank holds distinct images
    # only if it is no larger than that (later warm-up epochs overwrite rows, FIFO).
    filled = (num_images // batch) * batch
    if config["method"]["warmup_epochs"] > 0 and bank > filled:
        raise data.DataError(
            f"method.bank_size {bank} is larger than the data set at initialization: one pass "
            f"fills {filled} rows from {num_images} images in batches of {batch}")
    steps = num_images // batch
    warmup = warmup_steps(config, steps)
    if warmup >= config["train"]["epochs"] * steps:
        raise ConfigError(f"the warm-up ({warmup} steps: method.warmup_epochs "
                          f"{config['method']['warmup_epochs']}, method.warmup_min_steps "
                          f"{config['method']['warmup_min_steps']}) must end before the run's "
                          f"{config['train']['epochs'] * steps} steps")


def online_probe_classes(config, train):
    """The online probe's class count when ``evaluation.online_probe`` is on, else None.

    The probe trains on the training images' labels: an unlabelled source is a ``ConfigError``.
    """
    if not config["evaluation"]["online_probe"]:
        return None
    if not train.has_labels:
        raise ConfigError(f"evaluation.online_probe needs a labelled training source; "
                          f"{config['data']['source']} has no labels")
    classes = data.num_classes(train)
    if classes < 2:
        raise ConfigError(f"evaluation.online_probe needs at least 2 classes in the training "
                          f"labels of {config['data']['source']}, found {classes}")
    return classes


def health_sample(config, views, train):
    """Batches of ``evaluation.health_images`` un-augmented training images, an even sample:
    what ``HealthMonitor`` measures the effective ranks on (None when 0)."""
    count = config["evaluation"]["health_images"]
    if not count:
        return None
    every = max(1, len(train) // count)
    return eval_dataset(config, views, train, every=every).take(
        -(-count // config["evaluation"]["batch_size"]))


def precise_bn(config, views, train):
    """The ``PreciseBatchNorm`` callback of ``train.precise_bn_images``, or None (0: off)."""
    count = config["train"]["precise_bn_images"]
    if not count:
        return None
    every = max(1, len(train) // count)
    return callbacks.PreciseBatchNorm(eval_dataset(config, views, train, every=every))


def eval_dataset(config, views, source, skipped=None, every=1):
    """Normalized image batches of a source (with its labels if any), as evaluation sees
    them; ``every``: every ``every``-th image only."""
    return data.eval_dataset(source, config["evaluation"]["batch_size"], views.normalize,
                             image_size=config["data"]["image_size"],
                             channels=config["data"]["channels"], skipped=skipped, every=every)


Run = collections.namedtuple("Run", "directory config model views")


def load_run(run_dir):
    """The model of a run folder, rebuilt from its ``config.yaml`` and last checkpoint, or of a
    ``.keras`` file (``model.save``; the run's configuration travels in it)."""
    if str(run_dir).endswith(".keras"):
        return load_keras_file(run_dir)
    folder = RunFolder(run_dir)
    weights = folder.checkpoint
    if not os.path.exists(folder.config):
        raise ConfigError(f"no config.yaml in {run_dir}: not a run folder")
    config = load_config(folder.config, saved=True)  # as written, by this version or before
    if not os.path.exists(weights):
        raise ConfigError(f"no checkpoint at {weights}: has the run finished an epoch?")
    model = build_model(config, steps_per_epoch=1)
    model.load_weights(weights)
    return Run(run_dir, config, model, build_views(config))


def load_keras_file(path):
    """A ``Run`` from a ``.keras`` file written by ``model.save`` (``train.py`` writes
    ``RUN/model.keras``): the model as saved, the run configuration it carries."""
    import keras

    if not os.path.exists(path):
        raise ConfigError(f"no such .keras file: {path}")
    try:
        model = keras.models.load_model(path, compile=True)
    except (OSError, ValueError, TypeError) as error:
        raise ConfigError(f"cannot load {path}: {' '.join(str(error).split())[:300]}") from None
    if not getattr(model, "run_settings", None):
        raise ConfigError(f"{path} holds no run configuration (a model not built by "
                          f"caco_tf.build_model); evaluate its backbone from Python instead")
    config = load_config(None, _assignments(upgrade_saved_config(model.run_settings)))
    return Run(os.path.dirname(os.path.abspath(path)), config, model, build_views(config))


def _assignments(tree, prefix=""):
    """A nested configuration as ``key=value`` assignments (``load_config`` re-validates it)."""
    import json

    result = []
    for key, value in tree.items():
        if isinstance(value, dict):
            result += _assignments(value, f"{prefix}{key}.")
        else:
            result.append(f"{prefix}{key}={json.dumps(value)}")
    return result

