"""Pages generated from the code at build time (an mkdocs hook), so that they cannot drift.

Each marker in a page becomes a table: ``<!-- configuration-reference -->`` every configuration
key, its default, what it accepts and what it does (``SETTINGS`` in ``caco_tf/config.py``);
the methods' tables, from what each method class declares (its ``DOCS_ROW``, ``SETTINGS``,
``COLLAPSE_ADVICE``, ``CROPS``, ``CONSUMES``, ``AUTHORS_VIEWS``: a new method's file adds its
rows):
``<!-- methods-table -->`` docs/methods.md's (``caco_tf.methods.docs_table``),
``<!-- method-classes -->`` the API reference of every registered method's class,
``<!-- method-names-table -->`` and ``<!-- method-recipes-table -->`` docs/getting-started.md's
(the recipes' columns read from each ``configs/METHOD_imagenet_*.yaml``),
``<!-- collapse-table -->`` docs/health.md's and ``<!-- search-table -->`` docs/compare.md's.

The README, which GitHub and PyPI show as it is, holds its table of the methods between
``README_BEGIN`` and ``README_END``: ``python docs/hooks.py --write-readme`` writes it again
(tests/test_method_lists.py fails while it differs).
"""

import argparse
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
README_BEGIN, README_END = "<!-- readme-methods:begin -->", "<!-- readme-methods:end -->"
WRITE_README = "python docs/hooks.py --write-readme"


def on_page_markdown(markdown, page, config, files):
    for marker, table in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, table())
    return markdown


def configuration_reference():
    from caco_tf.config import SETTINGS

    sections = {}
    for name, setting in SETTINGS.items():
        sections.setdefault(name.split(".")[0] if "." in name else "(top level)", []).append(
            (name, setting))
    lines = []
    for section, rows in sections.items():
        lines += [f"## `{section}`" if section != "(top level)" else "## Top level", "",
                  "| key | default | accepts | what it does |", "|---|---|---|---|"]
        for name, setting in rows:
            shown = json.dumps(setting.default) if setting.default is not None else "null"
            lines.append(f"| `{name}` | `{shown}` | {_escape(setting.rule.allowed)} | "
                         f"{_escape(setting.help)} |")
        lines.append("")
    return "\n".join(lines)


def _escape(text):
    return text.replace("|", "\\|").replace("<", "&lt;")


def methods_table():
    from caco_tf.methods import docs_table

    return "\n".join(docs_table())


def method_classes():
    """mkdocstrings' directive of each registered method's class, in the registry's order."""
    from caco_tf.methods import METHODS

    return "\n\n".join(f"::: {cls.__module__}.{cls.__name__}" for cls in METHODS.values())


# ---------------------------------------------------------------- the methods' other tables
def docs_row(cls, key, table, default=None):
    """``cls.DOCS_ROW[key]``, which ``table`` shows: ``default`` when not declared, refused in
    one line without one."""
    row = cls.DOCS_ROW
    if key in row:
        return row[key]
    if default is None:
        raise ValueError(f"{cls.__module__}.{cls.__name__}.DOCS_ROW has no {key!r}, which "
                         f"{table} shows")
    return default


def _named(cls, table):
    """Its name in words, with " (a ViT)" for a method of a ViT's tokens."""
    return docs_row(cls, "name", table) + (" (a ViT)" if cls.CONSUMES == "tokens" else "")


def _default_method():
    from caco_tf.config import SETTINGS

    return SETTINGS["method.name"].default


def method_names_table():
    """docs/getting-started.md's table: each ``method.name``, what it trains towards."""
    from caco_tf.methods import METHODS

    where = "docs/getting-started.md's table of method.name"
    lines = ["| `method.name` | method | a view is trained towards | negatives |",
             "|---|---|---|---|"]
    for name, cls in METHODS.items():
        default = " (default)" if name == _default_method() else ""
        full = docs_row(cls, "full name", where, default=_named(cls, where))
        lines.append(f"| `{name}`{default} | {full} | {docs_row(cls, 'towards', where)} | "
                     f"{docs_row(cls, 'negatives', where)} |")
    return "\n".join(lines)


def readme_methods_table():
    """The README's table: a row per method, adjacent rows of one name and summary merged
    (CaCo's ablation rows)."""
    from caco_tf.methods import METHODS

    where = "the README's table of the methods"
    rows = []  # [label, names, summary]
    for name, cls in METHODS.items():
        label = _named(cls, where) + (" (default)" if name == _default_method() else "")
        summary = docs_row(cls, "summary", where, default=docs_row(cls, "towards", where))
        if rows and rows[-1][0] == label and rows[-1][2] == summary:
            rows[-1][1].append(name)
        else:
            rows.append([label, [name], summary])
    return "\n".join(["| method | `method.name` | what a view is trained towards |",
                      "|---|---|---|"] + [
        f"| {label} | {', '.join(f'`{n}`' for n in names)} | {summary} |"
        for label, names, summary in rows])


def readme_with_methods_table(readme):
    """``readme`` with its block between the markers written from the registry."""
    begin, end = readme.find(README_BEGIN), readme.find(README_END)
    if begin < 0 or end < begin:
        raise ValueError(f"README.md has no {README_BEGIN} ... {README_END} block")
    return (readme[:begin + len(README_BEGIN)] + "\n" + readme_methods_table() + "\n"
            + readme[end:])


def collapse_table():
    """docs/health.md's table: each method that declares its own ``COLLAPSE_ADVICE``, what
    its failure is judged by and that advice, its settings in code."""
    from caco_tf.config import SETTINGS
    from caco_tf.methods import METHODS

    where = "docs/health.md's table of known failures"
    sections = "|".join(sorted({key.split(".")[0] for key in SETTINGS if "." in key}))
    setting = re.compile(rf"\b((?:{sections})\.[a-z_0-9.]*[a-z_0-9](?:: [a-z0-9]+)?)")
    lines = ["| method | what is judged | what to change |", "|---|---|---|"]
    for name, cls in METHODS.items():
        if "COLLAPSE_ADVICE" in vars(cls):
            advice = setting.sub(r"`\1`", cls.COLLAPSE_ADVICE)
            lines.append(f"| {docs_row(cls, 'name', where)} (`{name}`) | "
                         f"{docs_row(cls, 'collapse', where)} | {advice} |")
    return "\n".join(lines)


def search_table():
    """docs/compare.md's table: the values of each comparison method's searched settings, and
    the views it trains on (its authors', ``AUTHORS_VIEWS``, else the budget's); the default
    methods, then those of a ViT's tokens."""
    from caco_tf.comparison.trials import comparison_methods, vit_methods
    from caco_tf.methods import METHODS

    lines = ["| method | the setting it declares for a comparison | its views |", "|---|---|---|"]
    for name in comparison_methods() + vit_methods():
        searched = [f"`{key}`: {_values(setting.search)}"
                    for key, setting in METHODS[name].SETTINGS.items() if setting.search]
        lines.append(f"| `{name}` | {'; '.join(searched) or '–'} | "
                     f"{_authors_views(METHODS[name].AUTHORS_VIEWS)} |")
    return "\n".join(lines)


def _authors_views(declared):
    """A method's ``AUTHORS_VIEWS`` in words: ``crop_flip`` (crop_scale 0.2-1)."""
    if declared is None:
        return "the budget's"
    shown = [f"{key.rsplit('.', 1)[-1]} " + (f"{_number(value[0])}-{_number(value[1])}"
                                             if isinstance(value, list) else f"{value}")
             for key, value in declared.settings.items()]
    if declared.local_share:
        shown.append(f"local side {declared.local_share:.2g} of the image's")
    return f"`{declared.views}` ({', '.join(shown)})" if shown else f"`{declared.views}`"


def _values(values):
    """10, 25, 50 when all are whole; 0.2, 0.5, 1.0 when some are not."""
    whole = all(float(value).is_integer() for value in values)
    return ", ".join(f"{value:g}" if whole else str(value) for value in values)


OPTIMIZERS = {"sgd": "SGD", "lars": "LARS", "adamw": "AdamW"}


def method_recipes_table():
    """docs/getting-started.md's table of the methods' ImageNet recipes
    (``configs/METHOD_imagenet_*.yaml``): the ConvNets', then the ViTs', in the registry's
    order; the views column names what differs from the views' defaults."""
    from caco_tf import config
    from caco_tf.methods import METHODS

    recipes = []
    for order, name in enumerate(METHODS):
        for recipe in config.shipped_configs():
            if recipe.startswith(f"{name}_imagenet_"):
                settings = config.load_config(recipe)
                vit = re.match(r"vit_([a-z])[a-z]*_patch(\d+)$", settings["model"]["backbone"])
                recipes.append((bool(vit), order, recipe, settings, vit))
    lines = ["| config | method | epochs | batch | encoder optimizer | views |",
             "|---|---|---|---|---|---|"]
    for _, _, recipe, settings, vit in sorted(recipes, key=lambda r: r[:3]):
        method, train = settings["method"]["name"], settings["train"]
        shown = f"`configs/{recipe}.yaml`" + (
            f" (ViT-{vit.group(1).upper()}/{vit.group(2)})" if vit else "")
        optimizer = (f"{OPTIMIZERS.get(train['optimizer'], train['optimizer'])} "
                     f"lr {_number(train['learning_rate'])}")
        if train["optimizer"] == "adamw":  # its decoupled decay, which ViT recipes schedule
            optimizer += f", decay {_number(train['weight_decay'])}" + (
                f" → {_number(train['weight_decay_end'])}"
                if train.get("weight_decay_end") is not None else "")
        lines.append(f"| {shown} | `{method}` | {train['epochs']} | {train['batch_size']} | "
                     f"{optimizer} | {_views(METHODS[method], settings)} |")
    return "\n".join(lines)


def _views(cls, settings):
    """A recipe's views: their kind, then where its crops differ from the defaults, its count
    of views if not 2, and its masks."""
    from caco_tf.config import SETTINGS

    data, section = settings["data"], settings["method"].get(cls.method) or {}
    words, details = f"`{data['views']}`", []
    if data["views"] == "multicrop":
        crops, size = data["multicrop"]["local_crops"], data["multicrop"]["local_size"]
        if (crops, size) != (SETTINGS["data.multicrop.local_crops"].default,
                             SETTINGS["data.multicrop.local_size"].default):
            details.append(f"2×{data['image_size']} + {crops}×{size}")
    elif list(data["crop_scale"]) != list(SETTINGS["data.crop_scale"].default):
        words += f" (crop {_number(data['crop_scale'][0])}-{_number(data['crop_scale'][1])})"
    views = cls.view_count(section)
    if views != 2:
        details.append("one view" if views == 1 else f"{views} views")
    details += [kind.wording() for kind in cls.view_masks(section)]
    return ", ".join([words] + details)


def _number(value):
    """1.6, 0.06, 1e-3, 3.5e-4: two significant digits."""
    if value >= 0.01 or value == 0:
        return f"{value:g}"
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


MARKERS = {"<!-- configuration-reference -->": configuration_reference,
           "<!-- methods-table -->": methods_table,
           "<!-- method-classes -->": method_classes,
           "<!-- method-names-table -->": method_names_table,
           "<!-- method-recipes-table -->": method_recipes_table,
           "<!-- collapse-table -->": collapse_table,
           "<!-- search-table -->": search_table}

sys.path.insert(0, ROOT)  # the checkout's caco_tf, also without an install


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python docs/hooks.py",
                                     description="Write README.md's table of the methods.")
    parser.add_argument("--write-readme", action="store_true", required=True,
                        help="write README.md's table of the methods from the registry")
    parser.parse_args(argv)
    with open(README, encoding="utf-8") as handle:
        readme = handle.read()
    written = readme_with_methods_table(readme)
    if written == readme:
        print("README.md: its table of the methods is up to date")
        return
    with open(README, "w", encoding="utf-8") as handle:
        handle.write(written)
    print("README.md: its table of the methods written from the registry")


if __name__ == "__main__":
    main()
