"""Pages generated from the code at build time (an mkdocs hook), so that they cannot drift.

``<!-- configuration-reference -->`` in a page becomes the table of every configuration key:
its default, what it accepts and what it does, as ``SETTINGS`` in ``caco_tf/config.py``
declares them; ``<!-- methods-table -->`` the table of the methods, from what each method class
declares (``caco_tf.methods.docs_table``), so a new method's file adds its row;
``<!-- method-classes -->`` the API reference of every registered method's class.
"""

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKERS = ("<!-- configuration-reference -->", "<!-- methods-table -->",
           "<!-- method-classes -->")


def on_page_markdown(markdown, page, config, files):
    for marker, table in zip(MARKERS, (configuration_reference, methods_table, method_classes)):
        if marker in markdown:
            markdown = markdown.replace(marker, table())
    return markdown


def configuration_reference():
    sys.path.insert(0, ROOT)
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
    sys.path.insert(0, ROOT)
    from caco_tf.methods import docs_table

    return "\n".join(docs_table())


def method_classes():
    """mkdocstrings' directive of each registered method's class, in the registry's order."""
    sys.path.insert(0, ROOT)
    from caco_tf.methods import METHODS

    return "\n\n".join(f"::: {cls.__module__}.{cls.__name__}" for cls in METHODS.values())
