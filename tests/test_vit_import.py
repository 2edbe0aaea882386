"""DINO's and MoCo v3's ViT checkpoints into the Keras ViT (caco-import-torch): a ViT written
here in PyTorch after their model code's layout and arithmetic (timm's parameter names, DINO's
bicubic position resize with its +0.1, MoCo v3's fixed sine-cosine table), random weights,
saved in each checkpoint's format, imported through the command: the same features to 1e-4."""

import math
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch extra is absent: pip install -e "
                                            "'.[torch]'")
from torch import nn  # noqa: E402

from caco_tf import build  # noqa: E402
from caco_tf.cli import import_torch  # noqa: E402
from caco_tf.nets import vit  # noqa: E402

pytestmark = pytest.mark.slow  # torch's import, two models built and imported: ~40 s

SHAPE = vit.VIT_PRESETS["vit_micro_patch4"]
SIZE = 32
SMALL = ["data.image_size=32", "data.multicrop.local_size=16", "model.projector_hidden=32",
         "model.embedding_dim=16", "method.dino.out_dim=64", "method.moco_v3.predictor_hidden=32",
         "model.sync_batchnorm=false"]


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width, eps=1e-6), nn.LayerNorm(width, eps=1e-6)
        self.attn = nn.Module()
        self.attn.qkv, self.attn.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Module()
        self.mlp.fc1, self.mlp.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        batch, count, width = x.shape
        qkv = self.attn.qkv(self.norm1(x)).reshape(batch, count, 3, self.heads, -1)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        weights = (q @ k.transpose(-2, -1) * (width // self.heads) ** -0.5).softmax(-1)
        x = x + self.attn.proj((weights @ v).transpose(1, 2).reshape(batch, count, width))
        return x + self.mlp.fc2(nn.functional.gelu(self.mlp.fc1(self.norm2(x))))


class TorchViT(nn.Module):
    def __init__(self, sincos=False):
        super().__init__()
        grid, width = SIZE // SHAPE.patch, SHAPE.width
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(3, width, SHAPE.patch, SHAPE.patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, width) * 0.02)
        if sincos:  # MoCo v3: fixed, the class token's position 0
            table = np.asarray(vit.sincos_position_embedding(grid, grid, width))
            self.pos_embed = nn.Parameter(torch.tensor(np.concatenate(
                [np.zeros((1, width)), table])[None], dtype=torch.float32), requires_grad=False)
        else:
            self.pos_embed = nn.Parameter(torch.randn(1, 1 + grid * grid, width) * 0.02)
        self.blocks = nn.ModuleList(Block(width, SHAPE.heads) for _ in range(SHAPE.depth))
        self.norm = nn.LayerNorm(width, eps=1e-6)

    def positions(self, rows):
        count = self.pos_embed.shape[1] - 1
        if rows * rows == count:
            return self.pos_embed
        grid = int(math.sqrt(count))
        table = self.pos_embed[:, 1:].reshape(1, grid, grid, -1).permute(0, 3, 1, 2)
        factor = (rows + 0.1) / grid
        table = nn.functional.interpolate(table, scale_factor=(factor, factor), mode="bicubic")
        return torch.cat([self.pos_embed[:, :1], table.permute(0, 2, 3, 1).flatten(1, 2)], 1)

    def forward(self, images):  # images: [B, C, H, W]
        x = self.patch_embed.proj(images)
        rows = x.shape[-1]
        x = torch.cat([self.cls_token.expand(len(x), -1, -1), x.flatten(2).transpose(1, 2)], 1)
        x = x + self.positions(rows)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)[:, 0]


def _randomize(model):
    torch.manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.requires_grad:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    return model


def _features(run, images):
    return np.asarray(build.load_run(run).model.backbone(images.transpose(0, 2, 3, 1)))


def _relative(got, expected):
    return float(np.abs(got - expected).max() / np.abs(expected).max())


def test_dinos_backbone_file_imports_with_its_features_at_two_sizes(tmp_path, capsys):
    model = _randomize(TorchViT()).eval()
    path = str(tmp_path / "dino_pretrain.pth")
    torch.save(model.state_dict(), path)  # dino_*_pretrain.pth: the backbone's state dict
    run = str(tmp_path / "run")
    assert import_torch.main([path, "--out", run, "--config", "dino_imagenet_vit_small16",
                              *sum((["--set", s] for s in SMALL), [])]) == 0
    assert "as vit_micro_patch4" in capsys.readouterr().out
    for size in (SIZE, 48):  # 48 px: the positions resized as DINO resizes them
        images = np.random.default_rng(size).normal(size=(2, 3, size, size)).astype("float32")
        with torch.no_grad():
            expected = model(torch.tensor(images)).numpy()
        assert _relative(_features(run, images), expected) <= 1e-4, size

    # DINO's full checkpoint: the teacher's backbone (and head, not imported) beside the rest.
    state = {f"backbone.{k}": v for k, v in model.state_dict().items()}
    state["head.last_layer.weight_v"] = torch.zeros(64, 16)
    torch.save({"teacher": state, "student": {}, "epoch": 100}, path)
    assert import_torch.main([path, "--out", str(tmp_path / "full"), "--config",
                              "dino_imagenet_vit_small16",
                              *sum((["--set", s] for s in SMALL), [])]) == 0
    assert "DINO's full checkpoint" in capsys.readouterr().out
    images = np.random.default_rng(0).normal(size=(2, 3, SIZE, SIZE)).astype("float32")
    with torch.no_grad():
        expected = model(torch.tensor(images)).numpy()
    assert _relative(_features(str(tmp_path / "full"), images), expected) <= 1e-4


def test_moco_v3s_checkpoint_imports_both_encoders_and_checks_its_positions(tmp_path, capsys):
    base, momentum = _randomize(TorchViT(sincos=True)).eval(), TorchViT(sincos=True).eval()
    momentum.load_state_dict(base.state_dict())
    state = {f"module.base_encoder.{k}": v for k, v in base.state_dict().items()}
    state.update({f"module.momentum_encoder.{k}": v for k, v in momentum.state_dict().items()})
    state["module.base_encoder.head.0.weight"] = torch.zeros(32, SHAPE.width)  # the projector
    state["module.predictor.0.weight"] = torch.zeros(32, 16)
    path = str(tmp_path / "vit-s-300ep.pth.tar")
    torch.save({"epoch": 300, "arch": "vit_small", "state_dict": state}, path)
    run = str(tmp_path / "run")
    assert import_torch.main([path, "--out", run, *sum((["--set", s] for s in SMALL), [])]) == 0
    assert "configuration moco_v3_imagenet_vit_small" in capsys.readouterr().out
    images = np.random.default_rng(0).normal(size=(2, 3, SIZE, SIZE)).astype("float32")
    with torch.no_grad():
        expected = base(torch.tensor(images)).numpy()
    assert _relative(_features(run, images), expected) <= 1e-4
    teacher = [layer for layer in build.load_run(run).model.key_encoder.layers
               if layer.name == "vit_micro_patch4"][0]
    assert _relative(np.asarray(teacher(images.transpose(0, 2, 3, 1))), expected) <= 1e-4

    state["module.base_encoder.pos_embed"] = state["module.base_encoder.pos_embed"] + 0.5
    torch.save({"epoch": 300, "state_dict": state}, path)
    assert import_torch.main([path, "--out", str(tmp_path / "other"),
                              *sum((["--set", s] for s in SMALL), [])]) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "pos_embed is not the sine-cosine table" in error


def test_a_vit_checkpoint_without_its_patch_embedding_is_one_line_naming_it(tmp_path, capsys):
    """Its patch size and width are read from that tensor."""
    state = {k: v for k, v in TorchViT().state_dict().items()
             if not k.startswith("patch_embed.")}
    path = str(tmp_path / "dino_pretrain.pth")
    torch.save({"teacher": {f"backbone.{k}": v for k, v in state.items()}}, path)
    assert import_torch.main([path, "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: the checkpoint lacks 'teacher.backbone.patch_embed.proj.weight', which a ViT "
        "backbone needs (its patch size and width are read from it)")
    assert not os.path.exists(tmp_path / "run")
