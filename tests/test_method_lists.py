"""A method is its file: every list of the methods outside the registry (``METHODS``) is
generated from it or checked against it here, so that a method missing from a list, or a list's
row naming no method, fails a test.

Generated from the method classes by docs/hooks.py's markers when the site is built:
docs/methods.md's table, docs/api/methods.md's classes, docs/getting-started.md's table of
``method.name`` and its table of the methods' ImageNet recipes (read from each
configs/METHOD_imagenet_*.yaml), docs/health.md's table of known failures and docs/compare.md's
search table; and the package's exports (``caco_tf.__all__``).  Written from the registry by
``python docs/hooks.py --write-readme`` and checked equal to what it writes: the README's table
(GitHub and PyPI run no hook).  Checked, where each method's own words or recipe are:
docs/methods.md's sections and the offline recipes of configs/mnist.yaml and
configs/shapes.yaml."""

import importlib
import importlib.util
import os
import re

import pytest
import yaml

import caco_tf
from caco_tf import build, config, methods
from caco_tf.comparison.trials import comparison_methods, vit_methods
from caco_tf.methods.base import Method
from caco_tf.run_settings import RunSettings
from caco_tf.settings import Setting, number

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = methods.METHODS  # the registry itself: a test may add a method to it


def page(path):
    return open(os.path.join(ROOT, path), encoding="utf-8").read()


def hooks():
    """docs/hooks.py, which the site's build runs on every page."""
    spec = importlib.util.spec_from_file_location("docs_hooks",
                                                  os.path.join(ROOT, "docs", "hooks.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rendered(path):
    """A page as the site builds it: docs/hooks.py's markers replaced."""
    return hooks().on_page_markdown(page(path), None, None, None)


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


# The generated tables: (page, its marker, the header of the table it becomes).
NAMES_TABLE = (os.path.join("docs", "getting-started.md"), "<!-- method-names-table -->",
               r"\| `method.name` \| method \|")
RECIPES_TABLE = (os.path.join("docs", "getting-started.md"), "<!-- method-recipes-table -->",
                 r"\| config \| method \|")
COLLAPSE_TABLE = (os.path.join("docs", "health.md"), "<!-- collapse-table -->",
                  r"\| method \| what is judged \|")
SEARCH_TABLE = (os.path.join("docs", "compare.md"), "<!-- search-table -->",
                r"\| method \| the setting it declares for a comparison \|")
README_TABLE = r"\| method \| `method.name` \|"


def generated(where):
    """The rows of a generated table; its page holds the marker, not a table of its own."""
    path, marker, header = where
    assert marker in page(path), f"{path} has no {marker}"
    assert not any(re.match(header, line) for line in page(path).splitlines()), (
        f"{path} writes by hand the table {marker} generates")
    return table(rendered(path), header)


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


def test_getting_starteds_table_of_method_names_is_generated_for_every_method():
    rows = generated(NAMES_TABLE)
    same({name for row in rows for name in named(row[0])}, METHODS,
         "docs/getting-started.md's table of method.name")
    assert rows[0][0] == "`caco` (default)"
    assert ["`mae`", "MAE (a ViT)"] == rows[[row[0] for row in rows].index("`mae`")][:2]


def test_getting_starteds_table_of_recipes_is_generated_for_every_method_recipe():
    rows = generated(RECIPES_TABLE)
    listed = {re.search(r"`configs/(\w+)\.yaml`", row[0]).group(1): named(row[1])
              for row in rows}
    shipped = {name for name in config.shipped_configs()
               if any(name.startswith(f"{method}_imagenet_") for method in METHODS)}
    assert set(listed) == shipped, (f"docs/getting-started.md's recipes: missing "
                                    f"{sorted(shipped - set(listed))}, not shipped "
                                    f"{sorted(set(listed) - shipped)}")
    for name, methods_named in listed.items():
        assert methods_named == {config.load_config(name)["method"]["name"]}, name
    byol = next(row for row in rows if "byol_imagenet_resnet50" in row[0])
    assert byol[2:] == ["1000", "4096", "LARS lr 3.2", "`imagenet` (crop 0.08-1)"]
    mae = next(row for row in rows if "mae_imagenet_vit_base16" in row[0])
    assert mae[0].endswith("(ViT-B/16)") and mae[4:] == [
        "AdamW lr 2.4e-3, decay 0.05", "`crop_flip`, one view, 75 % of the patches masked"]


def test_healths_table_is_generated_for_every_method_with_its_own_collapse_advice():
    """docs/health.md's table of each method's own failure has a row for every method that
    declares its own ``COLLAPSE_ADVICE``, for no other, and gives that advice."""
    rows = generated(COLLAPSE_TABLE)
    own = {name for name, cls in METHODS.items() if "COLLAPSE_ADVICE" in vars(cls)}
    same({name for row in rows for name in named(row[0])}, own,
         "docs/health.md's table of known failures")
    for row in rows:
        (method,) = named(row[0])
        assert row[2].replace("`", "") == METHODS[method].COLLAPSE_ADVICE, method


def test_compares_search_table_is_generated_from_each_methods_declared_search():
    rows = generated(SEARCH_TABLE)
    same({name for row in rows for name in named(row[0])}, comparison_methods() + vit_methods(),
         "docs/compare.md's search table")
    for row in rows:
        (method,) = named(row[0])
        declared = [(key, setting.search) for key, setting in METHODS[method].SETTINGS.items()
                    if setting.search]
        shown = [(key, tuple(float(v) for v in values.split(", "))) for key, values in
                 re.findall(r"`(\w+)`: ([\d., ]+[\d])", row[1])]
        assert shown == [(key, tuple(float(v) for v in values)) for key, values in declared], \
            method
        views = METHODS[method].AUTHORS_VIEWS  # its authors' views, else the budget's
        assert row[2].startswith(f"`{views.views}`" if views else "the budget's"), method


# ------------------------------------------------- written by a command, checked against it
def test_the_readmes_table_is_the_one_the_registry_writes():
    """The README's table (GitHub shows the file as it is) is what ``python docs/hooks.py
    --write-readme`` writes between its markers, and names every method."""
    docs_hooks, readme = hooks(), page("README.md")
    rows = table(docs_hooks.readme_methods_table(), README_TABLE)
    same({name for row in rows for name in named(row[1])}, METHODS,
         "the README's generated table")
    listed = {name for row in table(readme, README_TABLE) for name in named(row[1])}
    assert readme == docs_hooks.readme_with_methods_table(readme), (
        f"README.md's table of the methods is not the registry's (missing "
        f"{sorted(set(METHODS) - listed)}, not methods {sorted(listed - set(METHODS))}): run "
        f"{docs_hooks.WRITE_README}")


# ---------------------------------------------------------------------- checked
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
    """A method registered nowhere but here, declaring every row the generated tables show:
    no checked list names it."""

    method = "unlisted"
    SETTINGS = {"temperature": Setting(0.1, number(0.0, low_open=True), "tau",
                                       search=(0.05, 0.1, 0.2))}
    DOCS_ROW = dict(Method.DOCS_ROW, name="Unlisted", towards="its own target",
                    negatives="its own negatives", collapse="its own failure")
    COLLAPSE_ADVICE = "raise method.unlisted.temperature"


CHECKS = [test_the_readmes_table_is_the_one_the_registry_writes,
          test_docs_methods_has_a_section_for_every_method,
          lambda: test_every_comparison_method_has_its_section_in_the_offline_configs("mnist"),
          lambda: test_every_comparison_method_has_its_section_in_the_offline_configs("shapes")]


def test_a_new_method_gains_its_row_in_every_generated_table(monkeypatch):
    """Registered, a method's file alone gives its rows: each generated table takes it in."""
    monkeypatch.setitem(METHODS, Unlisted.method, Unlisted)
    rows = {tuple(row) for row in generated(NAMES_TABLE)}
    assert ("`unlisted`", "Unlisted", "its own target", "its own negatives") in rows
    rows = {tuple(row) for row in generated(COLLAPSE_TABLE)}
    assert ("Unlisted (`unlisted`)", "its own failure",
            "raise `method.unlisted.temperature`") in rows
    assert ["`unlisted`", "`temperature`: 0.05, 0.1, 0.2", "the budget's"] in generated(
        SEARCH_TABLE)
    assert ["Unlisted", "`unlisted`", "its own target"] in table(
        hooks().readme_methods_table(), README_TABLE)
    assert any(row[0] == "`unlisted`" for row in table(
        rendered(os.path.join("docs", "methods.md")), r"\| method \| class \|"))
    assert "::: test_method_lists.Unlisted" in rendered(os.path.join("docs", "api",
                                                                     "methods.md"))


def test_a_method_without_its_rows_fails_every_check(monkeypatch):
    """Registered, a method that a checked list lacks fails each check above; the README's
    names the command that writes it."""
    monkeypatch.setitem(METHODS, Unlisted.method, Unlisted)
    for check in CHECKS:
        with pytest.raises(AssertionError, match="unlisted"):
            check()
    with pytest.raises(AssertionError, match="run python docs/hooks.py --write-readme"):
        test_the_readmes_table_is_the_one_the_registry_writes()


def test_a_method_without_its_docs_row_is_refused_in_one_line(monkeypatch):
    class Unnamed(Unlisted):
        method = "unnamed"
        DOCS_ROW = dict(Unlisted.DOCS_ROW)
        del DOCS_ROW["name"]

    monkeypatch.setitem(METHODS, Unnamed.method, Unnamed)
    with pytest.raises(ValueError, match=r"^test_method_lists\.Unnamed\.DOCS_ROW has no 'name', "
                                         r"which docs/getting-started.md's table of "
                                         r"method.name shows$"):
        rendered(NAMES_TABLE[0])


def test_the_base_holds_the_step_and_keras_plumbing_only():
    """Each concern has its home (algorithm, online_probe, summary, old_files, state), so the
    model that trains every method stays short enough to read in one sitting (issue 76: at most
    350 lines)."""
    with open(os.path.join(ROOT, "caco_tf", "methods", "base.py")) as base:
        lines = len(base.read().splitlines())
    assert lines <= 350, f"caco_tf/methods/base.py has {lines} lines: move a concern to its home"
