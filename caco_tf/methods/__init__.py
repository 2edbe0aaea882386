"""The methods, one file each, over a shared base (``base.Method``).

A method is its file: a ``Method`` subclass that names itself (``method = "byol"``) and
declares its settings (``SETTINGS``, the section ``method.<name>`` of every configuration), its
parts, its advice and its row of the documentation (``DOCS_ROW``).  Every module of this package
is read here, and each class that names itself is registered (``METHODS``).  Every other list
of the methods is generated from it (the docs' tables, docs/hooks.py; the API reference,
``caco_tf``'s exports) or checked against it by tests/test_method_lists.py (the README's table,
written by ``python docs/hooks.py --write-readme``; docs/methods.md's sections; the offline
configurations' sections): adding a method touches its file, its test, its recipes, its loss
in ``caco_tf/losses.py``, its section of docs/methods.md and the README's table.

What every method shares: ``algorithm.py`` what a method declares, the hooks of its step and
its parts, ``base.py`` the Keras model that trains it (the one step, phases, trackers, fit,
export, summary, serialization), ``online_probe.py`` the online probe, ``summary.py`` the parts'
table, ``old_files.py`` older versions' files; ``contrastive.py`` the InfoNCE family (CaCo, its
ablation rows, MoCo v2, SimCLR), ``bank_warmup.py`` the bank warm-up, ``memory_bank.py`` the
bank, ``momentum_encoder.py`` the teacher, ``state.py`` queues and the center.  docs/methods.md
has each method's equations beside its code, and the table ``docs_table`` writes.
"""

import importlib
import inspect
import pkgutil

from caco_tf.errors import ConfigError
from caco_tf.methods.base import Method


def _registered():
    """{name: class} of every ``Method`` subclass that names itself in this package's modules:
    CaCo first, its ablation rows (which read its settings) next, then the others by name."""
    found = {}
    for module_info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        for cls in vars(module).values():
            if (inspect.isclass(cls) and issubclass(cls, Method)
                    and cls.__module__ == module.__name__ and cls.__dict__.get("method")):
                if cls.method in found:
                    raise TypeError(f"two methods are named {cls.method!r}: "
                                    f"{found[cls.method].__name__} and {cls.__name__}")
                found[cls.method] = cls

    def order(name):
        return (name != "caco", found[name].SETTINGS_OF != "caco", name)
    return {name: found[name] for name in sorted(found, key=order)}


METHODS = _registered()


def model_class(method):
    """The model class ``method.name`` names (arguments: ``Method``'s and its own settings)."""
    if method not in METHODS:
        raise ConfigError(f"method.name must be one of {', '.join(METHODS)}, got {method!r}")
    return METHODS[method]


def paper_figure(method):
    """The paper's ImageNet ResNet-50 linear top-1 of ``method`` (its class's ``DOCS_ROW``)."""
    return METHODS[method].DOCS_ROW.get("paper", "–") if method in METHODS else "–"


def docs_table():
    """docs/methods.md's table of the methods, from what each class declares (its lines)."""
    lines = ["| method | class | teacher | heads | state | global-batch quantities | crops | "
             "the paper: ImageNet ResNet-50 linear top-1 (%) |",
             "|---|---|---|---|---|---|---|---|"]
    for name, cls in METHODS.items():
        teacher = "momentum" if cls.TEACHER == "momentum" else cls.DOCS_ROW.get("teacher", "–")
        if cls.TEACHER == "momentum" and cls.TEACHER_HEADS:
            teacher += ", with the " + ", ".join(_words(h) for h in cls.TEACHER_HEADS)
        reads = f" (reads `method.{cls.SETTINGS_OF}`)" if cls.SETTINGS_OF else ""
        lines.append(
            f"| `{name}`{reads} | `{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}` | "
            f"{teacher} | {', '.join(_words(h) for h in cls.HEADS) or '–'} | "
            f"{cls.DOCS_ROW['state']} | {cls.DOCS_ROW['global batch']} | "
            f"{cls.crops_wording()} | {paper_figure(name)} |")
    return lines


def _words(name):
    return name.replace("_", " ")


__all__ = ["METHODS", "Method", "docs_table", "model_class", "paper_figure"]
