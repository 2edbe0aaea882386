"""The ablation's "Negative" row (AdCo-like): the bank holds negatives only, trained to ascend."""

import keras
import tensorflow as tf

from caco_tf import bank as bank_lib
from caco_tf.methods.base import MomentumEncoderMethod


@keras.saving.register_keras_serializable(package="caco_tf")
class AdversarialNegatives(MomentumEncoderMethod):
    """The positive is the other view's key; every bank row is a negative and ascends the loss
    (``bank.adversarial_negative_gradient``, with the run's bank learning rate, momentum and
    temperature)."""

    method = "negative"
    learns_bank = True

    def contrastive_loss(self, query1, query2, key1, key2, bank):
        return self._moco_loss(query1, query2, key1, key2, bank)

    def update_bank(self, query1, query2, key1, key2, bank, step):
        gradient = (
            bank_lib.adversarial_negative_gradient(query1, key2, bank, self.bank_temperature)
            + bank_lib.adversarial_negative_gradient(query2, key1, bank, self.bank_temperature))
        return self._bank_step(bank, gradient, step, tf.shape(query1)[0])
