"""MAE's step against DINO's on the same ViT, interleaved: what the encoder on the visible
patches saves.

    python benchmarks/mae_step.py [--model micro|base] [--batch N] [--rounds 5] [--output BENCHMARKS.md]

``micro`` (the default): the offline recipes on the micro ViT (``vit_micro_patch4``, 28 px
digits, 7×7 patches): configs/mnist_mae.yaml against configs/mnist_vit.yaml's DINO (its two
28 px global crops, no local crops), batch 64.  ``base``: the ImageNet recipes on ViT-B/16 at
224 px: configs/mae_imagenet_vit_base16.yaml against DINO's ViT recipe on the same backbone
(configs/dino_imagenet_vit_small16.yaml with ``model.backbone vit_base_patch16``, its two global
crops only), batch 8.  Float32, no XLA, one device, one step of each in turn each round (the
order reversed every other round).

FLOPs are counted for the ViTs only (DINO's head, MAE's frozen projector left out; MAE's
decoder counted, it is MAE's): DINO's student forward on both crops three times (forward and
backward) and its teacher's forward on both; MAE's encoder on 1 + K tokens (the patch
embedding on all L patches) and its decoder on 1 + L tokens, three times.  A block's
multiply-adds are ``nets.vit``'s: 2·N²·D for the attention, 12·N·D² for the q/k/v, output and
MLP matmuls.
"""

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

TITLE = "## MAE's step against DINO's on the same ViT"
COMMON = ["train.jit_compile=false", "train.steps_per_execution=1", "train.precision=float32",
          "model.sync_batchnorm=false"]
DINO_ON_DIGITS = ["method.name=dino", "model.drop_path=0.1"]  # docs/vit.md's DINO settings
MODELS = {  # mode: {label: (configuration, overrides)}, and the batch
    "micro": ({"DINO": ("mnist_vit", DINO_ON_DIGITS), "MAE": ("mnist_mae", [])}, 64),
    "base": ({"DINO": ("dino_imagenet_vit_small16", [
                  "model.backbone=vit_base_patch16", "data.views=symmetric"]),
              "MAE": ("mae_imagenet_vit_base16", [])}, 8),
}
TINY = ["model.backbone=vit_micro_patch4", "method.dino.out_dim=64",
        "model.projector_hidden=32", "model.embedding_dim=16", "method.mae.decoder_width=16",
        "method.mae.decoder_depth=1", "method.mae.decoder_heads=2"]


def block_flops(tokens, width, depth):
    """FLOPs (2 × multiply-adds) of ``depth`` pre-norm blocks on ``tokens`` tokens of
    ``width``: attention 2·N²·D, q/k/v + output + 4×-wide MLP 12·N·D² (``nets.vit``)."""
    return 2 * depth * (2 * tokens * tokens * width + 12 * tokens * width * width)


def vit_shape(config):
    from caco_tf.nets.sizes import VIT_SHAPES

    patch, width, depth, _ = VIT_SHAPES[config["model"]["backbone"]][:4]
    side = config["data"]["image_size"] // patch
    return patch, width, depth, side * side, config["data"]["channels"]


def dino_flops(config):
    """Per image: the student's forward and backward (3×) on 2 crops, the teacher's forward
    on 2 (``nets.vit.flops_per_image`` of each)."""
    patch, width, depth, patches, channels = vit_shape(config)
    forward = 2 * patches * patch * patch * channels * width + block_flops(1 + patches, width,
                                                                          depth)
    return 3 * 2 * forward + 2 * forward


def mae_flops(config):
    """Per image, forward and backward (3×): the patch embedding of all L patches, the encoder
    on 1 + K tokens, the decoder's embedding, blocks on 1 + L tokens and pixel prediction."""
    from caco_tf.data.masks import kept_count

    patch, width, depth, patches, channels = vit_shape(config)
    own = config["method"]["mae"]
    kept, decoder = kept_count(patches, own["mask_ratio"]), own["decoder_width"]
    pixels = patch * patch * channels
    forward = (2 * patches * pixels * width + block_flops(1 + kept, width, depth)
               + 2 * (1 + kept) * width * decoder
               + block_flops(1 + patches, decoder, own["decoder_depth"])
               + 2 * (1 + patches) * decoder * pixels)
    return 3 * forward


def build(name, overrides, batch, tiny):
    import keras
    import numpy as np
    import tensorflow as tf

    from caco_tf import build_model, load_config
    from caco_tf.build import view_masks
    from caco_tf.run_settings import RunSettings

    config = load_config(name, COMMON + overrides + [f"train.batch_size={batch}"]
                         + (TINY if tiny else []))
    keras.utils.set_random_seed(0)
    model = build_model(config, steps_per_epoch=1000)
    settings = RunSettings.of(config)
    size, channels = config["data"]["image_size"], config["data"]["channels"]
    rng = np.random.default_rng(0)
    crops = tuple(tf.constant(rng.normal(size=(batch, size, size, channels)).astype("float32"))
                  for _ in range(settings.views_per_image))
    drawn = view_masks(settings)
    if drawn:  # MAE: the view's masks, as the pipeline draws them
        kinds, (rows, cols) = drawn
        crops += tuple(kind.draw(tf.constant([0, i], tf.int64), batch, rows, cols)
                       for i, kind in enumerate(kinds))
    return model, crops, config


def main(argv=None):
    import tensorflow as tf

    argv = sys.argv[1:] if argv is None else argv
    parser = _harness.parser(__doc__)
    parser.add_argument("--model", choices=sorted(MODELS), default="micro")
    parser.add_argument("--batch", type=int)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    models, batch = MODELS[args.model]
    batch = args.batch or batch
    if args.tiny:
        batch, args.rounds = 2, 1
    start = time.time()
    runs, flops, configs = {}, {}, {}
    for label, (name, overrides) in models.items():
        model, crops, config = build(name, overrides, batch, args.tiny)
        function = model.make_train_function()
        function([crops])  # traces
        runs[label] = lambda f=function, b=[crops]: tf.nest.map_structure(
            lambda t: t.numpy(), f(b))
        flops[label] = batch * (mae_flops(config) if label == "MAE" else dino_flops(config))
        configs[label] = config
    times = _harness.interleave(runs, args.rounds, show="{:.3f} s")
    patch, width, depth, patches, _ = vit_shape(configs["MAE"])
    own = configs["MAE"]["method"]["mae"]
    from caco_tf.data.masks import kept_count

    lines = _harness.header(__file__, argv, (
        f"No GPU, float32, no XLA, batch {batch}; {configs['MAE']['model']['backbone']} "
        f"({patches} patches of {patch} px, {depth} blocks of width {width}); MAE keeps "
        f"{kept_count(patches, own['mask_ratio'])} patches, its decoder {own['decoder_width']} "
        f"wide, {own['decoder_depth']} blocks; DINO takes 2 crops of "
        f"{configs['DINO']['data']['image_size']} px, its teacher the same 2."))
    lines += ["| method | step (s, median) | × DINO's (median of rounds) | counted GFLOPs | "
              "× in FLOPs | GFLOP/s |", "|---|---:|---:|---:|---:|---:|"]
    for label in models:
        ratio = statistics.median(t / r for t, r in zip(times[label], times["DINO"]))
        seconds = statistics.median(times[label])
        lines.append(f"| {label} | {seconds:.3f} | {ratio:.2f} | {flops[label] / 1e9:.2f} | "
                     f"{flops[label] / flops['DINO']:.2f} | {flops[label] / 1e9 / seconds:.1f} |")
    minutes = round((time.time() - start) / 60)
    lines += ["", f"Took {minutes} minute{'s' if minutes != 1 else ''}."]
    _harness.publish(args, "mae_step", TITLE, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
