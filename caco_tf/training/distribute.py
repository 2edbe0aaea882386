"""Small helpers for updating state from inside a (possibly mirrored) train step.

Keras' optimizer updates the encoder under ``tf.distribute``; the bank, its momentum, the FIFO
pointer and the key encoder are assigned by the model itself.  Assigning a mirrored variable from
a replica needs a merge into cross-replica context; these helpers do that the way Keras'
``TFOptimizer`` does, so the same step runs on one device, on MirroredStrategy and on
MultiWorkerMirroredStrategy.  Also: the global batch's gathers and each replica's share of it.
"""

import os

import keras
import tensorflow as tf

from caco_tf import keras_compat
from caco_tf.errors import DataError


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

    keras_compat.maybe_merge_call(update, tf.distribute.get_strategy(), variables, list(values))


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


def global_sum(value):
    """The sum of ``value`` over every replica (itself on one device); its gradient is the sum
    of the replicas' gradients, so a loss every replica computes alike from global sums has,
    scaled by 1 / replicas, the one device's gradient."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return value
    return context.all_reduce(tf.distribute.ReduceOp.SUM, value)


def all_gather(value):
    """Concatenate ``value`` [n, ...] from all replicas along axis 0, in replica order.

    Every replica writes its rows into its own slot of a zero tensor and one SUM all-reduce
    fills all slots.  ``ReplicaContext.all_gather`` would do this too, but its shape exchange
    is a second kind of collective that MirroredStrategy may launch in a different order on
    different replicas next to synchronized BatchNorm's all-reduces, which aborts the step
    ("Collective instance … expected type 0 … but got type 2").  Local batches are equal
    (the pipelines drop remainders).
    """
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return value
    replicas = context.num_replicas_in_sync
    replica = tf.cast(context.replica_id_in_sync_group, tf.int32)
    slots = tf.one_hot(replica, replicas, dtype=value.dtype)  # [R]
    spread = slots[:, None] * tf.reshape(value, [1, -1])  # [R, n·...], zeros but own slot
    gathered = context.all_reduce(tf.distribute.ReduceOp.SUM, spread)
    return tf.reshape(gathered, tf.concat([[-1], tf.shape(value)[1:]], axis=0))


# ---------------------------------------------------------------------- strategies for a run
def make_strategy(name="auto", collective_timeout=None):
    """The ``tf.distribute`` strategy a run asks for.

    ``auto``: MirroredStrategy over the visible GPUs when there is more than one, else the
    default (one device).  ``mirrored``: MirroredStrategy over every GPU, or every logical CPU
    device when there is no GPU (how the tests get two replicas on one CPU).  ``multiworker``:
    MultiWorkerMirroredStrategy, the cluster and this process's task read from ``TF_CONFIG``,
    whose collectives give up after ``collective_timeout`` seconds (None or 0: never) with
    ``tf.errors.DeadlineExceededError``, so that no worker waits forever for a stuck peer.
    The global batch stays what the config says; each replica gets its share.
    """
    from caco_tf.errors import ConfigError

    # Physical devices only until the strategy exists: listing logical devices starts the
    # runtime, after which a multi-worker strategy can no longer be configured.
    if name == "auto":
        name = "mirrored" if len(tf.config.list_physical_devices("GPU")) > 1 else "default"
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
        return tf.distribute.MirroredStrategy([d.name for d in devices])
    if name == "multiworker":
        if "TF_CONFIG" not in os.environ:
            raise ConfigError("distribute.strategy multiworker needs TF_CONFIG (cluster and "
                              "this worker's task); see docs/distributed.md")
        options = tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=float(collective_timeout) if collective_timeout else None)
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    raise ConfigError(f"unknown distribute.strategy {name!r}")


def is_multi_worker(strategy=None):
    strategy = strategy or tf.distribute.get_strategy()
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and (
        keras_compat.in_multi_worker_mode(strategy))


def num_workers(strategy=None):
    """The processes of the run (one input pipeline each): the cluster's chief and workers."""
    strategy = strategy or tf.distribute.get_strategy()
    if not is_multi_worker(strategy):
        return 1
    cluster = strategy.cluster_resolver.cluster_spec().as_dict()
    return len(cluster.get("chief", [])) + len(cluster.get("worker", []))


def is_chief(strategy=None):
    """Whether this process writes the run folder (logs, checkpoints, SavedModel).

    One process per cluster writes: the ``chief`` task if the cluster has one, else worker 0.
    """
    strategy = strategy or tf.distribute.get_strategy()
    if not is_multi_worker(strategy):
        return True
    resolver = strategy.cluster_resolver
    return is_chief_task(resolver.task_type, resolver.task_id, resolver.cluster_spec().as_dict())


def is_chief_task(job, index, cluster):
    """Whether task ``index`` of ``job`` is the chief of ``cluster`` ({job: [addresses]})."""
    return job == "chief" or ("chief" not in cluster and job == "worker" and index == 0)


def reducible(logs):
    """Step outputs Keras can reduce under every strategy.

    Keras reduces a step's outputs with ``strategy.reduce("MEAN", value, axis=0)`` under
    MultiWorkerMirroredStrategy, which rejects scalars (keras-team/keras#20585); a [1] tensor
    reduces to the same scalar mean.  Other strategies get the scalars untouched.
    """
    if not is_multi_worker():
        return logs
    return {name: tf.reshape(value, [1]) for name, value in logs.items()}


def check_replica_shares(data, replicas):
    """A one-line ``DataError`` when ``data`` (what ``fit`` is given) has batches that
    ``replicas`` replicas cannot share equally, or whose size is unknown."""
    if replicas <= 1 or not isinstance(data, tf.data.Dataset):
        return
    spec = data.element_spec
    while isinstance(spec, (tuple, list, dict)):  # the first view's batch dimension
        spec = list(spec.values())[0] if isinstance(spec, dict) else spec[0]
    batch = spec.shape[0] if spec.shape.rank else None
    if batch is None:
        raise DataError(f"under {replicas} replicas every batch must split evenly, and this "
                        f"dataset's batches are of unknown size: batch it with "
                        f"drop_remainder=True and a multiple of {replicas} images")
    if batch % replicas:
        raise DataError(f"under {replicas} replicas every batch must split evenly: batches "
                        f"of {batch} images do not; use a multiple of {replicas}")


def replica_offset(local_count):
    """This replica's first row in a global batch gathered with ``distribute.all_gather``."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return 0
    return tf.cast(context.replica_id_in_sync_group, tf.int32) * tf.cast(local_count, tf.int32)
