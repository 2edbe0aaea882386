"""The bank warm-up: a MoCo-style pass before a method's own steps, as the CaCo reference does.

It trains the embedding network (backbone → projector → L2) against a bank with the other
view's key as the positive and every bank row a negative (eq. infonce, ``warmup_temperature``),
while filling the bank first in, first out with real key embeddings; the key encoder follows
the student by EMA.  A method with a bank of its own (CaCo, MoCo v2, ...) warms that bank up;
another gets one for the warm-up alone (the fair ablation: every method starts its own loss
from the same state).

A method opts in with ``WARMUP = BankWarmup`` and the settings ``warmup_settings`` gives;
``BankWarmup`` then gives the warm-up's step to the base's one step (``Method._step``): the
same hooks as a method (targets, forward, loss, update_state, after_step).  A method may report
its own diagnostics against the bank the warm-up fills (``warmup_diagnostics``: CaCo's MPPs).
"""

import tensorflow as tf

from caco_tf import losses
from caco_tf.methods.memory_bank import MemoryBank


class BankWarmup:
    """The warm-up's hooks for ``model`` (a ``base.Method`` with ``warmup_steps`` > 0)."""

    EXACT_GRADIENT = False

    def __init__(self, model):
        """The warm-up of ``model``, which has built its parts and state; what the method
        lacks, the warm-up adds for itself: a key encoder and a bank (``warmup_bank_size``
        rows)."""
        self.model = model
        if model.key_encoder is None:
            own = "key_momentum" in model.argument_defaults()  # a setting unused outside it
            model.key_encoder = model.momentum_teacher(
                model.key_momentum if own else model.warmup_key_momentum)
        if model.memory_bank is None:
            rows = (model.bank_size if "bank_size" in model.argument_defaults()
                    else model.warmup_bank_size)
            model.memory_bank = MemoryBank(rows, model.embedding_dim, 0.0)

    def on_end(self):
        """What the run does as the warm-up ends: the teacher re-synced to the student
        (``resync_after_warmup``), or nothing (None)."""
        model = self.model
        if not model.resync_after_warmup:
            return None
        return lambda: model.key_encoder.sync(model._chain_variables(model._teacher_heads()))

    @property
    def student_variables(self):
        """The embedding network's variables: the heads take no part in the warm-up."""
        return self.model.query_encoder.trainable_variables

    def targets(self, crops, training):
        """The keys of both global crops, and the pre-step bank (raw and normalized)."""
        key_encoder, bank = self.model.key_encoder, self.model.memory_bank.read()
        return (key_encoder(crops[0], training=training),
                key_encoder(crops[1], training=training), bank, losses.l2_normalize(bank))

    def forward(self, crops, training):
        encoder = self.model.query_encoder
        return encoder(crops[0], training=training), encoder(crops[1], training=training)

    def method_loss(self, outputs, targets, step):
        """Each view's query against the other view's key and every bank row."""
        (query1, query2), (key1, key2, _, bank_unit) = outputs, targets
        temperature = self.model.warmup_temperature
        return (tf.reduce_mean(losses.moco_loss(query1, key2, bank_unit, temperature))
                + tf.reduce_mean(losses.moco_loss(query2, key1, bank_unit, temperature))), {}

    def update_state(self, outputs, targets, step):
        """One key per image written into the bank; the method's diagnostics against the bank
        this step read."""
        (query1, query2), (key1, key2, bank, _) = outputs, targets
        own = getattr(self.model, "warmup_diagnostics", None)
        diagnostics = own(query1, query2, key1, key2, bank) if own else {}
        self.model.memory_bank.enqueue(key1, bank)
        return diagnostics

    def after_step(self, step):
        self.model.key_encoder.follow(self.model.query_encoder.trainable_variables, step)

    def view_embeddings(self, outputs):
        return outputs

    def track_diagnostics(self, diagnostics):
        self.model.track_diagnostics(diagnostics)


def warmup_settings(epochs=0, own_bank=True, own_keys=True):
    """The warm-up's settings, for the ``SETTINGS`` of a method that offers it: its length
    (``epochs``: the method's default), loss temperature and resync; and, for a method without
    a bank or a key encoder of its own, the warm-up's bank size and key momentum."""
    from caco_tf.settings import Setting, boolean, integer, number

    settings = {
        "warmup_epochs": Setting(
            epochs, integer(0), "epochs of the MoCo-style warm-up that fills a bank with real "
            "keys before the method's own steps (0: none)", passed=False),
        "warmup_min_steps": Setting(
            0, integer(0), "the least steps the warm-up lasts (the key encoder's EMA must "
            "follow the student before the resync)", passed=False),
        "warmup_temperature": Setting(
            0.2, number(0.0, low_open=True), "tau of the warm-up's loss"),
        "resync_after_warmup": Setting(
            True, boolean(), "copy the student into the key encoder when the warm-up ends"),
    }
    if not own_bank:
        settings["warmup_bank_size"] = Setting(
            65536, integer(1), "K, the rows of the bank the warm-up fills (the method has none)",
            trained=True, tiny=32, rows=True)
    if not own_keys:
        settings["warmup_key_momentum"] = Setting(
            0.99, number(0.0, 1.0), "the warm-up key encoder's EMA momentum at the start (it "
            "rises to 1 on a cosine over the run)", schedule="cosine to 1")
    return settings
