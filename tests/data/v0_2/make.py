"""How the files of this folder were made: by caco_tf 0.2.0 (commit cf75f45), before the bank and
the key encoder got their own components and the ``caco`` settings section became ``method``.

    git worktree add /tmp/v0_2 cf75f45 && cd /tmp/v0_2
    PYTHONPATH=. python tests/data/v0_2/make.py OUT   # then copy OUT's files here

``run/``: a two-epoch CaCo run folder (config.yaml, checkpoints/, backup/, history.json,
model.keras); ``simclr.keras``: an untrained SimCLR model, which then carried a bank and a key
encoder.  ``tests/test_old_files.py`` loads them with today's code.
"""

import os
import shutil
import subprocess
import sys

TINY = ["model.widths=[4,8,8,8]", "model.projector_hidden=16", "model.embedding_dim=8",
        "caco.bank_size=64", "train.batch_size=32", "train.epochs=2", "caco.warmup_epochs=1",
        "evaluation.knn_monitor_every=0", "evaluation.health_images=0",
        "evaluation.knn_train_images=500", "evaluation.knn_test_images=200"]


def main(out):
    run = os.path.join(out, "run")
    command = [sys.executable, "train.py", "--quiet", "--run-dir", run]
    for setting in TINY:
        command += ["--set", setting]
    subprocess.run(command, check=True)
    shutil.rmtree(os.path.join(run, "saved_model"))
    shutil.rmtree(os.path.join(run, "tensorboard"))

    import keras

    from caco_tf import build
    from caco_tf.config import load_config

    keras.utils.set_random_seed(0)
    config = load_config(None, TINY + ["caco.method=simclr"])
    build.build_model(config, steps_per_epoch=1).save(os.path.join(out, "simclr.keras"))


if __name__ == "__main__":
    main(sys.argv[1])
