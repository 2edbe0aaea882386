"""Where a training step's time goes: its parts timed alone, against the whole step and the run.

    python benchmarks/step_profile.py                          # offline default -> BENCHMARKS.md
    python benchmarks/step_profile.py --only r50_float32,r50_bfloat16 --steps 3
    python benchmarks/step_profile.py --run-dir runs/mnist     # adds that run's own step time

Configurations: ``offline`` (``configs/mnist.yaml``: small ConvNet, 28 px, batch 16, K=1,024,
XLA), ``r50_float32`` and ``r50_bfloat16`` (``configs/imagenet_resnet50_b256.yaml`` at batch 32,
K=65,536, no XLA, ``train.precision`` float32 or mixed_bfloat16).  Each is built by
``build.build_model`` with ``method.caco.warmup_epochs=0`` (every step a CaCo step) and one
synthetic two-view batch of random images; each part of the step (``Method._step``) is its own
``tf.function`` (the configuration's XLA setting), on inputs computed beforehand:

- query encoder forward (both views, ``forward``), and forward + backward (the gradient of the
  queries with respect to the student's parameters, as the step takes it);
- key encoder forward (both views, ``targets``);
- the bank pass (``CaCo.objective``: MPPs, loss, its gradient, the bank's update);
- the diagnostics (``track_diagnostics`` and ``_track_views``: MPP statistics, health);
- the key encoder's EMA (``after_step``);
- the optimizer's update (``optimizer.apply`` of the gradients);
- the whole compiled step (Keras' one-step function of the run's phase);
- the train function as ``fit`` calls it, one step at a time from a ``tf.data`` iterator
  (the difference to the compiled step: Python and dispatch), and with 10 steps per call in
  one compiled loop (``train.steps_per_execution``), per step;
- ``fit`` itself over that data (its loop, the logs, a no-op callback), per step (this and the
  10-step calls for the offline default only: a ResNet-50 step is seconds);
- for ``offline``: the input pipeline alone (``data.pretrain_dataset`` over the real MNIST
  digits with the run's views), per batch: on two cores its CPU work shares the step's.

All parts of a configuration are timed in turn, round after round (``_harness.interleave``),
after two untimed rounds; medians.  ``--run-dir`` reads the median ``step_ms`` of a finished
run's ``history.json``.  For ResNet-50 the backbone's forward is also timed without its
BatchNormalization layers (replaced by identities): the share BatchNorm takes per precision.
"""

import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

# One section for the offline default, one for the ResNet-50 rows (minutes against hours).
SECTIONS = {
    "offline": ("step_profile", "## Where the step's time goes (`benchmarks/step_profile.py`)"),
    "resnet50": ("step_profile_resnet50",
                 "## Where the ResNet-50 step's time goes, float32 and bfloat16 "
                 "(`benchmarks/step_profile.py --only r50_float32,r50_bfloat16`)"),
}
MNIST = "configs/mnist.yaml"
R50 = "configs/imagenet_resnet50_b256.yaml"
R50_SETTINGS = ["train.batch_size=32", "method.caco.bank_size=65536", "train.jit_compile=false"]
CONFIGS = {  # config file, settings, precision
    "offline": (MNIST, [], "float32"),
    "r50_float32": (R50, R50_SETTINGS, "float32"),
    "r50_bfloat16": (R50, R50_SETTINGS, "mixed_bfloat16"),
}
# --tiny: the smallest model of the same kind, from any configuration.
TINY_SETTINGS = ["model.backbone=small_convnet", "model.widths=[8, 16, 32, 64]",
                 "data.image_size=28", "model.projector_hidden=32", "model.embedding_dim=16",
                 "method.caco.bank_size=64", "train.batch_size=8", "train.jit_compile=false"]


def build(name, tiny=False):
    """(config, model, views) of a configuration, under its dtype policy."""
    import keras
    import tensorflow as tf

    from caco_tf import build_model, load_config

    path, settings, precision = CONFIGS[name]
    config = load_config(os.path.join(_harness.ROOT, path), settings + [
        "method.caco.warmup_epochs=0", "model.sync_batchnorm=false",
        f"train.precision={precision}"] + (TINY_SETTINGS if tiny else []))
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(precision)
    try:
        keras.utils.set_random_seed(0)
        model = build_model(config, steps_per_epoch=1000)
    finally:
        keras.config.set_dtype_policy(previous)
    size, channels = config["data"]["image_size"], config["data"]["channels"]
    batch = config["train"]["batch_size"]
    views = tuple(tf.random.stateless_normal([batch, size, size, channels], seed=[seed, 0])
                  for seed in (1, 2))
    return config, model, views


def wait(value):
    """Fetch every tensor of ``value``: the call it came from has finished."""
    import tensorflow as tf

    for tensor in tf.nest.flatten(value):
        if hasattr(tensor, "numpy"):
            tensor.numpy()


def parts(config, model, views, per_call):
    """{part: a callable running it once and waiting for it; a number it returns is its own
    per-step time}."""
    import keras
    import tensorflow as tf

    jit = config["train"]["jit_compile"]
    variables = model.student_variables
    step = model.optimizer.iterations

    def compiled(function):
        return tf.function(function, jit_compile=jit)

    query_forward = compiled(lambda *crops: model.forward(crops, training=True))
    queries = query_forward(*views)
    seed = tf.random.stateless_normal(queries.shape, seed=[7, 7])

    @compiled
    def query_forward_backward(*crops):
        with tf.GradientTape() as tape:
            outputs = model.forward(crops, training=True)
        return tape.gradient(outputs, variables, output_gradients=seed)

    gradients = query_forward_backward(*views)
    keys_of = compiled(lambda *crops: model.targets(crops, training=True))
    keys = keys_of(*views)
    bank_pass = compiled(lambda q, k: model.objective(q, k, step))
    objective = bank_pass(queries, keys)

    @compiled
    def diagnostics(q):
        model.track_diagnostics(objective.diagnostics)
        model._track_views(*model.view_embeddings(q))
        return tf.constant(0.0)

    @compiled
    def ema():
        model.after_step(step)
        return tf.constant(0.0)

    @compiled
    def optimizer_update():
        model.optimizer.apply(gradients, variables)
        return tf.constant(0.0)

    train_function = model.make_train_function()
    dataset = tf.data.Dataset.from_tensors(views).repeat()
    iterator = iter(dataset)

    def calls(count):
        """One call of the train function as ``fit`` makes it with ``count`` steps per call;
        seconds per step (other parts move the step counter, and a call ends at a multiple of
        ``count``, so it may run fewer)."""
        before = int(step.numpy())
        model.steps_per_execution, train_function.steps_per_epoch = count, count
        start = time.perf_counter()
        wait(train_function(iterator))
        return (time.perf_counter() - start) / max(1, int(step.numpy()) - before)

    def fit_steps(count=20):
        start = time.perf_counter()
        model.fit(dataset, steps_per_epoch=count, epochs=1, verbose=0,
                  callbacks=[keras.callbacks.Callback()])
        return (time.perf_counter() - start) / count

    found = {
        "query encoder forward": lambda: wait(query_forward(*views)),
        "query encoder forward + backward": lambda: wait(query_forward_backward(*views)),
        "key encoder forward": lambda: wait(keys_of(*views)),
        "bank pass (objective)": lambda: wait(bank_pass(queries, keys)),
        "diagnostics": lambda: wait(diagnostics(queries)),
        "key encoder EMA": lambda: wait(ema()),
        "optimizer update": lambda: wait(optimizer_update()),
        "compiled step": lambda: wait(train_function.one_step[-1]([views])),
        "train function (fit's call, one step)": lambda: calls(1),
    }
    if config["model"]["backbone"] == "resnet50":
        found.update(batchnorm_parts(model.backbone, views))
    else:  # the loops' parts: small steps only
        found[f"train function, {per_call} steps per call, per step"] = lambda: calls(per_call)
        found[f"fit, per step (of {2 * per_call})"] = lambda: fit_steps(2 * per_call)
    return found


def batchnorm_parts(backbone, views):
    """The backbone's forward with and without its BatchNormalization layers."""
    import keras
    import tensorflow as tf

    class Passthrough(keras.layers.Layer):
        """What replaces a BatchNormalization: its input, whatever the call's arguments."""

        def call(self, inputs, training=None, mask=None):
            return inputs

    def identity(layer):
        if isinstance(layer, keras.layers.BatchNormalization):  # ours subclasses it
            return Passthrough(name=layer.name, dtype=layer.dtype_policy)
        return layer.__class__.from_config(layer.get_config())

    without = keras.models.clone_model(backbone, clone_function=identity)
    images = tf.concat(views, 0)
    with_bn = tf.function(lambda x: backbone(x, training=True))
    without_bn = tf.function(lambda x: without(x, training=True))
    return {"backbone forward": lambda: with_bn(images).numpy(),
            "backbone forward, BatchNorm removed": lambda: without_bn(images).numpy()}


def input_pipeline(config, count):
    """Seconds per batch of the run's input pipeline alone."""
    from caco_tf import RunSettings, load_data, pretrain_dataset, run_views

    train, _ = load_data(RunSettings.of(config).data)
    batch = config["train"]["batch_size"]
    dataset = pretrain_dataset(train, batch, run_views(config), seed=config["data"]["seed"],
                               image_size=config["data"]["image_size"],
                               channels=config["data"]["channels"],
                               steps_per_epoch=len(train) // batch)
    iterator = iter(dataset)
    for _ in range(min(count, 20)):
        next(iterator)
    start = time.perf_counter()
    for _ in range(count):
        next(iterator)
    return (time.perf_counter() - start) / count


def profile(name, args):
    config, model, views = build(name, args.tiny)
    per_call = 2 if args.tiny else 10
    times = _harness.interleave(parts(config, model, views, per_call), args.steps,
                                warmup=0 if args.tiny else 2)
    medians = {part: statistics.median(each) for part, each in times.items()}
    if name == "offline":
        medians["input pipeline alone, per batch"] = input_pipeline(config, 2 if args.tiny
                                                                    else 200)
    return config, medians


def table(name, config, medians, run_step):
    step = medians["compiled step"]
    summed = sum(medians[p] for p in ("query encoder forward + backward", "key encoder forward",
                                      "bank pass (objective)", "diagnostics", "key encoder EMA",
                                      "optimizer update"))
    lines = [f"**{name}** ({config['model']['backbone']}, {config['data']['image_size']} px, "
             f"batch {config['train']['batch_size']}, "
             f"K={config['method']['caco']['bank_size']:,}, {config['train']['precision']}, "
             f"XLA {'on' if config['train']['jit_compile'] else 'off'}"
             f"):", "", "| part | ms | share of the compiled step |", "|---|---:|---:|"]
    for part, seconds in medians.items():
        lines.append(f"| {part} | {1e3 * seconds:.1f} | {100 * seconds / step:.0f} % |")
    lines.append(f"| sum of the step's parts (forward + backward, keys, bank, diagnostics, EMA, "
                 f"optimizer) | {1e3 * summed:.1f} | {100 * summed / step:.0f} % |")
    if run_step:
        lines.append(f"| the run's own step (`history.json` step_ms, median) | {run_step:.1f} | "
                     f"{100 * run_step / (1e3 * step):.0f} % |")
    return lines


def run_step_ms(run_dir):
    if not run_dir:
        return None
    with open(os.path.join(run_dir, "history.json")) as handle:
        return statistics.median(epoch["step_ms"] for epoch in json.load(handle))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = _harness.parser(__doc__)
    parser.add_argument("--only", default="offline", help="configurations, comma-separated: "
                        + ", ".join(CONFIGS))
    parser.add_argument("--steps", type=int, default=30, help="timed rounds")
    parser.add_argument("--run-dir", help="a finished offline run whose step_ms to add")
    args = parser.parse_args(argv)
    if args.tiny:
        args.steps = 1
    name, title = SECTIONS["offline" if args.only == "offline" else "resnet50"]
    started = time.time()
    body = []
    for config_name in args.only.split(","):
        config, medians = profile(config_name, args)
        rows = table(config_name, config, medians,
                     run_step_ms(args.run_dir) if config_name == "offline" else None)
        print("\n".join(rows), flush=True)
        body += rows + [""]
    lines = _harness.header(__file__, argv, (
        f"Medians of {args.steps} rounds, every part once a round in turn; whole run "
        f"{(time.time() - started) / 60:.0f} min."))
    _harness.publish(args, name, title, lines + body[:-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
