"""The ablation's "Negative" row (AdCo-like): the bank holds negatives only, trained to ascend."""

import keras

from caco_tf.methods.caco import CaCo
from caco_tf.methods.contrastive import ContrastiveMethod


@keras.saving.register_keras_serializable(package="caco_tf")
class AdversarialNegatives(ContrastiveMethod):
    """The positive is the other view's key; every bank row is a negative and ascends the loss
    (``MemoryBank.adversarial_step``, with CaCo's bank learning rate, momentum and bank
    temperature: CaCo's ablation row reads CaCo's settings)."""

    method = "negative"
    SETTINGS, SETTINGS_OF = CaCo.SETTINGS, "caco"  # CaCo's ablation row: its section
    BANK = True
    LEARNS_BANK = True
    DOCS_ROW = {"state": "bank (adversarial negatives)", "global batch": "the bank's gradient",
                "name": "CaCo's ablation rows",
                "full name": "the paper's Negative row (AdCo-like)",
                "towards": "the other view's key",
                "negatives": "the bank, trained adversarially",
                "summary": "the paper's None, Positive and Negative rows"}

    def contrastive_loss(self, query1, query2, key1, key2, bank):
        return self._moco_loss(query1, query2, key1, key2, bank)

    def update_bank(self, query1, query2, key1, key2, bank, step):
        return self.memory_bank.adversarial_step(query1, query2, key1, key2, bank,
                                                 self.bank_temperature, step)
