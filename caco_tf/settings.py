"""A setting's declaration: ``Setting`` (its default, what it accepts, what it does) and the
rules that say what a value may be.

The lowest floor of the configuration: the run's settings (``caco_tf.config``) and each
method's ``SETTINGS`` (``caco_tf.methods``) are declared with these, so neither imports the
other to declare its own.  Pure Python, no TensorFlow.
"""


class Rule:
    """What one key accepts: ``check(value)`` and the words that say it (``allowed``)."""

    def __init__(self, check, allowed):
        self.check, self.allowed = check, allowed


def is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def integer(low=None, high=None):
    words = ("an integer" + (f" >= {low}" if low is not None else "")
             + (f" and <= {high}" if high is not None else ""))
    return Rule(lambda v: is_int(v) and (low is None or v >= low)
                and (high is None or v <= high), words)


def number(low=None, high=None, low_open=False, high_open=False):
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {high:g}")

    def check(v):
        return is_number(v) and v == v and (
            low is None or (v > low if low_open else v >= low)) and (
            high is None or (v < high if high_open else v <= high))
    return Rule(check, "a number " + " and ".join(parts) if parts else "a number")


def choice(*values):
    return Rule(lambda v: v in values, "one of " + ", ".join(str(v) for v in values))


def boolean():
    return Rule(lambda v: isinstance(v, bool), "true or false")


def optional(rule, meaning):
    return Rule(lambda v: v is None or rule.check(v), f"{rule.allowed}, or null ({meaning})")


def span(low, high=None, positive_low=False):
    """[low, high] with bounds, as the crop scales and blur range."""
    bound = f" <= {high:g}" if high is not None else ""
    first = "0 < low" if positive_low else "0 <= low"

    def check(v):
        return (isinstance(v, list) and len(v) == 2 and all(is_number(x) for x in v)
                and (v[0] > low if positive_low else v[0] >= low) and v[0] <= v[1]
                and (high is None or v[1] <= high))
    return Rule(check, f"[low, high] with {first} <= high{bound}")


def text(pattern_words, check=lambda v: True):
    return Rule(lambda v: isinstance(v, str) and check(v), pattern_words)


def is_service_address(value):
    """Whether ``value`` is empty or a dispatcher's HOST:PORT (``grpc://`` allowed)."""
    host, _, port = str(value).removeprefix("grpc://").rpartition(":")
    return value == "" or (bool(host) and port.isdigit() and 0 < int(port) < 65536)


class Setting:
    """One key of a run, declared once: its default, what it accepts (``rule``, a ``Rule``) and
    what it does (``help``, one line).  A default of None means "derived" (the rule's
    ``optional`` says from what); ``derived`` is then the type a given value must have, as the
    default's type is otherwise.

    A method's setting is also its constructor's argument (``caco_tf.build.build_model`` passes
    it): ``argument`` names it when the names differ, ``passed=False`` keeps it for the build
    only (the warm-up's length); ``in_steps`` names the argument of a setting counted in epochs,
    which takes steps.  ``schedule``: the setting is a per-step quantity, and a number is the
    start of that shape over the run (``SCHEDULES``), or a mapping ``{start, end, epochs,
    shape}`` says the whole schedule (``caco_tf.training.optimizers.schedule``).

    ``trained``: the setting shapes what is trained (a bank's rows, a head's width), so a resume
    refuses a change of it (the checkpoint holds the old shapes).  ``tiny``: its value in the
    test suite's tiny models (``tests/tiny_methods.py``), where the default is too large or too
    slow there.

    ``search``: the values a comparison tries for this setting (``caco_tf.comparison``): the
    setting its authors or its known failures say matters most, declared by the method beside
    the others.  ``rows``: the setting counts images a bank or queue holds, which a comparison
    fits to the images it has."""

    def __init__(self, default, rule, help, derived=None, schedule=None, argument=None,
                 in_steps=None, passed=True, trained=False, tiny=None, search=None, rows=False):
        if (default is None) != (derived is not None):
            raise TypeError("a default of None needs derived=TYPE, and only such a default")
        if schedule is not None and schedule not in SCHEDULES:
            raise TypeError(f"schedule must be one of {', '.join(SCHEDULES)}")
        self.default, self.help = default, help
        self.rule = per_step(rule) if schedule else rule
        self.type = derived if default is None else type(default)
        self.schedule, self.in_steps, self.passed = schedule, in_steps, passed
        self.argument = in_steps or argument
        self.trained, self.tiny = trained, tiny
        if search is not None and not all(rule.check(value) for value in search):
            raise TypeError(f"every searched value must be {rule.allowed}: {search}")
        self.search, self.rows = tuple(search) if search else None, rows


# What a number given for a per-step setting means: the value throughout, or the start of a
# cosine over the whole run towards 0 (a learning rate) or towards 1 (an EMA momentum).
SCHEDULES = ("constant", "cosine to 0", "cosine to 1")
SCHEDULE_KEYS = ("start", "end", "epochs", "shape")


def per_step(rule):
    """``rule``'s numbers, or a schedule ``{start, end, epochs, shape}`` of them: from ``start``
    to ``end`` over the first ``epochs`` (the whole run when absent) on a ``shape`` (linear
    or cosine, default linear), ``end`` after."""

    def check(v):
        if not isinstance(v, dict):
            return rule.check(v)
        return (set(v) <= set(SCHEDULE_KEYS) and {"start", "end"} <= set(v)
                and rule.check(v["start"]) and rule.check(v["end"])
                and (v.get("epochs") is None or (is_number(v["epochs"]) and v["epochs"] > 0))
                and v.get("shape", "linear") in ("linear", "cosine"))
    return Rule(check, f"{rule.allowed}, or a schedule {{start, end, epochs, shape: linear or "
                       f"cosine}} of such numbers")
