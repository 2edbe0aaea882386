"""Train-step time of CaCo against MoCo v2, the learned bank's share, and how cost grows with K.

    python benchmarks/step_time.py [--steps 20] [--warmup 2] [--only NAME,...] [--tiny]
                                   [--interleave] [--intra-op N] [--inter-op N] [--trace DIR]
                                   [--output PATH] [--note ...]

Configurations (``--only`` picks some; the matmul peak always runs):

=================  ===============================================  =========================
r50_caco           ResNet-50, 224 px, batch 32, CaCo, K=65,536       also the K=65,536 scaling
r50_caco_xla       the same, ``jit_compile=True``
r50_moco           the same, MoCo v2 (FIFO queue), no XLA            the overhead's reference
r50_caco_k4096     r50_caco at K=4,096                               bank scaling
r50_caco_k262144   r50_caco at K=262,144                             bank scaling
c18_caco           CIFAR ResNet-18, 32 px, batch 256, CaCo, K=16,384 (the CIFAR config's K)
c18_caco_xla       the same, ``jit_compile=True``
m_caco_xla         the offline default (configs/mnist.yaml: small    its XLA setting
                   ConvNet, 28 px, batch 16, K=1,024), XLA
m_caco             the same without XLA
=================  ===============================================  =========================

Every model is built by ``build.build_model`` from ``configs/imagenet_resnet50_b256.yaml``
or ``configs/cifar10_resnet18.yaml`` (D=256, projector hidden 2048), with the batch, K, method
and XLA setting above, ``warmup_epochs=0`` (every timed step is a CaCo step with the learned
bank, or a MoCo v2 step with the FIFO queue) and unsynchronized BatchNorm (one device).  Each
configuration runs in its own process, so that its peak resident memory (``ru_maxrss``) is its
own; the process feeds one synthetic two-view batch of random float32 images, held in memory,
to ``model.make_train_function()`` (no input pipeline in the timing): ``--warmup`` steps
(tracing, XLA compilation), then the median of ``--steps`` timed steps.

``--interleave`` runs the chosen configurations in one process instead, one step of each in
turn (the order reversed every other round): a 20-minute drift of a shared machine then slows
all of them alike, so ratios between them (CaCo / MoCo v2, the K scaling) are fair; the
overhead line adds the median of each round's own CaCo / MoCo ratio.  Memory per configuration
is then the allocator's tensor peak over its steps (reported in both modes), the process's RSS
being shared.

Also measured, in the same run and processes:

* the bank part of the CaCo step alone, at the same B and K (normalizing the bank, the MPP
  products and argmax of both keys, the loss's logits and their gradient for both queries, the
  cooperative-adversarial bank gradient, the momentum update; then the same plus the step's
  diagnostics), divided by the full step; for MoCo v2, its queue part likewise;
* the float32 dense matmul peak of this machine (n×n matmuls, 2n³ FLOPs over the median time,
  the best size), under the same thread settings; utilization is the step's model FLOPs per
  second (counted analytically by ``caco_tf.profiling``) over that peak.

Prints a Markdown section and writes it into BENCHMARKS.md between the ``step_time`` markers
(``--tiny``: tiny sizes, one process; a check that the script runs).
``--trace DIR`` also writes a ``tf.profiler`` trace of two steps per configuration (TensorBoard's
profile tab) after the timing.
"""

import argparse
import datetime
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

ROOT = _harness.ROOT
# BENCHMARKS.md sections: (name, title).  --interleave writes its own, and an interleaved run
# of the offline default's configurations alone (m_*) a third, so that re-measuring the XLA
# gain leaves the ResNet-50 rows in place.
SECTIONS = {"separate": ("step_time", "## Train-step time and the cost of the learned bank"),
            "interleaved": ("step_time_interleaved",
                            "## Train-step time, configurations interleaved in one process"),
            "offline_default": (
                "step_time_offline_default", "## The offline default's step, with and without "
                "XLA (`benchmarks/step_time.py --interleave --only m_caco,m_caco_xla`)")}
RESULT = "STEP_TIME_RESULT "  # prefix of the child's JSON line on stdout
R50 = os.path.join("configs", "imagenet_resnet50_b256.yaml")
C18 = os.path.join("configs", "cifar10_resnet18.yaml")
MNIST = os.path.join("configs", "mnist.yaml")
STEPS_PER_EPOCH = 1000  # sets the schedules' length only; no effect on a step's cost
PAPER_OVERHEAD = 2.24 / 2.12  # GPU-hours per epoch, CaCo against MoCo v2 (the paper)
GOALS = {"overhead": 1.03, "utilization": 0.35, "bank_share": 0.05}

# name: (config file, batch, method, K (None: the config's), XLA)
CONFIGS = {
    "r50_caco": (R50, 32, "caco", 65536, False),
    "r50_caco_xla": (R50, 32, "caco", 65536, True),
    "r50_moco": (R50, 32, "moco_v2", 65536, False),
    "r50_caco_k4096": (R50, 32, "caco", 4096, False),
    "r50_caco_k262144": (R50, 32, "caco", 262144, False),
    "c18_caco": (C18, 256, "caco", None, False),
    "c18_caco_xla": (C18, 256, "caco", None, True),
    "m_caco_xla": (MNIST, 16, "caco", None, True),
    "m_caco": (MNIST, 16, "caco", None, False),
}


def section_of(args):
    """The (name, title) of the BENCHMARKS.md section this run writes."""
    if not args.interleave:
        return SECTIONS["separate"]
    names = [n for n in args.only.split(",") if n] or list(CONFIGS)
    if all(CONFIGS[n][0] == MNIST for n in names):
        return SECTIONS["offline_default"]
    return SECTIONS["interleaved"]


SCALING = ("r50_caco_k4096", "r50_caco", "r50_caco_k262144")  # increasing K
# --tiny: a tiny backbone, small images, batches and banks (K / 64).
TINY_SETTINGS = ["model.backbone=small_convnet", "model.widths=[8, 16, 32, 64]",
                 "model.projector_hidden=32", "model.embedding_dim=16"]
TINY_BATCH = {R50: (4, ["data.image_size=32"]), C18: (8, []), MNIST: (8, [])}
TINY_BANK_DIVISOR = 64


# ---------------------------------------------------------------------------------- children
def setup_tensorflow(args):
    """Import TensorFlow and apply the thread settings before any op runs."""
    import tensorflow as tf

    if args.intra_op:
        tf.config.threading.set_intra_op_parallelism_threads(args.intra_op)
    if args.inter_op:
        tf.config.threading.set_inter_op_parallelism_threads(args.inter_op)
    return tf


def threads(tf):
    return {"intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
            "inter_op": tf.config.threading.get_inter_op_parallelism_threads()}


def timed(run, warmup, steps):
    """Seconds of each of ``steps`` calls of ``run`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kB


def current_rss_mb():
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def model_settings(name, tiny):
    """(config file, ``--set`` style assignments, batch) of a configuration."""
    path, batch, method, bank, xla = CONFIGS[name]
    settings = [f"method.name={method}", f"method.{method}.warmup_epochs=0",
                f"train.jit_compile={xla}", "model.sync_batchnorm=false",
                "train.steps_per_execution=1"]
    if tiny:
        batch, size = TINY_BATCH[path]
        bank = (bank or 16384) // TINY_BANK_DIVISOR  # None: the CIFAR config's 16,384
        settings += TINY_SETTINGS + size
    settings.append(f"train.batch_size={batch}")
    if bank:
        settings.append(f"method.{method}.bank_size={bank}")
    return path, settings, batch


def bank_functions(tf, model, jit):
    """The bank part of the step as tf.functions of (query1, query2, key1, key2), the step's
    own code (``Method._step``) on queries [z¹; z²] and keys [k²; k¹]: for CaCo its
    ``objective`` (the MPPs, the loss and its gradient with respect to the queries, the bank's
    update), then the same plus the step's diagnostics (``track_diagnostics``); for MoCo v2 its
    loss against the queue, its gradient and the FIFO write (``update_state``): "queue"."""
    step = model.optimizer.iterations

    def stacked(query1, query2, key1, key2):
        return tf.concat([query1, query2], 0), tf.concat([key2, key1], 0)

    def algorithm(*embeddings):
        result = model.objective(*stacked(*embeddings), step)
        return result.loss + tf.reduce_sum(result.gradients), result.diagnostics

    def with_diagnostics(*embeddings):
        value, diagnostics = algorithm(*embeddings)
        model.track_diagnostics(diagnostics)
        return value

    def queue(*embeddings):
        queries, keys = stacked(*embeddings)
        with tf.GradientTape() as tape:
            tape.watch(queries)
            loss, _ = model.method_loss(queries, keys, step)
        gradient = tape.gradient(loss, queries)
        model.update_state(queries, keys, step)
        return loss + tf.reduce_sum(gradient)

    functions = ({"algorithm": lambda *e: algorithm(*e)[0], "with_diagnostics": with_diagnostics}
                 if model.EXACT_GRADIENT else {"queue": queue})
    return {name: tf.function(f, jit_compile=jit) for name, f in functions.items()}


def prepare_config(name, args, tf):
    """Build one configuration's model and synthetic batch; its ``step`` runs one train step."""
    import keras

    from caco_tf import build
    from caco_tf import config as config_lib

    path, settings, batch = model_settings(name, args.tiny)
    config = config_lib.load_config(os.path.join(ROOT, path), settings)
    keras.utils.set_random_seed(0)
    model = build.build_model(config, STEPS_PER_EPOCH)
    size, channels = config["data"]["image_size"], config["data"]["channels"]
    views = tuple(tf.random.stateless_normal([batch, size, size, channels], seed=[seed, 0])
                  for seed in (1, 2))
    train_function = model.make_train_function()
    # A plain iterable: Keras runs one step per item (train_on_batch's path), no tf.data.
    batches = [views]

    def step():
        float(train_function(batches)["loss"])  # fetching the loss waits for the step

    return {"name": name, "path": path, "config": config, "model": model, "batch": batch,
            "step": step, "rss_built_mb": current_rss_mb()}


class TensorMemory:
    """The allocator's peak of tensor memory during a step, above what was allocated before it
    (TensorFlow's BFC allocator keeps the counts: on CPU ``caco_tf`` turns it on).  None where
    the device keeps no statistics."""

    def __init__(self, tf):
        self.tf = tf
        self.device = "GPU:0" if tf.config.list_physical_devices("GPU") else "CPU:0"

    def reset(self):
        self.before = None
        try:
            self.tf.config.experimental.reset_memory_stats(self.device)
            self.before = self.tf.config.experimental.get_memory_info(self.device)["current"]
        except (ValueError, RuntimeError):
            pass

    def step_peak_mb(self):
        if self.before is None:
            return None
        info = self.tf.config.experimental.get_memory_info(self.device)
        return (info["peak"] - self.before) / 2 ** 20


def variables_mb(model):
    """The model's variables (encoders, bank, its momentum) and its optimizer's state, MB."""
    variables = {id(v): v for v in model.variables + model.optimizer.variables}
    return sum(int(v.numpy().nbytes) for v in variables.values()) / 2 ** 20


def timed_steps(setups, args, memory):
    """Round-robin over ``setups``: each round one step of each, the order reversed every
    other round.  Returns {name: step seconds} of the rounds after ``args.warmup`` and
    {name: the peak of the step's own tensors over that configuration's timed steps, MB}."""
    times = {setup["name"]: [] for setup in setups}
    peaks = {setup["name"]: None for setup in setups}
    for index in range(args.warmup + args.steps):
        for setup in (setups if index % 2 == 0 else setups[::-1]):
            memory.reset()
            start = time.perf_counter()
            setup["step"]()
            seconds = time.perf_counter() - start
            if index >= args.warmup:
                name, peak = setup["name"], memory.step_peak_mb()
                times[name].append(seconds)
                if peak is not None:
                    peaks[name] = max(peaks[name] or 0.0, peak)
    return times, peaks


def config_result(setup, step_times, tensor_peak, peak_rss, load, args, tf):
    """A configuration's result dict for the parent; also times its bank part alone."""
    from caco_tf.nets import profiling

    config, model, batch = setup["config"], setup["model"], setup["batch"]
    size, channels = config["data"]["image_size"], config["data"]["channels"]
    bank_size, dim = (int(d) for d in model.memory_bank.rows.shape)
    encoder_flops = profiling.forward_flops(model.query_encoder)
    matmuls = (profiling.CACO_BANK_MATMULS if config["method"]["name"] == "caco"
               else profiling.MOCO_BANK_MATMULS)
    step_flops = profiling.train_step_flops(encoder_flops, batch, bank_size, dim, matmuls)

    def unit(seed):
        return tf.math.l2_normalize(tf.random.stateless_normal([batch, dim], seed=[seed, 3]), -1)

    embeddings = [unit(seed) for seed in range(4)]
    bank_times = {}
    for part, function in bank_functions(tf, model, config["train"]["jit_compile"]).items():
        bank_times[part] = timed(lambda: float(function(*embeddings)), args.warmup, args.steps)

    if args.trace:
        tf.profiler.experimental.start(os.path.join(args.trace, setup["name"]))
        for _ in range(2):
            setup["step"]()
        tf.profiler.experimental.stop()

    return {"name": setup["name"], "config": setup["path"],
            "backbone": config["model"]["backbone"], "image_size": size, "channels": channels,
            "batch": batch, "method": config["method"]["name"], "bank_size": bank_size,
            "dim": dim, "projector_hidden": config["model"]["projector_hidden"],
            "xla": config["train"]["jit_compile"], "step_times": step_times,
            "bank_times": bank_times, "rss_built_mb": setup["rss_built_mb"],
            "peak_rss_mb": peak_rss, "tensor_peak_mb": tensor_peak,
            "encoder_flops": encoder_flops, "step_flops": step_flops,
            "threads": threads(tf), "load": load, "interleaved": args.interleave}


def measure_configs(names, args):
    """The configurations ``names`` in this (child) process: one (the default), or several
    stepped round-robin (``--interleave``).  A list of result dicts for the parent."""
    tf = setup_tensorflow(args)
    load_before = os.getloadavg()[0]
    setups = [prepare_config(name, args, tf) for name in names]
    times, peaks = timed_steps(setups, args, TensorMemory(tf))
    peak = peak_rss_mb()  # before the bank timing: the steps' own peak
    load = [load_before, os.getloadavg()[0]]
    # Tensor peak: the model's own variables and optimizer state, plus its steps' temporaries
    # (the other interleaved models' variables, allocated throughout, are left out).
    return [config_result(setup, times[setup["name"]],
                          None if peaks[setup["name"]] is None
                          else peaks[setup["name"]] + variables_mb(setup["model"]),
                          peak, load, args, tf) for setup in setups]


def measure_matmul(args):
    """The float32 dense matmul peak: the best size's 2n³ / median seconds."""
    tf = setup_tensorflow(args)
    sizes = (64, 128) if args.tiny else (2048, 4096)
    # The sum fetches one number instead of copying n² of them (n² adds against 2n³ FLOPs).
    product = tf.function(lambda a, b: tf.reduce_sum(tf.matmul(a, b)), autograph=False)
    rates = {}
    for n in sizes:
        a, b = (tf.random.stateless_normal([n, n], seed=[seed, 4]) for seed in (1, 2))
        seconds = statistics.median(timed(lambda: float(product(a, b)), 2, args.steps))
        rates[n] = 2 * n ** 3 / seconds
    best = max(rates, key=rates.get)
    import keras

    return {"name": "matmul", "rates": rates, "size": best, "peak_flops": rates[best],
            "threads": threads(tf), "tensorflow": tf.__version__, "keras": keras.__version__,
            "gpus": len(tf.config.list_physical_devices("GPU"))}


def child(args):
    result = (measure_matmul(args) if args.child == "matmul"
              else measure_configs(args.child.split(","), args))
    print(RESULT + json.dumps(result), flush=True)
    return 0


# ------------------------------------------------------------------------------------ parent
def run_child(names, args):
    """Run ``names`` ("matmul", or configurations) in a fresh process.

    Returns {name: result dict, or {"error": ...}}; a configuration's ``wall_s`` is its share
    of the process's wall time.
    """
    names = list(names)
    if args.tiny:  # in this process: the check that the script runs needs no fresh one
        results = measure_matmul(args) if names == ["matmul"] else measure_configs(names, args)
        results = results if isinstance(results, list) else [results]
        return {result["name"]: dict(result, wall_s=0.0) for result in results}
    command = [sys.executable, os.path.abspath(__file__), "--child", ",".join(names),
               "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--intra-op", str(args.intra_op), "--inter-op", str(args.inter_op)]
    command += ["--interleave"] if args.interleave else []
    command += ["--trace", args.trace] if args.trace else []
    start = time.perf_counter()
    # stderr passes through (TensorFlow's messages, tracebacks); stdout carries the result.
    process = subprocess.run(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    lines = [line for line in process.stdout.splitlines() if line.startswith(RESULT)]
    wall = (time.perf_counter() - start) / len(names)
    if process.returncode or not lines:
        return {name: {"name": name, "error": f"exit status {process.returncode}",
                       "wall_s": wall} for name in names}
    results = json.loads(lines[-1][len(RESULT):])
    results = results if isinstance(results, list) else [results]
    return {result["name"]: dict(result, wall_s=wall) for result in results}


def median(values):
    return statistics.median(values)


def summary(result, peak_flops):
    """Derived figures of one configuration's result: utilization against the machine's
    theoretical float32 peak (``_harness.theoretical_peak``), and against the matmul measured."""
    step = median(result["step_times"])
    theoretical = (_harness.theoretical_peak() or {}).get("flops")
    out = {"step": step, "images_per_s": result["batch"] / step,
           "utilization": (result["step_flops"] / step / theoretical) if theoretical else None,
           "of_matmul": (result["step_flops"] / step / peak_flops) if peak_flops else None}
    for part, times in result["bank_times"].items():
        out[f"{part}_s"] = median(times)
        out[f"{part}_share"] = median(times) / step
    return out


def machine():
    """The CPU's name (`_harness.cpu_name`) and the memory in GiB (None where unknown)."""
    model, memory = _harness.cpu_name(), None
    try:
        with open("/proc/meminfo") as handle:
            memory = int(handle.readline().split()[1]) / 2 ** 20  # MemTotal, kB → GiB
    except OSError:
        pass
    return model, memory


def command_line(argv, only=None):
    """The command as run, less ``--note``/``--output``; with ``--only NAME`` if given."""
    shown, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--note", "--output", "--only"):
            skip = True
            continue
        if arg.startswith(("--note=", "--output=", "--only=")):
            continue
        shown.append(shlex.quote(arg))
    if only:
        shown += ["--only", only]
    return " ".join(["python benchmarks/step_time.py", *shown])


def verdict(value, goal, at_most):
    if value is None:
        return "not measured in this run"
    met = value <= goal if at_most else value >= goal
    return "met" if met else "**missed**"


def _gb(mb):
    return f"{mb / 1024:.2f}"


def _gb_or_dash(mb):
    return "—" if mb is None else _gb(mb)


def _rate(value):
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def section(results, matmul, args, argv, wall_s, pending=()):
    if "tensorflow" not in matmul:  # the matmul process failed: ask this one
        import keras
        import tensorflow as tf

        matmul = dict(matmul, tensorflow=tf.__version__, keras=keras.__version__,
                      gpus=len(tf.config.list_physical_devices("GPU")))
    peak = matmul.get("peak_flops")
    done = {name: r for name, r in results.items() if "error" not in r}
    derived = {name: summary(r, peak) for name, r in done.items()}
    cpu, memory = machine()
    gpus = matmul["gpus"]
    thread = matmul.get("threads") or next(iter(done.values()), {}).get("threads", {})
    loads = [r["load"] for r in done.values()]
    env = ", ".join(f"{k}={os.environ[k]}" for k in (
        "OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS",
        "TF_ENABLE_ONEDNN_OPTS") if k in os.environ)
    heads = ", ".join(sorted({f"D={r['dim']}, projector hidden {r['projector_hidden']}"
                              for r in done.values()})) or "D and projector as configured"
    lines = [
        f"`{command_line(argv, args.only or None)}` — {datetime.date.today()}, {cpu}, "
        f"{_harness.cpu_count()} CPU cores (`nproc`)"
        + (f", {memory:.0f} GiB memory" if memory else "") + f", "
        f"{gpus or 'no'} GPU{'s' if gpus != 1 else ''}, TensorFlow {matmul['tensorflow']}, Keras "
        f"{matmul['keras']}; threads: intra-op {thread.get('intra_op')}, inter-op "
        f"{thread.get('inter_op')} (0: TensorFlow's default, from the cores)"
        + (f"; {env}" if env else "") + f". Whole run: {wall_s / 60:.0f} min.",
        "",
        ("All configurations in one process, stepped round-robin (`--interleave`: each round "
         "one step of each, the order reversed every other round), so that the machine's "
         "drifts hit them alike; per configuration: " if args.interleave else
         "Each configuration in its own process: ")
        + "the model from `build.build_model` (float32, "
        f"one device, BatchNorm not synchronized, {heads}, `warmup_epochs=0`: every step is "
        "a CaCo step with the learned bank, or a MoCo v2 step with its FIFO queue), one "
        "synthetic two-view batch of random images in memory (no input pipeline), "
        f"{args.warmup} warm-up step{'s' * (args.warmup != 1)} (tracing, XLA compilation), then "
        f"the median [min–max] of {args.steps} timed steps of `model.make_train_function()`. "
        "Images/s: batch / median step (one image = its two views). Peak RSS: the process's "
        "`ru_maxrss` after the timed steps (TensorFlow's runtime included"
        + ("; one process for all rows here" if args.interleave else "") + "). Tensor peak: "
        "the model's variables and optimizer state (the bank and its momentum included) plus the "
        "peak of its step's temporaries over the timed steps (TensorFlow's BFC allocator "
        "statistics, reset before each step). Model FLOPs "
        "(counted by `caco_tf.profiling`, not by XLA: TensorFlow has no public cost analysis): "
        "2 × multiply-adds of the convolutions and dense layers, 8 encoder forwards per image "
        "(query forward + backward = 3 per view, key forward 1 per view) plus the step's "
        "products with the bank. Utilization: model FLOP/s over the machine's theoretical "
        "float32 peak, "
        + ((_harness.theoretical_peak() or {}).get("description", "unknown here")) +
        " (`benchmarks/_harness.py`: cores, clock and vector width from /proc/cpuinfo); in "
        "brackets, over the best float32 matmul measured in the same run "
        + (f"({peak / 1e9:,.1f} GFLOP/s at n={matmul['size']}, median of {args.steps}, same "
           "thread settings)" if peak else "(not measured)") + ". Bank share: the bank "
        "part of the step alone (normalization, MPP products and argmax, loss logits and their "
        "gradient, cooperative-adversarial gradient, momentum update), same B, K and XLA "
        "setting, median over the median step; \"+ diag.\" adds the step's bank-sized "
        "diagnostics (contrast accuracy, MPP probability, distinct positives, bank norm).",
    ]
    if loads:
        lines += ["", f"Load average (1 min) over the run: {min(min(l) for l in loads):.1f} to "
                      f"{max(max(l) for l in loads):.1f} on {_harness.cpu_count()} cores; "
                      "figures taken under other jobs' load are low and noisy."]
    if pending:
        lines += ["", f"**Partial: the run was still going when this was written; not yet "
                      f"measured: {', '.join(pending)}.**"]
    if args.steps < 20:
        lines += ["", f"Only {args.steps} timed steps per figure: below the 20 the issue asks."]
    if args.note:
        lines += ["", args.note]

    lines += ["", "| figure | backbone, input | batch | method | K | XLA | step (s), median "
                  "[min–max] | images/s | peak RSS (GB) | model GFLOP / step | utilization "
                  "| tensor peak (GB) | bank share (+ diag.) | reproduce |",
              "|---|---|---:|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, result in results.items():
        # An interleaved row is only measured beside the others.
        reproduce = f"`{command_line(argv, args.only if args.interleave else name)}`"
        if "error" in result:
            lines.append(f"| {name} | failed: {result['error']} | | | | | | | | | | | | "
                         f"{reproduce} |")
            continue
        d, times = derived[name], result["step_times"]
        if "algorithm_share" in d:
            share = (f"{100 * d['algorithm_share']:.1f} % "
                     f"({100 * d['with_diagnostics_share']:.1f} %)")
        else:
            share = f"queue {100 * d['queue_share']:.1f} %"
        utilization = (f"{100 * d['utilization']:.1f} %" if d["utilization"] is not None
                       else "—") + (f" ({100 * d['of_matmul']:.0f} %)" if d["of_matmul"] else "")
        lines.append(
            f"| {name} | {result['backbone']}, {result['image_size']}² | {result['batch']} "
            f"| {result['method']} | {result['bank_size']:,} | {'yes' if result['xla'] else 'no'} "
            f"| {d['step']:.3f} [{min(times):.3f}–{max(times):.3f}] | {_rate(d['images_per_s'])} "
            f"| {_gb(result['peak_rss_mb'])} | {result['step_flops'] / 1e9:,.1f} | {utilization} "
            f"| {_gb_or_dash(result.get('tensor_peak_mb'))} "
            f"| {share} | {reproduce} |")

    lines += ["", "Ratios (from the rows above, same run) and goals:", ""]
    lines += ratio_lines(done, derived, peak)
    lines += scaling_lines(done, derived)
    return lines


def describe(result, bank=True):
    """'resnet50 224², batch 32, K=65,536' from a configuration's result."""
    text = f"{result['backbone']} {result['image_size']}², batch {result['batch']}"
    return text + (f", K={result['bank_size']:,}" if bank else "")


def ratio_lines(done, derived, peak):
    lines = xla_lines(done, derived)
    if not any(name.startswith("r50_") for name in done):
        return lines  # the goals are ResNet-50's; a run without it states only XLA's gain
    caco, moco = derived.get("r50_caco"), derived.get("r50_moco")
    overhead = caco["step"] / moco["step"] if caco and moco else None
    where = f" ({describe(done['r50_caco'])}, no XLA)" if caco else ""
    paired = ""
    if overhead and done["r50_caco"].get("interleaved") and done["r50_moco"].get("interleaved"):
        # Steps of the same round ran seconds apart: their ratio cancels the machine's drift.
        rounds = [c / m for c, m in zip(done["r50_caco"]["step_times"],
                                        done["r50_moco"]["step_times"])]
        paired = (f"; the median of the {len(rounds)} rounds' own ratios "
                  f"{median(rounds):.3f}× [{min(rounds):.3f}–{max(rounds):.3f}]")
    lines.append(
        f"- Learned-bank overhead, CaCo / MoCo v2 step{where}: "
        + (f"{overhead:.3f}×" if overhead else "—") + f" (ratio of the medians{paired}; paper: "
        f"2.24 / 2.12 GPU-hours per epoch = {PAPER_OVERHEAD:.3f}×). Goal ≤ "
        f"{GOALS['overhead']:.2f}×: {verdict(overhead, GOALS['overhead'], True)}.")
    for name, label in (("r50_caco", "no XLA"), ("r50_caco_xla", "XLA")):
        value = derived.get(name, {}).get("utilization")
        where = f"{describe(done[name], False)}, " if name in done else ""
        lines.append(
            f"- Utilization, CaCo, {where}{label}: "
            + (f"{100 * value:.1f} %" if value is not None else "—")
            + f" of the theoretical float32 peak. Goal ≥ {100 * GOALS['utilization']:.0f} %: "
            f"{verdict(value, GOALS['utilization'], False)}.")
    if caco:
        lines.append(
            f"- Bank share ({describe(done['r50_caco'])}, no XLA): "
            f"{100 * caco['algorithm_share']:.1f} % ({1e3 * caco['algorithm_s']:.0f} ms), "
            f"{100 * caco['with_diagnostics_share']:.1f} % with the diagnostics "
            f"({1e3 * caco['with_diagnostics_s']:.0f} ms). Goal ≤ "
            f"{100 * GOALS['bank_share']:.0f} % (judged with the diagnostics, which every step "
            f"runs): {verdict(caco['with_diagnostics_share'], GOALS['bank_share'], True)}.")
    else:
        lines.append("- Bank share: not measured in this run.")
    if moco:
        lines.append(f"- MoCo v2's queue part (logits, their gradient, FIFO write), "
                     f"{describe(done['r50_moco'])}: {100 * moco['queue_share']:.1f} % of its "
                     f"step ({1e3 * moco['queue_s']:.0f} ms).")
    if "r50_caco" in done:
        result = done["r50_caco"]
        shared = " (the process, every interleaved model in it)" if result.get("interleaved") \
            else ""
        lines.append(f"- Peak resident memory of a CaCo step, {describe(result)}, no XLA: "
                     f"{_gb(result['peak_rss_mb'])} GB{shared} (the process after building the "
                     f"model, before the first step: {_gb(result['rss_built_mb'])} GB); the "
                     f"step's tensor peak {_gb_or_dash(result.get('tensor_peak_mb'))} GB.")
    return lines


def xla_lines(done, derived):
    lines = []
    for slow, fast in (("r50_caco", "r50_caco_xla"), ("c18_caco", "c18_caco_xla"),
                       ("m_caco", "m_caco_xla")):
        if slow in derived and fast in derived:
            before, after = derived[slow]["step"], derived[fast]["step"]
            lines.append(f"- XLA speed-up, {describe(done[slow], False)}: {before / after:.2f}× "
                         f"({before:.3f} s → {after:.3f} s).")
    return lines


def scaling_lines(done, derived):
    """Step, bank part and peak memory against K, and whether growth is at most linear.

    Time: the bank part's growth from the previous K over the growth of K (≤ 1: at most
    linear).  Memory: the peak's increment per added bank row, from one K to the next; linear
    growth keeps it from rising (a K-independent baseline cancels in the increments).
    """
    present = [name for name in SCALING if name in done]
    if not present:
        return []
    if len(present) < 2:
        return ["", "Bank scaling: fewer than two K measured in this run."]
    first = done[present[0]]
    # The allocator's tensor peak is the step's own; RSS (one process for all rows when
    # interleaved) is the fallback where the device keeps no statistics.
    key, label = (("tensor_peak_mb", "tensor peak")
                  if all(done[name].get("tensor_peak_mb") for name in present)
                  else ("peak_rss_mb", "peak RSS"))
    lines = ["", f"Bank scaling, CaCo, {describe(first, False)}, D={first['dim']}, no XLA:", "",
             "| K | step (s) | bank part + diag. (ms) | bank share | bank growth / K growth "
             f"| {label} (GB) | {label} increment per added row (kB) |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    time_linear, per_row = True, []
    for index, name in enumerate(present):
        result, d = done[name], derived[name]
        time_growth = increment = "—"
        if index:
            before, b = done[present[index - 1]], derived[present[index - 1]]
            ratio = (d["with_diagnostics_s"] / b["with_diagnostics_s"]
                     / (result["bank_size"] / before["bank_size"]))
            time_linear &= ratio <= 1
            time_growth = f"{ratio:.2f}"
            per_row.append((result[key] - before[key]) * 1024
                           / (result["bank_size"] - before["bank_size"]))
            increment = f"{per_row[-1]:.2f}"
        lines.append(f"| {result['bank_size']:,} | {d['step']:.3f} "
                     f"| {1e3 * d['with_diagnostics_s']:.1f} "
                     f"| {100 * d['with_diagnostics_share']:.1f} % | {time_growth} "
                     f"| {_gb(result[key])} | {increment} |")
    if len(per_row) < 2:
        memory = "not measured (needs three K)"
    elif per_row[0] <= 0:
        memory = ("not resolved: the peak did not rise between the two smallest K "
                  "(the bank is small next to the step's other memory)")
    else:
        memory = "met" if per_row[-1] <= per_row[0] else "**missed**"
    lines += ["", f"Goal, growth no worse than linear in K: bank part's time "
                  f"{'met' if time_linear else '**missed**'}; {label} {memory}."]
    return lines


def parse_args(argv):
    parser = _harness.parser(__doc__)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per figure")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--only", default="",
                        help=f"comma-separated configurations of: {', '.join(CONFIGS)}")
    parser.add_argument("--intra-op", type=int, default=0,
                        help="tf.config.threading intra-op threads (0: TensorFlow's default)")
    parser.add_argument("--inter-op", type=int, default=0,
                        help="tf.config.threading inter-op threads (0: TensorFlow's default)")
    parser.add_argument("--interleave", action="store_true",
                        help="all configurations in one process, one step of each in turn, so "
                             "that the machine's drifts hit them alike (ratios between them "
                             "are then fair); peak RSS is then the process's")
    parser.add_argument("--trace", default="", help="also write tf.profiler traces here")
    parser.add_argument("--note", default="", help="a line to add, e.g. about machine load")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.tiny and not args.only:
        args.only, args.steps, args.warmup = "m_caco", 1, 1
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be positive and --warmup at least 0")
    unknown = [n for n in args.only.split(",") if n and n not in CONFIGS]
    if args.child:
        unknown = [n for n in args.child.split(",") if n not in CONFIGS and n != "matmul"]
    if unknown:
        parser.error(f"unknown configuration(s) {', '.join(unknown)}; known: "
                     f"{', '.join(CONFIGS)}")
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.child:
        return child(args)
    names = [n for n in CONFIGS if not args.only or n in args.only.split(",")]
    name, title = section_of(args)

    start = time.perf_counter()
    matmul = run_child(["matmul"], args)["matmul"]
    if "error" in matmul:
        print(f"matmul peak: failed ({matmul['error']})", flush=True)
    else:
        print(f"matmul peak: {matmul['peak_flops'] / 1e9:,.1f} GFLOP/s at n={matmul['size']} "
              f"({matmul['wall_s']:.0f} s)", flush=True)
    # One process per configuration (its own peak RSS), or all in one, stepped round-robin.
    groups = [names] if args.interleave else [[name] for name in names]
    results = {}
    for group in groups:
        results.update(run_child(group, args))
        for config in group:
            result = results[config]
            if "error" in result:
                print(f"{config}: failed ({result['error']})", flush=True)
                continue
            d = summary(result, matmul.get("peak_flops"))
            print(f"{config}: {d['step']:.3f} s/step (median of {args.steps}), "
                  f"{d['images_per_s']:,.1f} images/s, peak RSS {_gb(result['peak_rss_mb'])} GB "
                  f"({result['wall_s']:.0f} s)", flush=True)
        if len(results) < len(names):
            # A long run (hours for the ResNet-50 rows) keeps what it has measured so far.
            _harness.publish(args, name, title, section(
                results, matmul, args, argv, time.perf_counter() - start,
                pending=names[len(results):]))
    _harness.publish(args, name, title, section(results, matmul, args, argv,
                                                time.perf_counter() - start))
    failed = [n for n, r in results.items() if "error" in r] + (
        ["matmul"] if "error" in matmul else [])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
