"""The errors a user can fix.  Every command turns one into a single ``error: ...`` line
(``caco_tf.cli``): exit status 2 for a mistake, 74 for a write that failed, 75 for a lost peer;
the message says what was wrong, the value, and what is allowed or what to do."""


class UserError(ValueError):
    """A problem the user can fix: a setting, a path, a file."""


class ConfigError(UserError):
    """A configuration or command-line setting that is unknown, of the wrong type or out of
    range."""


class DataError(UserError):
    """A data problem: a missing path, an empty set, a batch larger than the data..."""


class ExtractionError(UserError):
    """A feature-extraction problem: a missing model or source, an unknown signature..."""


class CheckpointError(UserError):
    """A PyTorch checkpoint that cannot be imported: unreadable, another architecture, a key
    missing or of the wrong shape."""


class StateError(UserError):
    """A file a command keeps its state in (a comparison's plan, a run's record) that cannot be
    read: empty, cut short, not JSON; the message names it and what to do."""
