"""Where a training step's time goes: its parts timed alone, against the whole step and the run.

    python benchmarks/step_profile.py                          # offline default -> BENCHMARKS.md
    python benchmarks/step_profile.py --only r50_float32,r50_bfloat16 --steps 3
    python benchmarks/step_profile.py --run-dir runs/mnist     # adds that run's own step time

Configurations: ``offline`` (``configs/mnist.yaml``: small ConvNet, 28 px, batch 16, K=1,024,
XLA), ``r50_float32`` and ``r50_bfloat16`` (``configs/imagenet_resnet50_b256.yaml`` at batch 32,
K=65,536, no XLA, ``train.precision`` float32 or mixed_bfloat16).  Each is built by
``build.build_model`` with ``method.warmup_epochs=0`` (every step a CaCo step) and one
synthetic two-view batch of random images; each part of the step is its own ``tf.function``
(the configuration's XLA setting), on inputs computed beforehand:

- query encoder forward (both views), and forward + backward (the gradient of the queries with
  respect to the encoder's parameters, as the step takes it);
- key encoder forward (both views);
- the bank pass (``CaCo.contrast``: MPPs, loss, its gradient, the bank's update);
- the diagnostics (``_track`` and ``_track_views``: MPP statistics, histogram, health);
- the key encoder's EMA (``MomentumEncoder.follow``);
- the optimizer's update (``optimizer.apply`` of the gradients);
- the whole compiled step (``train_step`` under the strategy: Keras' one-step function);
- the train function as ``fit`` calls it, one step at a time from a ``tf.data`` iterator
  (the difference to the compiled step: Python and dispatch), and with 10 steps per call in
  one compiled loop (``train.steps_per_execution``), per step;
- ``fit`` itself over that data (its loop, the logs, a no-op callback), per step (this and the
  10-step calls for the offline default only: a ResNet-50 step is seconds);
- for ``offline``: the input pipeline alone (``data.pretrain_dataset`` over the real MNIST
  digits with the run's views), per batch: on two cores its CPU work shares the step's.

All parts of a configuration are timed round-robin (one call of each in turn, the order
reversed every other round) after two untimed rounds; medians.  ``--run-dir`` reads the median
``step_ms`` of a finished run's ``history.json`` (the run as ``train.py`` makes it, with its
callbacks and its input pipeline).  For ResNet-50 the backbone's forward is also timed without
its BatchNormalization layers (replaced by identities): the share BatchNorm takes per precision.
"""

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import _report  # noqa: E402

# One section for the offline default, one for the ResNet-50 rows (minutes against hours).
SECTIONS = {
    "offline": ("<!-- step_profile:begin -->", "<!-- step_profile:end -->",
                "## Where the step's time goes (`benchmarks/step_profile.py`)"),
    "resnet50": ("<!-- step_profile_resnet50:begin -->", "<!-- step_profile_resnet50:end -->",
                 "## Where the ResNet-50 step's time goes, float32 and bfloat16 "
                 "(`benchmarks/step_profile.py --only r50_float32,r50_bfloat16`)"),
}
MNIST = "configs/mnist.yaml"
R50 = "configs/imagenet_resnet50_b256.yaml"
PER_CALL = 10  # steps per call of the chunked train function
CONFIGS = {  # config file, settings, precision
    "offline": (MNIST, [], "float32"),
    "r50_float32": (R50, ["train.batch_size=32", "method.bank_size=65536",
                          "train.jit_compile=false"], "float32"),
    "r50_bfloat16": (R50, ["train.batch_size=32", "method.bank_size=65536",
                           "train.jit_compile=false"], "mixed_bfloat16"),
}


def build(name):
    """(config, model, views) of a configuration, under its dtype policy."""
    import keras
    import tensorflow as tf

    from caco_tf import build as build_lib
    from caco_tf.training.config import load_config

    path, settings, precision = CONFIGS[name]
    config = load_config(os.path.join(ROOT, path), settings + [
        "method.warmup_epochs=0", "model.sync_batchnorm=false", f"train.precision={precision}"])
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(precision)
    try:
        keras.utils.set_random_seed(0)
        model = build_lib.build_model(config, steps_per_epoch=1000)
    finally:
        keras.config.set_dtype_policy(previous)
    size, channels = config["data"]["image_size"], config["data"]["channels"]
    batch = config["train"]["batch_size"]
    views = tuple(tf.random.stateless_normal([batch, size, size, channels], seed=[seed, 0])
                  for seed in (1, 2))
    return config, model, views


def parts(config, model, views):
    """{part: a callable running it once and waiting for it}."""
    import keras
    import tensorflow as tf

    from caco_tf.training import steps

    jit = config["train"]["jit_compile"]
    query, key = model.query_encoder, model.key_encoder
    variables = query.trainable_variables
    step = model.optimizer.iterations

    def compiled(function):
        return tf.function(function, jit_compile=jit)

    @compiled
    def query_forward(view1, view2):
        return tf.concat([query(view1, training=True), query(view2, training=True)], 0)

    queries = query_forward(*views)
    seed = tf.random.stateless_normal(queries.shape, seed=[7, 7])

    @compiled
    def query_forward_backward(view1, view2):
        with tf.GradientTape() as tape:
            stacked = tf.concat([query(view1, training=True), query(view2, training=True)], 0)
        return tape.gradient(stacked, variables, output_gradients=seed)

    gradients = query_forward_backward(*views)
    keys_of = compiled(lambda view1, view2: model._keys(view1, view2, training=True))
    keys = keys_of(*views)
    bank_pass = compiled(lambda q, k: model.contrast(q, k, step))
    contrast = bank_pass(queries, keys)

    @compiled
    def diagnostics(q):
        model._track(contrast, tf.constant(0.03))
        model._track_views(*tf.split(q, 2))
        return tf.constant(0.0)

    @compiled
    def ema():
        key.follow(query, step)
        return tf.constant(0.0)

    @compiled
    def optimizer_update():
        model.optimizer.apply(gradients, variables)
        return tf.constant(0.0)

    one_step = model.make_train_function()
    dataset = tf.data.Dataset.from_tensors(views).repeat()
    iterator = iter(dataset)
    # The same steps, PER_CALL of them in one compiled call (train.steps_per_execution).
    chunked = steps.TrainFunction(model, model.warmup_step, model.train_step, 0)
    chunked.steps_per_epoch = PER_CALL

    def chunk():
        """Returns the steps the call ran: other parts move the step counter (the optimizer's
        update), and a call ends at a multiple of PER_CALL."""
        before = int(model.optimizer.iterations.numpy())
        model.steps_per_execution = PER_CALL
        try:
            wait(chunked(iterator))
        finally:
            model.steps_per_execution = 1
        return int(model.optimizer.iterations.numpy()) - before

    class Nothing(keras.callbacks.Callback):
        pass

    def fit_steps(count=20):
        model.fit(dataset, steps_per_epoch=count, epochs=1, verbose=0, callbacks=[Nothing()])
        return count

    def wait(value):
        for tensor in tf.nest.flatten(value):
            if hasattr(tensor, "numpy"):
                tensor.numpy()

    small = config["model"]["backbone"] != "resnet50"  # the loops' parts: small steps only
    found = {
        "query encoder forward": lambda: wait(query_forward(*views)),
        "query encoder forward + backward": lambda: wait(query_forward_backward(*views)),
        "key encoder forward": lambda: wait(keys_of(*views)),
        "bank pass (contrast)": lambda: wait(bank_pass(queries, keys)),
        "diagnostics": lambda: wait(diagnostics(queries)),
        "key encoder EMA": lambda: wait(ema()),
        "optimizer update": lambda: wait(optimizer_update()),
        "compiled step": lambda: wait(chunked.one_step[False]([views])),
        "train function (fit's call, one step)": lambda: wait(one_step(iterator)),
    }
    if small:
        found[f"train function, {PER_CALL} steps per call, per step"] = chunk
        found["fit, per step (of 20)"] = fit_steps
    if config["model"]["backbone"] == "resnet50":
        found.update(batchnorm_parts(model.backbone, views, tf, keras))
    return found


def batchnorm_parts(backbone, views, tf, keras):
    """The backbone's forward with and without its BatchNormalization layers."""
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
    from caco_tf import build as build_lib
    from caco_tf import data

    train, _ = build_lib.load_data(config)
    batch = config["train"]["batch_size"]
    dataset = data.pretrain_dataset(train, batch, build_lib.build_views(config),
                                    seed=config["data"]["seed"],
                                    image_size=config["data"]["image_size"],
                                    channels=config["data"]["channels"],
                                    steps_per_epoch=len(train) // batch)
    iterator = iter(dataset)
    for _ in range(20):
        next(iterator)
    start = time.perf_counter()
    for _ in range(count):
        next(iterator)
    return (time.perf_counter() - start) / count


def round_robin(found, rounds, warmup=2):
    """Median seconds of each part (per step for the parts that return their step count)."""
    times = {name: [] for name in found}
    names = list(found)
    for index in range(warmup + rounds):
        for name in (names if index % 2 == 0 else names[::-1]):
            start = time.perf_counter()
            count = found[name]()
            if index >= warmup:
                steps = count if isinstance(count, int) and count > 0 else 1
                times[name].append((time.perf_counter() - start) / steps)
    return {name: statistics.median(values) for name, values in times.items()}


def profile(name, rounds):
    config, model, views = build(name)
    medians = round_robin(parts(config, model, views), rounds)
    if name == "offline":
        medians["input pipeline alone, per batch"] = input_pipeline(config, 200)
    return config, medians


def table(name, config, medians, run_step):
    step = medians["compiled step"]
    summed = sum(medians[p] for p in ("query encoder forward + backward", "key encoder forward",
                                      "bank pass (contrast)", "diagnostics", "key encoder EMA",
                                      "optimizer update"))
    lines = [f"**{name}** ({config['model']['backbone']}, {config['data']['image_size']} px, "
             f"batch {config['train']['batch_size']}, K={config['method']['bank_size']:,}, "
             f"{config['train']['precision']}, "
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="offline", help="configurations, comma-separated: "
                        + ", ".join(CONFIGS))
    parser.add_argument("--steps", type=int, default=30, help="timed rounds")
    parser.add_argument("--run-dir", help="a finished offline run whose step_ms to add")
    parser.add_argument("--output", default=os.path.join(ROOT, "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    begin, end, title = SECTIONS["offline" if args.only == "offline" else "resnet50"]
    started = time.time()
    lines = [begin, _report.command_line("step_profile.py", argv), ""]
    body = []
    for name in args.only.split(","):
        config, medians = profile(name, args.steps)
        rows = table(name, config, medians, run_step_ms(args.run_dir) if name == "offline"
                     else None)
        print("\n".join(rows), flush=True)
        body += rows + [""]
    import tensorflow as tf
    import keras

    lines += [f"{_report.cpu_model()}; {time.strftime('%Y-%m-%d')}; TensorFlow {tf.__version__}, "
              f"Keras {keras.__version__}; medians of {args.steps} rounds, every part once a "
              f"round in turn; whole run {(time.time() - started) / 60:.0f} min.", ""]
    text = "\n".join(lines + body + [end]) + "\n"
    _report.publish(text, args.output, begin, end, title)


if __name__ == "__main__":
    main()
