"""The ablation's "Negative" row (AdCo-like): the bank holds negatives only, trained to ascend."""

import keras

from caco_tf.methods.contrastive import ContrastiveMethod


@keras.saving.register_keras_serializable(package="caco_tf")
class AdversarialNegatives(ContrastiveMethod):
    """The positive is the other view's key; every bank row is a negative and ascends the loss
    (``MemoryBank.adversarial_step``, with CaCo's bank learning rate, momentum and bank
    temperature: CaCo's ablation row reads CaCo's settings)."""

    method = "negative"
    SETTINGS_OF = "caco"
    BANK = True
    LEARNS_BANK = True

    def contrastive_loss(self, query1, query2, key1, key2, bank):
        return self._moco_loss(query1, query2, key1, key2, bank)

    def update_bank(self, query1, query2, key1, key2, bank, step):
        return self.memory_bank.adversarial_step(query1, query2, key1, key2, bank,
                                                 self.bank_temperature, step)
