"""The memory bank: K raw rows of dimension D, their SGD momentum and a FIFO pointer, as a layer.

``MemoryBank`` owns the state and does with it what the methods do with a bank, on every
replica alike: a FIFO write of keys (MoCo's queue, the warm-up fill), the statistics of queries
against it, CaCo's cooperative-adversarial step (eq. real_update, the tiled pass) and AdCo's
adversarial step.  The math is ``caco_tf.bank``'s pure functions; this module adds the
variables, the replicas and the learning rate.
"""

import keras
import tensorflow as tf

from caco_tf import bank as bank_lib
from caco_tf.training import distribute
from caco_tf.training.optimizers import as_schedule


class MemoryBank(keras.layers.Layer):
    """The bank B = {b_j}: ``size`` × ``dim`` raw rows (normalized where used, never in place).

    Args:
      size: K, the number of rows.
      dim: D, the embedding's dimension.
      learning_rate: η of the bank's own SGD, a float or a schedule of the encoder's step.
      momentum: that SGD's momentum (PyTorch's rule, no weight decay).

    State: ``rows`` (random at first, as in the reference), ``velocity`` (the momentum buffer),
    ``pointer`` (the next FIFO row).  The step assigns them, never an optimizer: each is
    ``only_first_replica``-aggregated and every replica assigns the same value.
    """

    def __init__(self, size, dim, learning_rate=3.0, momentum=0.9, name="memory_bank",
                 **kwargs):
        super().__init__(name=name, dtype="float32", **kwargs)
        self.learning_rate = as_schedule(learning_rate)
        self.momentum = momentum
        state = dict(trainable=False, aggregation="only_first_replica")
        self.rows = self.add_weight(
            shape=(size, dim), initializer=keras.initializers.RandomNormal(seed=0),
            name="bank", **state)
        self.velocity = self.add_weight(shape=(size, dim), initializer="zeros",
                                        name="bank_velocity", **state)
        self.pointer = self.add_weight(shape=(), dtype="int32", initializer="zeros",
                                       name="bank_pointer", **state)
        # Rows per tile of the K×D passes: the [N, K] matrices are never held whole.
        self.tile_rows = bank_lib.tile_rows(size)
        self._rows_saved_by_owner = None
        self.built = True

    @property
    def size(self):
        return int(self.rows.shape[0])

    def describe(self):
        return f"K × D = {self.size:,} × {self.rows.shape[1]} rows, momentum, FIFO pointer"

    def read(self):
        """The rows as a tensor: the pre-step bank every part of a step reads."""
        return tf.convert_to_tensor(self.rows)

    def mean_row_norm(self):
        return tf.reduce_mean(tf.norm(self.rows, axis=-1))

    # ------------------------------------------------------------------ what methods do
    def enqueue(self, keys, bank):
        """FIFO write of one key per image of the global batch (gathered in replica order)."""
        new_bank, new_pointer = bank_lib.enqueue(bank, distribute.all_gather(keys),
                                                 tf.convert_to_tensor(self.pointer))
        distribute.assign_in_sync([self.rows, self.pointer], [new_bank, new_pointer])

    def statistics(self, queries, keys, bank, temperature, bank_temperature):
        """``bank_lib.bank_statistics`` of queries [z¹; z²] against keys [k²; k¹], tiled."""
        return bank_lib.bank_statistics(queries, keys, bank, temperature, bank_temperature,
                                        self.tile_rows)

    def cooperative_adversarial_step(self, queries, statistics, bank, temperature,
                                     bank_temperature, step, views=2):
        """CaCo's bank step (eq. real_update) from the pre-step ``bank``, in one tiled pass.

        Returns (Σ_j p_nj b̂_j [N, D], which the queries' gradient needs, this step's η).
        """
        settings = (temperature, bank_temperature)
        if distribute.num_replicas() > 1:  # the replicas' g are averaged before the momentum
            expected_unit, gradient = bank_lib.tiled_caco_gradient(
                queries, statistics, bank, *settings, views, self.tile_rows)
            return expected_unit, self.momentum_step(bank, gradient, step,
                                                     tf.shape(queries)[0] // views)
        learning_rate = self.learning_rate(step)
        expected_unit, new_bank, new_velocity = bank_lib.tiled_caco_update(
            queries, statistics, bank, tf.convert_to_tensor(self.velocity), *settings,
            learning_rate, self.momentum, views, self.tile_rows)
        distribute.assign_in_sync([self.rows, self.velocity], [new_bank, new_velocity])
        return expected_unit, learning_rate

    def adversarial_step(self, query1, query2, key1, key2, bank, temperature, step):
        """AdCo's step: every row a negative of both views' InfoNCE, ascending it.  Returns η."""
        gradient = (bank_lib.adversarial_negative_gradient(query1, key2, bank, temperature)
                    + bank_lib.adversarial_negative_gradient(query2, key1, bank, temperature))
        return self.momentum_step(bank, gradient, step, tf.shape(query1)[0])

    def momentum_step(self, bank, gradient, step, local_batch):
        """Average ``gradient`` over the global batch, take the SGD-momentum step on the
        pre-step ``bank`` and assign it on every replica.  Returns this step's η."""
        gradient = distribute.global_mean(gradient, local_batch)
        learning_rate = self.learning_rate(step)
        new_bank, new_velocity = bank_lib.momentum_step(
            bank, tf.convert_to_tensor(self.velocity), gradient, learning_rate, self.momentum)
        distribute.assign_in_sync([self.rows, self.velocity], [new_bank, new_velocity])
        return learning_rate

    # ------------------------------------------------------------------ files
    def load_own_variables(self, store):
        # Files written by caco_tf 0.2 hold these three variables at the model's own level; the
        # model hands them over (``ContrastiveMethod.load_own_variables``) before this runs.
        if len(store.keys()) == 0 and self._rows_saved_by_owner is not None:
            for variable, value in zip(self.weights, self._rows_saved_by_owner):
                variable.assign(value)
            self._rows_saved_by_owner = None
            return
        super().load_own_variables(store)
