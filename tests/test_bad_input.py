"""Every command turns a user's mistake into one ``error: ...`` line and exit status 2: no
traceback, and nothing new in the run folder (or no run folder at all when there was none); an
output that cannot be written (a read-only or full disk) is one line and exit status 74.

The commands run in this process (``main(argv)``, what the console scripts call); one real
process per command at the end checks the entry points themselves, start-up included."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from caco_tf.cli import data_service, evaluate, export, extract, figures, import_torch, train

from fill_disk_at_step import fill
from tiny_methods import MULTI_CROP
from test_long_run_faults import tmpfs as long_run_tmpfs

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
    (root / "plain.txt").write_text("a file where a folder or a new file goes")
    (root / "full").mkdir()
    (root / "full" / "notes.txt").write_text("someone else's")
    model.save(root / "run" / "model.keras")  # then cut to half its bytes: a damaged archive
    whole = (root / "run" / "model.keras").read_bytes()
    (root / "run" / "model.keras").write_bytes(whole[:len(whole) // 2])
    (root / "empty.keras").write_bytes(b"")
    keras.backend.clear_session()
    return {"RUN": run_dir, "MODEL": model_dir, "IMAGES": str(root / "images"),
            "FLOAT_NPZ": str(root / "float.npz"), "ROOT": str(root),
            "BAD_CHECKPOINT": str(root / "not_a_checkpoint.pth.tar"),
            "PLAIN_FILE": str(root / "plain.txt"), "FULL_FOLDER": str(root / "full"),
            "SERVED": str(root / "served")}


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
    ("train", ["--set", "evaluation.features=patch_mean"],
     "evaluation.features patch_mean pools a Vision Transformer's patch tokens, and "
     "model.backbone small_convnet has none"),
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
     f"multicrop works with method.name {MULTI_CROP}"),
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
    ("export", ["--run", "RUN/model.keras"], "RUN/model.keras cannot be read as a Keras archive"
     " (damaged or cut short): use its run folder instead, --run RUN, which rebuilds the model "
     "from config.yaml and its last checkpoint"),
    ("export", ["--run", "ROOT/empty.keras"], "ROOT/empty.keras cannot be read as a Keras "
     "archive (damaged or cut short): save the model again (model.save)"),
    ("evaluate", ["knn", "--run", "RUN/model.keras"], "cannot be read as a Keras archive"),
    # Outputs in places the user must change: refused before the model loads, nothing written.
    ("export", ["--run", "RUN", "--out", "PLAIN_FILE"],
     "--out PLAIN_FILE is a file, not a folder: pass another --out or remove it"),
    ("export", ["--run", "RUN", "--out", "SERVED"], "SERVED/backbone/1 already holds files "
     "(assets, fingerprint.pb, saved_model.pb, ...): pass another --out or --serving-version, "
     "or remove it"),
    ("export", ["--run", "RUN", "--out", "PLAIN_FILE/x"],
     "--out PLAIN_FILE/x: PLAIN_FILE is a file, not a folder: pass another --out"),
    ("export", ["--run", "RUN", "--format", "onnx", "--out", "FULL_FOLDER"],
     "--out FULL_FOLDER is a folder, not a file: pass a file's path (e.g. "
     "FULL_FOLDER/backbone.onnx)"),
    ("export", ["--run", "RUN", "--format", "onnx", "--out", "PLAIN_FILE"],
     "--out PLAIN_FILE already exists: pass another --out or remove it"),
    ("export", ["--run", "RUN", "--format", "litert", "--out", "FULL_FOLDER"],
     "--out FULL_FOLDER is a folder, not a file"),
    ("export", ["--run", "RUN", "--format", "litert", "--out", "PLAIN_FILE/x.tflite"],
     "PLAIN_FILE is a file, not a folder"),
    ("export", ["--run", "RUN", "--format", "keras-hub", "--out", "FULL_FOLDER"],
     "--out FULL_FOLDER already holds files (notes.txt): pass another --out or remove it"),
    ("export", ["--run", "RUN", "--format", "keras-hub", "--out", "PLAIN_FILE"],
     "--out PLAIN_FILE is a file, not a folder"),
    ("extract", ["--model", "MODEL", "--images", "IMAGES", "--out", "PLAIN_FILE"],
     "--out PLAIN_FILE is a file, not a folder: pass another --out or remove it"),
    ("extract", ["--model", "MODEL", "--images", "IMAGES", "--out", "FULL_FOLDER"],
     "--out FULL_FOLDER already holds files (notes.txt): pass another --out or remove it"),
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
    words = _place(words, places)
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


def tmpfs(path, options=""):
    """A 1 MB file system of its own at ``path`` (``options``: e.g. "ro")."""
    return long_run_tmpfs(path, 1 << 20, options)


# Each format's output, and caco-extract's, on a disk of its own (DISK).
OUTPUTS = [("export", ["--run", "RUN", "--out", "DISK/served"], "DISK/served/backbone/1"),
           ("export", ["--run", "RUN", "--format", "onnx", "--out", "DISK/b.onnx"],
            "DISK/b.onnx"),
           ("export", ["--run", "RUN", "--format", "litert", "--out", "DISK/b.tflite"],
            "DISK/b.tflite"),
           ("export", ["--run", "RUN", "--format", "keras-hub", "--out", "DISK/preset"],
            "DISK/preset"),
           ("extract", ["--model", "MODEL", "--images", "IMAGES", "--out", "DISK/features"],
            "DISK/features")]
OUTPUT_IDS = ["saved_model", "onnx", "litert", "keras-hub", "extract"]


def _run_command(command, arguments, places, capsys):
    """(exit status, standard error's lines) of one command run in this process."""
    try:
        status = COMMANDS[command]([_place(argument, places) for argument in arguments])
    except SystemExit as exit:
        status = exit.code
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    return status, [line for line in captured.err.splitlines() if line.strip()]


@pytest.mark.parametrize("command, arguments, target", OUTPUTS, ids=OUTPUT_IDS)
def test_an_output_on_a_read_only_file_system_is_one_line_and_exit_status_74(
        command, arguments, target, places, tmp_path, capsys):
    """Refused before the model loads."""
    with tmpfs(tmp_path / "disk", "ro") as disk:
        places = dict(places, DISK=disk)
        status, lines = _run_command(command, arguments, places, capsys)
        assert status == 74, lines
        assert lines == [f"error: cannot write {_place(target, places)}: Read-only file "
                         f"system; make it writable or pass another --out"]


@pytest.mark.parametrize("command, arguments, target", OUTPUTS, ids=OUTPUT_IDS)
def test_an_output_on_a_full_disk_is_one_line_exit_status_74_and_nothing_left(
        command, arguments, target, places, tmp_path, capsys):
    """The write itself fails (TensorFlow's, tf2onnx's, h5py's, NumPy's): one line, and what
    was written of the output is removed, so that the same command runs again once there is
    space."""
    with tmpfs(tmp_path / "disk") as disk:
        fill(os.path.join(disk, "filler"))
        places = dict(places, DISK=disk)
        status, lines = _run_command(command, arguments, places, capsys)
        assert status == 74, lines
        assert lines == [f"error: cannot write {_place(target, places)}: No space left on "
                         f"device; free space on its disk or pass another --out"]
        assert os.listdir(disk) == ["filler"]


def test_features_larger_than_their_disk_are_one_line_not_a_bus_error(places, tmp_path):
    """The features go into memory maps: a page written where the disk has no room left is a
    SIGBUS that kills the process, unless the maps' space is taken first (a real process)."""
    np.savez(tmp_path / "many.npz", images=np.zeros((1500, 28, 28), np.uint8))  # 1.5 MB out
    with tmpfs(tmp_path / "disk") as disk:
        out = os.path.join(disk, "features")
        result = subprocess.run(
            [sys.executable, os.path.join(ROOT, "export", "extract_features.py"), "--model",
             places["MODEL"], "--npz", str(tmp_path / "many.npz"), "--out", out, "--quiet"],
            capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
        assert result.returncode == 74, result.stderr[-2000:]
        assert result.stderr == (f"error: cannot write {out}: No space left on device; free "
                                 f"space on its disk or pass another --out\n")
        assert os.listdir(disk) == []


NOT_ABOUT_THE_RUN = ("E0000 00:00:1733130000.123456   12345 onednn_ops_rewrite.cc:34] oneDNN "
                     "supports DT_UINT8 only on platforms with AVX-512. Falling back to the "
                     "default Eigen-based implementation if present.")


def test_tensorflows_error_line_about_avx_512_is_start_up_noise_and_other_errors_are_not():
    from caco_tf import cli

    assert cli.is_noise(NOT_ABOUT_THE_RUN, gpu_machine=False)
    for line in ("E0000 00:00:1733130000.123456   12345 onednn_ops_rewrite.cc:34] oneDNN "
                 "failed to allocate a scratchpad",
                 "E0000 00:00:1733130000.123456   12345 kernel.cc:9] DT_UINT8 images are "
                 "not supported here"):
        assert not cli.is_noise(line, gpu_machine=False), line


def test_the_quiet_start_filters_the_avx_512_line_and_keeps_the_others():
    """The line injected into a real process's standard error after ``cli.start``: this
    machine's TensorFlow may not print it."""
    other = "E0000 00:00:1733130000.5   12345 kernel.cc:9] a real error"
    script = ("import os\nfrom caco_tf import cli\ncli.start([])\n"
              f"os.write(2, {(NOT_ABOUT_THE_RUN + chr(10) + other + chr(10)).encode()!r})\n"
              "cli.exit_after(lambda: 0)\n")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60, env=dict(env, PYTHONPATH=ROOT))
    assert result.returncode == 0, result.stderr
    assert result.stderr == other + "\n"


def _place(argument, places):
    """The argument with its placeholders (RUN, MODEL, ...; whole words: RUN_DIR stays)
    replaced by the fixture's paths."""
    return re.sub(r"\b(" + "|".join(places) + r")\b", lambda found: places[found.group()],
                  argument)


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
