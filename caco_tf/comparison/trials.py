"""The trials of a comparison: the same number for every method, each drawn from one search
space stated before any result is seen.

A method's search space is the encoder's learning rate (the budget's, times
``LEARNING_RATE_FACTORS``) and the setting its authors or its known failures say matters most,
which the method declares beside its others (``Setting(search=...)``), with the budget's own
value among them.  Trial 0 is the budget as given (inside the space); the others are chosen so
that every dimension takes as many of its values as the trials allow (``draw_trials``: with 3
trials, all three learning rates and all three settings), the ties of that choice broken by a
generator seeded with the comparison's seed and the method's name; the grid's other points,
in the same order, are the spares that replace a trial that fails.
"""

import itertools
import json
import random

from caco_tf.methods import METHODS
from caco_tf.nets.sizes import VIT_SHAPES

LEARNING_RATE_FACTORS = (1 / 3, 1.0, 3.0)


def comparison_methods():
    """The methods a comparison trains unless ``--methods`` names others: every registered
    method but CaCo's ablation rows (variants of CaCo's loss, which read its settings) and the
    methods of a ViT's tokens (``vit_methods``: the default budgets train ConvNets)."""
    return [name for name, cls in METHODS.items()
            if not cls.SETTINGS_OF and cls.CONSUMES == "features"]


def vit_methods():
    """The methods of a ViT's tokens (``CONSUMES``), which a comparison trains when named, on a
    ViT budget."""
    return [name for name, cls in METHODS.items() if cls.CONSUMES == "tokens"]


def search_space(method, config):
    """[(dotted key, candidate values)] of ``method`` on the budget ``config``: its declared
    values and the budget's own, sorted."""
    rate = budget_learning_rate(config)
    space = [("train.learning_rate", tuple(_round(rate * f) for f in LEARNING_RATE_FACTORS))]
    section = METHODS[method].SETTINGS_OF or method  # an ablation row reads its method's
    for key, setting in METHODS[method].SETTINGS.items():
        if setting.search:
            dotted = f"method.{section}.{key}"
            space.append((dotted, tuple(sorted(set(setting.search) | {_current(config, dotted)}))))
    return space


def max_trials(methods, config):
    """The most trials every method can have: the smallest grid's size."""
    return min(len(grid(search_space(m, config))) for m in methods)


def grid(space):
    """Every point of ``space``, a {dotted key: value} each."""
    return [dict(zip((k for k, _ in space), values))
            for values in itertools.product(*(v for _, v in space))]


def draw_trials(method, config, count, seed=0):
    """(``count`` trials of ``method``, the spares): {dotted key: value} each, trial 0 the
    budget.  Each next trial is the grid point that brings the most values not yet tried
    (then the least tried ones; then the seeded generator's pick), so that every dimension
    of ``n`` values takes min(count, n) of them; the spares are the rest of the grid in the
    same order."""
    space = search_space(method, config)
    points = grid(space)
    if count > len(points):
        raise ValueError(f"{method} has {len(points)} trials at most, {count} asked")
    first = {key: _current(config, key) for key, _ in space}
    chosen, left = [first], [p for p in points if p != first]
    generator = random.Random(f"{seed}:{method}")
    generator.shuffle(left)
    while left:
        tried = {key: [p[key] for p in chosen] for key, _ in space}
        left.sort(key=lambda p: (-sum(p[k] not in tried[k] for k in tried),
                                 sum(tried[k].count(p[k]) for k in tried)))
        chosen.append(left.pop(0))  # a stable sort: the shuffle breaks the ties
    return chosen[:count], chosen[count:]


def assignments(trial):
    """A trial as ``--set`` assignments (values as JSON, which YAML reads back)."""
    return [f"{key}={json.dumps(value)}" for key, value in trial.items()]


def fitted_rows(method, config, images):
    """Assignments that shrink ``method``'s banks and queues (``Setting(rows=True)``) to what
    one pass over ``images`` training images fills: the largest power of two below it."""
    batch = config["train"]["batch_size"]
    filled = (images // batch) * batch
    fitted, section = [], METHODS[method].SETTINGS_OF or method
    for key, setting in METHODS[method].SETTINGS.items():
        value = config["method"].get(section, {}).get(key, setting.default)
        if setting.rows and value and value > filled:
            fitted.append(f"method.{section}.{key}={1 << (max(filled, 1).bit_length() - 1)}")
    return fitted


def own_settings(method, config, typed):
    """Assignments ``method`` trains with after the budget ``config``'s: the views its authors
    use (``AUTHORS_VIEWS``), unless ``typed`` (the user's assignments, ``--views`` and ``--set``)
    names ``data.views``, which then holds for every method as typed; and the ViT options it
    needs (``VIT_OPTIONS``: DINOv2's mask token).  A setting in ``typed`` stays the user's."""
    cls, keys = METHODS[method], {assignment.split("=", 1)[0].strip() for assignment in typed}
    patch = VIT_SHAPES.get(config["model"]["backbone"], (1,))[0]
    own = {} if "data.views" in keys else cls.authors_views(config["data"]["image_size"], patch)
    own.update({f"model.{key}": value for key, value in getattr(cls, "VIT_OPTIONS", {}).items()})
    return assignments({key: value for key, value in own.items() if key not in keys})


def budget_learning_rate(config):
    """The encoder's peak learning rate of ``config``: its own, or the paper's rule's."""
    rate = config["train"]["learning_rate"]
    if rate is None:
        from caco_tf.training.optimizers import paper_learning_rate

        return paper_learning_rate(config["train"]["batch_size"], config["train"]["optimizer"])[1]
    return rate


def _current(config, key):
    if key == "train.learning_rate":
        return budget_learning_rate(config)
    _, method, setting = key.split(".")
    return config["method"].get(method, {}).get(setting, METHODS[method].SETTINGS[setting].default)


def _round(value):
    return float(f"{value:.4g}")

