"""The documentation cannot drift from the code: every setting name, command, flag, method and
extra that README.md and docs/*.md quote in code (inline spans, fenced and indented blocks) is
checked against the configuration's schema, the commands' own parsers and pyproject.toml; the
site builds strictly; the README stays a short front door."""

import argparse
import ast
import functools
import importlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from unittest import mock

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(
    os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs"))
    if name.endswith(".md"))

# Quoted names that look like a setting or a command but are not one, each with its reason.
# Everything else is decided by rule (see ``unknown_setting``), so that this list stays short.
NOT_OURS = {
    "--requeue": "SLURM's sbatch option (docs/long-runs.md), not a caco-tf flag",
}


# ------------------------------------------------------------------------ the code in the pages
class Snippet:
    """Code quoted in a page: an inline span, or one line of a block (continuations joined)."""

    def __init__(self, page, line, text, language=""):
        self.page, self.line, self.text, self.language = page, line, text, language

    def where(self):
        return f"{self.page}:{self.line}"


FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")
SPAN = re.compile(r"(`+)(.+?)\1", re.S)


def snippets(page):
    """Every span and code line of ``page`` (a path under ROOT), in order."""
    lines = open(os.path.join(ROOT, page), encoding="utf-8").read().splitlines()
    found, prose, fence, block, in_admonition = [], [], None, [], False

    def flush_prose():
        # A span may run over a line break inside a paragraph: spans are found per paragraph.
        if not prose:
            return
        first, text = prose[0][0], "\n".join(line for _, line in prose)
        for match in SPAN.finditer(text):
            line = first + text.count("\n", 0, match.start())
            content = match.group(2).replace("\n", " ").replace("\\|", "|").strip()
            found.append(Snippet(page, line, content))
        prose.clear()

    def flush_block(language):
        joined = []
        for number, line in block:  # shell continuations make one logical line
            if joined and joined[-1][1].endswith("\\"):
                joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + line.strip())
            else:
                joined.append((number, line))
        found.extend(Snippet(page, number, line, language) for number, line in joined
                     if line.strip())
        block.clear()

    for number, line in enumerate(lines, 1):
        opening = FENCE.match(line)
        if fence is not None:
            if opening and opening.group(1) == fence[0]:
                flush_block(fence[1])
                fence = None
            else:
                block.append((number, line))
            continue
        if opening:
            flush_prose()
            fence = (opening.group(1), opening.group(2).lower())
        elif not line.strip():
            flush_prose()
        elif line.startswith("!!!"):  # an admonition: its indented body is prose, not code
            flush_prose()
            in_admonition = True
        elif line.startswith("    ") and not prose and not in_admonition:
            found.append(Snippet(page, number, line.strip(), "text"))  # an indented block
        else:
            in_admonition = in_admonition and line.startswith("    ")
            prose.append((number, line))
    flush_prose()
    return found


@functools.lru_cache(maxsize=None)
def all_snippets():
    return [snippet for page in PAGES for snippet in snippets(page)]


# ------------------------------------------------------------------------ what the code accepts
@functools.lru_cache(maxsize=None)
def schema():
    from caco_tf import config

    return config.SETTINGS, config.RULES, config.DEFAULTS


@functools.lru_cache(maxsize=None)
def methods():
    from caco_tf.methods import METHODS

    return tuple(METHODS)


def sections():
    """The top-level sections (data, model, method, train, ...) and every section below."""
    settings = schema()[0]
    return {".".join(name.split(".")[:depth]) for name in settings
            for depth in range(1, name.count(".") + 1)}


# A name ending so is a file (``train.py``, ``model.keras``), not a setting.
FILE_ENDINGS = {"py", "yaml", "yml", "keras", "json", "h5", "md", "png", "txt", "npz", "npy",
                "onnx", "tflite", "pb", "tar", "gz", "log"}
# Where a dotted name under a section's name may be Python, not a setting: ``model.fit`` is
# keras.Model's, ``distribute.all_gather`` caco_tf.training.distribute's.
PYTHON_NAMESPACES = {"model": "keras.Model", "distribute": "caco_tf.training.distribute",
                     "data": "caco_tf.data", "evaluation": "caco_tf.evaluation"}


def python_attribute(name):
    """Whether ``name`` (``model.fit``) is an attribute path of the Python object its first
    part stands for (``PYTHON_NAMESPACES``)."""
    first, *rest = name.split(".")
    if first not in PYTHON_NAMESPACES:
        return False
    module, _, attribute = PYTHON_NAMESPACES[first].rpartition(".")
    try:
        value = importlib.import_module(PYTHON_NAMESPACES[first])
    except ImportError:
        value = getattr(importlib.import_module(module), attribute)
    for part in rest:
        if not hasattr(value, part):
            try:  # a submodule not imported yet
                value = importlib.import_module(f"{value.__name__}.{part}")
                continue
            except (ImportError, AttributeError):
                return False
        value = getattr(value, part)
    return True


DOTTED = re.compile(r"(?<![\w./$-])([a-z_]+(?:\.[a-z_0-9]+)+)(?![\w(])")


def unknown_setting(name):
    """Why ``name``, a dotted name under a top-level section, is not a setting (None if it is
    one, a section, a file or a Python attribute)."""
    settings = schema()[0]
    if name in settings or name in sections():
        return None
    if name.rsplit(".", 1)[1] in FILE_ENDINGS or python_attribute(name):
        return None
    parts = name.split(".")
    if parts[0] == "method" and len(parts) >= 2 and parts[1] in methods():
        return (f"method {parts[1]} has no settings of its own (it reads "
                f"method.{reader(parts[1])}'s)" if len(parts) == 2 else
                f"method.{parts[1]} has no setting {'.'.join(parts[2:])}")
    near = [setting for setting in settings if setting.endswith("." + parts[-1])]
    return "no such setting" + (f" (did you mean {' or '.join(near[:3])}"
                                f"{' or ...' if len(near) > 3 else ''}?)" if near else "")


def reader(method):
    from caco_tf import config

    return config.settings_section(method)


def value_problem(name, raw):
    """Why ``raw`` (text, read as YAML as ``--set`` reads it) is not a value ``name`` accepts;
    None when it is, or when it is a placeholder (``S``, ``PATH``, ``...``)."""
    if re.search(r"[A-Z]|\.\.\.|<|…", raw):
        return None
    settings, rules, _ = schema()
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str) and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+", value):
        value = float(value)  # YAML 1.1 reads 1e-4 as text; the configuration does not
    if settings[name].schedule and isinstance(value, dict) or rules[name].check(value):
        return None
    return f"{name} must be {rules[name].allowed}, got {raw}"


# ------------------------------------------------------------------------ the commands
@functools.lru_cache(maxsize=None)
def project():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        return tomllib.load(handle)["project"]


class _Captured(Exception):
    def __init__(self, parser):
        super().__init__()
        self.parser = parser


@functools.lru_cache(maxsize=None)
def cli_parser(module):
    """The ``argparse`` parser a command module builds (its ``parse_args``), without running."""
    def capture(parser, *args, **kwargs):
        raise _Captured(parser)

    command = importlib.import_module(module)
    with mock.patch.object(argparse.ArgumentParser, "parse_args", capture):
        try:
            command.parse_args([])
        except _Captured as captured:
            return captured.parser
    raise AssertionError(f"{module}.parse_args never parsed")


@functools.lru_cache(maxsize=None)
def script_flags(path):
    """The flags a script's own ``add_argument`` calls declare (read, not run: a benchmark
    imports TensorFlow and its models at the top)."""
    tree = ast.parse(open(os.path.join(ROOT, path), encoding="utf-8").read())
    return {argument.value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
            for argument in node.args
            if isinstance(argument, ast.Constant) and str(argument.value).startswith("-")
            } | {"-h", "--help"}


def script_command_module(path):
    """The command module a checkout script runs (``train.py``: caco_tf.cli.train), if any."""
    source = open(os.path.join(ROOT, path), encoding="utf-8").read()
    found = re.search(r"^from (caco_tf\.cli\.\w+) import console", source, re.M)
    return found.group(1) if found else None


COMMAND = re.compile(r"(?<![\w./$-])(caco-[a-z][a-z-]*|python3? +-m +[\w.]+|"
                     r"python3? +[\w./-]+\.py)(?![\w-])")


def command_arguments(text):
    """The words after a command, to the end of its shell command (``&&``, ``;``, a pipe, a
    redirection or a comment at the top level, not inside ``(...)`` or ``[...]``)."""
    depth, end = 0, len(text)
    for place, char in enumerate(text):
        if char in "([":
            depth += 1
        elif char in ")]":
            if depth == 0:
                end = place
                break
            depth -= 1
        elif depth == 0 and (char in ";&|<>'\"`" or (
                char == "#" and (place == 0 or text[place - 1].isspace()))):
            end = place
            break
    words = text[:end].replace("[", " ").replace("]", " ").replace("(", " ").replace(")", " ")
    try:
        return shlex.split(words)
    except ValueError:
        return words.split()


def is_placeholder(word):
    return bool(re.search(r"[A-Z]|\.\.\.|<|…|\$", word)) or word in ("key=value",)


def check_command(name, words, problems, where):
    """Append to ``problems`` what ``name`` (a command as written) and its ``words`` (its
    arguments) get wrong."""
    scripts = project()["scripts"]
    if name.startswith("caco-"):
        if name == project()["name"]:
            return  # the distribution (pip install caco-tf), not a command
        if name not in scripts:
            problems.append(f"{where}: {name} is not a command (pyproject.toml's "
                            f"[project.scripts]: {', '.join(scripts)})")
            return
        check_words(cli_parser(scripts[name].split(":")[0]), name, words, problems, where)
        return
    module = re.match(r"python3? +-m +([\w.]+)", name)
    if module:
        if not module.group(1).startswith("caco_tf"):
            return  # pip, pytest, venv...
        if importlib.util.find_spec(module.group(1)) is None:
            problems.append(f"{where}: python -m {module.group(1)}: no such module")
        elif module.group(1).startswith("caco_tf.cli."):
            check_words(cli_parser(module.group(1)), name, words, problems, where)
        return
    path = name.split()[-1]
    if not os.path.isfile(os.path.join(ROOT, path)):
        problems.append(f"{where}: {name}: no such file in the checkout")
    elif script_command_module(path):
        check_words(cli_parser(script_command_module(path)), name, words, problems, where)
    else:
        for word in words:
            flag = word.split("=")[0]
            if flag.startswith("-") and flag not in script_flags(path):
                problems.append(f"{where}: {name} has no flag {flag}")


def check_words(parser, name, words, problems, where):
    """The flags, subcommands and choices of one command line against its parser."""
    words = list(words)
    chooser = next((action for action in parser._actions if not action.option_strings
                    and action.choices), None)
    while words:
        word = words.pop(0)
        if word == "--" or word.startswith(">") or word[:1].isdigit() and ">" in word:
            return
        if word.startswith("-") and len(word) > 1:
            flag, _, attached = word.partition("=")
            action = parser._option_string_actions.get(flag)
            if action is None:
                problems.append(f"{where}: {name} has no flag {flag}")
                continue
            if action.nargs == 0:
                continue
            value = attached or (words.pop(0) if words and not words[0].startswith("-")
                                 else None)
            if value is not None and action.choices and not is_placeholder(value):
                for alternative in value.split("|"):
                    if alternative not in action.choices:
                        problems.append(f"{where}: {name} {flag} takes "
                                        f"{', '.join(map(str, action.choices))}, not "
                                        f"{alternative}")
            if value is not None and flag == "--config":
                check_config_name(value, problems, where)
            continue
        if chooser is not None and not is_placeholder(word):
            choices = chooser.choices
            for alternative in word.split("|"):
                if alternative not in choices:
                    problems.append(f"{where}: {name} takes {', '.join(choices)} here, "
                                    f"not {alternative}")
            if isinstance(chooser, argparse._SubParsersAction) and word in choices:
                parser = choices[word]
                name = f"{name} {word}"
                chooser = next((action for action in parser._actions
                                if not action.option_strings and action.choices), None)
            else:
                chooser = None


def check_config_name(value, problems, where):
    """``--config NAME`` names a shipped configuration; ``--config configs/X.yaml`` a file of
    the checkout (a path elsewhere is the reader's own)."""
    if is_placeholder(value):
        return
    from caco_tf.config import shipped_configs

    if "/" not in value and not value.endswith((".yaml", ".yml")):
        if value not in shipped_configs():
            problems.append(f"{where}: --config {value}: no shipped configuration of that "
                            f"name ({', '.join(shipped_configs())})")
    elif value.startswith("configs/") and not os.path.isfile(os.path.join(ROOT, value)):
        problems.append(f"{where}: --config {value}: no such file in the checkout")


@functools.lru_cache(maxsize=None)
def every_flag():
    """Every flag of every command and benchmark script (for a flag quoted without its
    command)."""
    flags = set().union(*(script_flags(os.path.join("benchmarks", name))
                          for name in os.listdir(os.path.join(ROOT, "benchmarks"))
                          if name.endswith(".py")))
    for module in {spec.split(":")[0] for spec in project()["scripts"].values()}:
        parsers = [cli_parser(module)]
        while parsers:
            parser = parsers.pop()
            flags |= set(parser._option_string_actions)
            for action in parser._actions:
                if isinstance(action, argparse._SubParsersAction):
                    parsers.extend(action.choices.values())
    return flags


# ------------------------------------------------------------------------ the checks
def problems_in(snippet):
    """Every stale name in one snippet, each a line ``page:line: what is wrong``."""
    problems, where, text = [], snippet.where(), snippet.text
    python = snippet.language in ("python", "py")
    # An old name is quoted as such where the rename's own message names its new one.
    renamed = {match.group(1) for match in re.finditer(
        rf"{DOTTED.pattern} (?:moved to|was renamed) ([a-z_.]+[a-z_])", text)
        if match.group(2) in schema()[0]}
    # In Python code only strings can hold a setting's name: model.fit there is Keras'.
    for match in DOTTED.finditer(strings_of(text) if python else text):
        name = match.group(1)
        if name.split(".")[0] in sections() and name not in renamed:
            why = unknown_setting(name)
            if why:
                problems.append(f"{where}: {name}: {why}")
    for match in re.finditer(r"\bmethod\.name['\"]?\s*[=:]\s*['\"]?([a-z_0-9]+)\b", text):
        if match.group(1) not in methods():
            problems.append(f"{where}: method.name {match.group(1)}: not a method "
                            f"({', '.join(methods())})")
    for match in re.finditer(r"--set[= ]+(['\"]?)([^\s'\"]+)\1", text):
        assignment = match.group(2)
        key, equals, raw = assignment.partition("=")
        if is_placeholder(key) or key == "key":
            continue
        if not equals:
            problems.append(f"{where}: --set {assignment}: not KEY=VALUE")
        elif key not in schema()[0]:
            if key.split(".")[0] not in sections():  # a name under a section is told above
                problems.append(f"{where}: --set {key}: not a setting")
        elif value_problem(key, raw):
            problems.append(f"{where}: --set {assignment}: {value_problem(key, raw)}")
    if not python:
        for match in COMMAND.finditer(text):
            words = command_arguments(text[match.end():])
            check_command(re.sub(r"\s+", " ", match.group(1)), words, problems, where)
        if text.startswith("--") and not COMMAND.search(text):
            flag = text.split()[0].split("=")[0]
            if flag not in every_flag() and flag not in NOT_OURS:
                problems.append(f"{where}: {flag}: no command takes this flag")
    for match in re.finditer(r"(?:caco-tf|(?<![\w/])\.)\[([\w,-]+)\]", text):
        for extra in match.group(1).split(","):
            if extra not in project()["optional-dependencies"]:
                problems.append(f"{where}: [{extra}]: not an extra of pyproject.toml "
                                f"({', '.join(project()['optional-dependencies'])})")
    return problems


def strings_of(code):
    """The string literals of a line of Python, space-separated."""
    return " ".join(match.group(2) for match in re.finditer(r"(['\"])(.*?)\1", code))


def yaml_blocks():
    """Every ``yaml`` fenced block of the pages: (page, first line, text)."""
    for page in PAGES:
        text = open(os.path.join(ROOT, page), encoding="utf-8").read()
        for match in re.finditer(r"^```ya?ml\n(.*?)^```", text, re.S | re.M):
            yield page, text.count("\n", 0, match.start()) + 2, match.group(1)


def configuration_problems(tree, where, path=()):
    """The keys of a configuration's (part of a) tree that are no setting, and a method.name
    that is no method."""
    settings, problems = schema()[0], []
    for key, value in tree.items():
        name = ".".join(path + (str(key),))
        if name in settings:
            if name == "method.name" and value not in methods():
                problems.append(f"{where}: method.name {value}: not a method")
            elif not isinstance(value, str) or not is_placeholder(value):
                problem = value_problem(name, yaml.safe_dump(value, default_flow_style=True)
                                        .removesuffix("\n...\n").strip())
                if problem:
                    problems.append(f"{where}: {problem}")
        elif isinstance(value, dict) and name in sections():
            problems += configuration_problems(value, where, path + (str(key),))
        else:
            problems.append(f"{where}: {name}: {unknown_setting(name) or 'not a setting'}")
    return problems


# ------------------------------------------------------------------------ the tests
def test_every_quoted_setting_command_and_flag_exists():
    """A setting the configuration refuses, a command or flag its parser refuses, a method not
    registered: one line each, all of them at once."""
    problems = [problem for snippet in all_snippets() for problem in problems_in(snippet)]
    assert not problems, "stale names in the docs:\n" + "\n".join(problems)


def test_yaml_blocks_are_configurations():
    problems = []
    for page, line, text in yaml_blocks():
        tree = yaml.safe_load(text)
        if isinstance(tree, dict) and set(tree) & {"data", "model", "method", "train",
                                                   "distribute", "evaluation"}:
            problems += configuration_problems(tree, f"{page}:{line}")
    assert not problems, "stale YAML in the docs:\n" + "\n".join(problems)


def test_the_checks_catch_stale_names():
    """The checks themselves: each kind of stale name is caught, and Python is not misread."""
    def found(text, language=""):
        return problems_in(Snippet("page.md", 1, text, language))

    assert found("method.bank_lr") and found("method.caco.bank_rate")
    assert found("caco-train --set method.warmup_epochs=2")
    assert found("caco-train --set train.epochs=none")  # a value the setting refuses
    assert found("caco-evaluate linear --runs RUN") and found("caco-evaluate lienar --run R")
    assert found("caco-data-service worker --dispatch HOST:PORT")
    assert found("caco-trian") and found("python -m caco_tf.evaluate linear")
    assert found("method.name: simclr2") and found("caco-train --config imagenet_r50")
    assert found('pip install -e ".[tests]"')
    assert not found("model.fit(images)", "python") and not found("model.fit")
    assert not found("distribute.all_gather") and not found("train.py") and not found(
        "model.keras")
    assert not found("caco-train --config NAME [--set key=value ...] [--run-dir DIR]")
    assert not found("caco-evaluate knn|linear --run RUN --data tfds:cifar10")
    assert not found("caco-data-service worker --dispatcher cpu-0:5050 --host $host > w.log")
    assert not found('config = caco_tf.load_config("configs/mnist.yaml")', "python")
    assert not found("method.caco.bank_lr: {start: 3.0, end: 0.0}")
    assert not found("error: method.bank_lr moved to method.caco.bank_lr in caco_tf 0.4.0")
    assert found("error: method.bank_lr moved to method.bank_rate in caco_tf 0.4.0")


@pytest.mark.slow  # mkdocs and mkdocstrings import every module: ~30 s on 2 cores
def test_the_site_builds_strictly(tmp_path):
    if shutil.which("mkdocs") is None and not os.path.exists(
            os.path.join(os.path.dirname(sys.executable), "mkdocs")):
        pytest.skip("the docs extra is absent: pip install -e '.[docs]'")
    mkdocs = shutil.which("mkdocs") or os.path.join(os.path.dirname(sys.executable), "mkdocs")
    result = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    page = (tmp_path / "site" / "configuration" / "index.html").read_text()
    # The hook replaced its marker by the table of keys (the heading's anchor keeps the name).
    assert "method.caco.bank_size" in page and "<!-- configuration-reference -->" not in page


def test_the_readme_is_short_and_keeps_its_commands():
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert len(readme.splitlines()) <= 200
    assert ("python3 -m venv .venv && . .venv/bin/activate && pip install -e . && "
            "python train.py") in readme
    assert ('python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[test]" && '
            "python -m pytest -q -n 2") in readme
    assert 'python -m pytest -q -n 2 -m "not slow"' in readme
    # Where the measured timings of the suite and of its fast tier are written.
    assert "<!-- timing: suite -->" in readme and "<!-- timing: fast -->" in readme


def test_the_readmes_table_of_methods_names_registered_methods():
    """The README's table of methods names registered methods only, by their method.name (the
    whole list is docs/methods.md's generated table: a new method's file adds its row there)."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    table = re.search(r"^\| method \|.*?\n\n", readme, re.S | re.M)
    assert table, "the README has no table of methods (| method | method.name | ...)"
    named = set(re.findall(r"`([a-z_0-9]+)`", table.group(0))) - {"method.name"}
    assert named and named <= set(methods()), f"not methods: {sorted(named - set(methods()))}"
