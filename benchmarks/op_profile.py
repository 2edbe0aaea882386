"""Where a training step's time goes by kind of TensorFlow op, float32 against bfloat16.

    python benchmarks/op_profile.py                        # ResNet-50 and the offline net
    python benchmarks/op_profile.py --only offline --steps 20 --output /tmp/o.md

Each configuration of ``step_profile.py`` (``offline``: the small ConvNet of configs/mnist.yaml,
batch 16; ``r50``: ResNet-50, 224 px, batch 32, K=65,536) is built in ``float32`` and in
``mixed_bfloat16``, both without XLA (the profiler sees into TensorFlow's ops, not into an XLA
cluster), and its compiled step (Keras' one-step function) runs under TensorFlow's profiler
(``tf.profiler.experimental``) after two untimed steps.  Every op's execution time is read from
the trace and summed by kind: convolution forward / backward-data / backward-filter, matmul,
BatchNorm forward / backward, element-wise, casts, data movement (pad, slice, concat,
transpose), pooling, variable reads and writes, the rest.  The two precisions' times and
their ratio, per kind, show which ops keep the bfloat16 step from the AMX units' speed-up.

The sums are of op times as the executor's threads saw them: two ops running at once on two
cores both count in full, so the total exceeds the step's wall time (given beside it, timed
without the profiler).

Then the compiled step's wall time in both precisions with and without XLA, the four built in
one process and stepped in turn, round after round (medians): what the profile cannot see
into (XLA's own CPU kernels).  ``--no-xla-for r50`` leaves XLA out for a configuration (a
ResNet-50 step under XLA takes tens of seconds on two cores, its compilation minutes).
"""

import collections
import functools
import glob
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402
import step_profile  # noqa: E402

TITLE = "## The step by kind of op, float32 and bfloat16 (`benchmarks/op_profile.py`)"
NO_XLA = ["train.jit_compile=false"]
R50 = ["train.batch_size=32", "method.caco.bank_size=65536"] + NO_XLA
CONFIGS = {  # name -> (config file, settings)
    "offline": (step_profile.MNIST, NO_XLA),
    "r50": (step_profile.R50, R50),
}
XLA = ["train.jit_compile=true"]
ROUNDS = {"offline": 30, "r50": 3}  # of the wall-time table: a ResNet-50 step is seconds
PRECISIONS = ("float32", "mixed_bfloat16")
# Kind of each op type (TensorFlow's names, oneDNN's _Mkl/_MklNative prefixes removed);
# the first pattern an op type starts with decides.
KINDS = [
    ("convolution, backward filter",
     ("Conv2DBackpropFilter", "DepthwiseConv2dNativeBackpropFilter")),
    ("convolution, backward data", ("Conv2DBackpropInput", "DepthwiseConv2dNativeBackpropInput")),
    ("convolution, forward", ("Conv2D", "PadWithConv2D", "FusedConv2D", "DepthwiseConv2dNative")),
    ("matmul", ("MatMul", "BatchMatMul", "FusedMatMul")),
    ("BatchNorm, backward", ("FusedBatchNormGrad",)),
    ("BatchNorm, forward", ("FusedBatchNorm",)),
    ("casts", ("Cast",)),
    ("pooling", ("AvgPool", "MaxPool")),
    ("data movement (pad, slice, concat, transpose, tile)",
     ("Pad", "Slice", "StridedSlice", "Concat", "Transpose", "Tile", "Pack", "Unpack", "Split",
      "Reshape", "Gather", "ScatterNd", "UnsortedSegmentSum")),
    ("XLA kernels (the bank's pass: bank.py compiles it)", ("XLA",)),
    ("variables (read, assign)", ("ReadVariableOp", "Assign", "ResourceApply", "TemporaryVariable",
                                  "DestroyTemporaryVariable", "VarHandleOp")),
    ("element-wise (relu, add, mul, ...)",
     ("Relu", "ReluGrad", "Add", "AddV2", "AddN", "Mul", "Sub", "RealDiv", "Div", "Neg",
      "Square", "SquaredDifference", "Sqrt", "Rsqrt", "Exp", "Log", "Maximum", "Minimum",
      "Select", "SelectV2", "Greater", "Less", "Equal", "Sum", "Mean", "Max", "Min", "Prod",
      "Softmax", "LogSoftmax", "BiasAdd", "Tanh", "Sigmoid", "Pow", "Reciprocal",
      "ZerosLike", "OnesLike", "Fill", "Abs", "Sign", "FloorMod", "FloorDiv")),
]
OTHER = "other"
XLA_KERNELS = ("custom-call", "dot", "convolution", "sort", "reduce", "gather", "scatter",
               "copy", "dynamic-update-slice", "dynamic-slice", "while", "conditional", "tuple",
               "concatenate", "transpose", "broadcast")  # op types of XLA's HLO
CALLS = ("PartitionedCall", "StatefulPartitionedCall", "While", "If", "StatelessIf",
         "StatelessWhile", "IteratorGetNext")  # containers: their ops are counted themselves


def kind_of(op_type):
    name = op_type
    for prefix in ("_MklNative", "_Mkl"):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    if "fusion" in name or name in XLA_KERNELS:
        name = "XLA"
    for kind, patterns in KINDS:
        if name in patterns or any(name.startswith(p) for p in patterns if len(p) > 4):
            return kind
    return OTHER


def op_times(trace_dir, steps):
    """{op type: ms a step} from the profiler's trace (every TensorFlow op event)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)[0],
              "rb") as handle:
        space.ParseFromString(handle.read())
    times = collections.Counter()
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if ":" not in name or "::" in name:  # ops are "name:Type"; frames are not
                    continue
                op_type = name.rsplit(":", 1)[1].strip()
                if op_type not in CALLS and "__inference" not in op_type:  # not a function
                    times[op_type] += event.duration_ps / 1e9 / steps
    return times


@functools.lru_cache(maxsize=None)  # a variant's model, built once for all its tables
def compiled_step(name, precision, xla=False, tiny=False):
    """A callable running one compiled step of a configuration (built, traced, warmed up)."""
    path, settings = CONFIGS[name]
    variant = f"{name}_{precision}{'_xla' if xla else ''}"
    step_profile.CONFIGS[variant] = (path, settings + (XLA if xla else []), precision)
    _, model, views = step_profile.build(variant, tiny)
    one_step = model.make_train_function().one_step[-1]

    def run():
        step_profile.wait(one_step([views]))

    for _ in range(1 if tiny else 2):
        run()
    return run


def wall_times(name, args, xla=True):
    """{(precision, XLA): median ms of the compiled step}, the variants stepped in turn."""
    runs = {(p, x): compiled_step(name, p, x, args.tiny)
            for p in PRECISIONS for x in ((False, True) if xla else (False,))}
    rounds = args.rounds or ROUNDS[name]
    return {key: 1e3 * statistics.median(seconds) for key, seconds in _harness.interleave(
        runs, rounds, warmup=0).items()}


def profile(name, precision, args):
    """(op ms by type, the step's wall ms without the profiler) of one configuration."""
    import tensorflow as tf

    run = compiled_step(name, precision, tiny=args.tiny)
    walls = _harness.interleave({"step": run}, args.steps, warmup=0)["step"]
    with tempfile.TemporaryDirectory() as trace_dir:
        tf.profiler.experimental.start(trace_dir)
        for _ in range(args.steps):
            run()
        tf.profiler.experimental.stop()
        return op_times(trace_dir, args.steps), 1e3 * statistics.median(walls)


def table(name, results):
    (f32, f32_wall), (bf16, bf16_wall) = (results[p] for p in PRECISIONS)
    kinds = collections.defaultdict(lambda: [0.0, 0.0])
    for index, times in enumerate((f32, bf16)):
        for op_type, ms in times.items():
            kinds[kind_of(op_type)][index] += ms
    order = [kind for kind, _ in KINDS] + [OTHER]
    lines = [f"**{name}** (no XLA): ms a step, summed over the executor's threads", "",
             "| kind of op | float32 | bfloat16 | float32 / bfloat16 |", "|---|---:|---:|---:|"]
    others = sorted((t for t in set(f32) | set(bf16) if kind_of(t) == OTHER),
                    key=lambda t: -f32.get(t, 0) - bf16.get(t, 0))[:4]
    for kind in order:
        a, b = kinds.get(kind, (0.0, 0.0))
        if kind == OTHER:
            kind += f" (mostly {', '.join(f'`{t}`' for t in others)})"
        if a or b:
            lines.append(f"| {kind} | {a:.1f} | {b:.1f} | {a / b if b else float('inf'):.2f} |")
    a, b = sum(f32.values()), sum(bf16.values())
    lines.append(f"| all ops | {a:.1f} | {b:.1f} | {a / b:.2f} |")
    lines.append(f"| the step's wall time (no profiler, median) | {f32_wall:.1f} | {bf16_wall:.1f} "
                 f"| {f32_wall / bf16_wall:.2f} |")
    lines += ["", "The ten op types of the bfloat16 step that gained least (ms a step, float32 → "
              "bfloat16):", ""]
    shared = [t for t in bf16 if f32.get(t, 0) > 0.01 * a and bf16[t] > 0.01 * b]
    for op_type in sorted(shared, key=lambda t: f32[t] / bf16[t])[:10]:
        lines.append(f"- `{op_type}`: {f32[op_type]:.1f} → {bf16[op_type]:.1f} "
                     f"({f32[op_type] / bf16[op_type]:.2f}x)")
    return lines


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = _harness.parser(__doc__)
    parser.add_argument("--only", default="r50,offline", help="configurations, comma-separated: "
                        + ", ".join(CONFIGS))
    parser.add_argument("--steps", type=int, default=3, help="profiled (and timed) steps")
    parser.add_argument("--rounds", type=int, help="rounds of the wall-time tables (default: "
                        + ", ".join(f"{n} {r}" for n, r in ROUNDS.items()) + ")")
    parser.add_argument("--no-xla-for", default="", help="configurations whose wall-time "
                        "table leaves XLA out, comma-separated")
    args = parser.parse_args(argv)
    if args.tiny:
        args.only, args.steps, args.rounds, args.no_xla_for = "offline", 1, 1, "offline"
    started = time.time()
    body = []
    for name in args.only.split(","):
        results = {p: profile(name, p, args) for p in PRECISIONS}
        rows = table(name, results)
        rounds = args.rounds or ROUNDS[name]
        walls = wall_times(name, args, xla=name not in args.no_xla_for.split(","))
        rows += ["", f"**{name}**, the compiled step's wall time (ms, median of {rounds} "
                 "rounds, the variants in turn):", "", "| precision | no XLA | XLA |",
                 "|---|---:|---:|"]
        rows += [f"| {p} | {walls[(p, False)]:.1f} | "
                 f"{f'{walls[(p, True)]:.1f}' if (p, True) in walls else '–'} |"
                 for p in PRECISIONS]
        print("\n".join(rows), flush=True)
        body += rows + [""]
    lines = _harness.header(__file__, argv, (
        f"{args.steps} profiled steps a configuration; whole run "
        f"{(time.time() - started) / 60:.0f} min."))
    _harness.publish(args, "op_profile", TITLE, lines + body[:-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
