"""mkdocs hooks: pages generated from the code at build time, so that they cannot drift.

``<!-- configuration-reference -->`` in a page becomes the table of every configuration key:
its default (``DEFAULTS``), what it accepts (``RULES``) and what it does (``HELP``), from
``caco_tf/training/config.py``.
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
    from caco_tf.training.config import DEFAULTS_FLAT, HELP, RULES

    sections = {}
    for key, default in DEFAULTS_FLAT.items():
        sections.setdefault(key[0] if len(key) > 1 else "(top level)", []).append(
            (".".join(key), default))
    lines = []
    for section, rows in sections.items():
        lines += [f"## `{section}`" if section != "(top level)" else "## Top level", "",
                  "| key | default | accepts | what it does |", "|---|---|---|---|"]
        for name, default in rows:
            shown = json.dumps(default) if default is not None else "null"
            lines.append(f"| `{name}` | `{shown}` | {_escape(RULES[name].allowed)} | "
                         f"{_escape(HELP[name])} |")
        lines.append("")
    return "\n".join(lines)


def _escape(text):
    return text.replace("|", "\\|").replace("<", "&lt;")
