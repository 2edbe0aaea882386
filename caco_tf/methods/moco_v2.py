"""MoCo v2 (symmetrized): the other view's key against a FIFO queue of past keys."""

import keras

from caco_tf.methods.bank_warmup import warmup_settings
from caco_tf.methods.contrastive import ContrastiveMethod
from caco_tf.settings import Setting, integer, number


@keras.saving.register_keras_serializable(package="caco_tf")
class MoCoV2(ContrastiveMethod):
    """Query z¹'s positive is the other view's key k²; its negatives every row of a FIFO queue
    of past view-1 keys (the bank, written after each step and never trained).

    Defaults: MoCo v2's ImageNet recipe (facebookresearch/moco main_moco.py: ``--moco-k
    65536``, ``--moco-t 0.2``, ``--moco-m 0.999``, a constant momentum), the loss symmetrized as
    in the CaCo paper's Table memory_size.
    """

    method = "moco_v2"
    SETTINGS = {
        "bank_size": Setting(65536, integer(1), "K, the queue's rows (the negatives)",
                             trained=True, tiny=32, rows=True),
        "temperature": Setting(0.2, number(0.0, low_open=True), "tau of the loss", tiny=0.1,
                               search=(0.1, 0.2, 0.4)),
        "key_momentum": Setting(0.999, number(0.0, 1.0), "the key encoder's EMA momentum",
                                schedule="constant", tiny=0.9),
        **warmup_settings(epochs=0),
    }
    BANK = True
    DOCS_ROW = {"state": "queue of keys", "global batch": "–",
                "paper": "67.5 (200 ep); 71.1 (800 ep)",
                "name": "MoCo v2",
                "towards": "the other view's key",
                "negatives": "a FIFO queue of past keys",
                "summary": "the other view's key against a FIFO queue of past keys"}

    def contrastive_loss(self, query1, query2, key1, key2, bank):
        return self._moco_loss(query1, query2, key1, key2, bank)

    def update_bank(self, query1, query2, key1, key2, bank, step):
        self.memory_bank.enqueue(key1, bank)
