"""The typed settings objects (caco_tf.run_settings): generated from the schema, so every key of
a section is a field, and a configuration's values read the same as attributes."""

import dataclasses

import pytest

from caco_tf.config import SETTINGS, load_config
from caco_tf.run_settings import SECTIONS, RunSettings, section_class


def _fields(cls, prefix=""):
    names = set()
    for field in dataclasses.fields(cls):
        if dataclasses.is_dataclass(field.type):
            names |= _fields(field.type, f"{prefix}{field.name}.")
        else:
            names.add(prefix + field.name)
    return names


@pytest.mark.parametrize("section", SECTIONS)
def test_every_setting_of_a_section_is_a_field(section):
    keys = {name[len(section) + 1:] for name in SETTINGS if name.startswith(section + ".")}
    assert keys and _fields(section_class(section)) == keys


def test_the_objects_hold_the_configurations_values_and_are_frozen():
    config = load_config(None, ["method.name=w_mse", "method.w_mse.views=4",
                                "data.views=asymmetric", "data.image_size=32"])
    settings = RunSettings.of(config)
    assert settings.data.image_size == 32 and settings.data.views == "asymmetric"
    assert settings.data.multicrop.local_size == config["data"]["multicrop"]["local_size"]
    assert settings.train.batch_size == config["train"]["batch_size"]
    assert settings.method == "w_mse" and settings.views_per_image == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.data.image_size = 64


def test_as_config_is_the_configuration_in_use():
    from caco_tf.config import in_use

    config = load_config(None, ["method.name=negative", "name=row", "train.epochs=3"])
    settings = RunSettings.of(config)
    assert settings.method_section == "caco" and settings.as_config() == in_use(config)
    assert RunSettings.of(in_use(config)) == settings
