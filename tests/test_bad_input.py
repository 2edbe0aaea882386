"""Every command turns a user's mistake into one ``error: ...`` line and exit status 2: no
traceback, and nothing new in the run folder (or no run folder at all when there was none).

The commands run in this process (``main(argv)``, what the console scripts call); one real
process per command at the end checks the entry points themselves, start-up included."""

import os
import subprocess
import sys

import numpy as np
import pytest

from caco_tf.cli import data_service, evaluate, export, extract, figures, import_torch, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = {"train": train.main, "evaluate": evaluate.main, "figures": figures.main,
            "export": export.main, "extract": extract.main, "import": import_torch.main,
            "data-service": data_service.main}


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    """A run folder, an exported SavedModel, a few images and bad files to point commands at."""
    import keras

    from caco_tf.serving import export as export_lib
    from tiny_run import make_run

    root = tmp_path_factory.mktemp("bad")
    run_dir, model = make_run(root / "run")
    model_dir = export_lib.export_backbone(model.backbone, str(root / "served"), 28, 1,
                                           0.13, 0.31)
    images = root / "images" / "seven"
    images.mkdir(parents=True)
    from PIL import Image
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(images / "0.png")
    np.savez(root / "float.npz", images=np.zeros((3, 28, 28), np.float32))
    (root / "not_a_checkpoint.pth.tar").write_bytes(b"no pickle here")
    keras.backend.clear_session()
    return {"RUN": run_dir, "MODEL": model_dir, "IMAGES": str(root / "images"),
            "FLOAT_NPZ": str(root / "float.npz"), "ROOT": str(root),
            "BAD_CHECKPOINT": str(root / "not_a_checkpoint.pth.tar")}


# (command, arguments, words the error line must hold); NEW is a path that must stay absent.
CASES = [
    ("train", ["--set", "model.backbone=vgg99"], "model.backbone must be one of"),
    ("train", ["--set", "data.service=localhost:5050"], "data.service runs the colour views"),
    ("data-service", ["worker", "--dispatcher", "127.0.0.1:1"],
     "data.service: no dispatcher answers at 127.0.0.1:1"),
    ("data-service", ["worker", "--dispatcher", "nowhere"],
     "data.service must be a dispatcher's HOST:PORT"),
    ("data-service", ["dispatcher", "--port", "70000"], "--port must be in 0..65535"),
    ("data-service", ["worker"], "the following arguments are required: --dispatcher"),
    ("train", ["--set", "data.image_size=3"], "data.image_size 3 is too small for"),
    ("train", ["--set", "train.learning_rate=-1"], "train.learning_rate must be a number > 0"),
    ("train", ["--set", "train.lr_warmup_epochs=50"], "train.lr_warmup_epochs must be at most"),
    ("train", ["--set", "method.caco.key_momentum=1.5"],
     "method.caco.key_momentum must be a number >= 0"),
    ("train", ["--set", "train.momentum=1.2"], "train.momentum must be a number >= 0 and < 1"),
    ("train", ["--set", "train.weight_decay=-0.1"], "train.weight_decay must be a number >= 0"),
    ("train", ["--set", "method.caco.bank_lr=-3"], "method.caco.bank_lr must be a number >= 0"),
    ("train", ["--set", "model.widths=[32,64]"], "model.widths must be 4 positive integers"),
    ("train", ["--set", "model.backbone=resnet18", "--set", "model.widths=[8,8,8,8]"],
     "model.widths applies to small_convnet only"),
    ("train", ["--set", "train.batch_size=0"], "train.batch_size must be an integer >= 1"),
    ("train", ["--set", "method.caco.temperature=0"],
     "method.caco.temperature must be a number > 0"),
    ("train", ["--set", "data.channels=2"], "data.channels must be one of 1, 3"),
    ("train", ["--set", "data.views=fancy"], "data.views must be one of"),
    ("train", ["--set", "data.crop_scale=[0.9,0.1]"], "data.crop_scale must be [low, high]"),
    ("train", ["--set", "data.source=nowhere:x"], "data.source must be mnist"),
    ("train", ["--set", "data.source=npz:/no/such.npz"], "data path not found: /no/such.npz"),
    ("train", ["--set", "data.source=folder:/no/such"], "data path not found: /no/such"),
    ("train", ["--set", "data.held_out=mnist"], "data.held_out must be ''"),
    ("train", ["--set", "distribute.strategy=tpu"], "distribute.strategy must be one of"),
    ("train", ["--set", "train.precision=float8"], "train.precision must be one of"),
    ("train", ["--set", "method.name=byol2"], "method.name must be one of caco"),
    ("train", ["--set", "method.bank_size=5"], "method.bank_size moved to method.caco.bank_size"),
    ("train", ["--set", "train.optimizer=adam"], "train.optimizer must be one of auto"),
    ("train", ["--set", "method.caco.bank_sise=5"], "unknown config key 'method.caco.bank_sise'"),
    ("train", ["--set", "train.epochs=ten"], "train.epochs must be of type int"),
    ("train", ["--set", "name=a/b"], "name must be a non-empty name without '/'"),
    ("train", ["--config", "/no/such.yaml"], "cannot read config /no/such.yaml"),
    ("train", ["--set", "train.batch_size=8192"], "train.batch_size 8192 is larger than"),
    ("train", ["--set", "method.caco.bank_size=4001"],
     "method.caco.bank_size 4001 is larger than the data"),
    ("train", ["--set", "method.caco.warmup_epochs=40"], "method.caco.warmup_epochs must be below"),
    ("train", ["--set", "evaluation.knn_k=0"], "evaluation.knn_k must be an integer >= 1"),
    ("train", ["--set", "train.on_schedule_change=maybe"], "train.on_schedule_change must be"),
    ("train", ["--set", "data.multicrop.local_crops=-1"], "data.multicrop.local_crops must"),
    ("train", ["--set", "model.pool_grid=0"], "model.pool_grid must be an integer >= 1"),
    ("train", ["--set", "method.caco.warmup_min_steps=100000"], "must end before the run's"),
    ("train", ["--set", "data.views=multicrop", "--set", "method.name=simclr"],
     "multicrop works with method.name caco, dino, swav"),
    ("train", ["--set", "data.extra_layers=[{layer: Resizing, height: 20, width: 20}]"],
     "data.extra_layers: Resizing turns a view of 28x28x1 pixels into 20x20x1; the encoder"),
    ("train", ["--set", "data.views=asymmetric", "--set", "data.extra_layers=["
               "{layer: RandomContrast, factor: 0.2}, {layer: Dense, units: 4}]"],
     "data.extra_layers: Dense turns a view of 28x28x1 pixels into 28x28x4"),
    ("train", ["--strategy", "fast"], "argument --strategy: invalid choice"),
    ("evaluate", ["knn"], "--run RUN_DIR is required"),
    ("evaluate", ["knn", "--run", "/no/such"], "no config.yaml in /no/such"),
    ("evaluate", ["linear", "--run", "RUN", "--epochs", "0"], "--epochs must be positive"),
    ("evaluate", ["linear", "--run", "RUN", "--l2", "-1"], "--l2 must be auto or a number"),
    ("evaluate", ["linear", "--run", "RUN", "--l2", "auto", "--augment", "digits"],
     "--l2 auto chooses"),
    ("evaluate", ["knn", "--run", "RUN", "--data", "nowhere:x"], "unknown data source"),
    ("evaluate", ["knn", "--run", "RUN", "--held-out", "mnist"],
     "--held-out must be '', folder:PATH"),
    ("evaluate", ["linear", "--run", "RUN", "--l2-folds", "1"], "--l2-folds must be at least"),
    ("evaluate", ["knn", "--run", "RUN", "--k", "0"], "--k must be positive"),
    ("evaluate", ["knn", "--run", "RUN", "--data", "folder:IMAGES"],
     "has no labelled held-out split"),
    ("evaluate", ["sideways", "--run", "RUN"], "argument protocol: invalid choice"),
    ("figures", ["--run", "/no/such"], "no config.yaml in /no/such"),
    ("figures", ["--run", "RUN", "--points", "0"], "--points must be positive"),
    ("export", ["--run", "/no/such"], "no config.yaml in /no/such"),
    ("export", ["--run", "RUN", "--serving-version", "0"],
     "--serving-version must be at least 1"),
    ("export", ["--run", "RUN", "--crop-fraction", "1.5"], "--crop-fraction must be in"),
    ("export", ["--run", "RUN", "--version", "3"], "the model version is --serving-version 3"),
    ("extract", ["--model", "/no/such", "--images", "IMAGES", "--out", "ROOT/features"],
     "no SavedModel at /no/such"),
    ("extract", ["--model", "MODEL", "--images", "/no/such", "--out", "ROOT/features"],
     "not a readable folder: /no/such"),
    ("extract", ["--model", "MODEL", "--npz", "FLOAT_NPZ", "--out", "ROOT/features"],
     "expected uint8"),
    ("extract", ["--model", "MODEL", "--images", "IMAGES", "--out", "ROOT/features",
                 "--batch-size", "0"], "--batch-size must be at least 1"),
    ("extract", ["--model", "MODEL", "--images", "IMAGES", "--out", "ROOT/features",
                 "--signature", "nope"], "argument --signature: invalid choice"),
    ("import", ["/no/such.pth.tar", "--out", "ROOT/imported"], "checkpoint not found"),
    ("import", ["BAD_CHECKPOINT", "--out", "ROOT/imported"], "cannot read"),
    ("import", ["BAD_CHECKPOINT", "--out", "ROOT/imported", "--steps-per-epoch", "0"],
     "--steps-per-epoch must be at least 1"),
]


def _files(folder):
    return sorted(os.path.relpath(os.path.join(root, name), folder)
                  for root, _, names in os.walk(folder) for name in names)


@pytest.mark.parametrize("command, arguments, words", CASES,
                         ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(CASES)])
def test_a_bad_input_is_one_error_line_and_exit_status_2(command, arguments, words, places,
                                                         tmp_path, capsys):
    arguments = [_place(argument, places) for argument in arguments]
    new_run = str(tmp_path / "new_run")
    if command == "train":
        arguments += ["--run-dir", new_run, "--quiet"]
    before = _files(places["ROOT"])
    try:
        status = COMMANDS[command](arguments)
    except SystemExit as exit:  # argparse's usage errors exit
        status = exit.code
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert status == 2, captured.err[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err[-2000:]
    assert words in lines[0]
    assert "Traceback" not in captured.err + captured.out
    assert not os.path.exists(new_run)  # no half-written run folder
    assert _files(places["ROOT"]) == before  # nothing new beside the existing run


def _place(argument, places):
    """The argument with its placeholders (RUN, MODEL, ...) replaced by the fixture's paths."""
    for name in sorted(places, key=len, reverse=True):
        argument = argument.replace(name, places[name])
    return argument


def test_every_command_validates_the_whole_table():
    assert len(CASES) >= 40
    assert {command for command, _, _ in CASES} == set(COMMANDS)


@pytest.mark.parametrize("script", ["train.py", "export/export_saved_model.py",
                                    "export/extract_features.py", "export/import_torch.py"])
@pytest.mark.slow
def test_the_entry_points_print_one_line_and_no_start_up_noise(script, tmp_path):
    """Real processes, TensorFlow's start-up included: one line on standard error."""
    arguments = {"train.py": ["--set", "data.image_size=3", "--run-dir", str(tmp_path / "r")],
                 "export/export_saved_model.py": ["--run", str(tmp_path / "none")],
                 "export/extract_features.py": ["--model", str(tmp_path / "none"),
                                                "--images", str(tmp_path), "--out",
                                                str(tmp_path / "f")],
                 "export/import_torch.py": [str(tmp_path / "none.pth"), "--out",
                                            str(tmp_path / "i")]}[script]
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run([sys.executable, os.path.join(ROOT, script), *arguments],
                            capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
                            env=dict(env, PYTHONPATH=ROOT))
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error: ")
