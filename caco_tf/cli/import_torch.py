"""Turn a published PyTorch CaCo checkpoint into a caco-tf run folder (``caco-import-torch``,
``python export/import_torch.py``).

    caco-import-torch CHECKPOINT.pth.tar --out RUN_DIR \\
        [--config configs/imagenet_resnet50_b1024.yaml] [--set key=value ...] \\
        [--steps-per-epoch N] [--saved-model] [--trust-pickle]

Writes RUN_DIR/config.yaml (the config, with the projector and bank sizes read from the
checkpoint), checkpoints/last.weights.h5 (query and key encoders, BatchNorm statistics, bank and
bank momentum), import.json (where it came from), backup/ (so ``caco-train --config
RUN_DIR/config.yaml --run-dir RUN_DIR`` continues from the checkpoint's epoch; written when the
steps per epoch are known: ``--steps-per-epoch`` or an ImageNet source) and, with
``--saved-model``, saved_model/backbone/1 (TF Serving, ImageNet normalization).  DINO's,
DINOv2's and MoCo v3's ViT checkpoints import their backbone (``import_vit_checkpoint``: the run evaluates,
exports and draws attention maps; default configuration the method's ViT-S recipe).  Needs torch
(``pip install "caco-tf[torch]"``).  Mapping and checks: ``caco_tf/serving/torch_import.py``.
"""

import json
import os

from caco_tf import cli

DEFAULT_CONFIG = "imagenet_resnet50_b1024"  # a shipped configuration


def parse_args(argv):
    parser = cli.ArgumentParser(prog="caco-import-torch",
                                     description="Import a PyTorch CaCo checkpoint.")
    parser.add_argument("checkpoint", help="the authors' checkpoint (.pth.tar): CaCo's, or "
                                           "DINO's, DINOv2's or MoCo v3's ViT")
    parser.add_argument("--out", required=True, help="run folder to write (must hold no run)")
    parser.add_argument("--config", default=DEFAULT_CONFIG,
                        help="run config to build the model and resume with "
                             "(default: imagenet_resnet50_b1024)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config key, as in caco-train")
    parser.add_argument("--steps-per-epoch", type=int,
                        help="training steps per epoch, to resume at the right step "
                             "(default: from the data source's size, when known)")
    parser.add_argument("--saved-model", action="store_true",
                        help="also export saved_model/backbone/1 for serving")
    parser.add_argument("--trust-pickle", action="store_true",
                        help="let torch.load run pickled code (trusted files only)")
    cli.verbose_argument(parser)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    cli.start(["--verbose"] if args.verbose else [])
    return cli.guard(lambda: import_checkpoint(args))


def import_checkpoint(args):
    """The command's work: check, import into a fresh model, then write the run folder."""
    from caco_tf.build import build_model
    from caco_tf.errors import ConfigError
    from caco_tf.serving import torch_import
    from caco_tf.config import load_config
    from caco_tf.training.run_folder import RunFolder

    folder = RunFolder(args.out)
    for used in (folder.checkpoint, folder.backup):
        if os.path.exists(used):
            raise ConfigError(f"{args.out} already holds a run ({used}); choose another --out")
    if args.steps_per_epoch is not None and args.steps_per_epoch < 1:
        raise ConfigError(f"--steps-per-epoch must be at least 1, got {args.steps_per_epoch}")
    checkpoint = torch_import.load_checkpoint(args.checkpoint, args.trust_pickle)
    vit_state = torch_import.vit_backbone_state(checkpoint)
    if vit_state is not None:
        return import_vit_checkpoint(args, vit_state, folder)
    sizes = torch_import.checkpoint_sizes(checkpoint)
    config = load_config(args.config, [*args.set, *(
        f"{section}.{key}={sizes[key]}" for section, key in (
            ("model", "projector_hidden"), ("model", "embedding_dim"),
            ("method.caco", "bank_size")))])
    model = build_model(config, steps_per_epoch=1)
    info = torch_import.import_checkpoint(model, checkpoint)

    import yaml
    os.makedirs(os.path.dirname(folder.checkpoint), exist_ok=True)
    with open(folder.config, "w") as handle:
        yaml.safe_dump(config, handle, sort_keys=False)

    steps = args.steps_per_epoch
    source_size = torch_import.TRAIN_SET_SIZES.get(config["data"]["source"])
    if steps is None and source_size is not None:
        steps = source_size // config["train"]["batch_size"]  # full batches, as the reference
    record = {"checkpoint": os.path.abspath(args.checkpoint), **info, **sizes}
    if steps is not None and info["epoch"] is not None:
        record["resume_epoch"], step = torch_import.resume_point(config, info["epoch"], steps)
        model.optimizer.iterations.assign(step)
        record["resume_step"] = step
    model.save_weights(folder.checkpoint)
    if "resume_epoch" in record:  # the resume state caco-train reads, as training writes it
        folder.write_backup(model, record["resume_epoch"], 0, steps)
    _finish_record(args, model, config, folder, record)

    print(f"imported {info['tensors']} tensors (epoch {info['epoch']}) into "
          f"{os.path.abspath(args.out)}")
    if "resume_epoch" not in record:
        print("no backup/ written (steps per epoch unknown: pass --steps-per-epoch to make "
              "caco-train continue from this checkpoint)")
    return 0


def _finish_record(args, model, config, folder, record):
    """With ``--saved-model``, the backbone for serving (ImageNet normalization); then
    import.json, the import's record."""
    if args.saved_model:
        from caco_tf.serving import export, torch_import
        record["saved_model"] = export.export_backbone(
            model.backbone, folder.saved_model, config["data"]["image_size"],
            config["data"]["channels"], torch_import.IMAGENET_MEAN, torch_import.IMAGENET_STD,
            embedder=model.query_encoder)
    with open(folder.import_record, "w") as handle:
        json.dump(record, handle, indent=1)


def import_vit_checkpoint(args, vit_state, folder):
    """A DINO, DINOv2 or MoCo v3 ViT checkpoint: its backbone into the student's and the teacher's
    backbones of a fresh model of the configuration (the heads stay initialized), written as a
    run folder that evaluates, exports and draws attention maps (it does not resume)."""
    import keras
    import yaml

    from caco_tf.build import build_model
    from caco_tf.config import load_config
    from caco_tf.serving import torch_import

    tensors, prefix, what = vit_state
    name = args.config
    if name == DEFAULT_CONFIG:  # --config not given: the method's own ViT recipe
        name = ("moco_v3_imagenet_vit_small" if prefix.startswith("state_dict.")
                else "dino_imagenet_vit_small16")
    backbone = torch_import.vit_preset_of(tensors, prefix)
    # DINOv2's LayerScale, registers, mask token and table size, read from the tensors first:
    # the user's --set come after and win.
    image_size = load_config(name, args.set)["data"]["image_size"]
    config = load_config(name, [f"model.backbone={backbone}",
                                *torch_import.vit_settings_of(tensors, image_size), *args.set])
    model = build_model(config, steps_per_epoch=1)
    teachers = [layer for layer in (model.key_encoder.layers if model.key_encoder else [])
                if isinstance(layer, keras.Model)][:1]
    count = torch_import.import_vit_backbone([model.backbone, *teachers], tensors, prefix)

    os.makedirs(os.path.dirname(folder.checkpoint), exist_ok=True)
    with open(folder.config, "w") as handle:
        yaml.safe_dump(config, handle, sort_keys=False)
    model.save_weights(folder.checkpoint)
    record = {"checkpoint": os.path.abspath(args.checkpoint), "layout": what,
              "backbone": backbone, "config": name, "tensors": count}
    _finish_record(args, model, config, folder, record)
    print(f"imported {count} tensors of {what} as {backbone} into "
          f"{os.path.abspath(args.out)} (configuration {name}; the heads are not imported: "
          f"the run evaluates, exports and draws attention maps, it does not resume)")
    return 0


def console():
    """``caco-import-torch``: ``main()``, then the process ends at once (``cli.exit_after``)."""
    cli.exit_after(main)


if __name__ == "__main__":
    console()
