"""What a pre-training run is made of besides the method: configuration, optimizers and
schedules, callbacks (history, resume, precise BatchNorm), and ``tf.distribute`` helpers.

- ``config``: ``SETTINGS`` (every key of a run, declared once), YAML files and ``--set`` on
  top, validation;
- ``optimizers``: LARS (PyTorch semantics), the warm-up + cosine schedule, the EMA momentum;
- ``callbacks``: ``HistoryJSON``, ``Resume``, ``PreciseBatchNorm``;
- ``distribute``: strategies for a run, and assigning state from inside a mirrored step.
"""
