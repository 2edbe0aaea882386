"""The methods, one file each, over a shared base (``base.Method``).

``method.name`` picks the class (``METHODS``) and ``method.<name>`` its settings (each method
declares its own, ``SETTINGS``); everything else (backbone, projector widths, optimizer and
schedules, views) is the run's configuration, shared by every method.

The InfoNCE family (``contrastive.ContrastiveMethod``): CaCo, the paper's ablation rows and two
baselines differ only in where a query's positive and negatives come from.  For the query z¹ of
view 1 (view 2 is symmetric; k is the momentum encoder's key, "batch" the global batch):

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

The paper's other comparison methods and two that tensorflow/similarity users have:

============  ======================================  =====================  ==============
method        the student learns to match             teacher                state
============  ======================================  =====================  ==============
byol          the target's projection, by a predictor  EMA copy              none
simsiam       its own other view, by a predictor       stop-gradient student none
moco_v3       the other view's key among the batch's   EMA copy              none
nnclr         the nearest neighbour of its projection  none                  support-set queue
swav          the other crops' Sinkhorn codes          stop-gradient codes   queue (optional)
dino          the teacher's centered, sharpened output EMA copy with head    center
barlow_twins  an identity cross-correlation            none                  none
vicreg        invariance, variance and covariance      none                  none
============  ======================================  =====================  ==============

``base.py`` holds what every method shares (the parts, the one step, the Keras plumbing),
``bank_warmup.py`` the bank warm-up, ``memory_bank.py`` CaCo's bank (``MemoryBank``),
``momentum_encoder.py`` the teacher (``MomentumEncoder``), ``state.py`` queues and the center.
docs/methods.md has each method's equations beside its code.
"""

from caco_tf.errors import ConfigError
from caco_tf.methods.adversarial_negatives import AdversarialNegatives
from caco_tf.methods.barlow_twins import BarlowTwins
from caco_tf.methods.base import Method
from caco_tf.methods.byol import BYOL
from caco_tf.methods.caco import CaCo
from caco_tf.methods.contrastive import ContrastiveMethod
from caco_tf.methods.dino import DINO
from caco_tf.methods.in_batch import InBatch
from caco_tf.methods.memory_bank import MemoryBank
from caco_tf.methods.moco_v2 import MoCoV2
from caco_tf.methods.moco_v3 import MoCoV3
from caco_tf.methods.momentum_encoder import MomentumEncoder, build_encoder
from caco_tf.methods.nn_positive import NearestNeighbourPositive
from caco_tf.methods.nnclr import NNCLR
from caco_tf.methods.simclr import SimCLR
from caco_tf.methods.simsiam import SimSiam
from caco_tf.methods.swav import SwAV
from caco_tf.methods.vicreg import VICReg

METHODS = {cls.method: cls for cls in (
    CaCo, InBatch, NearestNeighbourPositive, AdversarialNegatives, MoCoV2, SimCLR, BYOL, SimSiam,
    MoCoV3, NNCLR, SwAV, DINO, BarlowTwins, VICReg)}


def model_class(method):
    """The model class ``method.name`` names (arguments: ``Method``'s and its own settings)."""
    if method not in METHODS:
        raise ConfigError(f"method.name must be one of {', '.join(METHODS)}, got {method!r}")
    return METHODS[method]


__all__ = ["METHODS", "AdversarialNegatives", "BYOL", "BarlowTwins", "CaCo",
           "ContrastiveMethod", "DINO", "InBatch", "MemoryBank", "Method", "MoCoV2", "MoCoV3",
           "MomentumEncoder", "NNCLR", "NearestNeighbourPositive", "SimCLR", "SimSiam", "SwAV",
           "VICReg", "build_encoder", "model_class"]
