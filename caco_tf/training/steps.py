"""The train function a method gives ``fit``: its warm-up pass then its own step, and
``steps_per_execution`` steps in one compiled call that takes its batches itself.

Keras' ``fit`` calls the train function once per ``steps_per_execution`` steps and hands it the
input pipeline's iterator.  ``TrainFunction`` runs the calls' steps inside one ``tf.function``
loop (no Python between the steps), times in that loop how long each step waits for its batch
(``model.input_wait``, seconds; ``callbacks.Throughput`` reports its share), and picks each
step's phase by the optimizer's step counter, which every checkpoint holds:

- the warm-up pass while the counter is below ``warmup_steps``, then the method's step, with
  ``at_warmup_end`` run once in between (the key encoder's resync), exactly at its step even
  when it falls inside a call (the call is then two loops);
- calls end at the epoch's last step and start at multiples of ``steps_per_execution`` inside
  the epoch, so a resume at any step, with any ``steps_per_execution``, realigns.

With ``steps_per_execution`` 1, for a list of batches (``train_on_batch``), or when ``fit`` does
not know the epoch's length (the last call could cross the end of the data), the steps run one
by one from Python, the same step functions; ``model.waiting_for_input`` then tells
``peers.StuckPeerWatchdog`` that a step waits for its batch.
"""

import time

import tensorflow as tf


class TrainFunction:
    """What ``fit`` calls (module docstring).

    Args:
      model: the ``keras.Model`` (its ``steps_per_execution``, optimizer step counter,
        ``input_wait`` and ``waiting_for_input`` are read and written).
      warmup_step, method_step: the model's two step methods (``train_step``'s signature).
      warmup_steps: the steps of the warm-up pass (0: none).
      at_warmup_end: called once, before the first method step that follows a warm-up.
    """

    def __init__(self, model, warmup_step, method_step, warmup_steps, at_warmup_end=None):
        self.model = model
        self.warmup_steps = int(warmup_steps)
        self.at_warmup_end = at_warmup_end
        self.warming_up = self.warmup_steps > 0
        # Keras' one-step functions: the step under the strategy, its outputs reduced.
        self.one_step = {True: model._make_function(warmup_step),
                         False: model._make_function(method_step)}
        self.loops = {phase: _compiled_loop(step) for phase, step in self.one_step.items()}
        self.steps_per_epoch = None  # set by ``fit`` when it knows it

    def __call__(self, iterator):
        per_call = self.model.steps_per_execution
        if per_call == 1 or not self.steps_per_epoch or not isinstance(
                iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
            return self._one_by_one(iter(iterator), per_call)  # iter: a list of batches too
        step = int(self.model.optimizer.iterations.numpy())
        within = step % self.steps_per_epoch
        count = min(per_call - within % per_call, self.steps_per_epoch - within)
        logs = None
        if self.warming_up and step < self.warmup_steps:
            warmup = min(count, self.warmup_steps - step)
            logs = self._loop(True, iterator, warmup)
            step, count = step + warmup, count - warmup
        if count:
            self._leave_warmup(step)
            logs = self._loop(False, iterator, count)
        return logs

    def _loop(self, warming_up, iterator, count):
        logs, waited = self.loops[warming_up](iterator, tf.constant(count))
        self.model.input_wait += float(waited)
        return logs

    def _one_by_one(self, iterator, count):
        logs = None
        for _ in range(count):
            start = time.perf_counter()
            self.model.waiting_for_input = True
            batch = next(iterator)
            self.model.waiting_for_input = False
            self.model.input_wait += time.perf_counter() - start
            step = int(self.model.optimizer.iterations.numpy()) if self.warming_up else None
            if not (self.warming_up and step < self.warmup_steps):
                self._leave_warmup(step)
            logs = self.one_step[self.warming_up]([batch])
        return logs

    def _leave_warmup(self, step):
        """The first method step after a warm-up: run ``at_warmup_end`` (a run resumed after
        the warm-up's end has had it already)."""
        if self.warming_up:
            self.warming_up = False
            if step == self.warmup_steps and self.at_warmup_end is not None:
                self.at_warmup_end()


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

    @tf.function
    def loop(iterator, count):
        logs, waited = timed_step(iterator, [])
        for _ in tf.range(count - 1):
            logs, more = timed_step(iterator, tf.nest.flatten(logs))
            waited += more
        return logs, waited

    return loop
