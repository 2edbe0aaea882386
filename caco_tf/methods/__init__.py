"""The methods, one file each, over a shared base (``base.ContrastiveMethod``).

``method.name`` picks the class (``METHODS``); everything else (encoders, optimizer and
schedules, views, bank size, τ, key-encoder EMA, warm-up) is the run's configuration, so the
paper's ablation rows (Table positive_nega) and the two baselines differ only in where a
query's positive and negatives come from.  For the query z¹ of view 1 (view 2 is symmetric; k
is the momentum encoder's key, "batch" the global batch):

========  ================================  ============================  ==================
method    positive                          negatives                     bank
========  ================================  ============================  ==================
caco      the MPP of k² in the bank         the other bank rows           co-op.-adversarial
none      k² of the same image              the batch's other keys k²_j   unused
positive  k²'s nearest neighbour in queue   the batch's other keys k²_j   FIFO queue of k¹
negative  k² of the same image              every bank row                adversarial (AdCo)
moco_v2   k² of the same image              every queue row               FIFO queue of k¹
simclr    z² (the other view's query)       the other 2N-2 queries        unused, no keys
========  ================================  ============================  ==================

Files: ``caco.py``, ``in_batch.py`` (none), ``nn_positive.py`` (positive),
``adversarial_negatives.py`` (negative), ``moco_v2.py``, ``simclr.py``; ``base.py`` holds what
they share (the step's template), ``memory_bank.py`` the bank (``MemoryBank``) and
``momentum_encoder.py`` the encoders (``MomentumEncoder``, the key encoder), which a method
holds only if it uses them.

Methods with a bank keep the MoCo-style warm-up pass that fills it FIFO
(``ContrastiveMethod.warmup_step``); methods without one skip it and train with their own
loss from the first step.  Every loss is the sum of the two views' batch means, as CaCo's, so
one learning rate means the same for all.
"""

from caco_tf.methods.adversarial_negatives import AdversarialNegatives
from caco_tf.methods.base import ContrastiveMethod
from caco_tf.methods.memory_bank import MemoryBank
from caco_tf.methods.momentum_encoder import MomentumEncoder, build_encoder
from caco_tf.methods.caco import CaCo
from caco_tf.methods.in_batch import InBatch
from caco_tf.methods.moco_v2 import MoCoV2
from caco_tf.methods.nn_positive import NearestNeighbourPositive
from caco_tf.methods.simclr import SimCLR
from caco_tf.training.config import METHODS as METHOD_NAMES
from caco_tf.training.config import ConfigError

METHODS = {cls.method: cls for cls in (CaCo, InBatch, NearestNeighbourPositive,
                                       AdversarialNegatives, MoCoV2, SimCLR)}
assert tuple(METHODS) == METHOD_NAMES  # the config validates names without TensorFlow


def model_class(method):
    """The model class ``method.name`` names (arguments: ``ContrastiveMethod``'s)."""
    if method not in METHODS:
        raise ConfigError(f"method.name must be one of {', '.join(METHODS)}, got {method!r}")
    return METHODS[method]


__all__ = ["METHODS", "AdversarialNegatives", "CaCo", "ContrastiveMethod", "InBatch",
           "MemoryBank", "MoCoV2", "MomentumEncoder", "NearestNeighbourPositive", "SimCLR",
           "build_encoder", "model_class"]
