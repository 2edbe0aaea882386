"""A method is its file: every list of the methods outside the registry (``METHODS``) is
generated from it or checked against it here, so that a method missing from a table, or a
table's row naming no method, fails a test.

Generated: docs/methods.md's table and docs/api/methods.md's classes (docs/hooks.py), the
package's exports (``caco_tf.__all__``).  Checked, where prose surrounds the list: the README's
table, docs/getting-started.md's two tables, docs/methods.md's sections, docs/health.md's
table of known failures, docs/compare.md's search table, and the offline recipes of
configs/mnist.yaml and configs/shapes.yaml."""

import importlib
import importlib.util
import os
import re

import pytest
import yaml

import caco_tf
from caco_tf import build, config, methods
from caco_tf.comparison.trials import comparison_methods
from caco_tf.methods.base import Method
from caco_tf.run_settings import RunSettings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = methods.METHODS  # the registry itself: a test may add a method to it


def page(path):
    return open(os.path.join(ROOT, path), encoding="utf-8").read()


def rendered(path):
    """A page as the site builds it: docs/hooks.py's markers replaced."""
    spec = importlib.util.spec_from_file_location("docs_hooks",
                                                  os.path.join(ROOT, "docs", "hooks.py"))
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks.on_page_markdown(page(path), None, None, None)


def table(text, header):
    """The rows (lists of cells) of the Markdown table whose header line matches ``header``."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(header, line)), None)
    assert start is not None, f"no table with the header {header!r}"
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def named(cell):
    """The method names a cell quotes in code (`caco`, `none`, ...)."""
    return set(re.findall(r"`([a-z_0-9]+)`", cell))


def same(listed, expected, where):
    """``listed`` names the methods of ``expected``, no more, no fewer."""
    listed, expected = set(listed), set(expected)
    assert listed == expected, (f"{where}: missing {sorted(expected - listed)}, "
                                f"not methods {sorted(listed - expected)}")


# ---------------------------------------------------------------------- generated
def test_the_api_reference_documents_every_method_class():
    text = rendered(os.path.join("docs", "api", "methods.md"))
    documented = set(re.findall(r"^::: ([\w.]+)$", text, re.M))
    wanted = {f"{cls.__module__}.{cls.__name__}" for cls in METHODS.values()}
    missing = sorted(wanted - documented)
    assert not missing, f"docs/api/methods.md documents no {', '.join(missing)}"
    for target in documented:  # none names a method class that is not registered
        module, _, name = target.rpartition(".")
        try:
            value = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue  # a module itself (::: caco_tf.build)
        if isinstance(value, type) and issubclass(value, Method) and vars(value).get("method"):
            assert value in METHODS.values(), target


def test_the_package_exports_every_method_class():
    for cls in METHODS.values():
        assert cls.__name__ in caco_tf.__all__, cls.__name__
        assert getattr(caco_tf, cls.__name__) is cls
    assert caco_tf.CaCo is METHODS["caco"] and "Method" in caco_tf.__all__
    with pytest.raises(AttributeError, match="has no attribute 'BYOL2'"):
        caco_tf.BYOL2


# ---------------------------------------------------------------------- checked
def test_the_readmes_table_names_every_method():
    rows = table(page("README.md"), r"\| method \| `method.name` \|")
    same({name for row in rows for name in named(row[1])}, METHODS, "README.md's table")


def test_getting_starteds_tables_name_every_method_and_every_method_recipe():
    text = page(os.path.join("docs", "getting-started.md"))
    rows = table(text, r"\| `method.name` \| method \|")
    same({name for row in rows for name in named(row[0])}, METHODS,
         "docs/getting-started.md's table of method.name")
    recipes = table(text, r"\| config \| method \|")
    listed = {re.search(r"`configs/([\w]+)\.yaml`", row[0]).group(1): named(row[1])
              for row in recipes}
    shipped = {name for name in config.shipped_configs()
               if any(name.startswith(f"{method}_imagenet_") for method in METHODS)}
    assert set(listed) == shipped, (f"docs/getting-started.md's recipes: missing "
                                    f"{sorted(shipped - set(listed))}, not shipped "
                                    f"{sorted(set(listed) - shipped)}")
    for name, methods_named in listed.items():
        assert methods_named == {config.load_config(name)["method"]["name"]}, name


def test_docs_methods_has_a_section_for_every_method():
    """Each method is named in a section of docs/methods.md's "The methods" by its file
    (`methods/byol.py`) or its ``method.name``; the generated table lists them all."""
    text = page(os.path.join("docs", "methods.md"))
    part = text.split("\n## The methods\n", 1)[1].split("\n## ", 1)[0]
    sections = re.split(r"^### ", part, flags=re.M)[1:]
    found = set()
    for section in sections:
        files = set(re.findall(r"`methods/(\w+)\.py`", section.splitlines()[0]))
        found |= {name for name, cls in METHODS.items()
                  if cls.__module__.rsplit(".", 1)[-1] in files} | (named(section) & set(METHODS))
    same(found, METHODS, "docs/methods.md's sections")
    table_rows = table(rendered(os.path.join("docs", "methods.md")), r"\| method \| class \|")
    same({name for row in table_rows for name in named(row[0]) & set(METHODS)}, METHODS,
         "docs/methods.md's generated table")


def test_health_names_every_method_with_its_own_collapse_advice():
    """docs/health.md's table of each method's own failure has a row for every method that
    declares its own ``COLLAPSE_ADVICE``, and for no other."""
    rows = table(page(os.path.join("docs", "health.md")), r"\| method \| what is judged \|")
    own = {name for name, cls in METHODS.items() if "COLLAPSE_ADVICE" in vars(cls)}
    same({name for row in rows for name in named(row[0])}, own,
         "docs/health.md's table of known failures")


def test_compares_search_table_is_each_methods_declared_search():
    rows = table(page(os.path.join("docs", "compare.md")),
                 r"\| method \| the setting it declares for a comparison \|")
    same({name for row in rows for name in named(row[0])}, comparison_methods(),
         "docs/compare.md's search table")
    for row in rows:
        (method,) = named(row[0])
        declared = [(key, setting.search) for key, setting in METHODS[method].SETTINGS.items()
                    if setting.search]
        shown = [(key, tuple(float(v) for v in values.split(", "))) for key, values in
                 re.findall(r"`(\w+)`: ([\d., ]+[\d])", row[1])]
        assert shown == [(key, tuple(float(v) for v in values)) for key, values in declared], \
            method


# The offline configurations every comparison method has a recipe in, and the images a run of
# each trains on at the least (its validation split).
OFFLINE = {"mnist": 3000, "shapes": 15000}


@pytest.mark.parametrize("name", sorted(OFFLINE))
def test_every_comparison_method_has_its_section_in_the_offline_configs(name):
    """Each comparison method has its section in configs/NAME.yaml, or a comment there saying
    it runs at its defaults (``# simclr, at its defaults: ...``); either way its run on that
    configuration is not refused (``build.check_sizes``)."""
    text = page(os.path.join("configs", f"{name}.yaml"))
    sections = yaml.safe_load(text)["method"]
    problems = []
    for method in comparison_methods():
        if method not in sections and not re.search(
                rf"^\s*# {method}, at its defaults\b", text, re.M):
            problems.append(f"{method}: no section and no '# {method}, at its defaults' line")
            continue
        settings = RunSettings.of(config.load_config(name, [f"method.name={method}"]))
        plan = build.RunPlan.of(settings, OFFLINE[name] // settings.train.batch_size)
        try:
            build.check_sizes(plan, OFFLINE[name], plan.embedding_dim)
        except caco_tf.UserError as refusal:
            problems.append(f"{method}: refused: {refusal}")
    assert not problems, f"configs/{name}.yaml: " + "; ".join(problems)


class Unlisted(Method):
    """A method registered nowhere but here: no row of any table names it."""

    method = "unlisted"
    COLLAPSE_ADVICE = "its own advice"


CHECKS = [test_the_readmes_table_names_every_method,
          test_getting_starteds_tables_name_every_method_and_every_method_recipe,
          test_docs_methods_has_a_section_for_every_method,
          test_health_names_every_method_with_its_own_collapse_advice,
          test_compares_search_table_is_each_methods_declared_search,
          lambda: test_every_comparison_method_has_its_section_in_the_offline_configs("mnist"),
          lambda: test_every_comparison_method_has_its_section_in_the_offline_configs("shapes")]


def test_a_method_without_its_rows_fails_every_check(monkeypatch):
    """Registered, a method that no table lists fails each check above (the generated lists
    take it in: docs/hooks.py's and the package's exports)."""
    monkeypatch.setitem(METHODS, Unlisted.method, Unlisted)
    for check in CHECKS:
        with pytest.raises(AssertionError, match="unlisted"):
            check()
    assert "::: test_method_lists.Unlisted" in rendered(os.path.join("docs", "api",
                                                                     "methods.md"))
