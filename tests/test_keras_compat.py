"""The private Keras (and TensorFlow distribute) internals that caco_tf/keras_compat.py uses:
each exists on the installed versions with the signature keras_compat calls, Keras still calls
the hooks caco_tf overrides, and no other module of caco_tf uses a private Keras name.  A new
Keras fails here with one line naming the internal."""

import ast
import functools
import inspect
import os
import sys

import keras
import pytest
import tensorflow as tf

from caco_tf import keras_compat

CACO_TF = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "caco_tf")
COMPAT = os.path.join(CACO_TF, "keras_compat.py")


def saving_lib():
    from keras.src.saving import saving_lib

    return saving_lib


def multi_worker_extended():
    """The class of ``MultiWorkerMirroredStrategy().extended``, without making a strategy."""
    module = sys.modules[tf.distribute.MultiWorkerMirroredStrategy.__module__]
    return module.CollectiveAllReduceExtended


# (internal, how to reach it, its signature as keras_compat calls it)
SIGNATURES = [
    ("keras.Model._make_function", lambda: keras.Model._make_function,
     "(self, step_function)"),
    ("keras.Model._maybe_symbolic_build", lambda: keras.Model._maybe_symbolic_build,
     "(self, iterator=None, data_batch=None)"),
    ("keras.layers.BatchNormalization._moments",
     lambda: keras.layers.BatchNormalization._moments, "(self, inputs, mask)"),
    ("keras.layers.Layer._flatten_layers", lambda: keras.layers.Layer._flatten_layers,
     "(self, include_self=True, recursive=True)"),
    ("keras.optimizers.Optimizer._get_variable_index",
     lambda: keras.optimizers.Optimizer._get_variable_index, "(self, variable)"),
    ("keras.optimizers.Optimizer._use_weight_decay",
     lambda: keras.optimizers.Optimizer._use_weight_decay, "(self, variable)"),
    ("keras.src.saving.saving_lib.H5IOStore", lambda: saving_lib().H5IOStore,
     "(path_or_io, archive=None, mode='r')"),
    ("keras.src.saving.saving_lib.H5IOStore.close", lambda: saving_lib().H5IOStore.close,
     "(self)"),
    ("keras.src.saving.saving_lib._save_state", lambda: saving_lib()._save_state,
     "(saveable, weights_store, assets_store, inner_path, visited_saveables)"),
    ("tensorflow CollectiveAllReduceExtended._in_multi_worker_mode",
     lambda: multi_worker_extended()._in_multi_worker_mode, "(self)"),
    ("tf.__internal__.distribute.interim.maybe_merge_call",
     lambda: tf.__internal__.distribute.interim.maybe_merge_call,
     "(fn, strategy, *args, **kwargs)"),
]

# (internal, the Keras function that must still use it, the text it uses it by)
USED_BY_KERAS = [
    ("keras.Model._initial_epoch", lambda: keras.Model.fit, "self._initial_epoch"),
    ("keras.Model._maybe_symbolic_build", lambda: keras.Model.fit,
     "self._maybe_symbolic_build("),
    ("keras.layers.BatchNormalization._moments",
     lambda: keras.layers.BatchNormalization.call, "self._moments("),
]


def fail(internal, problem):
    pytest.fail(f"{internal}: {problem} on keras {keras.__version__}, tensorflow "
                f"{tf.__version__} (caco_tf/keras_compat.py uses it)", pytrace=False)


@pytest.mark.parametrize("internal, reach, expected", SIGNATURES,
                         ids=[internal for internal, _, _ in SIGNATURES])
def test_internal_has_the_signature_used(internal, reach, expected):
    try:
        found = str(inspect.signature(reach()))
    except (AttributeError, ImportError) as error:
        fail(internal, f"missing ({error})")
    if found != expected:
        fail(internal, f"signature {found}, expected {expected}")


@pytest.mark.parametrize("internal, reach, text", USED_BY_KERAS,
                         ids=[f"{internal} in {text}" for internal, _, text in USED_BY_KERAS])
def test_keras_still_uses_the_internal(internal, reach, text):
    function = reach()
    if text not in inspect.getsource(function):
        fail(internal, f"{function.__qualname__} no longer uses {text!r}")


def test_the_attributes_exist_where_keras_compat_reads_and_writes_them():
    if "_initial_epoch" not in vars(keras.Model()):
        fail("keras.Model._initial_epoch", "missing")
    layer = keras.layers.BatchNormalization()
    layer.build((None, 3, 3, 4))
    if getattr(layer, "_reduction_axes", None) != [0, 1, 2]:
        fail("keras.layers.BatchNormalization._reduction_axes",
             f"{getattr(layer, '_reduction_axes', 'missing')}, expected [0, 1, 2]")


def test_the_overridden_hooks_are_overridden():
    from caco_tf.methods.base import Method
    from caco_tf.nets.layers import BatchNormalization

    overrides = {keras.Model: Method, keras.layers.BatchNormalization: BatchNormalization}
    assert set(keras_compat.OVERRIDDEN_HOOKS) == set(overrides)
    for keras_class, names in keras_compat.OVERRIDDEN_HOOKS.items():
        for name in names:
            assert name in vars(overrides[keras_class]), (overrides[keras_class], name)
            assert hasattr(keras_class, name), f"{keras_class.__name__}.{name}"


# --- no other module of caco_tf uses a private Keras name ----------------------------------------

def dotted(node):
    """``a.b.c`` of a Name/Attribute chain, else ''."""
    if isinstance(node, ast.Attribute):
        head = dotted(node.value)
        return f"{head}.{node.attr}" if head else ""
    return node.id if isinstance(node, ast.Name) else ""


def keras_object(name):
    """The Keras object ``keras.x.y`` names, or None."""
    value = keras
    for part in name.split(".")[1:]:
        value = getattr(value, part, None)
    return value


def is_private(name):
    return name.startswith("_") and not name.startswith("__")


@functools.cache
def private_names(keras_class):
    """The private names of a Keras class and of an instance of it."""
    names = set(dir(keras_class))
    for arguments in ({}, {"learning_rate": 0.01}):
        try:
            names |= set(vars(keras_class(**arguments)))
            break
        except Exception:  # an abstract class, or other required arguments: the class's names
            continue
    return set(filter(is_private, names))


KERAS_CLASSES = (keras.Model, keras.layers.BatchNormalization, keras.optimizers.SGD,
                 keras.callbacks.ProgbarLogger, keras.metrics.Mean,
                 keras.optimizers.schedules.LearningRateSchedule)


def keras_private_names():
    names = set().union(*(private_names(keras_class) for keras_class in KERAS_CLASSES))
    names |= set(filter(is_private, dir(multi_worker_extended())))
    return names | set(filter(is_private, dir(saving_lib())))


def sources():
    for folder, _, files in os.walk(CACO_TF):
        for name in sorted(files):
            path = os.path.join(folder, name)
            if name.endswith(".py") and path != COMPAT:
                with open(path) as handle:
                    yield os.path.relpath(path, os.path.dirname(CACO_TF)), handle.read()


def class_bases(trees):
    """{class name: its bases' dotted names}, over every class of caco_tf."""
    return {node.name: [dotted(base) for base in node.bases]
            for tree in trees.values() for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef)}


def keras_base(name, bases, seen=()):
    """The Keras class a caco_tf class derives from (through caco_tf classes), or None."""
    for base in bases.get(name, ()):
        if base.startswith("keras."):
            return keras_object(base)
        if base in bases and base not in seen:  # a caco_tf class, imported by its name
            found = keras_base(base, bases, seen + (name,))
            if found is not None:
                return found
    return None


def private_keras_uses(path, tree, bases, everywhere):
    """``path:line: what`` of each private Keras name ``tree`` uses: ``keras.src`` and
    ``tf.__internal__``; ``x._name`` on anything but ``self`` for a private name of Keras'
    main classes; on ``self``, and ``def _name``, for a private name of the class's own Keras
    base (the hooks of ``keras_compat.OVERRIDDEN_HOOKS`` may be defined)."""
    hooks = {name for names in keras_compat.OVERRIDDEN_HOOKS.values() for name in names}
    uses = []

    def visit(node, keras_class):
        if isinstance(node, ast.ClassDef):
            keras_class = keras_base(node.name, bases)
        own = private_names(keras_class) if keras_class is not None else set()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [alias.name for alias in node.names] + [getattr(node, "module", "") or ""]
            uses.extend((node.lineno, module) for module in modules
                        if module.startswith(("keras.src", "tensorflow.python.distribute")))
        elif isinstance(node, ast.Attribute):
            name = dotted(node)
            if name.startswith("keras.src") or ".__internal__" in name:
                uses.append((node.lineno, name))
                return  # the whole chain, once
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                if node.attr in own:
                    uses.append((node.lineno, f"self.{node.attr}"))
            elif node.attr in everywhere:
                uses.append((node.lineno, name or f"(...).{node.attr}"))
        elif isinstance(node, ast.FunctionDef) and node.name in own - hooks:
            uses.append((node.lineno, f"def {node.name}"))
        for child in ast.iter_child_nodes(node):
            visit(child, keras_class)

    visit(tree, None)
    return [f"{path}:{line}: {what}" for line, what in sorted(set(uses))]


def test_no_other_module_uses_a_private_keras_name():
    trees = {path: ast.parse(text, path) for path, text in sources()}
    assert len(trees) > 30 and "caco_tf/nets/layers.py" in trees
    bases = class_bases(trees)
    assert keras_base("CaCo", bases) is keras.Model  # through ContrastiveMethod, Method
    everywhere = keras_private_names()
    uses = [use for path, tree in trees.items()
            for use in private_keras_uses(path, tree, bases, everywhere)]
    assert not uses, ("private Keras names outside caco_tf/keras_compat.py: "
                      + "; ".join(uses))
