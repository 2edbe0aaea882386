"""State a method keeps besides its networks, as layers that own their variables and their
update: a FIFO queue of past embeddings (NNCLR's support set, SwAV's queue) and a running mean
(DINO's center).  Every replica assigns the same value (the update is computed from the global
batch), so one replica and R replicas hold the same state.

The bank that CaCo trains is ``memory_bank.MemoryBank``.
"""

import keras
import tensorflow as tf

from caco_tf import bank as bank_lib
from caco_tf.training import distribute

_REPLICATED = dict(trainable=False, aggregation="only_first_replica")


class Queue(keras.layers.Layer):
    """``size`` rows of dimension ``dim`` written first in, first out, and how many were ever
    written (``filled``, capped at ``size``): a queue is full once every row holds an
    embedding, which SwAV waits for before using it.

    The rows start at zero, or random (``random=True``: NNCLR's support set, searched from the
    first step); ``enqueue`` writes the global batch's rows (gathered in replica order) at the
    pointer.
    """

    def __init__(self, size, dim, random=False, name="queue", **kwargs):
        super().__init__(name=name, dtype="float32", **kwargs)
        initializer = keras.initializers.RandomNormal(seed=0) if random else "zeros"
        self.rows = self.add_weight(shape=(int(size), int(dim)), initializer=initializer,
                                    name="rows", **_REPLICATED)
        self.pointer = self.add_weight(shape=(), dtype="int32", initializer="zeros",
                                       name="pointer", **_REPLICATED)
        self.filled = self.add_weight(shape=(), dtype="int32", initializer="zeros",
                                      name="filled", **_REPLICATED)
        self.built = True

    @property
    def size(self):
        return int(self.rows.shape[0])

    def describe(self):
        return f"{self.size:,} × {self.rows.shape[1]} rows, FIFO pointer, filled count"

    def read(self):
        return tf.convert_to_tensor(self.rows)

    def is_full(self):
        return tf.equal(tf.convert_to_tensor(self.filled), self.size)

    def enqueue(self, local_rows, when=True):
        """Write the global batch's rows (this replica's ``local_rows``, gathered), if ``when``
        (a boolean tensor: the gather runs either way, so every replica runs the same
        collectives)."""
        rows = tf.stop_gradient(distribute.all_gather(tf.cast(local_rows, tf.float32)))
        old_rows, old_pointer = self.read(), tf.convert_to_tensor(self.pointer)
        old_filled = tf.convert_to_tensor(self.filled)
        new_rows, new_pointer = bank_lib.enqueue(old_rows, rows, old_pointer)
        new_filled = tf.minimum(old_filled + tf.shape(rows)[0], self.size)
        distribute.assign_in_sync(
            [self.rows, self.pointer, self.filled],
            [tf.where(when, new, old) for new, old in ((new_rows, old_rows),
                                                       (new_pointer, old_pointer),
                                                       (new_filled, old_filled))])


class RunningMean(keras.layers.Layer):
    """An exponential moving average of the global batch's mean row, [1, dim]: DINO's center
    c ← m c + (1 - m) mean_n t_n, starting at zero."""

    def __init__(self, dim, momentum=0.9, name="center", **kwargs):
        super().__init__(name=name, dtype="float32", **kwargs)
        self.momentum = float(momentum)
        self.value = self.add_weight(shape=(1, int(dim)), initializer="zeros", name="value",
                                     **_REPLICATED)
        self.built = True

    def describe(self):
        return f"[{self.value.shape[1]:,}], EMA momentum {self.momentum:g}"

    def read(self):
        return tf.convert_to_tensor(self.value)

    def update(self, local_rows):
        """Move towards the mean of the global batch's rows (this replica's ``local_rows``)."""
        local_rows = tf.stop_gradient(tf.cast(local_rows, tf.float32))
        count = tf.shape(local_rows)[0]
        batch_mean = distribute.global_mean(tf.reduce_mean(local_rows, 0, keepdims=True), count)
        distribute.assign_in_sync(
            [self.value], [self.momentum * self.read() + (1.0 - self.momentum) * batch_mean])
