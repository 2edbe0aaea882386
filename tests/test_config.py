import pytest

from caco_tf.config import ConfigError, changed_settings, load_config


def test_defaults_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("method: {caco: {bank_size: 1024}, name: simclr}\ntrain: {epochs: 3}\n")
    config = load_config(str(path), ["method.caco.bank_lr=0.5", "train.learning_rate=1"])
    assert config["method"]["caco"]["bank_size"] == 1024 and config["method"]["name"] == "simclr"
    assert config["method"]["caco"]["bank_lr"] == 0.5
    assert config["train"]["learning_rate"] == 1.0 and isinstance(
        config["train"]["learning_rate"], float)
    assert config["method"]["caco"]["temperature"] == 0.08  # untouched defaults
    assert config["method"]["simclr"]["temperature"] == 0.1  # each method's own


def test_a_configuration_carries_every_methods_settings_and_the_name_picks_them():
    from caco_tf import build

    config = load_config(None, ["method.name=dino", "method.caco.temperature=0.2"])
    assert build.method_settings(config) is config["method"]["dino"]
    assert config["method"]["dino"]["teacher_temperature"] == 0.04
    # CaCo's ablation rows read CaCo's section.
    row = load_config(None, ["method.name=negative", "method.caco.temperature=0.2"])
    assert build.method_settings(row)["temperature"] == 0.2 and "negative" not in row["method"]


def test_a_per_step_setting_takes_a_number_or_a_schedule():
    config = load_config(None, [
        "method.dino.teacher_temperature={start: 0.04, end: 0.07, epochs: 30}"])
    assert config["method"]["dino"]["teacher_temperature"] == {"start": 0.04, "end": 0.07,
                                                               "epochs": 30}
    for bad in ("{start: 0.04}", "{start: 0.04, end: 0.07, shape: square}",
                "{start: 0.04, end: 0.07, epochs: -1}", "{start: 0, end: 0.07}"):
        with pytest.raises(ConfigError, match="method.dino.teacher_temperature must be a number "
                                              "> 0, or a schedule"):
            load_config(None, [f"method.dino.teacher_temperature={bad}"])


@pytest.mark.parametrize("assignment, message", [
    ("method.caco.bank_sise=5", "unknown config key 'method.caco.bank_sise'"),
    ("method.bank_size=5", "method.bank_size moved to method.caco.bank_size in caco_tf 0.4.0"),
    ("method.none.temperature=0.2", "method.none.temperature: method none has no settings of "
                                    "its own, it reads method.caco's"),
    ("method.byol=3", "method.byol must be a mapping of settings"),
    ("train.epochs=ten", "train.epochs must be of type int"),
    ("train.epochs=2.5", "train.epochs must be of type int"),
    ("model.sync_batchnorm=1", "model.sync_batchnorm must be true or false"),
    ("method.caco.temperature=0", "method.caco.temperature must be a number > 0, got 0.0"),
    ("train.optimizer=adam", "train.optimizer must be one of auto, sgd, lars, adamw, got 'adam'"),
    ("model=3", "model must be a mapping"),
    ("method=simclr", "method must be a mapping of settings (the method itself is method.name)"),
    ("method.method=simclr", "caco.method was renamed method.name in caco_tf 0.3.0"),
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


def test_every_setting_has_one_line_of_help_and_a_rule_its_default_passes():
    from caco_tf.config import DEFAULTS, SETTINGS

    assert load_config(None) == DEFAULTS  # the defaults pass every check together, too
    for name, setting in SETTINGS.items():
        assert setting.help.strip() and "\n" not in setting.help, name
        assert setting.rule.allowed.strip() and "\n" not in setting.rule.allowed, name
        assert setting.rule.check(setting.default), name
        # A derived (None) default: a given value of its type is checked by the rule.
        assert setting.type is not type(None), name


def test_defaults_are_the_settings_nested_by_section():
    from caco_tf.config import DEFAULTS, DEFAULTS_FLAT, RULES, SETTINGS

    assert {".".join(key) for key in DEFAULTS_FLAT} == set(SETTINGS) == set(RULES)
    assert DEFAULTS["method"]["name"] == "caco"
    assert DEFAULTS["data"]["multicrop"]["local_crops"] == 6
    assert list(DEFAULTS) == ["name", "data", "model", "method", "train", "distribute",
                              "evaluation"]


def test_a_derived_setting_takes_a_value_of_its_type_or_null():
    config = load_config(None, ["train.learning_rate=1", "model.sync_batchnorm=null",
                                "model.widths=[8, 8, 16, 16]"])
    assert config["train"]["learning_rate"] == 1.0 and config["model"]["sync_batchnorm"] is None
    with pytest.raises(ConfigError, match="model.widths must be of type list, got 8"):
        load_config(None, ["model.widths=8"])


@pytest.mark.parametrize("assignment, new, version", [
    ("caco.bank_lr=0.3", "method.caco.bank_lr", "0.4.0"),
    ("caco.method=simclr", "method.name", "0.3.0"),
    ("caco.warmup_epochs=0", "method.caco.warmup_epochs", "0.4.0"),
])
def test_an_old_key_in_a_set_is_refused_with_its_new_name(assignment, new, version):
    old = assignment.split("=")[0]
    with pytest.raises(ConfigError) as error:
        load_config(None, [assignment])
    assert str(error.value) == (f"{old} was renamed {new} in caco_tf {version}; rename it in "
                                f"your configuration")


def test_an_old_section_in_a_yaml_file_is_refused_in_one_line(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("train: {epochs: 3}\ncaco:\n  method: simclr\n  bank_lr: 0.3\n")
    with pytest.raises(ConfigError) as error:
        load_config(str(path))
    message = str(error.value)
    assert message.startswith("caco.method was renamed method.name in caco_tf 0.3.0; rename it "
                              "in your configuration")
    assert "the whole section caco is now method.caco" in message and "\n" not in message
    path.write_text("caco: {bank_lr: 0.3, method: simclr}\n")
    with pytest.raises(ConfigError, match=r"caco.bank_lr was renamed method.caco.bank_lr .*"
                                          r"caco.method is method.name"):
        load_config(str(path))
    path.write_text("caco: {bank_sise: 3}\n")
    with pytest.raises(ConfigError, match="unknown config key 'caco.bank_sise' \\(the section caco "
                                          "was renamed method.caco"):
        load_config(str(path))


OLD_RUN_CONFIG = """\
name: old
data: {source: mnist, image_size: 28, channels: 1, views: digits}
model: {backbone: small_convnet, projector_hidden: 32, embedding_dim: 16}
caco: {bank_size: 64, bank_lr: 0.3, warmup_epochs: 1, method: simclr}
train: {epochs: 2, batch_size: 16}
"""


def as_saved_by_0_3(config):
    """A configuration in the layout caco_tf 0.3 saved: the method's settings flat in section
    method (CaCo's for every method, and warmup_every_method)."""
    method = config["method"]
    flat = dict(method["caco"], name=method["name"], warmup_every_method=False)
    return {key: (flat if key == "method" else value) for key, value in config.items()}


def as_saved_by_0_2(config):
    """A configuration in the layout caco_tf 0.2 saved (section caco, key caco.method)."""
    config = as_saved_by_0_3(config)
    return {("caco" if key == "method" else key): (
        {("method" if k == "name" else k): v for k, v in value.items()
         if k != "warmup_every_method"}
        if key == "method" else value) for key, value in config.items()}


def test_a_config_yaml_saved_before_the_sections_loads_in_the_new_layout(tmp_path):
    from caco_tf.config import ABSENT_MEANS, upgrade_saved_config

    path = tmp_path / "config.yaml"
    path.write_text(OLD_RUN_CONFIG)
    config = load_config(str(path), saved=True)
    assert config["method"]["name"] == "simclr" and "caco" not in config
    # 0.2's and 0.3's SimCLR ran no warm-up (it had no bank): neither does it now.
    assert config["method"]["simclr"]["warmup_epochs"] == 0
    with pytest.raises(ConfigError, match="caco.bank_size was renamed method.caco.bank_size"):
        load_config(str(path))  # as a user's configuration: refused
    old = {"name": "old", "caco": {"method": "moco_v2", "temperature": 0.3}, "train": {}}
    new = upgrade_saved_config(old)
    # The train settings added since, at what their absence meant (ABSENT_MEANS).
    added = {path[-1]: off for path, off in ABSENT_MEANS.items() if path[0] == "train"}
    assert added["clip_gradient_norm"] == 0.0 and added["weight_decay_end"] is None
    assert added["export"] is True  # every run exported before the setting
    assert new == {"name": "old", "method": {"name": "moco_v2", "moco_v2": {
        "temperature": 0.3}}, "train": added}
    assert list(new) == ["name", "method", "train"] and "caco" in old  # a copy, in order
    assert upgrade_saved_config(config) == config  # today's layout: as it is
    # A MoCo v3 run saved before its projector's layers were a setting had ResNet's 2.
    saved = {"method": {"name": "moco_v3", "moco_v3": {"temperature": 0.2}}}
    assert upgrade_saved_config(saved)["method"]["moco_v3"]["projector_layers"] == 2
    flat = {"method": {"name": "none", "bank_size": 64, "warmup_epochs": 2,
                       "warmup_every_method": True, "temperature": 0.1}}
    assert upgrade_saved_config(flat) == {"method": {"name": "none", "caco": {
        "bank_size": 64, "warmup_epochs": 2, "temperature": 0.1}}}


@pytest.mark.parametrize("saved_by", [as_saved_by_0_2, as_saved_by_0_3])
def test_resuming_a_run_folder_saved_before_the_sections_reports_no_change(tmp_path, saved_by):
    import os

    import yaml

    from caco_tf.pretrain import changes_since_backup
    from caco_tf.training.run_folder import METADATA, RunFolder

    folder = RunFolder(str(tmp_path / "run"))
    os.makedirs(folder.backup)
    with open(os.path.join(folder.backup, METADATA), "w") as handle:
        handle.write("{}")  # a backup to resume (its contents are not read here)
    same = load_config(None, ["method.caco.bank_lr=0.3"])
    with open(folder.config, "w") as handle:  # the resolved configuration, as 0.2 wrote it
        yaml.safe_dump(saved_by(same), handle, sort_keys=False)
    assert changes_since_backup(folder, same) == []
    changed = load_config(None, ["method.caco.bank_lr=0.5"])
    assert changes_since_backup(folder, changed) == ["method.caco.bank_lr: 0.3 -> 0.5"]


def test_a_run_folder_and_a_keras_file_saved_before_the_sections_load(tmp_path, monkeypatch):
    import keras
    import yaml
    from tiny_run import make_run

    from caco_tf import build
    from caco_tf.training.run_folder import RunFolder

    run_dir, _ = make_run(tmp_path / "run")
    folder = RunFolder(run_dir)
    config = yaml.safe_load(open(folder.config))
    for saved_by in (as_saved_by_0_2, as_saved_by_0_3):
        with open(folder.config, "w") as handle:
            yaml.safe_dump(saved_by(config), handle, sort_keys=False)
        run = build.load_run(run_dir)  # caco-evaluate, caco-figures and caco-export read it so
        assert run.config["method"]["caco"] == config["method"]["caco"]
        assert run.model.method == "caco"

        class Saved:  # what keras.models.load_model gives for an old .keras file
            run_settings = saved_by(config)

        path = tmp_path / "model.keras"
        path.write_text("")
        monkeypatch.setattr(keras.models, "load_model", lambda *args, **kwargs: Saved())
        assert build.load_keras_file(str(path)).config["method"]["caco"] == config["method"][
            "caco"]


def test_numbers_in_scientific_notation_are_floats(tmp_path):
    """YAML 1.1 reads 1e-4 (no dot) as a string: a float setting takes it as the number."""
    path = tmp_path / "c.yaml"
    path.write_text("train: {weight_decay: 1e-4, learning_rate: 3E-2}\n")
    config = load_config(str(path), ["method.caco.bank_lr=5e-1"])
    assert config["train"]["weight_decay"] == 1e-4 and config["train"]["learning_rate"] == 0.03
    assert load_config(None, ["train.weight_decay=5e-4"])["train"]["weight_decay"] == 5e-4
    assert isinstance(config["method"]["caco"]["bank_lr"], float) and config["method"]["caco"][
        "bank_lr"] == 0.5
    with pytest.raises(ConfigError, match="train.weight_decay must be of type float, got '5e'"):
        load_config(None, ["train.weight_decay=5e"])


def test_an_empty_configuration_file_is_refused_naming_the_file(tmp_path):
    for text in ("", "# a truncated copy: its settings are gone\n"):
        path = tmp_path / "truncated.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=f"config {path} holds no settings"):
            load_config(str(path))


def test_digit_views_at_another_size_than_the_digits_are_one_line():
    with pytest.raises(ConfigError, match="data.image_size must be 28 with data.views digits "
                                          "on data.source mnist .*, got 64"):
        load_config(None, ["data.image_size=64"])
    assert load_config(None, ["data.image_size=64", "data.views=asymmetric"])  # crops resize


def test_shipped_configurations_are_found_in_a_wheels_layout(tmp_path, monkeypatch):
    from caco_tf import config

    package = tmp_path / "site-packages" / "caco_tf"
    (package / "configs").mkdir(parents=True)
    (package / "configs" / "mnist.yaml").write_text("# the offline default\n")
    monkeypatch.setattr(config, "__file__", str(package / "config.py"))
    assert config.shipped_configs() == {"mnist": str(package / "configs" / "mnist.yaml")}
