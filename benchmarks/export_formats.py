"""Serving throughput of the three export formats on this CPU: the SavedModel (TensorFlow),
ONNX (onnxruntime) and LiteRT (ai-edge-litert's interpreter).

    python benchmarks/export_formats.py                 # -> BENCHMARKS.md
    python benchmarks/export_formats.py --rounds 3 --output /tmp/f.md

For the offline default's backbone (small ConvNet, 2×2 grid pooling, 28 px gray) and a
ResNet-50 at 224 px (random weights: throughput does not depend on them), each exported with
its preprocessing (uint8 images in, features out), images/s at batch 1 and batch 64.  The three
formats are timed in one process, interleaved: every round times each format once (a fixed
number of calls on the same images), the order reversed every other round, so the machine's
drift hits them alike; the figure is the median over the rounds.  Runtimes use every core
(``nproc``) for their threads.
"""

import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

TITLE = "## Serving throughput by export format (`benchmarks/export_formats.py`)"


def runners(name, folder, threads):
    """{format: callable(images) -> features} for one backbone."""
    import tensorflow as tf

    from caco_tf import build_model, load_config
    from caco_tf.data import augment
    from caco_tf.nets import backbones
    from caco_tf.serving import export, interop

    if name == "small_convnet":
        config = load_config(os.path.join(_harness.ROOT, "configs", "mnist.yaml"))
        model = build_model(config, steps_per_epoch=1)
        backbone, arguments = model.backbone, dict(image_size=28, channels=1,
                                                   mean=model.preprocessing["mean"],
                                                   std=model.preprocessing["std"])
    else:
        backbone = backbones.build_backbone("resnet50", (224, 224, 3))
        arguments = dict(image_size=224, channels=3, mean=augment.IMAGENET_MEAN,
                         std=augment.IMAGENET_STD)
    saved = tf.saved_model.load(export.export_saved_model(
        backbone, os.path.join(folder, f"{name}_saved"), **arguments)).signatures[
        "serving_default"]
    onnx = interop.OnnxModel(interop.export_onnx(backbone, os.path.join(folder, f"{name}.onnx"),
                                                 **arguments), threads=threads)
    litert = interop.LiteRTModel(interop.export_litert(
        backbone, os.path.join(folder, f"{name}.tflite"), **arguments), threads=threads)
    return ({"SavedModel": lambda images: saved(images=tf.constant(images))["features"].numpy(),
             "ONNX Runtime": onnx, "LiteRT": litert}, arguments)


def main(argv=None):
    import numpy as np

    argv = sys.argv[1:] if argv is None else argv
    parser = _harness.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--models", default="small_convnet,resnet50")
    args = parser.parse_args(argv)
    batches = (1, 64)
    if args.tiny:
        args.rounds, args.models, batches = 1, "small_convnet", (1,)
    threads = _harness.cpu_count()
    started = time.time()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models.split(","):
            functions, arguments = runners(name, folder, threads)
            size, channels = arguments["image_size"], arguments["channels"]
            for batch in batches:
                images = np.random.default_rng(batch).integers(
                    0, 256, (batch, size, size, channels), np.uint8)
                calls = max(1, (64 if name == "small_convnet" else 2) // batch * 8)

                def timed(function):
                    start = time.perf_counter()
                    for _ in range(calls):
                        function(images)
                    return (time.perf_counter() - start) / calls

                seconds = _harness.interleave(
                    {format: lambda f=function: timed(f) for format, function in functions.items()},
                    args.rounds)
                rows.append((name, batch, {format: batch / statistics.median(times)
                                           for format, times in seconds.items()}))
                print(rows[-1], flush=True)
    lines = _harness.header(__file__, argv) + section(rows, threads, time.time() - started)
    _harness.publish(args, "export_formats", TITLE, lines)
    return 0


def section(rows, threads, seconds):
    import onnxruntime
    from importlib.metadata import version

    lines = [f"onnxruntime {onnxruntime.__version__}, ai-edge-litert {version('ai-edge-litert')}; "
             f"{threads} threads each; whole run {seconds / 60:.0f} min. Images/s, median of the "
             "interleaved rounds; uint8 images at the model's size, preprocessing in each graph.",
             "", "| backbone | batch | SavedModel | ONNX Runtime | LiteRT |",
             "|---|---:|---:|---:|---:|"]
    names = {"small_convnet": "small ConvNet (offline default), 28 px",
             "resnet50": "ResNet-50, 224 px"}
    for name, batch, figures in rows:
        lines.append(f"| {names[name]} | {batch} | {figures['SavedModel']:,.1f} | "
                     f"{figures['ONNX Runtime']:,.1f} | {figures['LiteRT']:,.1f} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
