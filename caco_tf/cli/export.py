"""Export a run's backbone for serving (``caco-export``, ``python export/export_saved_model.py``).

    caco-export --run runs/mnist [--format saved_model|onnx|litert|keras-hub] [--out PATH]
                [--output features|embedding] [--serving-version N] [--crop-fraction 0.875]
                [--keras-hub-class auto|dinov2|caco]

``--run``: a run folder (rebuilt from its ``config.yaml`` and last checkpoint) or a ``.keras``
file (``RUN/model.keras``).  ``saved_model`` (the default) writes TF Serving's
``PATH/backbone/N/`` (default PATH: the run's ``saved_model/``; ``caco-train`` does the same at
the end of every run), signatures and preprocessing in ``caco_tf/serving/export.py``; ``onnx``
and ``litert`` write one file (default ``RUN/backbone.onnx`` / ``RUN/backbone.tflite``, or
``embedding.*`` for ``--output embedding``): uint8 [batch, S, S, C] in, the features (or
embedding) out, ``caco_tf/serving/interop.py``; ``keras-hub`` a KerasHub preset directory
(default ``RUN/keras_hub_preset``; the optional extra, ``caco_tf/serving/hub.py``): a ViT's is
KerasHub's own ``DINOV2Backbone``, which loads without caco_tf, every other backbone's (or a
ViT's with ``--keras-hub-class caco``) caco-tf's ``CacoBackbone``.

What exists is never replaced: an ``--out`` already holding the export (``backbone/N`` with
files, a preset folder with files, the file), a file where a folder goes or a folder where a
file goes are refused before the model loads (exit status 2); a write that fails (a read-only
or full disk) is one line and exit status 74, and what it wrote is removed.
"""

import os
import sys

from caco_tf import cli
# Without TensorFlow, so that --help stays quick.
from caco_tf.data import DEFAULT_CROP_FRACTION
from caco_tf.serving import FORMATS

SUFFIXES = {"onnx": ".onnx", "litert": ".tflite"}


def parse_args(argv):
    parser = cli.ArgumentParser(prog="caco-export",
                                description="Export a run's backbone for serving.")
    parser.add_argument("--run", required=True,
                        help="run folder written by caco-train, or its model.keras")
    parser.add_argument("--format", choices=FORMATS, default="saved_model")
    parser.add_argument("--out", help="output folder (saved_model, keras-hub) or file (onnx, "
                                      "litert)")
    parser.add_argument("--output", choices=("features", "embedding"), default="features",
                        help="onnx, litert: the backbone's features or the L2-normalized "
                             "embedding (the SavedModel serves both)")
    parser.add_argument("--serving-version", type=int, default=1,
                        help="saved_model: TF Serving's model version, the folder "
                             "backbone/<N>/ (default 1)")
    parser.add_argument("--crop-fraction", type=float, default=DEFAULT_CROP_FRACTION,
                        help="saved_model's resize: shorter side to image_size / this, then "
                             f"centre crop (default {DEFAULT_CROP_FRACTION}: 256 → 224)")
    parser.add_argument("--keras-hub-class", choices=("auto", "dinov2", "caco"), default="auto",
                        help="keras-hub: the preset's class, KerasHub's DINOV2Backbone (a ViT; "
                             "loads without caco_tf) or caco-tf's CacoBackbone (any backbone); "
                             "auto: dinov2 for a ViT, else caco")
    cli.verbose_argument(parser)
    argv = sys.argv[1:] if argv is None else argv
    for before, after in zip(argv, argv[1:]):
        if before == "--version" and after.lstrip("-").isdigit():
            parser.error(f"--version {after}: the model version is --serving-version {after} "
                         f"since caco-tf 0.2.0 (--version prints the package's)")
    return parser.parse_args(argv)


def output_of(args, folder):
    """Where the export goes: (the --out path, the folder written inside it, "folder" or
    "file", the file name --out would take); ``folder``: the run's."""
    if args.format == "saved_model":
        return (args.out or os.path.join(folder, "saved_model"),
                os.path.join("backbone", str(args.serving_version)), "folder", "")
    if args.format == "keras-hub":
        return args.out or os.path.join(folder, "keras_hub_preset"), "", "folder", ""
    name = ("backbone" if args.output == "features" else "embedding") + SUFFIXES[args.format]
    return args.out or os.path.join(folder, name), "", "file", name


def main(argv=None):
    args = parse_args(argv)
    cli.start(["--verbose"] if args.verbose else [])

    def work():
        from caco_tf.build import load_run
        from caco_tf.errors import ConfigError
        from caco_tf.serving import export

        if args.serving_version < 1:
            raise ConfigError(f"--serving-version must be at least 1, got "
                              f"{args.serving_version}")
        if not 0.0 < args.crop_fraction <= 1.0:
            raise ConfigError(f"--crop-fraction must be in (0, 1], got {args.crop_fraction}")
        folder = (os.path.dirname(os.path.abspath(args.run)) if args.run.endswith(".keras")
                  else args.run)
        out, inside, kind, name = output_of(args, folder)
        # Before the model loads: a refused output costs nothing.
        export.check_output(out, kind, inside=inside, example=name, other_choice=(
            "--serving-version" if args.format == "saved_model" else ""))
        model = load_run(args.run).model
        model.preprocessing = dict(model.preprocessing or {}, crop_fraction=args.crop_fraction)
        with export.writing_output(out, inside=inside):
            path = export.export_model(model, out, format=args.format,
                                       serving_layout=args.format == "saved_model",
                                       version=args.serving_version, output=args.output,
                                       hub_class=args.keras_hub_class)
        print(f"{args.format}: {os.path.abspath(path)}")
        return 0

    return cli.guard(work)


def console():
    """``caco-export``: ``main()``, then the process ends at once (``cli.exit_after``)."""
    cli.exit_after(main)


if __name__ == "__main__":
    console()
