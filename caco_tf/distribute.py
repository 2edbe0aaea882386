"""Small helpers for updating state from inside a (possibly mirrored) train step.

Keras' optimizer updates the encoder under ``tf.distribute``; the bank, its momentum, the FIFO
pointer and the key encoder are assigned by the model itself.  Assigning a mirrored variable from
a replica needs a merge into cross-replica context; these helpers do that the way Keras'
``TFOptimizer`` does, so the same step runs on one device, on MirroredStrategy and on
MultiWorkerMirroredStrategy.
"""

import keras
import tensorflow as tf


def _tf_variable(variable):
    return variable.value if isinstance(variable, keras.Variable) else variable


def assign_in_sync(variables, values):
    """Assign ``values[i]`` to ``variables[i]`` on every replica.

    Every replica must have computed the same value (e.g. after an all-reduce); each replica's
    copy of the variable receives its own replica's value.
    """
    variables = [_tf_variable(v) for v in variables]

    def update(strategy, variables, values):
        for variable, value in zip(variables, values):
            strategy.extended.update(
                variable, lambda var, val: var.assign(tf.cast(val, var.dtype)),
                args=(value,), group=False)

    tf.__internal__.distribute.interim.maybe_merge_call(
        update, tf.distribute.get_strategy(), variables, list(values))


def num_replicas():
    return tf.distribute.get_strategy().num_replicas_in_sync


def global_mean(local_mean, local_count):
    """Mean over the global batch of a quantity averaged over each replica's local batch.

    Weighting by the local count keeps it exact when the last batch splits unevenly.
    """
    context = tf.distribute.get_replica_context()
    local_count = tf.cast(local_count, tf.float32)
    if context is None or context.num_replicas_in_sync == 1:
        return local_mean
    total, count = context.all_reduce(
        tf.distribute.ReduceOp.SUM, [local_mean * local_count, local_count])
    return total / count


def all_gather(value):
    """Concatenate ``value`` from all replicas along axis 0, in replica order."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return value
    return context.all_gather(value, axis=0)
