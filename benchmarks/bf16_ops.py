"""Single TensorFlow ops in float32 and bfloat16 at ResNet-50's shapes: a minimal reproduction
of what holds a bfloat16 training step back on a CPU with AMX.

    python benchmarks/bf16_ops.py                 # -> BENCHMARKS.md
    python benchmarks/bf16_ops.py --rounds 5 --output /tmp/b.md

Each op runs alone in its own ``tf.function`` (no XLA) on random inputs of a ResNet-50 layer's
shape at batch 32: the convolutions of each kind (7×7/2 stem, 1×1, 3×3, 3×3/2, 1×1/2
projection) forward, backward-data and backward-filter; BatchNorm forward and backward in
training mode (``tf.compat.v1.nn.fused_batch_norm`` and its gradient, as Keras runs it); and
the element-wise ops of a residual block (``relu``, ``add``, ReLU's gradient).  The two
dtypes are timed in turn, round after round (medians).  A second pass of each op in a child
process with ``ONEDNN_VERBOSE=1`` names the oneDNN implementation it ran
(``brg_conv_fwd:avx10_1_512_amx`` is AMX; ``jit:avx512_core`` is AVX-512 without AMX; no line:
the op is TensorFlow's own Eigen kernel, not oneDNN).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

TITLE = "## Single ops in float32 and bfloat16 at ResNet-50's shapes (`benchmarks/bf16_ops.py`)"
# name -> (input height and width, input channels, output channels, kernel, stride)
CONVOLUTIONS = {
    "conv 7x7/2 stem, 224 px, 3->64": (224, 3, 64, 7, 2),
    "conv 1x1, 56 px, 64->256": (56, 64, 256, 1, 1),
    "conv 3x3, 56 px, 64->64": (56, 64, 64, 3, 1),
    "conv 3x3/2, 56 px, 128->128": (56, 128, 128, 3, 2),
    "conv 1x1/2 projection, 56 px, 256->512": (56, 256, 512, 1, 2),
}
ACTIVATION = (56, 56, 256)  # a residual block's output in stage 1


def ops(dtype, batch):
    """{name: (callable, GFLOP or None)} of every op in ``dtype`` at ``batch``."""
    import tensorflow as tf

    activation = (batch,) + ACTIVATION

    def normal(shape):
        return tf.cast(tf.random.stateless_normal(shape, seed=[len(shape), 1]), dtype)

    found = {}
    for name, (size, cin, cout, kernel, stride) in CONVOLUTIONS.items():
        out = -(-size // stride)
        x, w = normal([batch, size, size, cin]), normal([kernel, kernel, cin, cout])
        dy = normal([batch, out, out, cout])
        gflop = 2 * batch * out * out * cin * cout * kernel * kernel / 1e9
        strides = [1, stride, stride, 1]
        found[f"{name}: forward"] = (tf.function(
            lambda x=x, w=w, s=stride: tf.nn.conv2d(x, w, s, "SAME")), gflop)
        found[f"{name}: backward data"] = (tf.function(
            lambda w=w, dy=dy, shape=x.shape, s=strides: tf.raw_ops.Conv2DBackpropInput(
                input_sizes=list(shape), filter=w, out_backprop=dy, strides=s,
                padding="SAME")), gflop)
        found[f"{name}: backward filter"] = (tf.function(
            lambda x=x, dy=dy, shape=w.shape, s=strides: tf.raw_ops.Conv2DBackpropFilter(
                input=x, filter_sizes=list(shape), out_backprop=dy, strides=s,
                padding="SAME")), gflop)
    a, b = normal(activation), normal(activation)
    scale, offset = tf.ones([ACTIVATION[-1]]), tf.zeros([ACTIVATION[-1]])
    shape = "x".join(map(str, activation))

    @tf.function
    def batchnorm_backward(x, dy):
        with tf.GradientTape() as tape:
            tape.watch([x, scale, offset])
            y, _, _ = tf.compat.v1.nn.fused_batch_norm(x, scale, offset, is_training=True)
        return tape.gradient(y, [x, scale, offset], output_gradients=dy)

    found[f"BatchNorm forward (training), {shape}"] = (tf.function(
        lambda: tf.compat.v1.nn.fused_batch_norm(a, scale, offset, is_training=True)[0]), None)
    found[f"BatchNorm forward + backward, {shape}"] = (
        lambda: batchnorm_backward(a, b)[0], None)
    found[f"relu, {shape}"] = (tf.function(lambda: tf.nn.relu(a)), None)
    found[f"add, {shape}"] = (tf.function(lambda: a + b), None)
    found[f"ReLU's gradient, {shape}"] = (tf.function(
        lambda: tf.raw_ops.ReluGrad(gradients=a, features=b)), None)
    found[f"cast to the other dtype, {shape}"] = (tf.function(
        lambda: tf.cast(a, tf.float32 if dtype == tf.bfloat16 else tf.bfloat16)), None)
    return found


def timed(rounds, batch):
    """{op: {dtype: median seconds}}, each op's two dtypes in turn, round after round."""
    import tensorflow as tf

    both = {dtype.name: ops(dtype, batch) for dtype in (tf.float32, tf.bfloat16)}
    medians = {}
    for name in both["float32"]:
        times = _harness.interleave({d: lambda d=d: both[d][name][0]().numpy() for d in both},
                                    rounds)
        medians[name] = {d: statistics.median(v) for d, v in times.items()}
    return medians, {name: f for name, (_, f) in both["float32"].items()}


def implementations(batch):
    """{op: {dtype: oneDNN implementation(s)}}, from a child process with ONEDNN_VERBOSE=1."""
    env = dict(os.environ, ONEDNN_VERBOSE="1", TF_CPP_MIN_LOG_LEVEL="3")
    output = subprocess.run([sys.executable, __file__, "--verbose-pass", "--batch", str(batch)],
                            env=env, capture_output=True, text=True, check=True).stdout
    found, current = {}, None
    for line in output.splitlines():
        if line.startswith("@@ "):
            current = json.loads(line[3:])
            found.setdefault(current[0], {})[current[1]] = set()
        elif current and line.startswith("onednn_verbose") and ",exec," in line:
            fields = line.split(",")
            primitive, implementation = fields[5], fields[6]
            if primitive != "reorder":
                found[current[0]][current[1]].add(f"{primitive} {implementation}")
    return found


def verbose_pass(batch):
    """Each op once, after its warm-up, between markers (what ``implementations`` reads)."""
    import tensorflow as tf

    for dtype in (tf.float32, tf.bfloat16):
        for name, (function, _) in ops(dtype, batch).items():
            function()
            print("@@ " + json.dumps([name, dtype.name]), flush=True)
            function()
            print("@@ " + json.dumps(["", ""]), flush=True)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = _harness.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--verbose-pass", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.verbose_pass:
        return verbose_pass(args.batch)
    if args.tiny:
        args.rounds, args.batch = 1, 1
    started = time.time()
    medians, gflop = timed(args.rounds, args.batch)
    kernels = implementations(args.batch)
    lines = _harness.header(__file__, argv, (
        f"Batch {args.batch}, medians of {args.rounds} rounds; whole run "
        f"{(time.time() - started) / 60:.0f} min."))
    lines += ["| op | float32 ms | bfloat16 ms | float32 / bfloat16 | GFLOP/s f32 → bf16 "
              "| oneDNN implementation, bfloat16 (float32) |", "|---|---:|---:|---:|---:|---|"]
    for name, by_dtype in medians.items():
        f32, bf16 = by_dtype["float32"], by_dtype["bfloat16"]
        rate = (f"{gflop[name] / f32:.0f} → {gflop[name] / bf16:.0f}" if gflop[name] else "")
        kernel = kernels.get(name, {})
        named = "; ".join(sorted(kernel.get("bfloat16", ()))) or "none (Eigen)"
        other = "; ".join(sorted(kernel.get("float32", ()))) or "none (Eigen)"
        lines.append(f"| {name} | {1e3 * f32:.1f} | {1e3 * bf16:.1f} | {f32 / bf16:.2f} | "
                     f"{rate} | {named} ({other}) |")
    _harness.publish(args, "bf16_ops", TITLE, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
