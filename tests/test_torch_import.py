"""Importing the authors' PyTorch checkpoints: a torchvision-layout CaCo ResNet-50 built here in
PyTorch (random weights, non-trivial BatchNorm statistics), saved in the reference's checkpoint
format, imported through the CLI, must give the same features and embeddings in Keras."""

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest
import tensorflow as tf
import torch
import yaml
from torch import nn

from caco_tf import build
from caco_tf.serving import torch_import
from caco_tf.training import callbacks
from caco_tf.training.run_folder import RunFolder
from caco_tf.config import load_config
from caco_tf.serving.torch_import import CheckpointError

# A PyTorch model built, saved and imported (torch's import and the module's fixture: ~1 min).
pytestmark = pytest.mark.slow


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "imagenet_resnet50_b1024.yaml")
SIZE, HIDDEN, DIM, BANK, EPOCH = 64, 64, 32, 128, 7


# ---------------------------------------------------------------- torchvision's layout, in torch
class Bottleneck(nn.Module):
    """torchvision's v1.5 bottleneck: the stride sits in the 3x3 conv."""
    expansion = 4

    def __init__(self, inplanes, planes, stride, downsample):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU()
        self.downsample = downsample

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride, downsample):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU()
        self.downsample = downsample

    def forward(self, x):
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet(nn.Module):
    """torchvision's ResNet whose ``fc`` is CaCo's projector (the reference's ``_build_mlp``)."""

    def __init__(self, block, blocks, hidden, dim):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        inplanes = 64
        for index, (count, planes) in enumerate(zip(blocks, (64, 128, 256, 512))):
            stride, layers = (1 if index == 0 else 2), []
            for number in range(count):
                downsample = None
                if number == 0 and (stride != 1 or inplanes != planes * block.expansion):
                    downsample = nn.Sequential(
                        nn.Conv2d(inplanes, planes * block.expansion, 1, stride, bias=False),
                        nn.BatchNorm2d(planes * block.expansion))
                layers.append(block(inplanes, planes, stride if number == 0 else 1, downsample))
                inplanes = planes * block.expansion
            setattr(self, f"layer{index + 1}", nn.Sequential(*layers))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Sequential(
            nn.Linear(inplanes, hidden, bias=False), nn.BatchNorm1d(hidden), nn.ReLU(),
            nn.Linear(hidden, hidden, bias=False), nn.BatchNorm1d(hidden), nn.ReLU(),
            nn.Linear(hidden, dim, bias=False))

    def features(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for index in range(1, 5):
            x = getattr(self, f"layer{index}")(x)
        return torch.flatten(self.avgpool(x), 1)


class TorchCaCo(nn.Module):
    def __init__(self, block=Bottleneck, blocks=(3, 4, 6, 3)):
        super().__init__()
        self.encoder_q = ResNet(block, blocks, HIDDEN, DIM)
        self.encoder_k = ResNet(block, blocks, HIDDEN, DIM)


def randomize(module):
    """Random weights as torchvision initializes them, BatchNorm far from the identity."""
    for layer in module.modules():
        if isinstance(layer, nn.Conv2d):
            nn.init.kaiming_normal_(layer.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(layer, (nn.BatchNorm1d, nn.BatchNorm2d)):
            with torch.no_grad():
                layer.weight.uniform_(0.5, 1.5)
                layer.bias.normal_(0.0, 0.2)
                layer.running_mean.normal_(0.0, 0.2)
                layer.running_var.uniform_(0.5, 2.0)
                layer.num_batches_tracked.fill_(1000)
    return module


def reference_checkpoint(model, epoch=EPOCH, **extra):
    """The reference's save_dict: DDP ``module.`` keys, the bank state, the epoch."""
    generator = torch.Generator().manual_seed(1)
    return {"epoch": epoch, "arch": "resnet50", "best_acc": 0.0,
            "state_dict": {f"module.{key}": value for key, value in model.state_dict().items()},
            "optimizer": {"state": {}, "param_groups": []},
            "Memory_Bank": {"W": torch.randn(DIM, BANK, generator=generator),
                            "v": 0.01 * torch.randn(DIM, BANK, generator=generator)},
            **extra}


def load_cli():
    spec = importlib.util.spec_from_file_location(
        "import_torch", os.path.join(ROOT, "export", "import_torch.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """The CLI run once on a saved checkpoint; a fresh model restored the way train.py resumes."""
    torch.manual_seed(0)
    reference = TorchCaCo()
    randomize(reference.encoder_q)
    randomize(reference.encoder_k)  # its own weights and statistics, as after EMA steps
    reference.eval()
    checkpoint = reference_checkpoint(reference)
    folder = tmp_path_factory.mktemp("import")
    path = str(folder / "checkpoint_0006.pth.tar")
    torch.save(checkpoint, path)

    run_dir = str(folder / "run")
    code = load_cli().main([path, "--out", run_dir, "--config", CONFIG,
                            "--set", f"data.image_size={SIZE}", "--saved-model"])
    assert code == 0

    # A fresh model from the written config, restored by the resume callback train.py uses.
    config = load_config(os.path.join(run_dir, "config.yaml"))
    model = build.build_model(config, steps_per_epoch=1)
    resume = callbacks.Resume(run_dir)
    resume.set_model(model)
    resume.on_train_begin()

    images = np.random.default_rng(0).normal(size=(3, SIZE, SIZE, 3)).astype(np.float32)
    yield types.SimpleNamespace(reference=reference, checkpoint=checkpoint, model=model,
                                config=config, run_dir=run_dir, images=images, path=path)
    shutil.rmtree(folder)  # about 0.8 GB of checkpoints and SavedModel


def close(keras_value, torch_value):
    """Equal to 1e-4 relative (to the array's scale: ReLU features have exact zeros)."""
    keras_value, torch_value = np.asarray(keras_value), torch_value.detach().numpy()
    np.testing.assert_allclose(keras_value, torch_value, rtol=1e-4,
                               atol=1e-4 * np.abs(torch_value).max())


@pytest.mark.parametrize("encoder", ["q", "k"])
def test_features_and_embeddings_equal_pytorch(imported, encoder):
    torch_encoder = getattr(imported.reference, f"encoder_{encoder}")
    keras_encoder = (imported.model.query_encoder if encoder == "q"
                     else imported.model.key_encoder)
    backbone, projector = keras_encoder.layers[1], keras_encoder.layers[2]
    with torch.no_grad():
        pixels = torch.from_numpy(imported.images.transpose(0, 3, 1, 2).copy())  # NHWC → NCHW
        features = torch_encoder.features(pixels)
        projection = torch_encoder.fc(features)
    keras_features = backbone(imported.images, training=False)
    assert float(np.abs(features.numpy()).max()) > 0.1  # a live network, not all zeros
    close(keras_features, features)
    close(projector(keras_features, training=False), projection)
    close(keras_encoder(imported.images, training=False),
          nn.functional.normalize(projection, dim=1))
    if encoder == "q":
        close(imported.model.backbone(imported.images, training=False), features)


def test_bank_statistics_and_resume_state_are_carried_exactly(imported):
    model, checkpoint = imported.model, imported.checkpoint
    np.testing.assert_array_equal(model.memory_bank.rows.numpy(),
                                  checkpoint["Memory_Bank"]["W"].numpy().T)
    np.testing.assert_array_equal(model.memory_bank.velocity.numpy(),
                                  checkpoint["Memory_Bank"]["v"].numpy().T)
    state = checkpoint["state_dict"]
    for prefix, encoder in (("module.encoder_q", model.query_encoder),
                            ("module.encoder_k", model.key_encoder)):
        bn = encoder.layers[1].get_layer("layer3_4_bn2")
        assert bn.epsilon == torch_import.TORCH_BN_EPSILON == nn.BatchNorm2d(1).eps
        for keras_name, torch_name in (("moving_mean", "running_mean"),
                                       ("moving_variance", "running_var"),
                                       ("gamma", "weight"), ("beta", "bias")):
            np.testing.assert_array_equal(getattr(bn, keras_name).numpy(),
                                          state[f"{prefix}.layer3.4.bn2.{torch_name}"].numpy())
        conv = encoder.layers[1].get_layer("layer2_0_downsample_0").kernel.numpy()
        np.testing.assert_array_equal(
            conv, state[f"{prefix}.layer2.0.downsample.0.weight"].numpy().transpose(2, 3, 1, 0))
        dense = encoder.layers[2].get_layer("fc_6").kernel.numpy()
        np.testing.assert_array_equal(dense, state[f"{prefix}.fc.6.weight"].numpy().T)

    # The sizes come from the checkpoint; the resume point from ImageNet's 1,281,167 images.
    config = imported.config
    assert (config["model"]["projector_hidden"], config["model"]["embedding_dim"],
            config["method"]["caco"]["bank_size"]) == (HIDDEN, DIM, BANK)
    steps = 1281167 // 1024
    resume_epoch = config["method"]["caco"]["warmup_epochs"] + EPOCH
    assert model._initial_epoch == resume_epoch
    assert int(model.optimizer.iterations.numpy()) == resume_epoch * steps
    run_dir = imported.run_dir
    point = RunFolder(run_dir).read_backup()  # the resume state, as training writes it
    assert (point.epoch, point.step, point.iterations) == (resume_epoch, 0, resume_epoch * steps)
    with open(os.path.join(run_dir, "import.json")) as handle:
        record = json.load(handle)
    assert (record["epoch"], record["resume_epoch"], record["tensors"]) == (
        EPOCH, resume_epoch, len(model.query_encoder.weights) * 2 + 2)


def test_saved_model_serves_the_imported_backbone_with_imagenet_normalization(imported):
    pixels = np.random.default_rng(1).integers(0, 256, size=(2, SIZE, SIZE, 3), dtype=np.uint8)
    loaded = tf.saved_model.load(os.path.join(imported.run_dir, "saved_model", "backbone", "1"))
    served = loaded.signatures["serving_default"](images=tf.constant(pixels))["features"]
    normalized = ((pixels / 255.0 - np.array(torch_import.IMAGENET_MEAN))
                  / np.array(torch_import.IMAGENET_STD)).astype(np.float32)
    with torch.no_grad():
        expected = imported.reference.encoder_q.features(
            torch.from_numpy(normalized.transpose(0, 3, 1, 2).copy()))
    close(served, expected)


def broken(imported, edit):
    """A copy of the checkpoint with ``edit(state_dict)`` applied."""
    state = dict(imported.checkpoint["state_dict"])
    edit(state)
    return {**imported.checkpoint, "state_dict": state}


def resnet18_checkpoint():
    torch.manual_seed(1)
    return reference_checkpoint(TorchCaCo(BasicBlock, (2, 2, 2, 2)))


@pytest.mark.parametrize("make, message", [
    (lambda ok: broken(ok, lambda s: s.pop("module.encoder_k.layer3.1.bn2.running_var")),
     "the checkpoint lacks 'module.encoder_k.layer3.1.bn2.running_var'"),
    (lambda ok: broken(ok, lambda s: s.update({
        "module.encoder_q.layer2.0.conv2.weight": torch.zeros(128, 128, 1, 1)})),
     "'module.encoder_q.layer2.0.conv2.weight' has shape (128, 128, 1, 1), the resnet50 CaCo "
     "model expects (128, 128, 3, 3)"),
    (lambda ok: broken(ok, lambda s: s.update({
        "module.encoder_q.layer3.6.conv1.weight": torch.zeros(256, 1024, 1, 1)})),
     "unexpected key 'module.encoder_q.layer3.6.conv1.weight'"),
    (lambda ok: {**ok.checkpoint, "Memory_Bank": {"W": torch.zeros(DIM, BANK)}},
     "the checkpoint lacks 'Memory_Bank.v'"),
    (lambda ok: {**resnet18_checkpoint(), "arch": None},
     "'module.encoder_q.layer1.0.conv1.weight' has shape (64, 64, 3, 3), the resnet50 CaCo "
     "model expects (64, 64, 1, 1)"),
    (lambda ok: {**ok.checkpoint, "arch": "resnet18"},
     "the checkpoint's 'arch' is 'resnet18', the model's backbone is 'resnet50'"),
    (lambda ok: {"model": {}}, "the checkpoint has no 'state_dict' dict (its keys: model)"),
])
def test_a_wrong_checkpoint_names_the_key_and_changes_nothing(imported, make, message):
    before = (imported.model.memory_bank.rows.numpy().copy(),
              imported.model.backbone.weights[0].numpy().copy())
    with pytest.raises(CheckpointError) as caught:
        torch_import.import_checkpoint(imported.model, make(imported))
    assert message in str(caught.value)
    np.testing.assert_array_equal(imported.model.memory_bank.rows.numpy(), before[0])
    np.testing.assert_array_equal(imported.model.backbone.weights[0].numpy(), before[1])


def test_cli_errors_are_one_line(imported, tmp_path, capsys):
    cli = load_cli()
    resnet18 = str(tmp_path / "resnet18.pth.tar")
    torch.save({**resnet18_checkpoint(), "arch": None}, resnet18)
    not_a_checkpoint = tmp_path / "notes.pth.tar"
    not_a_checkpoint.write_text("not a checkpoint")
    with_code = str(tmp_path / "pickled.pth.tar")  # weights_only loading refuses classes
    torch.save({"args": argparse.Namespace(arch="resnet50")}, with_code)
    cases = [
        ([resnet18], "error: 'module.encoder_q.layer1.0.conv1.weight' has shape (64, 64, 3, 3)"),
        ([str(tmp_path / "missing.pth.tar")], "error: checkpoint not found: "),
        ([str(not_a_checkpoint)], "as a PyTorch checkpoint: not a torch.save file"),
        ([with_code], "GLOBAL argparse.Namespace (if you trust the file: trust_pickle=True, "
                      "--trust-pickle)"),
        ([imported.path, "--out", imported.run_dir], "already holds a run ("),
    ]
    for args, message in cases:
        if "--out" not in args:
            args = [*args, "--out", str(tmp_path / "run"), "--set", f"data.image_size={SIZE}"]
        assert cli.main(args) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_caco_tf_imports_without_torch():
    """torch is an optional extra: only reading a .pth file needs it, and says how to get it."""
    code = """
import sys
class NoTorch:  # as if torch were not installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            raise ImportError("No module named 'torch'")
sys.meta_path.insert(0, NoTorch())
import caco_tf.serving.torch_import as t, caco_tf.pretrain, caco_tf.serving.export
assert "torch" not in sys.modules
try:
    t.load_checkpoint("x.pth.tar")
except t.CheckpointError as error:
    print(error)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), timeout=120)
    assert result.returncode == 0, result.stderr
    assert 'pip install "caco-tf[torch]"' in result.stdout


def test_written_config_is_the_given_one_plus_the_checkpoint_sizes(imported):
    with open(CONFIG) as handle:
        given = yaml.safe_load(handle)
    config = imported.config
    assert config["model"]["backbone"] == given["model"]["backbone"] == "resnet50"
    assert config["train"]["batch_size"] == given["train"]["batch_size"]
    assert config["data"]["image_size"] == SIZE
