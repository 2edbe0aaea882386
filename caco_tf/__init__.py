"""caco-tf: CaCo (cooperative-adversarial contrastive learning) in Keras 3 / TensorFlow.

The public API, loaded on first use (``import caco_tf`` itself imports no TensorFlow)::

    from caco_tf import CaCo, build_backbone, build_projector, build_encoder_optimizer

Packages, lowest floor first: ``losses`` and ``bank`` (the method's math), ``nets``, ``data``,
``training``, ``methods``, then ``build`` (a configuration → objects), ``evaluation``,
``serving``, ``pretrain`` (a configuration → a trained run folder) and ``cli`` (the commands).
"""

import importlib
import os

# TensorFlow's default CPU allocator leaves every tensor over glibc's 32 MB mmap ceiling (a
# K=65,536 bank is 64 MB) to a fresh mmap, so each step page-faults its bank-sized tensors anew;
# the BFC pool (what TensorFlow uses on GPUs) keeps and reuses them.  It halved the bank part of
# a step at K=65,536 (BENCHMARKS.md).  Read when TensorFlow's runtime starts; an explicit
# TF_CPU_ALLOCATOR_USE_BFC=false in the environment wins.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

__version__ = "0.4.0"  # pyproject.toml reads it; CHANGELOG.md says what changed

# Public name → the module that defines it.  Besides these, every method's class by its name
# (``CaCo``, ``BYOL``, ...): the registry's (``caco_tf.methods.METHODS``), read on first use.
_API = {
    "Method": "caco_tf.methods.base",
    "ContrastiveMethod": "caco_tf.methods.contrastive",
    "MemoryBank": "caco_tf.methods.memory_bank",
    "MomentumEncoder": "caco_tf.methods.momentum_encoder",
    "METHODS": "caco_tf.methods",
    "build_backbone": "caco_tf.nets.backbones",
    "build_projector": "caco_tf.nets.backbones",
    "BACKBONE_NAMES": "caco_tf.nets.backbones",
    "LARS": "caco_tf.training.optimizers",
    "WarmupCosine": "caco_tf.training.optimizers",
    "CosineMomentum": "caco_tf.training.optimizers",
    "build_encoder_optimizer": "caco_tf.training.optimizers",
    "paper_learning_rate": "caco_tf.training.optimizers",
    "load_config": "caco_tf.config",
    "DEFAULTS": "caco_tf.config",
    "build_model": "caco_tf.build",
    "build_views": "caco_tf.build",
    "run_views": "caco_tf.build",
    "RunSettings": "caco_tf.run_settings",
    "load_data": "caco_tf.build",
    "load_run": "caco_tf.build",
    "knn_top1": "caco_tf.evaluation.monitor",
    "load_source": "caco_tf.data.sources",
    "pretrain_dataset": "caco_tf.data.pipeline",
    "eval_dataset": "caco_tf.data.pipeline",
    "DigitViews": "caco_tf.data.augment",
    "AsymmetricViews": "caco_tf.data.augment",
    "MultiCropViews": "caco_tf.data.augment",
    "SymmetricViews": "caco_tf.data.augment",
    "KNNMonitor": "caco_tf.evaluation.monitor",
    "knn_accuracy": "caco_tf.evaluation.knn",
    "extract_features": "caco_tf.evaluation.knn",
    "linear_evaluation": "caco_tf.evaluation.linear",
    "export_backbone": "caco_tf.serving.export",
    "export_saved_model": "caco_tf.serving.export",
    "UserError": "caco_tf.errors",
    "ConfigError": "caco_tf.errors",
    "DataError": "caco_tf.errors",
}


def _method_classes():
    """{class name: class} of every registered method."""
    from caco_tf.methods import METHODS

    return {cls.__name__: cls for cls in METHODS.values()}


def __getattr__(name):
    if name == "__all__":  # the method classes' names need the registry, so TensorFlow
        value = sorted(set(_API) | set(_method_classes()))
    elif name in _API:
        value = getattr(importlib.import_module(_API[name]), name)
    elif name[:1].isupper() and name in (classes := _method_classes()):  # "_x" imports nothing
        value = classes[name]
    else:
        raise AttributeError(f"module 'caco_tf' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__getattr__("__all__")))
