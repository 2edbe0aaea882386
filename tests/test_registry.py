"""A method is its file: what the registry and everything generated from it say (the method
list, ``method.name``'s rule and help, the settings that shape what is trained, the tests' tiny
models, docs/methods.md's table) follows from the method classes alone."""

import importlib.util
import os
import sys
import types

import pytest

from caco_tf import config, methods, pretrain
from caco_tf.methods.base import Method
from tiny_methods import ARGUMENTS, CONFIG_OVERRIDES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", os.path.join(ROOT, "docs",
                                                                             "hooks.py"))
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks


def test_every_method_module_is_registered_by_its_own_name():
    folder = os.path.dirname(methods.__file__)
    for name, cls in methods.METHODS.items():
        assert issubclass(cls, Method) and cls.method == name
        assert os.path.dirname(importlib.import_module(cls.__module__).__file__) == folder
    assert list(methods.METHODS)[0] == "caco"
    assert config.SETTINGS["method.name"].rule.check("byol")
    assert not config.SETTINGS["method.name"].rule.check("byol2")
    for name, cls in methods.METHODS.items():
        assert config.SETTINGS["method.name"].rule.check(name)
        if cls.SETTINGS_OF:  # an ablation row reads its method's section and names it
            assert f"read method.{cls.SETTINGS_OF}" in config.SETTINGS["method.name"].help
            assert name in config.SETTINGS["method.name"].help


def test_the_docs_table_of_the_methods_is_generated_from_the_classes():
    with open(os.path.join(ROOT, "docs", "methods.md")) as handle:
        page = handle.read()
    assert "<!-- methods-table -->" in page
    built = _hooks().on_page_markdown(page, None, None, None)
    for name, cls in methods.METHODS.items():
        row = next(line for line in built.splitlines() if line.startswith(f"| `{name}`"))
        assert f"{cls.__name__}`" in row and cls.DOCS_ROW["state"] in row


def test_a_resume_refuses_exactly_the_settings_declared_to_shape_what_is_trained():
    for name, setting in config.SETTINGS.items():
        if name.startswith("method.") and name != "method.name":
            assert pretrain._changes_what_is_trained(name) == setting.trained, name
    assert pretrain._changes_what_is_trained("method.caco.bank_size")
    assert not pretrain._changes_what_is_trained("method.caco.temperature")


def test_the_tiny_models_take_every_size_setting_at_its_tiny_value():
    for name, cls in methods.METHODS.items():
        for key, setting in cls.SETTINGS.items():
            # A setting that shapes a part and is a size must say its tiny size, or the tiny
            # models of the tests would build it at its ImageNet default.
            if setting.trained and setting.type is int and setting.default > 64:
                assert setting.tiny is not None, f"method.{name}.{key} declares no tiny value"
                assert ARGUMENTS[name][setting.argument or key] == setting.tiny
    assert "method.caco.bank_size=32" in CONFIG_OVERRIDES
    assert config.load_config(None, CONFIG_OVERRIDES)["method"]["dino"]["out_dim"] == 32


def test_a_method_that_names_itself_twice_is_refused(monkeypatch):
    fake = types.ModuleType("caco_tf.methods.byol_again")
    fake.Again = type("Again", (Method,), {"method": "byol", "__module__": fake.__name__})
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setattr(methods.pkgutil, "iter_modules", lambda path: [
        types.SimpleNamespace(name="byol"), types.SimpleNamespace(name="byol_again")])
    with pytest.raises(TypeError, match="two methods are named 'byol': BYOL and Again"):
        methods._registered()


def test_a_method_offers_the_warmup_settings_exactly_when_it_opts_into_the_warmup():
    for name, cls in methods.METHODS.items():
        assert ("warmup_epochs" in cls.SETTINGS) == (cls.WARMUP is not None), name
