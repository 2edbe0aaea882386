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

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _report  # noqa: E402

BEGIN, END = "<!-- export_formats:begin -->", "<!-- export_formats:end -->"
TITLE = "## Serving throughput by export format (`benchmarks/export_formats.py`)"


def runners(name, folder, threads):
    """{format: callable(images) -> features} for one backbone."""
    import tensorflow as tf

    from caco_tf import build
    from caco_tf.data import augment
    from caco_tf.nets import backbones
    from caco_tf.serving import export, interop
    from caco_tf.training.config import load_config

    if name == "small_convnet":
        config = load_config(os.path.join(ROOT, "configs", "mnist.yaml"))
        model = build.build_model(config, steps_per_epoch=1)
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

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--models", default="small_convnet,resnet50")
    parser.add_argument("--output", default=os.path.join(ROOT, "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    threads = _report.cpu_count()
    started = time.time()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models.split(","):
            functions, arguments = runners(name, folder, threads)
            size, channels = arguments["image_size"], arguments["channels"]
            for batch in (1, 64):
                images = np.random.default_rng(batch).integers(
                    0, 256, (batch, size, size, channels), np.uint8)
                calls = max(1, (64 if name == "small_convnet" else 2) // batch * 8)
                for function in functions.values():  # warm-up: tracing, allocation, threads
                    function(images)
                seconds = {format: [] for format in functions}
                order = list(functions)
                for round_ in range(args.rounds):
                    for format in (order if round_ % 2 == 0 else order[::-1]):
                        start = time.perf_counter()
                        for _ in range(calls):
                            functions[format](images)
                        seconds[format].append((time.perf_counter() - start) / calls)
                rows.append((name, batch, {format: batch / statistics.median(times)
                                           for format, times in seconds.items()}))
                print(rows[-1], flush=True)
    text = section(rows, args, threads, time.time() - started)
    _report.write_section(text, args.output, BEGIN, END, TITLE)
    print(text)


def section(rows, args, threads, seconds):
    import onnxruntime
    import tensorflow as tf
    from importlib.metadata import version

    lines = [BEGIN,
             f"`python benchmarks/export_formats.py --rounds {args.rounds}` — "
             f"{datetime.date.today()}, {threads} CPU cores; TensorFlow {tf.__version__}, "
             f"onnxruntime {onnxruntime.__version__}, ai-edge-litert "
             f"{version('ai-edge-litert')}; {threads} threads each; whole run "
             f"{seconds / 60:.0f} min.",
             "",
             "Images/s, median of the interleaved rounds; uint8 images at the model's size, "
             "preprocessing in each graph.",
             "",
             "| backbone | batch | SavedModel | ONNX Runtime | LiteRT |",
             "|---|---:|---:|---:|---:|"]
    names = {"small_convnet": "small ConvNet (offline default), 28 px",
             "resnet50": "ResNet-50, 224 px"}
    for name, batch, figures in rows:
        lines.append(f"| {names[name]} | {batch} | {figures['SavedModel']:,.1f} | "
                     f"{figures['ONNX Runtime']:,.1f} | {figures['LiteRT']:,.1f} |")
    lines += ["", END]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
