"""mkdocs hooks: pages generated from the code at build time, so that they cannot drift.

``<!-- configuration-reference -->`` in a page becomes the table of every configuration key:
its default, what it accepts and what it does, as ``SETTINGS`` in
``caco_tf/training/config.py`` declares them.
"""

import json
import os
import sys

MARKER = "<!-- configuration-reference -->"


def on_page_markdown(markdown, page, config, files):
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, configuration_reference())


def configuration_reference():
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from caco_tf.training.config import SETTINGS

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
