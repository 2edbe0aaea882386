"""One decision per run: what a worker would resolve from its own machine (``train.precision:
auto`` from its CPU and GPUs, XLA from its GPUs) is decided once and shared.

Every worker of a multi-worker run publishes what its machine would choose in the cluster's
coordination service and reads every other's; all then apply the same rule (``agree``): the
precision is the chief's (a worker whose machine would choose another says so in one line),
and XLA, which a machine either can or cannot compile the step's collectives with, must be
the same on all (else every worker stops with the same one line).  The decision is recorded
in the run folder (``training_metadata.json``: ``decided``) and kept by every resume of the
run, so a run relaunched on machines of another kind trains on as it began.
"""

from caco_tf.errors import ConfigError
from caco_tf.training import precision


def local(train, num_replicas, gpus=None, flags=None):
    """What this machine would choose for a run's ``train`` settings (``RunSettings.train``):
    {"precision", "why", "xla"}."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU") if gpus is None else gpus
    policy, why = precision.resolve(train.precision, gpus=gpus, flags=flags)
    xla = bool(train.jit_compile) and not (num_replicas > 1 and not gpus)
    return {"precision": policy, "why": why, "xla": xla}


def agree(choices, chief, recorded=None):
    """(the run's decision, a note for each worker whose machine would choose otherwise) from
    every worker's ``local`` choice ({worker name: choice}); ``chief``: the chief's name;
    ``recorded``: the decision a resumed run began with (its precision is kept).  A
    ``ConfigError`` when the workers cannot train alike (XLA on some machines only)."""
    decided = dict(choices[chief])
    if recorded and recorded.get("precision"):
        decided["precision"] = recorded["precision"]
        decided["why"] = recorded.get("why")
    xla = {name: choice["xla"] for name, choice in choices.items()}
    if len(set(xla.values())) > 1:
        sides = "; ".join(f"{', '.join(sorted(n for n, on in xla.items() if on == value))}: "
                          f"{'on' if value else 'off (no GPU)'}" for value in (True, False))
        raise ConfigError(f"train.jit_compile true: the workers' machines disagree on XLA "
                          f"({sides}); set train.jit_compile false, or run every worker on "
                          f"machines of one kind")
    notes = {}
    for name, choice in choices.items():
        if choice["precision"] != decided["precision"]:
            whose = "the run's (decided when it began)" if recorded else "the chief's"
            notes[name] = (f"precision: {decided['precision']}, {whose}; this machine would "
                           f"choose {choice['precision']} ({choice['why'] or 'as set'})")
    return decided, notes


def decide(train, strategy, recorded=None, timeout=None):
    """The run's decision ({"precision", "why", "xla"}) for its ``train`` settings
    (``RunSettings.train``) and this worker's note (or None), the workers' choices exchanged
    through the coordination service under a multi-worker ``strategy`` (waiting up to
    ``timeout`` seconds for each)."""
    from caco_tf.training import distribute, peers

    own = local(train, strategy.num_replicas_in_sync)
    if train.precision != "auto":
        recorded = None  # a precision set by hand is the user's, resumed or not
    if not distribute.is_multi_worker(strategy):
        decided, notes = agree({"this machine": own}, "this machine", recorded)
        return decided, notes.get("this machine")
    resolver = strategy.cluster_resolver
    cluster = resolver.cluster_spec().as_dict()
    tasks = [(job, index) for job in ("chief", "worker") for index in range(len(
        cluster.get(job, [])))]
    mine = (resolver.task_type, resolver.task_id)
    peers.share("caco_tf/decided/{}/{}".format(*mine), own)
    choices = {_name(*task): own if task == mine else peers.fetch(
        "caco_tf/decided/{}/{}".format(*task), timeout, f"{_name(*task)}'s choice of precision")
        for task in tasks}
    chief = next(_name(*task) for task in tasks if distribute.is_chief_task(*task, cluster))
    decided, notes = agree(choices, chief, recorded)
    return decided, notes.get(_name(*mine))


def _name(job, index):
    return f"{job} task {index}"
