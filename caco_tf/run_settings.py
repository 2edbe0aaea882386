"""A run's settings as typed objects: one frozen object per section of a validated
configuration (``data``, ``model``, ``train``, ``evaluation``, ``distribute``), whose fields are
the schema's keys (``caco_tf.config.SETTINGS``) with their types, a nested group (``data.multicrop``)
a nested object.  The classes are generated from the schema, so they cannot drift from it.

``RunSettings.of(config)`` builds them once a run; a builder takes the sections it reads
(``build.load_data(settings.data)``), not the whole configuration.  The method's own section
travels in ``build.RunPlan`` (``plan.settings``), which also derives what spans sections.
"""

import dataclasses
import functools
import typing

from caco_tf import config as config_lib

SECTIONS = ("data", "model", "train", "evaluation", "distribute")


@functools.lru_cache(maxsize=None)
def section_class(*path):
    """The frozen dataclass of the section at ``path`` (``("data",)``, ``("data",
    "multicrop")``): a field per setting, in the schema's order (Optional when its default is
    derived), and a nested class per group."""
    prefix = ".".join(path) + "."
    fields, groups = [], set()
    for name, setting in config_lib.SETTINGS.items():
        if not name.startswith(prefix):
            continue
        key, *rest = name[len(prefix):].split(".")
        if rest:
            if key not in groups:
                groups.add(key)
                fields.append((key, section_class(*path, key)))
        else:
            fields.append((key, typing.Optional[setting.type] if setting.default is None
                           else setting.type))
    name = "".join(part.replace("_", " ").title().replace(" ", "") for part in path)
    return dataclasses.make_dataclass(f"{name}Settings", fields, frozen=True,
                                      namespace={"__module__": __name__})


def section(config, *path):
    """The typed object of ``config``'s section at ``path`` (a validated configuration)."""
    values = config
    for part in path:
        values = values[part]
    cls = section_class(*path)
    return cls(**{field.name: (section(config, *path, field.name)
                               if dataclasses.is_dataclass(field.type) else values[field.name])
                  for field in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """Every section of a run's configuration as typed objects (``section``), and the method's
    name; built once a run (``of``)."""

    data: typing.Any
    model: typing.Any
    train: typing.Any
    evaluation: typing.Any
    distribute: typing.Any
    name: str                   # the run's name (its folder: runs/<name>)
    method: str                 # method.name
    method_section: str         # its settings are method.<method_section> (CaCo's: ablation rows)
    method_settings: dict       # that section, by key (each method's keys differ)
    views_per_image: int        # the method's crops (``Method.CROPS``): K equal views

    @classmethod
    def of(cls, config):
        from caco_tf.methods import model_class

        name = config["method"]["name"]
        own = config_lib.settings_section(name)
        return cls(**{part: section(config, part) for part in SECTIONS}, name=config["name"],
                   method=name, method_section=own, method_settings=dict(config["method"][own]),
                   views_per_image=model_class(name).view_count(config["method"][own]))

    def as_config(self):
        """The configuration these settings were built from, as a nested dict with only the
        method section the run reads (``config.in_use``): what a model keeps as its record
        (``Method.run_settings``, in its ``.keras`` file)."""
        tree = {"name": self.name}
        for part in SECTIONS:
            tree[part] = dataclasses.asdict(getattr(self, part))
        tree["method"] = {"name": self.method, self.method_section: dict(self.method_settings)}
        return tree
