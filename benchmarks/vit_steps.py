"""The ViT-S/16 step of DINO and MoCo v3 against ResNet-50's for the same method, interleaved.

    python benchmarks/vit_steps.py [--batch 8] [--rounds 3] [--output BENCHMARKS.md]

Each method's two ImageNet recipes as shipped (``configs/dino_imagenet_{resnet50,vit_small16}``
with DINO's 2×224 + 10×96 crops, ``configs/moco_v3_imagenet_{resnet50,vit_small}`` with 2×224),
float32, no XLA, one device, one step of each model in turn each round (the order reversed
every other round).  FLOPs are counted for the backbones only (the heads are the recipes' own
and alike within a method): the student's forward on every crop three times (forward and
backward) and the teacher's forward on the two global crops; ResNet-50 by
``nets.profiling.forward_flops``, the ViT by ``nets.vit.flops_per_image``.  The attention's
share (q·kᵀ and the weights times v, 2·N²·D a block, computed with two einsums that XLA fuses
with their neighbours) is given against the blocks' matmuls at each crop size.
"""

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

TITLE = "## ViT-S/16 against ResNet-50: DINO's and MoCo v3's steps"
COMMON = ["model.sync_batchnorm=false", "train.jit_compile=false", "train.steps_per_execution=1",
          "train.precision=float32"]
MODELS = {  # label: (method, configuration, crops)
    "DINO, ResNet-50": ("dino", "dino_imagenet_resnet50", (224, 96)),
    "DINO, ViT-S/16": ("dino", "dino_imagenet_vit_small16", (224, 96)),
    "MoCo v3, ResNet-50": ("moco_v3", "moco_v3_imagenet_resnet50", (224, None)),
    "MoCo v3, ViT-S/16": ("moco_v3", "moco_v3_imagenet_vit_small", (224, None)),
}
LOCAL_CROPS = 10  # DINO's ViT recipe of the paper's Table: 2×224 + 10×96
TINY = {"DINO, ViT-S/16": ("dino", "dino_imagenet_vit_small16", (32, 16)),
        "DINO, ResNet-50": ("dino", "dino_imagenet_resnet50", (32, 16))}
TINY_SETTINGS = ["model.backbone=vit_micro_patch4", "method.dino.out_dim=64",
                 "model.projector_hidden=32", "model.embedding_dim=16"]


def build(label, method, name, sizes, batch, tiny):
    import keras
    import numpy as np
    import tensorflow as tf

    from caco_tf import build_model, load_config

    size, local = sizes
    extra = [f"train.batch_size={batch}", f"data.image_size={size}"]
    if local:
        extra += [f"data.multicrop.local_size={local}",
                  f"data.multicrop.local_crops={2 if tiny else LOCAL_CROPS}"]
    if tiny:
        extra += TINY_SETTINGS if "ViT" in label else [
            "model.backbone=small_convnet", "model.widths=[8, 16, 32, 64]", "model.pool_grid=1",
            "method.dino.out_dim=64", "model.projector_hidden=32", "model.embedding_dim=16"]
    config = load_config(name, COMMON + extra)
    keras.utils.set_random_seed(0)
    model = build_model(config, steps_per_epoch=1000)
    sizes_of_crops = [size] * 2 + ([local] * (2 if tiny else LOCAL_CROPS) if local else [])
    rng = np.random.default_rng(0)
    crops = tuple(tf.constant(rng.normal(size=(batch, s, s, 3)).astype("float32"))
                  for s in sizes_of_crops)
    return model, crops, config


def backbone_flops(config, size):
    """Forward FLOPs of one image of side ``size`` through the configuration's backbone."""
    from caco_tf.nets import backbones, profiling, vit

    name = config["model"]["backbone"]
    if vit.is_vit(name):
        return vit.flops_per_image(name, size)
    return profiling.forward_flops(backbones.build_backbone(name, (size, size, 3),
                                                            widths=config["model"]["widths"]))


def step_flops(crops, config):
    sizes = [int(c.shape[1]) for c in crops]
    batch = int(crops[0].shape[0])
    student = sum(backbone_flops(config, s) for s in sizes)
    teacher = sum(backbone_flops(config, s) for s in sizes[:2])
    return batch * (3 * student + teacher)


def main(argv=None):
    import tensorflow as tf

    from caco_tf.nets import vit

    argv = sys.argv[1:] if argv is None else argv
    parser = _harness.parser(__doc__)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    models = TINY if args.tiny else MODELS
    if args.tiny:
        args.batch, args.rounds = 2, 1
    start = time.time()
    runs, flops = {}, {}
    for label, (method, name, sizes) in models.items():
        model, crops, config = build(label, method, name, sizes, args.batch, args.tiny)
        function = model.make_train_function()
        function([crops])  # traces
        runs[label] = lambda f=function, b=[crops]: tf.nest.map_structure(
            lambda t: t.numpy(), f(b))
        flops[label] = step_flops(crops, config)
    times = _harness.interleave(runs, args.rounds, show="{:.2f} s")
    lines = _harness.header(__file__, argv, f"No GPU, float32, batch {args.batch}.")
    lines += ["| model | step (s, median) | × ResNet-50's (median of rounds) | counted "
              "backbone GFLOPs | × in FLOPs | GFLOP/s |", "|---|---:|---:|---:|---:|---:|"]
    labels = list(models)
    for label in labels:
        method = label.split(",")[0]
        reference = next(other for other in labels if other.startswith(method + ",")
                         and "ResNet" in other)
        ratio = statistics.median(t / r for t, r in zip(times[label], times[reference]))
        seconds = statistics.median(times[label])
        lines.append(f"| {label} | {seconds:.2f} | {ratio:.2f} | {flops[label] / 1e9:.0f} | "
                     f"{flops[label] / flops[reference]:.2f} | "
                     f"{flops[label] / 1e9 / seconds:.0f} |")
    if not args.tiny:
        lines += ["", "The attention's share of a ViT-S/16 block's FLOPs (q·kᵀ and weights × v "
                  "against the q/k/v, output and MLP matmuls): "
                  f"{vit.attention_share('vit_small_patch16', 224):.1%} at 224 px (197 tokens), "
                  f"{vit.attention_share('vit_small_patch16', 96):.1%} at 96 px (37 tokens)."]
    minutes = round((time.time() - start) / 60)
    lines += ["", f"Took {minutes} minute{'s' if minutes != 1 else ''}."]
    _harness.publish(args, "vit_steps", TITLE, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
