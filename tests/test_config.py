import pytest

from caco_tf.training.config import ConfigError, changed_settings, load_config


def test_defaults_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("caco: {bank_size: 1024}\ntrain: {epochs: 3}\n")
    config = load_config(str(path), ["caco.bank_lr=0.5", "train.learning_rate=1"])
    assert config["caco"]["bank_size"] == 1024
    assert config["caco"]["bank_lr"] == 0.5
    assert config["train"]["learning_rate"] == 1.0 and isinstance(
        config["train"]["learning_rate"], float)
    assert config["caco"]["temperature"] == 0.08  # untouched default


@pytest.mark.parametrize("assignment, message", [
    ("caco.bank_sise=5", "unknown config key 'caco.bank_sise'"),
    ("train.epochs=ten", "train.epochs must be of type int"),
    ("train.epochs=2.5", "train.epochs must be of type int"),
    ("model.sync_batchnorm=1", "model.sync_batchnorm must be true or false"),
    ("caco.temperature=0", "caco.temperature must be a number > 0, got 0.0"),
    ("train.optimizer=adam", "train.optimizer must be one of auto, sgd, lars, got 'adam'"),
    ("caco=3", "caco must be a mapping"),
    ("epochs", "--set expects key=value"),
])
def test_bad_values_are_one_line_errors(assignment, message):
    with pytest.raises(ConfigError) as error:
        load_config(None, [assignment])
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_every_shipped_config_loads():
    import glob
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # any working directory
    paths = sorted(glob.glob(os.path.join(root, "configs", "*.yaml")))
    assert len(paths) >= 6
    for path in paths:
        load_config(path)


def test_changed_settings_names_each_differing_key_with_both_values():
    old = load_config(None, ["train.epochs=2"])
    new = load_config(None, ["train.epochs=3", "evaluation.online_probe=true"])
    assert changed_settings(old, new) == ["evaluation.online_probe: False -> True",
                                          "train.epochs: 2 -> 3"]
    assert changed_settings(old, old) == []
    assert changed_settings({"a": {"b": 1}}, {"a": {}}) == ["a.b: 1 -> None"]


def test_every_key_has_a_rule_and_a_line_of_help():
    from caco_tf.training.config import DEFAULTS_FLAT, HELP, RULES

    keys = {".".join(key) for key in DEFAULTS_FLAT}
    assert set(RULES) == keys and set(HELP) == keys
    for key, rule in RULES.items():  # the default passes its own rule
        assert rule.check(DEFAULTS_FLAT[tuple(key.split("."))]), key
