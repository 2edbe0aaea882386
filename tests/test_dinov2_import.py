"""facebookresearch/dinov2's checkpoints into the Keras ViT (caco-import-torch): a ViT written
here in PyTorch after dinov2's ``vision_transformer.py`` (its key names, LayerScale's ls1/ls2,
the register tokens after the class token, the mask token, ``interpolate_pos_encoding`` with its
offset and antialias), random weights, saved as dinov2's backbone file and as its chunked
training checkpoint, imported through the command: the same features to 1e-4, at the table's
size and at another; a tensor missing, unexpected or of another shape is one line naming it."""

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

pytestmark = pytest.mark.slow  # torch's import, models built and imported: ~30 s

SHAPE = vit.VIT_PRESETS["vit_micro_patch4"]
TABLE = 24  # the position table's side in pixels (dinov2's img_size: 518 for its releases)
SMALL = ["data.image_size=32", "data.multicrop.local_size=16", "model.projector_hidden=32",
         "model.embedding_dim=16", "method.dino.out_dim=64", "model.sync_batchnorm=false"]


class Block(nn.Module):
    """dinov2's Block at inference: x + ls1(attn(norm1(x))), x + ls2(mlp(norm2(x)))."""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width, eps=1e-6), nn.LayerNorm(width, eps=1e-6)
        self.attn = nn.Module()
        self.attn.qkv, self.attn.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.ls1, self.ls2 = nn.Module(), nn.Module()
        self.ls1.gamma = nn.Parameter(torch.full((width,), 1e-5))
        self.ls2.gamma = nn.Parameter(torch.full((width,), 1e-5))
        self.mlp = nn.Module()
        self.mlp.fc1, self.mlp.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        batch, count, width = x.shape
        qkv = self.attn.qkv(self.norm1(x)).reshape(batch, count, 3, self.heads, -1)
        q, k, v = [t.transpose(1, 2) for t in torch.unbind(qkv, 2)]
        mixed = nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.attn.proj(mixed.transpose(1, 2).reshape(batch, count, width)) * self.ls1.gamma
        hidden = self.mlp.fc2(nn.functional.gelu(self.mlp.fc1(self.norm2(x))))
        return x + hidden * self.ls2.gamma


class DinoV2ViT(nn.Module):
    """dinov2's DinoVisionTransformer: prepare_tokens_with_masks, the blocks, x_norm_clstoken."""

    def __init__(self, registers=0, offset=0.1, antialias=False):
        super().__init__()
        grid, width = TABLE // SHAPE.patch, SHAPE.width
        self.offset, self.antialias = offset, antialias
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(3, width, SHAPE.patch, SHAPE.patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, width) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, 1 + grid * grid, width) * 0.02)
        self.register_tokens = (nn.Parameter(torch.randn(1, registers, width) * 0.02)
                                if registers else None)
        self.blocks = nn.ModuleList(Block(width, SHAPE.heads) for _ in range(SHAPE.depth))
        self.norm = nn.LayerNorm(width, eps=1e-6)
        self.mask_token = nn.Parameter(torch.zeros(1, width))

    def interpolate_pos_encoding(self, x, w, h):
        npatch, count = x.shape[1] - 1, self.pos_embed.shape[1] - 1
        if npatch == count and w == h:
            return self.pos_embed
        w0, h0, grid = w // SHAPE.patch, h // SHAPE.patch, int(math.sqrt(count))
        if self.offset:
            kwargs = {"scale_factor": ((w0 + self.offset) / grid, (h0 + self.offset) / grid)}
        else:
            kwargs = {"size": (w0, h0)}
        table = self.pos_embed[:, 1:].reshape(1, grid, grid, -1).permute(0, 3, 1, 2)
        table = nn.functional.interpolate(table, mode="bicubic", antialias=self.antialias,
                                          **kwargs)
        return torch.cat([self.pos_embed[:, :1], table.permute(0, 2, 3, 1).flatten(1, 2)], 1)

    def forward(self, images):  # images: [B, C, H, W]
        _, _, w, h = images.shape
        x = self.patch_embed.proj(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], 1)
        x = x + self.interpolate_pos_encoding(x, w, h)
        if self.register_tokens is not None:
            x = torch.cat([x[:, :1], self.register_tokens.expand(len(x), -1, -1), x[:, 1:]], 1)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)[:, 0]


def _randomize(model):
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    return model


def _import(state, tmp_path, name, *extra):
    path = str(tmp_path / f"{name}.pth")
    torch.save(state, path)
    run = str(tmp_path / name)
    status = import_torch.main([path, "--out", run, "--config", "dino_imagenet_vit_small16",
                                *sum((["--set", s] for s in SMALL + list(extra)), [])])
    return status, run


def _relative_gap(run, model, size):
    images = np.random.default_rng(size).normal(size=(2, 3, size, size)).astype("float32")
    with torch.no_grad():
        expected = model(torch.tensor(images)).numpy()
    got = np.asarray(build.load_run(run).model.backbone(images.transpose(0, 2, 3, 1)))
    return float(np.abs(got - expected).max() / np.abs(expected).max())


@pytest.mark.parametrize("registers, offset, antialias", [(0, 0.1, False), (4, 0.0, True)],
                         ids=["dinov2", "dinov2 with registers"])
def test_a_dinov2_backbone_file_imports_with_its_features_at_two_sizes(
        registers, offset, antialias, tmp_path, capsys):
    model = _randomize(DinoV2ViT(registers, offset, antialias)).eval()
    status, run = _import(model.state_dict(), tmp_path, "backbone")
    assert status == 0
    printed = capsys.readouterr().out
    assert "DINOv2's backbone file" in printed and "as vit_micro_patch4" in printed
    config = build.load_run(run).config["model"]
    assert (config["registers"], config["mask_token"], config["position_table_size"],
            config["interpolate_offset"], config["interpolate_antialias"]) == (
        registers, True, TABLE, offset, antialias)
    for size in (TABLE, 32):  # 32 px: the table resized as dinov2 resizes it
        assert _relative_gap(run, model, size) <= 1e-4, size


def test_a_chunked_dinov2_training_checkpoint_imports_the_teachers_backbone(tmp_path, capsys):
    model = _randomize(DinoV2ViT(registers=2)).eval()
    teacher = {}
    for key, value in model.state_dict().items():
        if key.startswith("blocks."):  # block_chunks 2: blocks.<chunk>.<block>.*
            index = int(key.split(".")[1])
            key = f"blocks.{index // 2}.{index}." + key.split(".", 2)[2]
        teacher[f"backbone.{key}"] = value
    teacher["dino_head.last_layer.weight_v"] = torch.zeros(64, 16)  # the heads: not imported
    status, run = _import({"teacher": teacher}, tmp_path, "full",
                          "model.interpolate_offset=0.1", "model.interpolate_antialias=false")
    assert status == 0
    assert "DINOv2's training checkpoint" in capsys.readouterr().out
    assert _relative_gap(run, model, 32) <= 1e-4


@pytest.mark.parametrize("change, message", [
    (lambda s: s.pop("blocks.1.ls2.gamma"), "the checkpoint lacks 'blocks.1.ls2.gamma'"),
    (lambda s: s.update({"blocks.0.ls3.gamma": torch.zeros(SHAPE.width)}),
     "unexpected key 'blocks.0.ls3.gamma'"),
    (lambda s: s.update({"register_tokens": torch.zeros(1, 4, SHAPE.width + 1)}),
     r"'register_tokens' has shape \(1, 4, 97\), the vit_micro_patch4 backbone expects "
     r"\(1, 4, 96\)")], ids=["missing", "unexpected", "shape"])
def test_a_dinov2_tensor_missing_unexpected_or_misshapen_is_one_line(change, message, tmp_path,
                                                                       capsys):
    state = dict(_randomize(DinoV2ViT(registers=4)).state_dict())
    change(state)
    status, run = _import(state, tmp_path, "run")
    assert status == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error
    assert __import__("re").search(message, error), error
    assert not os.path.exists(os.path.join(run, "checkpoints"))


def test_a_dinov2_file_is_a_starting_point_through_its_dinov2backbone_preset(tmp_path, capsys):
    """docs/vit.md's way to continue DINOv2's pre-training: import, export as KerasHub's
    DINOV2Backbone, start from keras_hub:DIR; the same features all along."""
    pytest.importorskip("keras_hub", reason="the hub extra is absent: pip install -e '.[hub]'")
    from caco_tf.cli import export
    from caco_tf.nets import backbones

    model = _randomize(DinoV2ViT(registers=4, offset=0.0, antialias=True)).eval()
    status, run = _import(model.state_dict(), tmp_path, "run")
    assert status == 0 and export.main(["--run", run, "--format", "keras-hub"]) == 0
    start = backbones.build_backbone(f"keras_hub:{run}/keras_hub_preset", (32, 32, 3))
    images = np.random.default_rng(0).normal(size=(2, 3, 32, 32)).astype("float32")
    with torch.no_grad():
        expected = model(torch.tensor(images)).numpy()
    got = np.asarray(start(images.transpose(0, 2, 3, 1)))
    assert float(np.abs(got - expected).max() / np.abs(expected).max()) <= 1e-4
