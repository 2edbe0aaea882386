"""From a configuration to objects: the data sources, the views and the compiled model of a run,
its plan (``RunPlan``: what the builders derive from the configuration, once a run) and checks
against the data, its evaluation batches and callbacks, and a run folder's model rebuilt from
its ``config.yaml`` and checkpoint.

Both the pre-training run (``caco_tf.pretrain``) and the tools that read a finished run (the
evaluation CLI, the figures, the export) build through here, so they build the same model.
"""

import collections
import dataclasses
import logging
import os
import zipfile
import zlib
from typing import Optional

import tensorflow as tf

from caco_tf import data
from caco_tf.data import DEFAULT_CROP_FRACTION, augment, masks, service, sources
from caco_tf.methods import model_class
from caco_tf.nets import backbones, hub, sizes, tokens
from caco_tf.training import callbacks, optimizers
from caco_tf.config import (VIEWS, ConfigError, load_config, settings_section,
                            upgrade_saved_config)
from caco_tf.run_settings import RunSettings
from caco_tf.training.run_folder import RunFolder


def load_data(data):
    """The training source and the labelled held-out source, if any: ``data.held_out`` when
    set, else the source's own held-out split (``sources.load_source``); ``data``: the run's
    data settings (``RunSettings.data``).

    The encoder never sees labels; they serve evaluation only (kNN, the online probe)."""
    train, held_out = sources.load_source(data.source, channels=data.channels,
                                          data_dir=data.data_dir, manual_dir=data.manual_dir)
    if data.held_out:
        held_out = sources.load_held_out(data.held_out, train, channels=data.channels,
                                         data_dir=data.data_dir, manual_dir=data.manual_dir)
    return train, held_out


def method_settings(config):
    """The section of settings the run's method reads (``method.<name>``, or CaCo's for its
    ablation rows)."""
    return config["method"][settings_section(config["method"]["name"])]


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What the builders take from a run's configuration beyond its plain settings, derived
    once a run: the method and its section, the run's steps and replicas, the projection's
    dimension, the bank warm-up and the online probe.  ``plan_run`` makes a pre-training
    run's, after refusing what its data and replicas cannot hold; ``RunPlan.of`` one without
    data (``build_model``)."""

    method: type                     # the class ``method.name`` names (``caco_tf.methods``)
    section: str                     # the method's settings are ``method.<section>``
    settings: dict                   # that section
    batch_size: int                  # over every replica
    epochs: int
    steps_per_epoch: int
    replicas: int
    embedding_dim: int               # the projection's: the method's own, else the model's
    warmup_steps: int                # the bank warm-up's: 0 without one
    warmup_bank_rows: Optional[int]  # the rows the warm-up fills: None without one
    probe_classes: Optional[int]     # the online probe's: None without the probe

    @classmethod
    def of(cls, settings, steps_per_epoch, replicas=1, probe_classes=None):
        """The plan of a run's ``settings`` (``RunSettings``) at ``steps_per_epoch`` over
        ``replicas``; ``probe_classes`` counts only with ``evaluation.online_probe`` on.

        The warm-up lasts ``warmup_epochs`` epochs of the method's section, and at least its
        ``warmup_min_steps`` (the key encoder's EMA needs a few hundred steps to follow the
        student before the resync, however few steps an epoch has); it fills the method's own
        bank, or the warm-up's."""
        own = settings.method_settings
        method = model_class(settings.method)
        warmup = bool(own.get("warmup_epochs"))
        return cls(
            method=method, section=settings.method_section, settings=own,
            batch_size=settings.train.batch_size, epochs=settings.train.epochs,
            steps_per_epoch=steps_per_epoch, replicas=replicas,
            embedding_dim=method.projector_shape(own).get("output_dim",
                                                          settings.model.embedding_dim),
            warmup_steps=(max(own["warmup_epochs"] * steps_per_epoch,
                              own["warmup_min_steps"]) if warmup else 0),
            warmup_bank_rows=(own.get("bank_size", own.get("warmup_bank_size"))
                              if warmup else None),
            probe_classes=probe_classes if settings.evaluation.online_probe else None)

    @property
    def total_steps(self):
        return self.epochs * self.steps_per_epoch


def plan_run(settings, train, replicas=1, warn=True):
    """The ``RunPlan`` of pre-training on the source ``train`` over ``replicas`` with a run's
    ``settings`` (``RunSettings``), after refusing, in one line, what they cannot hold
    (``check_sizes``, ``check_image_size``, ``online_probe_classes``): before anything is
    built.  ``warn``: log what they can hold but not well (``batch_cautions``), one line each
    on the ``caco_tf`` logger."""
    plan = RunPlan.of(settings, len(train) // settings.train.batch_size, replicas)
    check_backbone(plan, settings.model)
    check_sizes(plan, len(train), plan.embedding_dim)
    check_image_size(settings.data, train)
    plan = dataclasses.replace(plan, probe_classes=online_probe_classes(settings, train))
    if warn:  # once nothing is refused: a refusal stays one line
        for caution in batch_cautions(plan):
            logging.getLogger("caco_tf").warning("warning: %s", caution)
    return plan


def check_backbone(plan, model):
    """Refuse, in one line, a method that works on a ViT's tokens (``CONSUMES``) on a
    backbone that has none (``model.backbone``: a ConvNet, a KerasHub backbone other than a
    ``DINOV2Backbone`` preset, which becomes a ViT), or without the ViT options it needs
    (``VIT_OPTIONS``: DINOv2's mask token)."""
    method, backbone = plan.method, model.backbone
    if method.CONSUMES != "tokens":
        return
    if not gives_tokens(backbone):
        raise ConfigError(tokens.tokens_refusal(method.method, backbone))
    for option, value in getattr(method, "VIT_OPTIONS", {}).items():
        if getattr(model, option) != value:
            raise ConfigError(f"method {method.method} needs model.{option} "
                              f"{str(value).lower()}, got {getattr(model, option)}: set "
                              f"--set model.{option}={str(value).lower()}")


def gives_tokens(backbone):
    """Whether ``model.backbone`` ``backbone`` is a ViT whose tokens a method can take: a
    ``vit_*`` preset, or a KerasHub ``DINOV2Backbone`` preset (which becomes one)."""
    return backbone in sizes.VIT_SHAPES or (hub.is_hub_backbone(backbone) and sizes.preset_class(
        backbone[len(hub.PREFIX):]) == hub.DINOV2)


def batch_cautions(plan):
    """What a run on ``plan`` trains with but not as its method means to: a D x D matrix the
    method estimates from the global batch (its ``BATCH_MATRIX``: Barlow Twins'
    cross-correlation, VICReg's covariance) from no more images than D.  B centred rows span at
    most B - 1 dimensions, so the identity (or the diagonal) its loss drives the matrix to is
    out of reach; the method still learns."""
    matrix = plan.method.BATCH_MATRIX
    batch, dim = plan.batch_size, plan.embedding_dim
    if matrix is None or batch > dim:
        return []
    return [f"{plan.method.method} estimates its {dim}x{dim} {matrix} from the global batch of "
            f"{batch} images (train.batch_size {batch}), no more than model.embedding_dim {dim}: "
            f"its rank is {batch - 1} at most, so the loss cannot reach its optimum (it still "
            f"trains); for a full-rank estimate raise train.batch_size above {dim} or lower "
            f"model.embedding_dim below {batch}"]


def warmup_steps(config, steps_per_epoch):
    """Steps of the bank warm-up at ``steps_per_epoch`` (``RunPlan.of``): 0 without one."""
    return RunPlan.of(RunSettings.of(config), steps_per_epoch).warmup_steps


def method_arguments(plan):
    """The method's constructor arguments from its section: per-step settings as schedules of
    the step (``optimizers.schedule``), settings counted in epochs in steps."""
    arguments = {}
    for key, setting in plan.method.SETTINGS.items():  # an ablation row's: CaCo's
        if not setting.passed:
            continue
        value = plan.settings[key]
        if setting.schedule:
            value = optimizers.schedule(value, setting.schedule, plan.steps_per_epoch,
                                        plan.total_steps)
        if setting.in_steps:
            value = round(value * plan.steps_per_epoch)
        arguments[setting.argument or key] = value
    return arguments


def view_masks(settings):
    """(the mask kinds, the patch grid) the run's method takes with its views
    (``Method.view_masks`` on its ViT's grid at ``data.image_size``), or None."""
    kinds = model_class(settings.method).view_masks(settings.method_settings)
    if not kinds or settings.model.backbone not in sizes.VIT_SHAPES:  # the method refuses it
        return None
    patch = sizes.VIT_SHAPES[settings.model.backbone][0]
    return kinds, masks.grid_of(settings.data.image_size, patch)


def build_views(data, views_per_image=2, view_masks=None):
    """The views ``data.views`` names (``caco_tf.data.augment``), at the configured sizes, with
    ``data.extra_layers`` appended to every view; with ``data.views_on_device``, split between
    the input pipeline and the train step (``augment.ColourOnDevice``).  ``data``: the run's
    data settings (``RunSettings.data``); ``views_per_image``: the method's K equal views
    (``RunSettings.views_per_image``; multi-crop's are its own); ``view_masks``: (the mask
    kinds, the patch grid) its masks are drawn on after the views (``view_masks``), or None."""
    views = _built_views(data, views_per_image)
    return views if view_masks is None else masks.MaskedViews(views, *view_masks)


def _built_views(data, views_per_image):
    views = _named_views(data, views_per_image)
    if data.views_on_device:  # the configuration refuses extra layers with it
        return augment.ColourOnDevice(views)
    if not data.extra_layers:
        return views
    views = augment.WithLayers(views, [augment.keras_layer(e) for e in data.extra_layers])
    recipes = getattr(views, "recipes", None)
    views.check_shapes(sorted({r.size for r in recipes}) if recipes else [data.image_size],
                       data.channels)
    return views


def _named_views(data, count):
    name, size, channels = data.views, data.image_size, data.channels
    if name == "digits":
        return augment.DigitViews(num_views=count)
    if name in ("asymmetric", "cifar", "imagenet"):  # the last two: the configs' names
        return augment.AsymmetricViews(size, channels, scale=data.crop_scale,
                                       blur_sigma=data.blur_sigma, num_views=count)
    if name == "symmetric":
        return augment.SymmetricViews(size, channels, scale=data.crop_scale,
                                      blur_sigma=data.blur_sigma, num_views=count)
    if name in ("crop", "crop_flip"):
        return augment.CropViews(size, channels, scale=data.crop_scale,
                                 flip_probability=0.5 if name == "crop_flip" else 0.0,
                                 num_views=count)
    if name == "multicrop":
        crops = data.multicrop
        return augment.MultiCropViews(
            size, crops.local_size, crops.local_crops, crops.global_scale, crops.local_scale,
            channels=channels, blur_sigma=data.blur_sigma)
    raise ConfigError(f"data.views must be one of {', '.join(VIEWS)}, got {name!r}")


def run_views(config):
    """``build_views`` of a whole configuration (a tool that holds no ``RunSettings``)."""
    settings = RunSettings.of(config)
    return build_views(settings.data, settings.views_per_image, view_masks(settings))


def build_model(config, steps_per_epoch, num_replicas=1, num_classes=None, views=None):
    """The model ``method.name`` names, compiled with the paper's optimizer and schedules, at
    ``steps_per_epoch`` over ``num_replicas`` (``build_planned_model``, on ``RunPlan.of``).

    Build it inside the strategy's scope.  ``num_classes``: the online probe's, when
    ``evaluation.online_probe`` is on (without it, no probe: a rebuilt model still loads a
    probed run's checkpoint, the probe's weights left aside).  ``views``: the run's
    (``build_views``), else built here.
    """
    settings = RunSettings.of(config)
    return build_planned_model(
        settings, RunPlan.of(settings, steps_per_epoch, num_replicas, num_classes), views)


def vit_options(model):
    """A ViT's options (``nets.vit.build_vit``: DINOv2's, the initialization) of the model
    settings, those set only."""
    options = {"layer_scale": model.layer_scale, "registers": model.registers,
               "mask_token": model.mask_token, "interpolate_offset": model.interpolate_offset,
               "interpolate_antialias": model.interpolate_antialias,
               "drop_path_uniform": model.drop_path_uniform, "init": model.vit_init}
    defaults = {"layer_scale": 0.0, "registers": 0, "mask_token": False,
                "interpolate_offset": 0.1, "interpolate_antialias": False,
                "drop_path_uniform": False, "init": "trunc_normal"}
    return {key: value for key, value in options.items() if value != defaults[key]}


def build_planned_model(settings, plan, views=None):
    """``build_model`` of a run's ``settings`` (``RunSettings``) on its ``RunPlan``
    (``plan_run``) and views (else built here).

    BatchNorm is synchronized over the replicas (as in the reference) unless
    ``model.sync_batchnorm`` says otherwise.
    """
    model, train, data_settings = settings.model, settings.train, settings.data
    size, channels = data_settings.image_size, data_settings.channels
    sync = plan.replicas > 1 if model.sync_batchnorm is None else model.sync_batchnorm
    multi_crop = data_settings.views == "multicrop"
    # Multi-crop feeds crops of two sizes: the backbone takes any size.
    backbone = backbones.build_backbone(
        model.backbone, (None, None, channels) if multi_crop else (size, size, channels),
        sync_batchnorm=sync, widths=model.widths, pool_grid=model.pool_grid,
        image_size=model.position_table_size or size, drop_path=model.drop_path,
        position_embedding=model.position_embedding,
        frozen_patch_embedding=model.frozen_patch_embedding,
        hub_arguments=model.backbone_arguments, vit_options=vit_options(model))
    # The projector's shape is the method's (its reference's), its widths the run's; its output
    # the plan's embedding (a method may have its own).
    projector = backbones.build_mlp(
        backbone.output_shape[-1], model.projector_hidden, sync_batchnorm=sync,
        name="projector", **{**plan.method.projector_shape(plan.settings),
                             "output_dim": plan.embedding_dim})
    if views is None:  # after the networks: data.extra_layers' layers draw Python's seeds too
        views = build_views(data_settings, settings.views_per_image, view_masks(settings))
    jit_compile = use_xla(train.jit_compile, plan.replicas)
    method = plan.method(
        backbone, projector, **method_arguments(plan), warmup_steps=plan.warmup_steps,
        online_probe_classes=plan.probe_classes, multi_crop=multi_crop, sync_batchnorm=sync,
        preprocessing=preprocessing(data_settings, views), run_settings=settings.as_config())
    if data_settings.views_on_device:  # the batches' views arrive cropped, with their draws
        method.views_on_device = views
    method.compile(
        optimizer=optimizers.build_encoder_optimizer(
            plan.batch_size, plan.total_steps, train.lr_warmup_epochs * plan.steps_per_epoch,
            optimizer=train.optimizer, learning_rate=train.learning_rate,
            weight_decay=train.weight_decay, momentum=train.momentum,
            weight_decay_end=train.weight_decay_end, adamw_beta2=train.adamw_beta2,
            decay_biases_and_norms=train.decay_biases_and_norms,
            clip_gradient_norm=train.clip_gradient_norm,
            final_learning_rate=train.final_learning_rate),
        jit_compile=jit_compile, steps_per_execution=train.steps_per_execution)
    return method


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


def preprocessing(data_settings, views):
    """How images reach the backbone (``Method.preprocessing``): the size and channels of
    ``data_settings`` (``RunSettings.data``), the normalization of ``views``, and evaluation's
    centre crop."""
    as_list = (lambda v: [float(x) for x in v] if isinstance(v, (tuple, list)) else float(v))
    return {"image_size": data_settings.image_size, "channels": data_settings.channels,
            "mean": as_list(views.mean), "std": as_list(views.std),
            "crop_fraction": DEFAULT_CROP_FRACTION}


def check_sizes(plan, num_images, embedding_dim):
    """Refuse, in one line, a batch, bank or warm-up that the data set or the replicas cannot
    hold (``plan``: the run's on ``num_images`` images): before anything is built."""
    batch, replicas, bank = plan.batch_size, plan.replicas, plan.warmup_bank_rows
    if batch > num_images:
        raise data.DataError(f"train.batch_size {batch} is larger than the data set "
                             f"({num_images} images)")
    if batch % replicas:
        raise ConfigError(f"train.batch_size {batch} must split evenly over the {replicas} "
                          f"replicas: use a multiple of {replicas}")
    refusal = plan.method.check_batch(plan.settings, batch // replicas, embedding_dim)
    if refusal:
        raise ConfigError(refusal)
    # One pass writes one key per image of its full batches: the bank holds distinct images
    # only if it is no larger than that (later warm-up epochs overwrite rows, FIFO).
    filled = (num_images // batch) * batch
    section = f"method.{plan.section}"
    if bank is not None and bank > filled:
        key = "bank_size" if "bank_size" in plan.settings else "warmup_bank_size"
        raise data.DataError(
            f"{section}.{key} {bank} is larger than the data set at initialization: one pass "
            f"fills {filled} rows from {num_images} images in batches of {batch}")
    if plan.warmup_steps >= plan.total_steps:
        raise ConfigError(f"the warm-up ({plan.warmup_steps} steps: {section}.warmup_epochs "
                          f"{plan.settings['warmup_epochs']}, {section}.warmup_min_steps "
                          f"{plan.settings['warmup_min_steps']}) must end before the run's "
                          f"{plan.total_steps} steps")


def check_image_size(data_settings, train):
    """Refuse, in one line, digit views of images that are not ``data.image_size`` square: the
    digit views keep the images' own size, which the backbone is built for."""
    size, images = data_settings.image_size, getattr(train, "images", None)
    if data_settings.views == "digits" and images is not None and (
            tuple(images.shape[1:3]) != (size, size)):
        raise ConfigError(
            f"data.image_size must be the images' own side with data.views digits (they keep "
            f"it): {data_settings.source} holds {images.shape[1]}x{images.shape[2]} "
            f"images, got {size}; set data.image_size {images.shape[1]} or choose colour views")


def online_probe_classes(settings, train):
    """The online probe's class count when ``evaluation.online_probe`` is on, else None
    (``settings``: the run's ``RunSettings``).

    The probe trains on the training images' labels: an unlabelled source is a ``ConfigError``.
    """
    if not settings.evaluation.online_probe:
        return None
    source = settings.data.source
    if not train.has_labels:
        raise ConfigError(f"evaluation.online_probe needs a labelled training source; "
                          f"{source} has no labels")
    classes = data.num_classes(train)
    if classes < 2:
        raise ConfigError(f"evaluation.online_probe needs at least 2 classes in the training "
                          f"labels of {source}, found {classes}")
    return classes


def health_sample(settings, views, train):
    """Batches of ``evaluation.health_images`` un-augmented training images, an even sample:
    what ``HealthMonitor`` measures the effective ranks on (None when 0); ``settings``: the
    run's ``RunSettings``."""
    count = settings.evaluation.health_images
    if not count:
        return None
    every = max(1, len(train) // count)
    return eval_dataset(settings, views, train, every=every).take(
        -(-count // settings.evaluation.batch_size))


def precise_bn(settings, views, train):
    """The ``PreciseBatchNorm`` callback of ``train.precise_bn_images``, or None (0: off)."""
    count = settings.train.precise_bn_images
    if not count:
        return None
    every = max(1, len(train) // count)
    return callbacks.PreciseBatchNorm(eval_dataset(settings, views, train, every=every))


def eval_dataset(settings, views, source, skipped=None, every=1):
    """Normalized image batches of a source (with its labels if any), as evaluation sees
    them; ``every``: every ``every``-th image only; ``settings``: the run's ``RunSettings``."""
    return service.eval_dataset(source, settings.evaluation.batch_size, views.normalize,
                                settings.data.service, settings.data.image_size,
                                settings.data.channels, skipped=skipped, every=every)


Run = collections.namedtuple("Run", "directory config model views")


def load_run(run_dir):
    """The model of a run folder, rebuilt from its ``config.yaml`` and last checkpoint, or of a
    ``.keras`` file (``model.save``; the run's configuration travels in it)."""
    if str(run_dir).endswith(".keras"):
        return load_keras_file(run_dir)
    run = load_run_config(run_dir)
    weights = RunFolder(run_dir).checkpoint
    if not os.path.exists(weights):
        raise ConfigError(f"no checkpoint at {weights}: has the run finished an epoch?")
    model = build_model(run.config, steps_per_epoch=1, views=run.views)
    model.load_weights(weights)
    return run._replace(model=model)


def load_run_config(run_dir):
    """A run folder's configuration and views, no weights read (``model`` None): what a
    baseline of the run needs, before its first checkpoint or without one."""
    folder = RunFolder(run_dir)
    if not os.path.exists(folder.config):
        raise ConfigError(f"no config.yaml in {run_dir}: not a run folder")
    config = load_config(folder.config, saved=True)  # as written, by this version or before
    return Run(run_dir, config, None, run_views(config))


def load_keras_file(path):
    """A ``Run`` from a ``.keras`` file written by ``model.save`` (``train.py`` writes
    ``RUN/model.keras``): the model as saved, the run configuration it carries."""
    import keras

    if not os.path.exists(path):
        raise ConfigError(f"no such .keras file: {path}")
    try:
        model = keras.models.load_model(path, compile=True)
    except (zipfile.BadZipFile, zlib.error, EOFError):  # an entry cut short or garbled
        raise ConfigError(_damaged_keras_file(path)) from None
    except (OSError, ValueError, TypeError) as error:
        if not zipfile.is_zipfile(path):  # Keras says "File not found" of it
            raise ConfigError(_damaged_keras_file(path)) from None
        raise ConfigError(f"cannot load {path}: {' '.join(str(error).split())[:300]}") from None
    if not getattr(model, "run_settings", None):
        raise ConfigError(f"{path} holds no run configuration (a model not built by "
                          f"caco_tf.build_model); evaluate its backbone from Python instead")
    config = load_config(None, _assignments(upgrade_saved_config(model.run_settings)))
    return Run(os.path.dirname(os.path.abspath(path)), config, model, run_views(config))


def _damaged_keras_file(path):
    """The line for a ``.keras`` file that is no readable zip archive, with what to use
    instead: its run folder when there is one beside it."""
    folder = RunFolder(os.path.dirname(os.path.abspath(path)))
    instead = (f"use its run folder instead, --run {folder.path}, which rebuilds the model from "
               f"config.yaml and its last checkpoint"
               if os.path.exists(folder.config) and os.path.exists(folder.checkpoint)
               else "save the model again (model.save)")
    return f"{path} cannot be read as a Keras archive (damaged or cut short): {instead}"


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
