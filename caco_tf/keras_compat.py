"""Every use caco_tf makes of Keras' private API, and of TensorFlow's private distribute API.

Keras has no public way to do a few things caco_tf needs (a step function under the strategy,
the weights file in memory, the epoch a resumed ``fit`` starts at, ...).  Private names change
without notice between Keras versions, so they all live here, one function each with what
breaks without it.  The rule: no other module of caco_tf uses a private Keras name.
``tests/test_keras_compat.py`` enforces it, and checks that every internal below exists with
the signature used here, so that a new Keras fails there naming the internal;
``pyproject.toml`` bounds keras to the versions checked.

Checked on Keras 3.15.0 and 3.15.1 (the test suite on 3.15.1), with TensorFlow 2.21.0.
"""

import keras
import tensorflow as tf

# Private Keras methods that caco_tf classes override, under these names since Keras calls
# them by name; were Keras to rename one, the override would silently stop running.
OVERRIDDEN_HOOKS = {
    # methods.base.Method skips fit's symbolic build on a first batch: its variables all exist
    # from __init__/compile, and the build converts the distributed batch eagerly, which fails
    # under MultiWorkerMirroredStrategy ("Attempt to convert a value (PerReplica...) with an
    # unsupported type to a Tensor", keras-team/keras#20585; tests/test_distributed.py).
    keras.Model: ("_maybe_symbolic_build",),
    # nets.layers.BatchNormalization sums synchronized statistics in float64.
    keras.layers.BatchNormalization: ("_moments",),
}


def batch_norm_moments(layer, inputs, mask):
    """Keras' own batch statistics of a BatchNormalization (what its ``_moments`` computes)."""
    # Without it the ``_moments`` override could not fall back to Keras' (masks, unsynced BN).
    return keras.layers.BatchNormalization._moments(layer, inputs, mask)


def batch_norm_reduction_axes(layer):
    """The axes a built BatchNormalization reduces over."""
    # Without it synchronized BN would re-derive them from ``axis`` and the input's rank.
    return layer._reduction_axes


def nested_layers(model):
    """Every layer inside ``model``, at any depth, each once."""
    # Without it recalibrate_batchnorm would miss the BatchNormalization inside sub-models.
    return model._flatten_layers(include_self=False)


def one_step_function(model, step):
    """Keras' one-step function: ``step`` under the model's strategy, outputs reduced over the
    replicas, compiled as ``run_eagerly`` and ``jit_compile`` say."""
    # Without it training.steps would re-implement how Keras distributes a step.
    return model._make_function(step)


def set_initial_epoch(model, epoch):
    """Make ``fit`` start at ``epoch``: fit reads it after ``on_train_begin``."""
    # Without it a run resumed by callbacks.Resume restarts at epoch 0.
    model._initial_epoch = epoch


def optimizer_variable_index(optimizer, variable):
    """The slot of ``variable`` in the lists ``add_optimizer_variables`` makes."""
    # Without it LARS could not find a variable's momentum buffer.
    return optimizer._get_variable_index(variable)


def uses_weight_decay(optimizer, variable):
    """Whether the optimizer decays ``variable``."""
    # Without it LARS would ignore ``exclude_from_weight_decay``.
    return optimizer._use_weight_decay(variable)


def write_weights_file(model, buffer):
    """Write into ``buffer`` (an ``io.BytesIO``) what ``model.save_weights`` writes to a file."""
    # Without it only h5py could write the file on the disk (why not: run_folder.weights_bytes).
    from keras.src.saving import saving_lib

    store = saving_lib.H5IOStore(buffer, mode="w")
    saving_lib._save_state(model, weights_store=store, assets_store=None, inner_path="",
                           visited_saveables=set())
    store.close()


def in_multi_worker_mode(strategy):
    """Whether a MultiWorkerMirroredStrategy has more than one worker (TensorFlow's private)."""
    # Without it (no public accessor) a one-worker MultiWorkerMirroredStrategy runs as a cluster.
    return strategy.extended._in_multi_worker_mode()


def maybe_merge_call(fn, strategy, *args):
    """``fn(strategy, *args)`` in cross-replica context, merging only where the strategy needs
    it (TensorFlow's interim API, which Keras' own TF optimizer uses)."""
    # Without it distribute.assign_in_sync could not assign mirrored variables from a replica.
    return tf.__internal__.distribute.interim.maybe_merge_call(fn, strategy, *args)
