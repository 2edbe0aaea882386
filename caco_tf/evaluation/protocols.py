"""The evaluation protocols on a run's frozen backbone: weighted kNN and the linear protocol,
on the run's own data or on the user's labelled sources (transfer).

``evaluate(...)`` is what ``caco-evaluate`` (``python -m caco_tf.cli.evaluate``) runs: the
run's training images against its held-out split (from its ``config.yaml``), or any labelled
``caco_tf.data`` source with a held-out split: ``mnist`` / ``mnist_validation`` (the offline
splits) or ``tfds:NAME[:SPLIT]``, any TFDS classification data set by name (training split
``train`` unless named, tested on ``test``, else ``validation``), its images converted to the
backbone's channels and size.  The result is a dict (what the JSON holds); ``format_table``
renders it as a Markdown row.
"""

import collections
import os
import re

import keras

from caco_tf import data
from caco_tf.data.sources import HELD_OUT_SOURCES, ArraySource
from caco_tf.build import build_model, load_data, load_run, load_run_config, run_views
from caco_tf.run_settings import RunSettings
from caco_tf.evaluation import knn as knn_lib
from caco_tf.evaluation import linear, pooling_name
from caco_tf.evaluation.features import pooled_backbone
from caco_tf.config import DEFAULTS, RULES, ConfigError
from caco_tf.training.run_folder import RunFolder

# train, test: labelled caco_tf.data sources.
LabelledData = collections.namedtuple("LabelledData", "name train test num_classes")


def load_labelled_data(spec, config, held_out_spec=None):
    """A :class:`LabelledData` for the source ``spec`` (None: the run's own data, with its
    ``data.held_out``) and the held-out source ``held_out_spec`` (None: ``spec``'s own held-out
    split: MNIST's, a TFDS set's test split, a folder's ``val/``).

    The training split's labels and a labelled held-out split are required.
    """
    settings = config["data"]
    if spec is None:
        train, held_out = load_data(RunSettings.of(config).data)
        spec = settings["source"]
    else:
        train, held_out = data.load_source(spec, channels=settings["channels"],
                                           data_dir=settings["data_dir"],
                                           manual_dir=settings["manual_dir"])
    if held_out_spec:
        held_out = data.load_held_out(held_out_spec, train, channels=settings["channels"],
                                      data_dir=settings["data_dir"],
                                      manual_dir=settings["manual_dir"])
    if not train.has_labels:
        raise data.DataError(f"{spec} has no labels: evaluation needs labelled training "
                             f"images (class sub-folders, an .npz with 'labels', ...)")
    if held_out is None:
        raise data.DataError(f"{spec} has no labelled held-out split; pass --held-out SOURCE "
                             f"({HELD_OUT_SOURCES}) or a source that has one "
                             f"(mnist, tfds:NAME, a folder with train/ and val/)")
    train, held_out = (_with_channels(source, settings["channels"])
                       for source in (train, held_out))
    return LabelledData(spec, train, held_out, data.num_classes(train, held_out))


def _with_channels(source, channels):
    """Array sources converted to the backbone's channel count (files convert when decoded)."""
    if isinstance(source, data.ArraySource) and source.images.shape[-1] != channels:
        return data.ArraySource(data.convert_array_channels(source.images, channels),
                                source.labels, name=source.name)
    return source


def preprocessing_for(config, pixels=False, views=None):
    """The backbone's input transform; raw pixels are only scaled to [0, 1] (no mean, std).
    ``views``: the run's (``load_run``), else built from ``config``."""
    size, channels = config["data"]["image_size"], config["data"]["channels"]
    if pixels:
        return linear.Preprocessing(size, channels, 0.0, 1.0)
    views = run_views(config) if views is None else views
    return linear.Preprocessing(size, channels, views.mean, views.std)


def knn(backbone, labelled, preprocessing, k, temperature, batch_size=500):
    """Weighted kNN top-1 and top-5 (%) of ``labelled.test`` against ``labelled.train``."""
    result = knn_lib.knn_of_backbone(
        backbone, *(linear.eval_batches(source, preprocessing, batch_size)
                    for source in (labelled.train, labelled.test)),
        k, temperature, num_classes=labelled.num_classes)
    return {**result, "k": int(k), "temperature": float(temperature)}


def default_json_path(run_dir, protocol, spec, baseline="", features="class"):
    """``RUN/eval_<protocol>[_<baseline>][_<features>][_<data>].json`` (baseline: "",
    "pixels", "untrained" or "teacher"; features named unless "class"), or None without a run
    folder."""
    if run_dir is None:
        return None
    if str(run_dir).endswith(".keras"):  # a saved model: its folder
        run_dir = os.path.dirname(os.path.abspath(run_dir))
    suffix = "" if spec is None else "_" + re.sub(r"[^A-Za-z0-9.-]+", "_", spec)
    baseline = f"_{baseline}" if baseline else ""
    pooled = "" if features == "class" else "_" + pooling_name(features)
    return RunFolder(run_dir).evaluation_record(f"{protocol}{baseline}{pooled}{suffix}")


def teacher_backbone(model):
    """The backbone of ``model``'s momentum teacher (``Algorithm.TEACHER``): the EMA copy that
    DINO's, DINOv2's and I-JEPA's authors evaluate (I-JEPA's target encoder), BYOL's target
    and MoCo's key encoder; one line for a method that trains none."""
    from caco_tf.methods import METHODS

    if model.TEACHER != "momentum":  # a warm-up's key encoder is not the method's teacher
        with_one = ", ".join(name for name, cls in METHODS.items() if cls.TEACHER == "momentum")
        raise ConfigError(f"--teacher: {model.method} trains no momentum teacher; the methods "
                          f"that do: {with_one}")
    return model.key_encoder.backbone


def untrained_backbone(config, seed):
    """The run's backbone as ``train.py`` builds it before its first step (weights seeded by
    ``seed`` as ``train.seed`` seeds them): the baseline that shows what pre-training added."""
    keras.utils.set_random_seed(seed)
    return build_model(config, steps_per_epoch=1).backbone


def format_table(result):
    """One Markdown table row (with its header) for a result dict."""
    if result["protocol"] == "knn":
        setting = f"k={result['k']}, T={result['temperature']:g}"
    else:
        chosen = f" ({result['l2_folds']}-fold CV)" if "l2_scores" in result else ""
        setting = (f"{result['epochs']} epochs, lr {result['learning_rate']:g}, "
                   f"L2 {result['l2']:g}{chosen}, augment {result['augment']}")
    return "\n".join([
        "| protocol | encoder | data | train / test images | top-1 | top-5 |",
        "|---|---|---|---|---|---|",
        f"| {result['protocol']} ({setting}) | {result['encoder']} | {result['data']} | "
        f"{result['train_images']} / {result['test_images']} | {result['top1']:.1f} % | "
        f"{result['top5']:.1f} % |"])


def l2_setting(text, augment):
    """``--l2``: "auto", λ ≥ 0, or None (unset: auto where features are cached, else 0)."""
    if text is None:
        return None
    if text == "auto":
        if augment != "none":
            raise ConfigError("--l2 auto chooses λ on cached features: pass a number with "
                              f"--augment {augment}")
        return text
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ConfigError(f"--l2 must be auto or a number >= 0, got {text}")
    return value


def evaluate(protocol, run=None, data=None, held_out=None, baseline="", seed=0, k=None,
             temperature=None, config=None, teacher=False, features=None, **linear_settings):
    """Run ``protocol`` (``knn`` or ``linear``) on a frozen backbone; returns the result dict
    (also what ``caco-evaluate``'s JSON holds).

    ``run``: a run folder or ``.keras`` file (its backbone, configuration and data); ``data``,
    ``held_out``: labelled sources instead of the run's own (``load_labelled_data``);
    ``baseline``: "" (the run's trained backbone), "pixels" (raw pixels; ``run`` optional) or
    "untrained" (the run's network with fresh weights seeded by ``seed``); ``k``,
    ``temperature``: the kNN's (default: the run's ``evaluation`` settings); ``config``: a
    run's configuration in place of ``run`` for a baseline (nothing trained is read);
    ``teacher``: the run's momentum teacher's backbone in place of the student's
    (``teacher_backbone``); ``features``: a ViT's class token ("class", the backbone's output),
    the mean of its patch tokens or both (``features.pooled_backbone``; None: the run's
    ``evaluation.features``); the rest:
    ``linear.linear_evaluation``'s arguments.
    """
    if teacher and (baseline or run is None):
        raise ConfigError("--teacher reads a trained run's teacher: give --run RUN_DIR, "
                          "without --pixels or --untrained")
    if features not in (None, "class") and baseline == "pixels":
        raise ConfigError(f"--features {features} pools a backbone's tokens: drop it with --pixels")
    if run is None and config is None and baseline != "pixels":
        raise ConfigError("--run RUN_DIR is required (or --pixels for the raw-pixel baseline)")
    if held_out and not RULES["data.held_out"].check(held_out):
        raise ConfigError(f"--held-out must be {RULES['data.held_out'].allowed}, got "
                          f"{held_out!r}")
    given = config is not None
    if run and baseline and not str(run).endswith(".keras"):
        loaded = load_run_config(run)  # a baseline reads no trained weight
    else:
        loaded = load_run(run) if run else None
    config = loaded.config if loaded else (config if given else DEFAULTS)
    if features is None:
        features = "class" if baseline == "pixels" else config["evaluation"]["features"]
    labelled = load_labelled_data(data, config, held_out)
    if loaded is None and not given and isinstance(labelled.train, ArraySource):
        # No run to take a size from: the images' own side, not the defaults' 28 px.
        config = {**config, "data": {**config["data"],
                                     "image_size": int(labelled.train.images.shape[1])}}
    preprocessing = preprocessing_for(config, pixels=baseline == "pixels",
                                      views=loaded.views if loaded else None)
    if baseline == "pixels":
        backbone, encoder = linear.pixels_backbone(preprocessing), "raw pixels"
    elif baseline == "untrained":
        backbone = untrained_backbone(config, seed)
        encoder = (f"untrained {config['model']['backbone']} (seed {seed})"
                   + (f" of {os.path.abspath(run)}" if run else ""))
    elif teacher:
        backbone = teacher_backbone(loaded.model)
        encoder = f"teacher of {os.path.abspath(run)}"
    else:
        backbone, encoder = loaded.model.backbone, os.path.abspath(run)
    if features != "class":
        backbone = pooled_backbone(backbone, features)
        encoder += f", features {features}"
    if protocol == "knn":
        result = knn(backbone, labelled, preprocessing, k or config["evaluation"]["knn_k"],
                     temperature or config["evaluation"]["knn_temperature"],
                     config["evaluation"]["batch_size"])
    else:
        result = linear.linear_evaluation(
            backbone, labelled.train, labelled.test, labelled.num_classes, preprocessing,
            seed=seed, **linear_settings)
    return {"protocol": protocol, "encoder": encoder, "features": features,
            "data": labelled.name, "classes": labelled.num_classes, **result}
