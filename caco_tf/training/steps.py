"""The train function a method gives ``fit``: its phases (a warm-up, then its own steps, split
where a frozen part thaws), and ``steps_per_execution`` steps in one compiled call that takes
its batches itself.

Keras' ``fit`` calls the train function once per ``steps_per_execution`` steps and hands it the
input pipeline's iterator.  ``TrainFunction`` runs the calls' steps inside one ``tf.function``
loop (no Python between the steps), times in that loop how long each step waits for its batch
(``model.input_wait``, seconds; ``callbacks.Throughput`` reports its share), and picks each
step's phase by the optimizer's step counter, which every checkpoint holds:

- a phase runs from its first step until the next phase's, with that next phase's
  ``on_enter`` run once in between (the key encoder's resync at the warm-up's end), exactly at
  its step even when it falls inside a call (the call is then several loops);
- calls end at the epoch's last step and start at multiples of ``steps_per_execution`` inside
  the epoch, so a resume at any step, with any ``steps_per_execution``, realigns.

With ``steps_per_execution`` 1, for a list of batches (``train_on_batch``), or when ``fit`` does
not know the epoch's length (the last call could cross the end of the data), the steps run one
by one from Python, the same step functions; ``model.waiting_for_input`` then tells
``peers.StuckPeerWatchdog`` that a step waits for its batch.
"""

import bisect
import time

import tensorflow as tf

from caco_tf import keras_compat
from caco_tf import tracing  # noqa: F401  (autograph leaves caco_tf alone)


class TrainFunction:
    """What ``fit`` calls (module docstring).

    Args:
      model: the ``keras.Model`` (its ``steps_per_execution``, optimizer step counter,
        ``input_wait`` and ``waiting_for_input`` are read and written).
      phases: [(first step, step function (``train_step``'s signature), on_enter or None)],
        the first from step 0; ``on_enter`` runs once, before the phase's first step, when the
        run reaches it (a run resumed inside the phase has had it already).
    """

    def __init__(self, model, phases):
        self.model = model
        self.starts = [int(first) for first, _, _ in phases]
        self.on_enter = [on_enter for _, _, on_enter in phases]
        # Keras' one-step functions: the step under the strategy, its outputs reduced.
        self.one_step = [keras_compat.one_step_function(model, step) for _, step, _ in phases]
        self.loops = [_compiled_loop(step) for step in self.one_step]
        self.current = None  # the phase the last step ran in
        self.steps_per_epoch = None  # set by ``fit`` when it knows it

    def _phase(self, step):
        return bisect.bisect_right(self.starts, step) - 1

    def __call__(self, iterator):
        per_call = self.model.steps_per_execution
        if per_call == 1 or not self.steps_per_epoch or not isinstance(
                iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
            return self._one_by_one(iter(iterator), per_call)  # iter: a list of batches too
        step = int(self.model.optimizer.iterations.numpy())
        within = step % self.steps_per_epoch
        count = min(per_call - within % per_call, self.steps_per_epoch - within)
        logs = None
        while count:
            phase = self._phase(step)
            ahead = self.starts[phase + 1] - step if phase + 1 < len(self.starts) else count
            steps = min(count, ahead)
            self._enter(phase, step)
            logs, waited = self.loops[phase](iterator, tf.constant(steps))
            self.model.input_wait += float(waited)
            step, count = step + steps, count - steps
        return logs

    def _one_by_one(self, iterator, count):
        logs = None
        for _ in range(count):
            start = time.perf_counter()
            self.model.waiting_for_input = True
            batch = next(iterator)
            self.model.waiting_for_input = False
            self.model.input_wait += time.perf_counter() - start
            # The counter is read only while a phase lies ahead.
            last = len(self.starts) - 1
            step = None if self.current == last else int(self.model.optimizer.iterations.numpy())
            phase = last if step is None else self._phase(step)
            self._enter(phase, step)
            logs = self.one_step[phase]([batch])
        return logs

    def _enter(self, phase, step):
        """Make ``phase`` current; run its ``on_enter`` if this step is its first."""
        if phase != self.current:
            self.current = phase
            if step == self.starts[phase] and self.on_enter[phase] is not None:
                self.on_enter[phase]()


def _compiled_loop(one_step):
    """``count`` steps of ``one_step`` in one ``tf.function``, each taking its batch from the
    iterator; returns the last step's logs and the seconds the steps waited for their batches.

    The explicit dependencies order each step: the clock, the batch, the clock, the step, then
    the next step's clock, so the wait is the time ``get_next`` blocked.
    """
    @tf.autograph.experimental.do_not_convert
    def timed_step(iterator, after):
        with tf.control_dependencies(after):
            start = tf.timestamp()
        with tf.control_dependencies([start]):
            batch = iterator.get_next()
        with tf.control_dependencies(tf.nest.flatten(batch, expand_composites=True)):
            waited = tf.timestamp() - start
        logs = one_step([batch])
        return logs, waited

    @tf.function(autograph=False)
    def loop(iterator, count):
        logs, waited = timed_step(iterator, [])

        def one_more(done, logs, waited):
            logs, more = timed_step(iterator, tf.nest.flatten(logs))
            return done + 1, logs, waited + more

        _, logs, waited = tf.while_loop(lambda done, *_: done < count, one_more,
                                        (tf.constant(1), logs, waited))
        return logs, waited

    return loop
