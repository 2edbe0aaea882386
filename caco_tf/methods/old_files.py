"""The ``.keras`` files of older caco_tf versions, read in this version's terms: where they held
a method's variables and arguments elsewhere (tests/test_old_files.py loads them)."""


def bank_rows_of_0_2(model, store):
    """Whether ``store`` (the model's own variables in a file) is a caco_tf 0.2 file's, which
    kept the bank's three variables there: they go to ``memory_bank``, which loads them next
    (or are left aside, for a method without a bank)."""
    if len(store.keys()) != 3:
        return False
    if model.memory_bank is not None:
        model.memory_bank._rows_saved_by_owner = [store[str(i)] for i in range(3)]
    return True


def upgrade_arguments(cls, config, common_arguments):
    """A ``.keras`` file's arguments in this version's terms: caco_tf 0.3 gave every method
    CaCo's (bank, temperatures, warm-up, ``warmup_every_method``); those a method does not
    take are left aside, and a method without a bank ran no warm-up without that switch.
    ``common_arguments``: those every method takes besides its own settings."""
    if "warmup_every_method" in config:
        every = config.pop("warmup_every_method")
        if not every and config.get("warmup_steps") and not getattr(cls, "BANK", False):
            config["warmup_steps"] = 0
    known = set(cls.argument_defaults()) | set(common_arguments) | {"name", "backbone",
                                                                   "projector"}
    return {key: value for key, value in config.items() if key in known}
