"""The trials of a comparison: the same number for every method, each drawn from one search
space stated before any result is seen.

A method's search space is the encoder's learning rate (the budget's, times
``LEARNING_RATE_FACTORS``) and the setting its authors or its known failures say matters most,
which the method declares beside its others (``Setting(search=...)``).  Trial 0 is the budget as
given (the configuration's own values); the others are drawn without replacement from the
rest of the grid by a generator seeded with the comparison's seed and the method's name.
"""

import itertools
import json
import random

from caco_tf.methods import METHODS

LEARNING_RATE_FACTORS = (1 / 3, 1.0, 3.0)


def comparison_methods():
    """The methods a comparison trains: every registered method but CaCo's ablation rows
    (variants of CaCo's loss, which read its settings)."""
    return [name for name, cls in METHODS.items() if not cls.SETTINGS_OF]


def search_space(method, config):
    """[(dotted key, candidate values)] of ``method`` on the budget ``config``."""
    rate = budget_learning_rate(config)
    space = [("train.learning_rate", tuple(_round(rate * f) for f in LEARNING_RATE_FACTORS))]
    for key, setting in METHODS[method].SETTINGS.items():
        if setting.search:
            space.append((f"method.{method}.{key}", setting.search))
    return space


def max_trials(methods, config):
    """The most trials every method can have: the smallest grid's size (trial 0 may lie
    outside its grid, so one grid point can duplicate it)."""
    return min(len(list(itertools.product(*(v for _, v in search_space(m, config)))))
               for m in methods)


def draw_trials(method, config, count, seed=0):
    """``count`` trials of ``method``: each a {dotted key: value} of its search space's keys."""
    space = search_space(method, config)
    first = {key: _current(config, key) for key, _ in space}
    grid = [dict(zip((k for k, _ in space), values))
            for values in itertools.product(*(v for _, v in space))]
    others = [point for point in grid if point != first]
    if count - 1 > len(others):
        raise ValueError(f"{method} has {len(others) + 1} trials at most, {count} asked")
    return [first] + random.Random(f"{seed}:{method}").sample(others, count - 1)


def assignments(trial):
    """A trial as ``--set`` assignments (values as JSON, which YAML reads back)."""
    return [f"{key}={json.dumps(value)}" for key, value in trial.items()]


def fitted_rows(method, config, images):
    """Assignments that shrink ``method``'s banks and queues (``Setting(rows=True)``) to what
    one pass over ``images`` training images fills: the largest power of two below it."""
    batch = config["train"]["batch_size"]
    filled = (images // batch) * batch
    fitted = []
    for key, setting in METHODS[method].SETTINGS.items():
        value = config["method"].get(method, {}).get(key, setting.default)
        if setting.rows and value and value > filled:
            fitted.append(f"method.{method}.{key}={1 << (max(filled, 1).bit_length() - 1)}")
    return fitted


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

