"""Each method's train step against MoCo v2's, on the same encoder and batch, interleaved.

    python benchmarks/method_steps.py [--sets r50,offline,multicrop,dino_head] [--rounds 5]
                                      [--methods caco,swav,...] [--output BENCHMARKS.md]

Sets, each timed in one process, one step of every model of the set in turn each round (the
order reversed every other round, so a shared machine's drift slows all alike):

=========  ========================================================================
r50        ResNet-50, 224 px, batch 32, projector 2,048 → 256 for every method, each
           method's ImageNet sizes (its recipe's heads; CaCo's bank and MoCo v2's queue
           65,536 rows, NNCLR's support set 98,304, SwAV's 3,000 prototypes, DINO's
           65,536 outputs), float32, no XLA, one device, no warm-up pass
offline    configs/mnist.yaml (small ConvNet, 28 px, batch 16, XLA), each method's offline
           recipe (its section there)
multicrop  ResNet-50, batch 32: CaCo, SwAV and DINO with 2×224 + 6×96 crops against
           their own 2×224 step
dino_head  ResNet-50, batch 32: DINO with K = 65,536 outputs against K = 4,096
=========  ========================================================================

For each model: the median step time, its ratio to the set's reference (MoCo v2; in the last
two sets the method's own two-crop or K = 4,096 step), the median of the per-round ratios, and
the ratio of their counted FLOPs (``flops``): the student's forward on every crop three times
(forward and backward), the teacher's forward on the global crops, and the products with a bank,
a queue or a support set.  A ratio within its FLOP ratio is the arithmetic the method needs.
Each set writes its own table into BENCHMARKS.md (between the markers
``method_steps/<set>``), so that a set can be measured again alone.
"""

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

TITLE = "## Each method's step against MoCo v2's"
REFERENCE = "moco_v2"


def registered_methods():
    """Every registered method (``caco_tf.methods.METHODS``) but CaCo's ablation rows, which
    read CaCo's settings, and the methods of a ViT's tokens (``CONSUMES``: this measures
    ResNet-50; MAE's step is benchmarks/mae_step.py's); the reference, MoCo v2, first."""
    from caco_tf import methods

    names = [name for name, cls in methods.METHODS.items()
             if cls.SETTINGS_OF is None and cls.CONSUMES == "features"]
    return [REFERENCE] + [name for name in names if name != REFERENCE]
R50 = ["data.source=mnist", "data.image_size=224", "data.channels=3", "data.views=imagenet",
       "model.backbone=resnet50", "model.projector_hidden=2048", "model.embedding_dim=256",
       "model.sync_batchnorm=false", "train.batch_size=32", "train.jit_compile=false",
       "train.steps_per_execution=1", "method.caco.warmup_epochs=0"]
# The heads' widths of each method's ImageNet recipe (configs/*_imagenet_resnet50.yaml).
R50_HEADS = {"simsiam": ["method.simsiam.predictor_hidden=512"]}
# --tiny: CaCo's two-crop and multi-crop steps at the smallest sizes (a step's first trace
# takes seconds: every method's would take minutes).
TINY_SETTINGS = ["model.backbone=small_convnet", "model.widths=[8, 16, 32, 64]",
                 "model.projector_hidden=32", "model.embedding_dim=16", "train.batch_size=4",
                 "method.caco.bank_size=64"]
LOCAL = {False: (96, 6), True: (16, 2)}  # the local crops' side and count (--tiny: True)


def settings(set_name, method, variant=None, tiny=False):
    """The configuration overrides of one model of a set."""
    if set_name == "offline":  # each method's offline recipe, its section in configs/mnist.yaml
        return [f"method.name={method}", "train.steps_per_execution=1"] + (
            TINY_SETTINGS if tiny else [])
    base = R50 + [f"method.name={method}"] + R50_HEADS.get(method, [])
    if set_name == "multicrop" and variant == "multi":
        size, count = LOCAL[tiny]
        base += ["data.views=multicrop", f"data.multicrop.local_crops={count}",
                 f"data.multicrop.local_size={size}"]
    if set_name == "dino_head":
        base.append(f"method.dino.out_dim={65536 if variant == 'wide' else 4096}")
    return base + (TINY_SETTINGS + ["data.image_size=32"] if tiny else [])


def models_of(set_name, methods):
    """[(label, method, variant)] of a set, of ``methods`` only; the first is the reference."""
    if set_name in ("r50", "offline"):
        return [(m, m, None) for m in registered_methods() if m in methods]
    if set_name == "multicrop":
        return [(f"{m}, {v}", m, v) for m in ("caco", "swav", "dino") if m in methods
                for v in ("2 global crops", "multi")]
    return [("dino, K = 4,096", "dino", "narrow"), ("dino, K = 65,536", "dino", "wide")]


def build(set_name, method, variant, tiny):
    """(model, a fixed batch of crops, its configuration) for one model of a set."""
    import keras
    import numpy as np
    import tensorflow as tf

    from caco_tf import build_model, load_config

    config = load_config(os.path.join(_harness.ROOT, "configs", "mnist.yaml"),
                         settings(set_name, method, variant, tiny))
    keras.utils.set_random_seed(0)
    model = build_model(config, steps_per_epoch=1000)
    size, channels = config["data"]["image_size"], config["data"]["channels"]
    batch = config["train"]["batch_size"]
    local = config["data"]["multicrop"]
    sizes = [size] * 2 + ([local["local_size"]] * local["local_crops"] if variant == "multi"
                          else [])
    rng = np.random.default_rng(0)
    crops = tuple(tf.constant(rng.normal(size=(batch, s, s, channels)).astype("float32"))
                  for s in sizes)
    return model, crops, config


def step_flops(model, crops, config):
    """Counted FLOPs of one step (module docstring)."""
    from caco_tf.nets import profiling

    return profiling.method_step_flops(model, [int(c.shape[1]) for c in crops],
                                       int(crops[0].shape[0]), config)


def measure(set_name, args):
    import tensorflow as tf

    runs, flops = {}, {}
    from caco_tf.errors import ConfigError

    skipped = []
    for label, method, variant in models_of(set_name, args.methods.split(",")):
        try:
            model, crops, config = build(set_name, method, variant, args.tiny)
        except (ConfigError, ValueError) as error:  # e.g. W-MSE's sub-batch at this batch
            skipped.append(f"{label}: not measured ({error})")
            continue
        function = model.make_train_function()
        batch = [crops]
        function(batch)  # traces (and compiles)
        runs[label] = lambda f=function, b=batch: tf.nest.map_structure(
            lambda t: t.numpy(), f(b))  # fetching the logs waits for the step
        flops[label] = step_flops(model, crops, config)
    times = _harness.interleave(runs, args.rounds)
    reference = next(iter(runs))
    return skipped, [dict(label=label, ms=1000 * statistics.median(times[label]),
                 ratio=statistics.median(t / r for t, r in zip(times[label], times[reference])),
                 flops_ratio=flops[label] / flops[reference], gflops=flops[label] / 1e9)
            for label in runs]


def table(set_name, rows, reference):
    lines = [f"| {set_name}: model | step (ms, median) | × {reference} (median of rounds) | "
             f"counted GFLOPs | × {reference} in FLOPs | step ratio / FLOP ratio |",
             "|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['label']} | {row['ms']:.0f} | {row['ratio']:.2f} | "
                     f"{row['gflops']:.1f} | {row['flops_ratio']:.2f} | "
                     f"{row['ratio'] / row['flops_ratio']:.2f} |")
    return lines


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = _harness.parser(__doc__)
    parser.add_argument("--sets", default="r50,offline,multicrop,dino_head")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--methods", help="the methods of the r50, offline and multicrop sets "
                                           "(default: every registered method)")
    args = parser.parse_args(argv)
    args.methods = args.methods or ",".join(registered_methods())
    if args.tiny:
        args.sets, args.rounds, args.methods = "multicrop", 1, "caco"
    references = {"r50": "moco_v2", "offline": "moco_v2", "multicrop": "the first row",
                  "dino_head": "K = 4,096"}
    for set_name in args.sets.split(","):
        start = time.time()
        skipped, rows = measure(set_name, args)
        if set_name == "multicrop":  # each method against its own two-crop step
            for two, multi in zip(rows[::2], rows[1::2]):
                multi["ratio"] /= two["ratio"]
                multi["flops_ratio"] /= two["flops_ratio"]
                two["ratio"] = two["flops_ratio"] = 1.0
        minutes = round((time.time() - start) / 60)
        lines = _harness.header(__file__, argv, "No GPU, float32.")
        lines += table(set_name, rows, references[set_name])
        lines += [""] + skipped if skipped else []
        lines += ["", f"Took {minutes} minute{'s' if minutes != 1 else ''}."]
        # Each set replaces its own table, inside the section, so that one set can run alone.
        _harness.publish(args, f"method_steps/{set_name}", f"{TITLE}: {set_name}", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
