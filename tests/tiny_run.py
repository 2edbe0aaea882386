"""A tiny run folder for the evaluation CLI and figure tests (no training: initial weights).

Its data source is ``tfds:mnist``, which tests serve with ``tfds.testing.mock_data`` (random
28×28 digits and labels, ``train`` and ``test`` splits, nothing downloaded).
"""

import json
import os

import keras
import yaml

from caco_tf import build
from caco_tf.config import load_config
from caco_tf.training.run_folder import RunFolder

OVERRIDES = ["data.source=tfds:mnist", "model.projector_hidden=32", "model.embedding_dim=16",
             "method.caco.bank_size=32", "method.caco.warmup_epochs=1", "train.epochs=4",
             "train.batch_size=16", "evaluation.batch_size=32", "evaluation.knn_k=3"]


def offline_digits(folder, train, held_out):
    """The first ``train`` offline training digits and ``held_out`` held-out ones as
    ``folder``/train.npz and test.npz (images and labels): their paths, for ``npz:`` sources."""
    import numpy as np

    from caco_tf.data import load_offline_mnist
    split, paths = load_offline_mnist(), []
    for name, count in (("train", train), ("test", held_out)):
        images, labels = split[name]
        paths.append(os.path.join(str(folder), f"{name}.npz"))
        np.savez(paths[-1], images=images[:count], labels=labels[:count])
    return paths


def make_run(directory, history=None, overrides=()):
    """config.yaml, checkpoints/last.weights.h5 and (optionally) history.json in ``directory``;
    ``overrides``: more ``--set`` assignments."""
    keras.utils.set_random_seed(0)
    config = load_config(None, OVERRIDES + list(overrides))
    folder = RunFolder(str(directory))
    os.makedirs(os.path.dirname(folder.checkpoint), exist_ok=True)
    with open(folder.config, "w") as handle:
        yaml.safe_dump(config, handle, sort_keys=False)
    model = build.build_model(config, steps_per_epoch=1)
    model.save_weights(folder.checkpoint)
    if history is not None:
        with open(folder.history, "w") as handle:
            json.dump(history, handle)
    return str(directory), model
