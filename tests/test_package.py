"""The package as it installs: its module list, its shipped configurations found by name, a
version on every command, and only the dependencies it uses.  The built wheel in a fresh
environment is .ci/wheel-smoke's (run by .ci/run)."""

import importlib
import os
import re
import subprocess
import sys

import pytest
import yaml

import caco_tf
from caco_tf import config as config_lib
from caco_tf.methods import METHODS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = ("train", "evaluate", "figures", "export", "extract", "import_torch")


def pyproject():
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        return tomllib.load(handle)


def test_the_wheel_lists_every_package_and_ships_configs():
    listed = set(pyproject()["tool"]["setuptools"]["packages"])
    found = {os.path.relpath(folder, ROOT).replace(os.sep, ".")
             for folder, _, files in os.walk(os.path.join(ROOT, "caco_tf"))
             if "__init__.py" in files}
    assert listed == found | {"caco_tf.configs"}
    assert pyproject()["tool"]["setuptools"]["package-dir"] == {"caco_tf.configs": "configs"}


def test_a_shipped_configuration_is_found_by_name_and_by_path(tmp_path, monkeypatch):
    shipped = config_lib.shipped_configs()
    assert set(shipped) == {name[:-5] for name in os.listdir(os.path.join(ROOT, "configs"))
                            if name.endswith(".yaml")}
    monkeypatch.chdir(tmp_path)  # away from the checkout: names still work
    by_name = config_lib.load_config("imagenet_resnet50_b256")
    assert by_name == config_lib.load_config(os.path.join(ROOT, "configs",
                                                          "imagenet_resnet50_b256.yaml"))
    assert config_lib.load_config("configs/mnist.yaml") == config_lib.load_config("mnist.yaml")
    mine = tmp_path / "mnist.yaml"  # a file of the user's wins over a shipped name
    mine.write_text(yaml.safe_dump({"name": "mine"}))
    assert config_lib.load_config("mnist.yaml")["name"] == "mine"
    with pytest.raises(config_lib.ConfigError) as error:
        config_lib.load_config("imagenet_resnet50")
    assert str(error.value) == (
        f"cannot read config imagenet_resnet50: no such file, and no shipped configuration of "
        f"that name ({', '.join(shipped)}; caco-train --list-configs)")


def test_list_configs_prints_one_line_each(capsys):
    from caco_tf.cli import train

    assert train.main(["--list-configs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(config_lib.shipped_configs())
    assert all(len(line.split(None, 1)) == 2 for line in lines)  # a name and what it is


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_says_its_version(command, capsys):
    module = importlib.import_module(f"caco_tf.cli.{command}")
    with pytest.raises(SystemExit) as done:
        module.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip().endswith(f" {caco_tf.__version__}")
    scripts = pyproject()["project"]["scripts"]
    assert f"caco_tf.cli.{command}:console" in scripts.values()


@pytest.mark.parametrize("command", COMMANDS)
def test_every_commands_help_imports_no_tensorflow(command):
    """The choices and defaults --help shows (the linear protocol's, the export formats, the
    crop fraction) come from modules without TensorFlow, so --help answers at once."""
    script = (f"import sys\nfrom caco_tf.cli import {command}\n"
              f"try:\n    {command}.parse_args(['--help'])\nexcept SystemExit:\n    pass\n"
              "assert 'tensorflow' not in sys.modules, 'tensorflow was imported'\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout


# Dependencies the package needs without importing them itself, and why.
NOT_IMPORTED = {
    "importlib_resources": "TFDS prepares data sets through it without declaring it",
    "tensorboard": "the `tensorboard --logdir` command that shows the run's curves",
}
IMPORT_NAMES = {"tensorflow-datasets": "tensorflow_datasets", "scikit-learn": "sklearn",
                "pillow": "PIL", "pyyaml": "yaml"}


def test_every_runtime_dependency_is_imported_by_the_package():
    sources = ""
    for folder, _, files in os.walk(os.path.join(ROOT, "caco_tf")):
        for name in files:
            if name.endswith(".py"):
                sources += open(os.path.join(folder, name)).read()
    for requirement in pyproject()["project"]["dependencies"]:
        name = re.split(r"[<>=!~ \[]", requirement)[0].lower()
        module = IMPORT_NAMES.get(name, name.replace("-", "_"))
        if module in NOT_IMPORTED:
            continue
        assert re.search(rf"^\s*(import|from) {module}\b", sources, re.M), requirement
    assert not any(r.lower().startswith("keras-cv") for r in
                   pyproject()["project"]["dependencies"])
    assert sys.version_info >= (3, 11)  # requires-python


# The registered methods that ship their authors' ImageNet ResNet-50 recipe.
METHOD_RECIPES = [method for method in METHODS
                  if f"{method}_imagenet_resnet50" in config_lib.shipped_configs()]


def test_each_methods_imagenet_recipe_reaches_tfds_manual_directory(tmp_path, capsys):
    """`caco-train --config M_imagenet_resnet50` on a machine without ImageNet: the recipe
    loads and validates, and the run stops at TFDS's manual directory with one line."""
    from caco_tf.cli import train

    assert {name for name in config_lib.shipped_configs() if name.endswith("_imagenet_resnet50")
            } == {f"{method}_imagenet_resnet50" for method in METHOD_RECIPES}  # none unread
    for method in METHOD_RECIPES:
        name = f"{method}_imagenet_resnet50"
        assert config_lib.load_config(name)["method"]["name"] == method
        code = train.main(["--config", name, "--run-dir", str(tmp_path / method),
                           "--set", f"data.data_dir={tmp_path / 'tfds'}"])
        errors = capsys.readouterr().err.strip().splitlines()
        assert code != 0 and len(errors) == 1, (name, errors)
        assert errors[0].startswith("error: cannot prepare TFDS data set 'imagenet2012'") and \
            "data.manual_dir" in errors[0], (name, errors)
        assert not os.path.exists(tmp_path / method)  # nothing of value: the folder is gone
