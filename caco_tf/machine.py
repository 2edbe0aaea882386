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


def source_commit():
    """The git commit of the caco_tf being run (its checkout's HEAD, with "+changes" when its
    files differ from it), or None for an installed wheel or without git."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.exists(os.path.join(root, ".git")):
        return None
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=True)
        changed = subprocess.run(["git", "-C", root, "status", "--porcelain", "--",
                                  "caco_tf"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+changes" if changed.stdout.strip() else "")


def machine():
    """The CPU and the cores this process may use."""
    return f"{cpu_name()}, {cpu_count()} cores"


def versions():
    """'TensorFlow 2.21.0, Keras 3.15.1, Python 3.11.7': what the figures were measured with."""
    import keras
    import tensorflow as tf

    return (f"TensorFlow {tf.__version__}, Keras {keras.__version__}, Python "
            f"{platform.python_version()}")
