"""torchvision classification and segmentation models, random weights, exported by ``torch.onnx.export``.

torchvision from the package index can be a build whose C++ operators do not load with the installed
torch (``operator torchvision::nms does not exist`` at ``import torchvision``, shared/TVM027_NOTES.md).
:func:`import_torchvision` then declares torchvision's operator schemas with ``torch.library`` before the
import, so the Python package loads; the models here call none of those operators.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from .common import ZooModel, batchnorm_statistics, require, seeded, torch_export

# torchvision's operators as its C++ extension declares them (torchvision 0.29), names without the
# "torchvision::" namespace. Only the schemas: no kernels (nothing here calls them).
TORCHVISION_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio, bool aligned) -> Tensor",
    "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "SymInt batch_size, SymInt channels, SymInt height, SymInt width, int sampling_ratio, bool aligned) -> Tensor",
    "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio) -> (Tensor, Tensor)",
    "_ps_roi_align_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, int sampling_ratio, SymInt batch_size, SymInt channels, "
    "SymInt height, SymInt width) -> Tensor",
    "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
    "ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_ps_roi_pool_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, "
    "SymInt width) -> Tensor",
    "qroi_align(Tensor input, Tensor rois, float input_scale, int input_zero_point, float rois_scale, "
    "int rois_zero_point, float spatial_scale, SymInt pooled_height, SymInt pooled_width, int sampling_ratio, "
    "bool aligned) -> Tensor",
    "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, SymInt stride_h, "
    "SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups, "
    "SymInt offset_groups, bool use_mask) -> Tensor",
    "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
    "SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, "
    "SymInt groups, SymInt offset_groups, bool use_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
)
_SHIM = None  # the torch.library.Library holding the declared schemas (dropping it would undo them)
SHIM_USED = False  # whether this process needed the schemas


def _has_torchvision_ops(torch) -> bool:
    try:
        torch.ops.torchvision.nms.default  # noqa: B018
        return True
    except (AttributeError, RuntimeError):
        return False


def _extension_loads(torch) -> bool:
    """Whether torchvision's own C++ operator library loads into this torch (found without importing
    torchvision: ``_C*.so`` in its package folder)."""
    if _has_torchvision_ops(torch):
        return True
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return False
    for folder in spec.submodule_search_locations:
        for lib in sorted(Path(folder).glob("_C*.so")):
            try:
                torch.ops.load_library(str(lib))
            except (OSError, RuntimeError):
                continue
            if _has_torchvision_ops(torch):
                return True
    return False


def import_torchvision():
    """``import torchvision``, declaring its operator schemas first where its extension does not load."""
    global _SHIM, SHIM_USED
    if "torchvision" in sys.modules:
        return sys.modules["torchvision"]
    torch = require("torch")
    if importlib.util.find_spec("torchvision") is None:
        return require("torchvision")  # raises ZooUnavailable naming it
    if not _extension_loads(torch):
        _SHIM = torch.library.Library("torchvision", "DEF")
        for schema in TORCHVISION_SCHEMAS:
            _SHIM.define(schema)
        SHIM_USED = True
    return require("torchvision")


def _classifier(builder: str, statistics: bool = False):
    """Export torchvision's ``builder`` with random weights; ``statistics``: its batch norms' running
    statistics measured first (:func:`batchnorm_statistics`)."""
    def export(path: Path, size: int, dynamo: bool) -> None:
        torch = require("torch")
        tv = import_torchvision()
        model = seeded(lambda: getattr(tv.models, builder)(weights=None))
        if statistics:
            model = batchnorm_statistics(model, (1, 3, size, size))
        torch_export(model, (torch.randn(1, 3, size, size),), path, ["image"], ["logits"], dynamo)

    return export


def _segmenter(builder: str):
    def export(path: Path, size: int, dynamo: bool) -> None:
        torch = require("torch")
        tv = import_torchvision()

        class OutOnly(torch.nn.Module):  # the models return {"out": ...}; export the map alone
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, x):
                return self.inner(x)["out"]

        model = seeded(lambda: getattr(tv.models.segmentation, builder)(weights=None, weights_backbone=None))
        torch_export(OutOnly(model), (torch.randn(1, 3, size, size),), path, ["image"], ["out"], dynamo)

    return export


def _vit(path: Path, size: int, dynamo: bool) -> None:
    torch = require("torch")
    tv = import_torchvision()
    model = seeded(lambda: tv.models.vit_b_16(weights=None, image_size=size))  # size: a multiple of 16
    # torchvision starts the classifier head at zero (fine-tuning's choice): every image would give the
    # same logits, and the output check's cosine would be undefined; a small random head instead
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        head = model.heads.head
        head.weight.copy_(torch.randn(head.weight.shape, generator=generator) * head.in_features ** -0.5)
    torch_export(model, (torch.randn(1, 3, size, size),), path, ["image"], ["logits"], dynamo)


def _cnn(name, description, small=128, size=224, statistics=False):
    return ZooModel(name, "torchvision", description, size, small, _classifier(name, statistics), "image", ("cnn",),
                    revision=1 if statistics else 0)


MODELS: dict[str, ZooModel] = {m.name: m for m in (
    _cnn("resnet50", "ResNet-50 (torchvision), 1000 classes", small=112),
    _cnn("mobilenet_v3_large", "MobileNetV3-Large (hard-swish, squeeze-excite)"),
    _cnn("efficientnet_b0", "EfficientNet-B0 (SiLU, squeeze-excite)", statistics=True),
    _cnn("convnext_tiny", "ConvNeXt-T (7x7 depthwise, LayerNorm, GELU)", small=112),
    _cnn("regnet_y_400mf", "RegNetY-400MF (group convs, squeeze-excite)"),
    _cnn("shufflenet_v2_x1_0", "ShuffleNetV2 1.0x (channel shuffle)"),
    _cnn("squeezenet1_1", "SqueezeNet 1.1 (fire modules, concat)", small=64),
    ZooModel("vit_b_16", "torchvision", "ViT-B/16 (12 layers, d 768)", 224, 112, _vit, "image", ("transformer",),
             revision=1),
    ZooModel("deeplabv3_mobilenet_v3_large", "torchvision", "DeepLabV3 on MobileNetV3-Large (ASPP, 21 classes)",
             320, 160, _segmenter("deeplabv3_mobilenet_v3_large"), "image", ("cnn", "segmentation")),
    ZooModel("lraspp_mobilenet_v3_large", "torchvision", "LR-ASPP on MobileNetV3-Large (21 classes)",
             320, 160, _segmenter("lraspp_mobilenet_v3_large"), "image", ("cnn", "segmentation")),
)}
