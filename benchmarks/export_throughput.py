"""Feature-extraction throughput: the exported SavedModel against keras ``predict``.

    python benchmarks/export_throughput.py [--batches 20] [--repeats 5] [--budget 120] [--note ...]

For each backbone (random weights: throughput does not depend on them), images/second of
``serving_default`` on uint8 batches at the model's size (preprocessing in the graph) through
the SavedModel loaded with ``tf.saved_model.load``, and of ``backbone.predict`` on the same
batches already normalized to float.  The two are timed in turn, ``--repeats`` rounds after one
warm-up round (medians), each a pass over ``--batches`` batches of ``--batch``; a backbone gets
fewer batches when its estimated time would exceed ``--budget`` seconds.
"""

import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness  # noqa: E402

TITLE = "## SavedModel export throughput"
# name, image size, channels, mean, std (CIFAR-10 statistics for the colour model)
MODELS = [
    ("small_convnet", 28, 1, 0.1307, 0.3081),
    ("cifar_resnet18", 32, 3, [0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]),
]


def measure(model, args, directory):
    """(SavedModel images/s, predict images/s, batches used), or None if even one batch is
    over the time budget."""
    import keras
    import numpy as np
    import tensorflow as tf

    from caco_tf import build_backbone, export_backbone

    name, size, channels, mean, std = model
    keras.utils.set_random_seed(0)
    backbone = build_backbone(name, (size, size, channels))
    path = export_backbone(backbone, directory, size, channels, mean, std, model_name=name)
    serve = tf.saved_model.load(path).signatures["serving_default"]
    rng = np.random.default_rng(0)
    shape = (args.batch, size, size, channels)
    first = rng.integers(0, 256, shape, dtype=np.uint8)
    start = time.perf_counter()
    for _ in range(2):
        serve(images=first)["features"].numpy()
    per_batch = (time.perf_counter() - start) / 2  # an over-estimate: includes start-up
    # Warm-up plus repeats, for both, assuming predict is about as fast.
    batches = min(args.batches, int(args.budget / (per_batch * (args.repeats + 1) * 2)))
    if batches < 1:
        return None
    images = [first] + [rng.integers(0, 256, shape, dtype=np.uint8) for _ in range(batches - 1)]
    floats = ((np.concatenate(images) / 255.0 - mean) / np.asarray(std)).astype(np.float32)

    def saved_model_pass():
        for batch in images:
            serve(images=batch)["features"].numpy()

    def predict_pass():
        backbone.predict(floats, batch_size=args.batch, verbose=0)

    times = _harness.interleave({"saved": saved_model_pass, "predict": predict_pass},
                                args.repeats)
    count = batches * args.batch
    return (count / statistics.median(times["saved"]),
            count / statistics.median(times["predict"]), batches)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = _harness.parser(__doc__)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget", type=float, default=120.0,
                        help="skip a backbone whose estimated time exceeds this (seconds)")
    parser.add_argument("--note", default="", help="a line to add, e.g. about machine load")
    args = parser.parse_args(argv)
    models = MODELS
    if args.tiny:
        args.batches, args.batch, args.repeats, models = 1, 8, 1, MODELS[:1]

    lines = _harness.header(__file__, argv, (
        f"Images/second of feature extraction, batch {args.batch}, up to {args.batches} "
        f"batches (fewer where the {args.budget:.0f} s budget requires), median of "
        f"{args.repeats} passes, the two in turn after a warm-up. SavedModel: "
        "`serving_default` of the loaded SavedModel on uint8 images (cast, normalization and "
        "the size check in the graph). Keras: `backbone.predict` on the same images already "
        "normalized to float32."))
    if args.note:
        lines += [args.note, ""]
    lines += ["| backbone | input | batches | SavedModel (images/s) | keras predict (images/s) "
              "| SavedModel / predict |", "|---|---|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as directory:
        for model in models:
            result = measure(model, args, directory)
            name, shape = model[0], f"{model[1]}×{model[1]}×{model[2]}"
            if result is None:
                lines.append(f"| {name} | {shape} | skipped: one batch exceeds the "
                             f"{args.budget:.0f} s budget | | | |")
            else:
                saved, predict, batches = result
                lines.append(f"| {name} | {shape} | {batches} | {saved:,.0f} | {predict:,.0f} "
                             f"| {saved / predict:.2f} |")
            print(lines[-1], flush=True)
    _harness.publish(args, "export_throughput", TITLE, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
