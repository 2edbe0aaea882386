"""No worker of a multi-worker run waits forever for a stuck peer.

A collective waits for every worker; a worker that hangs (stuck I/O, a paused VM, a lost GPU)
would hold the others at their next collective for ever.  ``StuckPeerWatchdog`` watches the
whole run, each step and everything between steps (Keras' epoch-end metrics, the kNN monitor,
the health pass, precise BatchNorm, the saves, the end-of-run kNN): a phase that makes no
progress for ``distribute.collective_timeout_seconds`` ends the process with one line naming
where the run stood and the worker that is behind, and exit status 75, so that a scheduler
relaunches the job, which then resumes from its last save.  A long pass of many collectives
(an evaluation) marks its progress batch by batch (``progress``), so only a wait is timed.
Each worker publishes the step it has reached in the cluster's coordination service (a key
per worker, every few seconds), which is how the line can name the worker that is behind.

A worker whose process dies or stops sending heartbeats is also noticed by TensorFlow's
coordination service; its error ends the others' steps, and ``peer_error`` turns it into the
same kind of line.
"""

import contextlib
import json
import os
import re
import threading
import time

import keras

EXIT_STATUS = 75  # EX_TEMPFAIL: relaunching may succeed
PUBLISH_EVERY = 5.0  # seconds between two publications of this worker's step
_KEY = "caco_tf/step/{}"


class PeerError(Exception):
    """A peer stopped answering; the message says which and where.  Exit status 75."""

    exit_status = EXIT_STATUS


ADVICE = "relaunch every worker with the same command: the run resumes from its last save"


def peer_error(error, step, watchdog=None, where=None):
    """A ``PeerError`` from TensorFlow's error about a lost peer (a collective aborted or past
    its deadline, heartbeats missed), or None when ``error`` is of another kind.  The peer is
    named from the coordination service's message, else by ``watchdog.behind()``; ``where``:
    what could not finish (default: global step ``step + 1``)."""
    import tensorflow as tf

    if not isinstance(error, (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                              tf.errors.AbortedError, tf.errors.CancelledError)):
        return None
    text = str(error)
    who = None
    if "stopped sending heartbeats" in text:  # the coordination service names them
        unhealthy = text.split("stopped sending heartbeats", 1)[1].split("The tasks", 1)[0]
        tasks = sorted(set(re.findall(r"/job:(\w+)/(?:replica:\d+/)?task:(\d+)", unhealthy)))
        who = ", ".join(f"{job} task {index} is not answering" for job, index in tasks) or None
    if who is None and watchdog is not None:
        who = watchdog.behind()
    if "stopped sending heartbeats" in text:
        cause = "its heartbeats stopped"
    elif isinstance(error, tf.errors.DeadlineExceededError):
        cause = "a collective waited longer than distribute.collective_timeout_seconds"
    else:
        cause = type(error).__name__
    where = where or (watchdog.where() if watchdog is not None and watchdog.phase
                      else f"global step {step + 1}")
    return PeerError(f"{who or 'a peer is not answering'}: {where} could not finish ({cause}); "
                     f"{ADVICE}")


def share(key, value):
    """Publish ``value`` (JSON) under ``key`` in the cluster's coordination service."""
    from tensorflow.python.eager import context

    context.context().set_config_key_value(key, json.dumps(value))


def fetch(key, timeout=None, what=None):
    """The value a worker published under ``key`` (``share``), waiting up to ``timeout``
    seconds (None or 0: for ever); a ``PeerError`` when it does not come."""
    from tensorflow.python.eager import context

    try:
        text = context.context().get_config_key_value(
            key, int(1000 * timeout) if timeout else 0)
    except Exception as error:  # noqa: BLE001 (DeadlineExceeded, Unavailable: the peer is gone)
        waited = f"within {timeout:g} s (distribute.collective_timeout_seconds)" if timeout \
            else f"({type(error).__name__})"
        raise PeerError(f"a peer is not answering: {what or key} did not come {waited}; "
                        f"{ADVICE}") from None
    return json.loads(text)


_ACTIVE = []  # the running watchdog, for ``progress``


def progress():
    """Mark progress inside a long phase of collectives (a batch of an evaluation): the
    watchdog times the wait for the next one, not the whole pass."""
    for watchdog in _ACTIVE:
        watchdog.restart()


def ticking(batches):
    """``batches`` (any iterable), marking ``progress`` before each."""
    for batch in batches:
        progress()
        yield batch
    progress()


class StuckPeerWatchdog(keras.callbacks.Callback):
    """Ends this worker with one line when a phase of the run makes no progress for longer than
    ``timeout`` seconds: a step, or the time between two steps (the epoch's end: Keras' metrics,
    the evaluations, the saves), or a phase named with ``watching`` (the end-of-run kNN).

    Every few seconds a thread publishes (a counter, the steps done, whether the process waits
    for its input) in the coordination service.  When a phase overruns, it reads every peer's
    twice, a publication apart, and names the ones that are stuck: not publishing (a paused or
    dead process), waiting for their input (hung I/O), or behind.

    Args:
      timeout: seconds (None or 0: off).
      task: this worker's (job, index); ``tasks``: every worker's, in the cluster's order.
      exit: called with the exit status (``os._exit``: a step cannot be interrupted).
    """

    def __init__(self, timeout, task, tasks, exit=os._exit):
        super().__init__()
        self.timeout, self.task, self.tasks, self.exit = timeout, task, list(tasks), exit
        self._began, self._step, self._count = None, 0, 0
        self.phase, self._epoch = None, 0
        self._stop = threading.Event()
        self._thread = None

    def _start(self):
        if self._thread is not None and self._stop.is_set():
            self._thread.join()  # closed: it ends at once (its waits return on the stop)
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._watch, name="stuck-peer-watchdog",
                                            daemon=True)
            self._thread.start()
        if self not in _ACTIVE:
            _ACTIVE.append(self)

    def close(self):
        """Stop timing (the run ended, or this worker is stopping)."""
        self._began, self.phase = None, None
        self._stop.set()
        if self in _ACTIVE:
            _ACTIVE.remove(self)

    def _enter(self, phase):
        self.phase, self._began = phase, time.monotonic()

    def restart(self):
        """The phase made progress: time the wait from now."""
        if self._began is not None:
            self._began = time.monotonic()

    def where(self):
        """Where the run stands, as the error line says it."""
        if self.phase in ("step", "between steps"):  # before the next step can start
            return f"global step {self._step + 1}"
        if self.phase == "epoch end":
            return f"the end of epoch {self._epoch + 1} (after global step {self._step})"
        if self.phase == "epoch start":  # the epoch's iterator and callbacks, before its step
            return f"the start of epoch {self._epoch + 1} (after global step {self._step})"
        return f"{self.phase} (after global step {self._step})"

    def on_train_begin(self, logs=None):
        self._step = int(self.model.optimizer.iterations.numpy())
        self._start()
        self._enter("the start of training")

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._enter("epoch start")

    def on_train_batch_begin(self, batch, logs=None):
        self._enter("step")

    def on_train_batch_end(self, batch, logs=None):
        self._step = int(self.model.optimizer.iterations.numpy())
        # Between steps too: an epoch's end runs collectives (metrics, evaluations, saves).
        self._enter("epoch end" if batch + 1 >= (self.params or {}).get("steps") or 0
                    else "between steps")

    def on_epoch_end(self, epoch, logs=None):
        self._enter("epoch end")

    def on_train_end(self, logs=None):
        self.close()

    @contextlib.contextmanager
    def watching(self, phase):
        """Guard a phase after training (``phase``: what the error line calls it)."""
        self._start()
        self._enter(phase)
        try:
            yield self
        finally:
            self.close()

    def _publish(self):
        from tensorflow.python.eager import context  # the coordination service's store

        self._count += 1
        waiting = "input" if getattr(self.model, "waiting_for_input", False) else "step"
        key = _KEY.format("/".join(map(str, self.task)))
        try:
            try:
                context.context().delete_config_key_value(key)
            except Exception:  # noqa: BLE001 (absent the first time)
                pass
            context.context().set_config_key_value(key, f"{self._count}:{self._step}:{waiting}")
        except Exception:  # noqa: BLE001 (the service is gone: the watchdog still guards)
            pass

    def _read(self):
        """{task: (count, step, waiting) or None when it does not answer within 2 s}."""
        from tensorflow.python.eager import context

        values = {}
        for task in self.tasks:
            if tuple(task) == tuple(self.task):
                continue
            try:
                count, step, waiting = context.context().get_config_key_value(
                    _KEY.format("/".join(map(str, task))), 2000).split(":")
                values[tuple(task)] = (int(count), int(step), waiting)
            except Exception:  # noqa: BLE001
                values[tuple(task)] = None
        return values

    def behind(self):
        """The peers that hold the run up, named with why; None when none can be told."""
        first = self._read()
        self._stop.wait(PUBLISH_EVERY + 1.0)
        second = self._read()
        named = []
        for task, now in second.items():
            name = f"{task[0]} task {task[1]}"
            if now is None or first.get(task) is None or now[0] == first[task][0]:
                named.append(f"{name} is not answering")
            elif now[2] == "input":
                named.append(f"{name} is waiting for its input data")
            elif now[1] < self._step:
                named.append(f"{name} is behind, at step {now[1]}")
        return ", ".join(named) or None

    def _watch(self):
        last = 0.0
        while not self._stop.wait(1.0):
            if time.monotonic() - last >= PUBLISH_EVERY:
                self._publish()
                last = time.monotonic()
            began = self._began
            if began is None or time.monotonic() - began < self.timeout:
                continue
            where = self.where()
            who = self.behind() or "a peer is not answering"
            if self._began is None or self._began != began:
                continue  # it moved on while the peers were read
            os.write(2, (f"error: {who}: {where} has waited more than {self.timeout:g} s "
                         f"(distribute.collective_timeout_seconds); {ADVICE}\n").encode())
            self.exit(EXIT_STATUS)
            return


def watchdog(strategy, timeout):
    """The ``StuckPeerWatchdog`` of a multi-worker ``strategy``, or None (one worker, or no
    timeout)."""
    from caco_tf.training import distribute

    if not timeout or not distribute.is_multi_worker(strategy):
        return None
    resolver = strategy.cluster_resolver
    cluster = resolver.cluster_spec().as_dict()
    tasks = [(job, index) for job in ("chief", "worker") for index in range(len(
        cluster.get(job, [])))]
    return StuckPeerWatchdog(timeout, (resolver.task_type, resolver.task_id), tasks)
