"""timm models (``timm.create_model(name, pretrained=False)``: random weights, nothing downloaded)."""

from __future__ import annotations

from pathlib import Path

from .common import ZooModel, require, seeded, torch_export


def _timm(name: str, sized: bool = False):
    """``sized``: the model's position biases depend on the input size (LeViT): pass ``img_size``."""

    def export(path: Path, size: int, dynamo: bool) -> None:
        torch = require("torch")
        timm = require("timm")
        extra = {"img_size": size} if sized else {}
        model = seeded(lambda: timm.create_model(name, pretrained=False, **extra))
        torch_export(model, (torch.randn(1, 3, size, size),), path, ["image"], ["logits"], dynamo)

    return export


def _entry(name, description, tags=("cnn",), sized=False, small=128):
    return ZooModel(name, "timm", description, 224, small, _timm(name, sized), "image", tags)


MODELS: dict[str, ZooModel] = {m.name: m for m in (
    _entry("efficientvit_b0", "EfficientViT-B0 (MIT; ReLU linear attention, hard-swish)", ("cnn", "transformer")),
    _entry("mobilevitv2_050", "MobileViTv2-0.5 (separable self-attention, GroupNorm)", ("cnn", "transformer")),
    _entry("ghostnet_100", "GhostNet 1.0 (ghost modules, squeeze-excite)"),
    _entry("levit_128s", "LeViT-128S (attention with position biases, hard-swish)", ("transformer",), sized=True),
    _entry("repvit_m0_9", "RepViT-M0.9 (re-parameterised depthwise blocks)"),
)}
