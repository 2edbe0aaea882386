"""``train.precision: auto``: the dtype policy this machine trains fastest in without a loss.

bfloat16 pays on a CPU whose cores multiply bfloat16 matrices in AMX tiles (Intel Xeon since
Sapphire Rapids: ``amx_bf16`` in /proc/cpuinfo): a ResNet-50 step 1.65x faster, the offline
default learning as well (docs/speed.md, docs/results.md).  Elsewhere ``auto`` is float32: on
GPUs choose ``mixed_float16`` or ``mixed_bfloat16`` by hand.
"""

import tensorflow as tf

AMX_BF16 = "amx_bf16"  # /proc/cpuinfo's flag


def cpu_flags(path="/proc/cpuinfo"):
    """The CPU's feature flags (empty where /proc/cpuinfo is not there)."""
    try:
        with open(path) as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return set(value.split())
    except OSError:
        pass
    return set()


def resolve(precision, gpus=None, flags=None):
    """(the Keras dtype policy, why) for a ``train.precision`` setting; ``why`` is None unless
    ``auto`` chose."""
    if precision != "auto":
        return precision, None
    gpus = tf.config.list_physical_devices("GPU") if gpus is None else gpus
    flags = cpu_flags() if flags is None else flags
    if gpus:
        return "float32", "auto: GPUs are visible (choose mixed_float16 or mixed_bfloat16 by hand)"
    if AMX_BF16 in flags:
        return "mixed_bfloat16", "auto: this CPU has AMX-BF16 units and no GPU is visible"
    return "float32", "auto: this CPU has no AMX-BF16 units"
