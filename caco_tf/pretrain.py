"""From a configuration to a trained run folder: what ``train.py`` does, as a library call.

A run folder holds ``config.yaml`` (resolved), ``tensorboard/``, ``backup/`` (resume state),
``checkpoints/``, ``history.json``, ``saved_model/`` (the backbone, TF Serving layout) and
``results.json``.
"""

import json
import os

import keras
import numpy as np
import yaml

from caco_tf import augment, backbones, callbacks, data, evaluation, export, optimizers
from caco_tf.config import ConfigError
from caco_tf.model import CaCo


def load_data(config):
    """The training images (unlabelled for pre-training) and the evaluation split, if any."""
    source = config["data"]["source"]
    if source in ("mnist", "mnist_validation"):
        split = (data.load_offline_mnist() if source == "mnist"
                 else data.load_offline_mnist_validation())
        return split["train"], split["test"]
    if source.startswith("npz:"):
        path = source[4:]
        if not os.path.exists(path):
            raise data.DataError(f"data path not found: {path}")
        images, labels = data.load_numpy(path)
        return (images, labels), None
    raise ConfigError(f"data.source must be 'mnist', 'mnist_validation' or 'npz:PATH', "
                      f"got {source!r}")


def build_views(config):
    if config["data"]["views"] == "digits":
        return augment.DigitViews()
    raise ConfigError(f"data.views must be 'digits', got {config['data']['views']!r}")


def build_model(config, steps_per_epoch):
    """The CaCo model, compiled with the paper's optimizer and schedules for this run."""
    model_config, caco, train = config["model"], config["caco"], config["train"]
    size, channels = config["data"]["image_size"], config["data"]["channels"]
    backbone = backbones.build_backbone(model_config["backbone"], (size, size, channels),
                                        sync_batchnorm=model_config["sync_batchnorm"])
    projector = backbones.build_projector(
        backbone.output_shape[-1], model_config["projector_hidden"],
        model_config["embedding_dim"], sync_batchnorm=model_config["sync_batchnorm"])
    total_steps = train["epochs"] * steps_per_epoch
    model = CaCo(
        backbone, projector,
        bank_size=caco["bank_size"],
        temperature=caco["temperature"],
        bank_temperature=caco["bank_temperature"],
        bank_learning_rate=optimizers.WarmupCosine(caco["bank_lr"], total_steps),
        bank_momentum=caco["bank_momentum"],
        key_momentum=optimizers.CosineMomentum(caco["key_momentum"], total_steps),
        warmup_steps=caco["warmup_epochs"] * steps_per_epoch,
        warmup_temperature=caco["warmup_temperature"],
        resync_after_warmup=caco["resync_after_warmup"])
    model.compile(
        optimizer=optimizers.build_encoder_optimizer(
            train["batch_size"], total_steps, train["lr_warmup_epochs"] * steps_per_epoch,
            optimizer=train["optimizer"], learning_rate=train["learning_rate"],
            weight_decay=train["weight_decay"], momentum=train["momentum"]),
        jit_compile=train["jit_compile"])
    return model


def check_sizes(config, num_images):
    batch, bank = config["train"]["batch_size"], config["caco"]["bank_size"]
    if batch > num_images:
        raise data.DataError(f"train.batch_size {batch} is larger than the data set "
                             f"({num_images} images)")
    # One pass writes one key per image of its full batches: the bank holds distinct images
    # only if it is no larger than that (later warm-up epochs overwrite rows, FIFO).
    filled = (num_images // batch) * batch
    if config["caco"]["warmup_epochs"] > 0 and bank > filled:
        raise data.DataError(
            f"caco.bank_size {bank} is larger than the data set at initialization: one pass "
            f"fills {filled} rows from {num_images} images in batches of {batch}")


def run(config, run_dir, verbose=1):
    """Pre-train (resuming if ``run_dir`` holds a backup), evaluate and export. Returns results."""
    keras.utils.set_random_seed(config["train"]["seed"])
    (train_images, train_labels), held_out = load_data(config)
    check_sizes(config, len(train_images))
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "config.yaml"), "w") as handle:
        yaml.safe_dump(config, handle, sort_keys=False)

    batch = config["train"]["batch_size"]
    steps_per_epoch = len(train_images) // batch
    views = build_views(config)
    model = build_model(config, steps_per_epoch)
    dataset = data.pretrain_dataset(train_images, batch, views, seed=config["data"]["seed"])
    model.fit(dataset, epochs=config["train"]["epochs"], steps_per_epoch=steps_per_epoch,
              shuffle=False,  # the dataset shuffles itself, once per epoch
              verbose=verbose, callbacks=[
                  callbacks.resumable(run_dir),
                  callbacks.HistoryJSON(os.path.join(run_dir, "history.json")),
                  keras.callbacks.TensorBoard(os.path.join(run_dir, "tensorboard")),
                  keras.callbacks.ModelCheckpoint(
                      os.path.join(run_dir, "checkpoints", "last.weights.h5"),
                      save_weights_only=True)])

    results = {"epochs": config["train"]["epochs"]}
    if held_out is not None and train_labels is not None:
        results["knn_top1"] = knn_top1(model.backbone, views, config, train_images,
                                       train_labels, *held_out)
    results["saved_model"] = export.export_backbone(
        model.backbone, os.path.join(run_dir, "saved_model"), config["data"]["image_size"],
        config["data"]["channels"], views.mean, views.std, embedder=model.query_encoder)
    with open(os.path.join(run_dir, "results.json"), "w") as handle:
        json.dump(results, handle, indent=1)
    return results


def knn_top1(backbone, views, config, train_images, train_labels, test_images, test_labels):
    """Held-out weighted kNN top-1 (%) against the training images, per the config."""
    batch = config["evaluation"]["batch_size"]
    train_features = evaluation.extract_features(
        backbone, data.eval_dataset(train_images, batch, views.normalize))
    test_features = evaluation.extract_features(
        backbone, data.eval_dataset(test_images, batch, views.normalize))
    accuracy = evaluation.knn_accuracy(
        train_features, np.asarray(train_labels), test_features, np.asarray(test_labels),
        k=config["evaluation"]["knn_k"], temperature=config["evaluation"]["knn_temperature"])
    return 100.0 * accuracy
