"""The machine a figure was measured on: seeded runs repeat bit for bit on one CPU model only,
and the machine is shared and changes between sessions, so every published figure names it."""

import os
import platform


def cpu_count():
    try:
        return len(os.sched_getaffinity(0))  # what `nproc` reports
    except AttributeError:
        return os.cpu_count()


def cpu_name():
    """The CPU as `lscpu` names it ("Model name", /proc/cpuinfo's "model name"), with its family
    and model numbers (a hypervisor often hides the rest of the name)."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']} model {fields['model']})"
    return name


def machine():
    """The CPU and the cores this process may use."""
    return f"{cpu_name()}, {cpu_count()} cores"


def versions():
    """'TensorFlow 2.21.0, Keras 3.15.1, Python 3.11.7': what the figures were measured with."""
    import keras
    import tensorflow as tf

    return (f"TensorFlow {tf.__version__}, Keras {keras.__version__}, Python "
            f"{platform.python_version()}")
