"""Tiny models of every method, for the tests: a one-convolution backbone on 12×12 gray images,
an 16-wide projector to 6 dimensions, banks and queues of 32 rows, heads of 16."""

import keras
import numpy as np

from caco_tf import methods
from caco_tf.nets import backbones
from caco_tf.nets.layers import BatchNormalization

BATCH, BANK, SIZE = 8, 32, 12
CACO = dict(bank_size=BANK, temperature=0.1, bank_temperature=0.2, bank_learning_rate=0.5,
            bank_momentum=0.9, key_momentum=0.9)
# Each method's own arguments at tiny sizes (the rest: its defaults).
ARGUMENTS = {
    "caco": CACO, "none": CACO, "positive": CACO, "negative": CACO,
    "moco_v2": dict(bank_size=BANK, temperature=0.1, key_momentum=0.9),
    "simclr": dict(temperature=0.1),
    "byol": dict(key_momentum=0.9, predictor_hidden=16),
    "simsiam": dict(predictor_hidden=16),
    "moco_v3": dict(temperature=0.5, key_momentum=0.9, predictor_hidden=16),
    "nnclr": dict(temperature=0.1, queue_size=BANK, predictor_hidden=16),
    "swav": dict(num_prototypes=10, temperature=0.1, epsilon=0.05),
    "dino": dict(out_dim=32, key_momentum=0.9, teacher_temperature=0.05),
    "barlow_twins": dict(redundancy_weight=0.05),
    "vicreg": dict(),
}


# A run configuration's tiny sizes for every method's section (with model.projector_hidden 32
# and model.embedding_dim 16).
CONFIG_OVERRIDES = [
    "model.projector_hidden=32", "model.embedding_dim=16", "method.caco.bank_size=64",
    "method.caco.warmup_epochs=1", "method.moco_v2.bank_size=64",
    "method.byol.predictor_hidden=32", "method.simsiam.predictor_hidden=32",
    "method.moco_v3.predictor_hidden=32", "method.nnclr.queue_size=64",
    "method.nnclr.predictor_hidden=32", "method.swav.num_prototypes=20",
    "method.dino.out_dim=64"]


def tiny(method, warmup_steps=0, sync=False, any_size=False, steps_per_execution=1,
         optimizer=None, run_eagerly=False, **arguments):
    """A compiled tiny model of ``method`` (SGD 0.1, momentum 0.9); ``arguments`` override its
    own.  ``any_size``: the backbone takes crops of every size (multi-crop)."""
    keras.utils.set_random_seed(0)
    backbone = keras.Sequential([
        keras.Input((None, None, 1) if any_size else (SIZE, SIZE, 1)),
        keras.layers.Conv2D(4, 3, strides=2, use_bias=False),
        BatchNormalization(synchronized=sync),
        keras.layers.ReLU(),
        keras.layers.GlobalAveragePooling2D()], name="backbone")
    cls = methods.model_class(method)
    projector = backbones.build_mlp(4, 16, 6, sync_batchnorm=sync, name="projector",
                                    **cls.PROJECTOR)
    given = dict(ARGUMENTS[method], **arguments)
    if warmup_steps and "warmup_bank_size" in cls.argument_defaults():
        given.setdefault("warmup_bank_size", BANK)
    model = cls(backbone, projector, warmup_steps=warmup_steps, sync_batchnorm=sync, **given)
    model.compile(optimizer=optimizer or keras.optimizers.SGD(0.1, momentum=0.9),
                  steps_per_execution=steps_per_execution, run_eagerly=run_eagerly)
    return model


def views(seed=0, batch=BATCH, crops=2, local_crops=0, local_size=8):
    """``crops`` random global views (and ``local_crops`` smaller ones) of a batch."""
    rng = np.random.default_rng(seed)
    return tuple(rng.normal(size=(batch, size, size, 1)).astype("float32")
                 for size in [SIZE] * crops + [local_size] * local_crops)
