"""caco-tf's functions are traced as written: TensorFlow's autograph does not rewrite them.

``tf.function`` and every ``tf.data`` map run autograph on the Python functions they trace, and
autograph re-parses the source of each function they call, in every process: a quarter of a
short run's time went there (the tests' tiny runs: 41 s → 31 s).  Nothing in caco-tf needs it:
its loops over tensors are ``tf.while_loop``, its branches ``tf.cond``.  Importing this module
adds caco-tf to autograph's list of packages it leaves alone (as it leaves TensorFlow and
Keras); a user's own functions are converted as before.  The rule covers the functions a trace
calls, not the one ``tf.function`` traces: caco-tf's own ``tf.function`` say ``autograph=False``.
If a TensorFlow release moves the list, nothing breaks: tracing is slower.
"""

import tensorflow as tf  # noqa: F401  (autograph's rules are read once TensorFlow is imported)

try:
    from tensorflow.python.autograph.core import config as _autograph_config

    _RULE = _autograph_config.DoNotConvert("caco_tf")
    if all(getattr(rule, "_prefix", None) != "caco_tf"
           for rule in _autograph_config.CONVERSION_RULES):
        _autograph_config.CONVERSION_RULES = (_RULE,) + tuple(
            _autograph_config.CONVERSION_RULES)
except (ImportError, AttributeError):  # a TensorFlow without the list: autograph converts
    pass
