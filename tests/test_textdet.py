"""A mobile OCR text detector (DBNet-style: MobileNetV3-style backbone, FPN neck, DB head; benchmarks/models/textdet.py),
exported with dynamic height and width: its FP32 form and ONNX Runtime's quantize_static QDQ form compile
once the input shape is fixed and match ORT running the graph as written.

What it exercises beyond the YOLO-style detector (test_fold_shapes.py): BatchNormalization as separate
nodes with random statistics (folded into the preceding Conv at import), depthwise convolutions with
stride 1 and 2, squeeze-excite (GlobalAveragePool, 1x1 convs on a 1x1 map, HardSigmoid, broadcast Mul),
both hard-swish forms (the HardSwish op and ``x * HardSigmoid(x)``), nearest Resize by constant scales
and by sizes computed from a shape, and a ConvTranspose head (nothing is asserted about its kernels).
The paddle2onnx-style variant (``textdet-decomposed``: hard-swish as ``Add``, ``Clip``, ``Mul``, ``Div``,
a Q/DQ pair after each) is compiled from its QDQ file as the benchmark quantizes it.
"""

import re
from collections import Counter

import numpy as np
import onnx
import pytest

import tvm_lowprec
from tvm_lowprec.errors import DynamicShapeError
from tvm_lowprec.frontend.fold_shapes import fix_input_shapes, fold_shapes

from models import fp32_and_qdq
from reference import cosine, ort_session
from benchmarks.models.quantize import preprocess, quantize_qdq as quantize_static
from benchmarks.models.textdet import db_like

SHAPE = (1, 3, 64, 64)
# FP32: ours and ORT differ only in float32 summation order. The map is a sigmoid of logits of std ~2
# reached through ~30 layers whose activations peak near 60, where float32 rounding is ~4e-6; the
# observed difference is ~3e-6, so 1e-4 leaves a 30x margin and still catches any real error (a wrong
# BN fold moves the map by 1e-2 and more)
FP32_ATOL = 1e-4


@pytest.fixture(scope="module")
def textdet():
    return fp32_and_qdq(db_like(), SHAPE)


def _batch_norms(mod) -> int:
    return len(re.findall(r"R\.nn\.batch_norm\(", mod.script()))


def _compile(model):
    return tvm_lowprec.compile(tvm_lowprec.from_onnx(model, shape_dict={"images": list(SHAPE)}), target="native")


def test_fp32_form_compiles_and_matches_ort(textdet, rng):
    model = textdet["fp32"]
    mod = tvm_lowprec.from_onnx(model, shape_dict={"images": list(SHAPE)})
    # every Conv -> BatchNormalization pair is folded at import (the BN after the head's ConvTranspose
    # is outside fold_batchnorm's scope and may stay)
    producer = {o: n.op_type for n in model.graph.node for o in n.output}
    after_deconv = sum(n.op_type == "BatchNormalization" and producer[n.input[0]] == "ConvTranspose"
                       for n in model.graph.node)
    assert _batch_norms(mod) <= after_deconv == 1
    compiled = tvm_lowprec.compile(mod, target="native")
    assert not [k for k in compiled.kernels() if k.op == "qgemm"]
    x = rng.standard_normal(SHAPE).astype(np.float32)
    (got,), (want,) = compiled(x), ort_session(model, optimized=False).run(None, {"images": x})
    assert got.shape == want.shape == SHAPE[:1] + (1,) + SHAPE[2:]
    assert 0.1 < want.std()  # a map that is not saturated: errors would show
    assert np.abs(got - want).max() <= FP32_ATOL
    assert cosine(got, want) >= 0.9999


def test_qdq_form_compiles_to_integer_convolutions_and_matches_ort(textdet, rng):
    model = textdet["qdq"]
    compiled = _compile(model)
    kernels = compiled.kernels()
    names = [k.name for k in kernels]
    # every Conv an integer kernel: GEMM convolutions and the seven depthwise ones (distinct channels,
    # sizes and strides, so seven kernels), and no float conv2d left (conv2d_transpose is not looked at)
    assert [n for n in names if n.startswith("qconv2d")]
    assert len([n for n in names if n.startswith("qdepthwise")]) == 7
    assert not [n for n in names if re.search(r"(?<![a-z])conv2d", n)]  # conv2d_transpose included
    # the head's two ConvTranspose: integer GEMMs (int32 out) and the col2im that requantizes
    assert len([k for k in kernels if k.op == "col2im"]) == 2
    assert len([k for k in kernels if k.op == "qgemm" and k.name.endswith("_int32")]) == 2
    x = rng.standard_normal(SHAPE).astype(np.float32)
    (got,), (want,) = compiled(x), ort_session(model, optimized=False).run(None, {"images": x})
    assert got.shape == want.shape == SHAPE[:1] + (1,) + SHAPE[2:]
    assert cosine(got, want) >= 0.9999


def test_a_quantized_standalone_batchnorm_runs_as_written(textdet):
    """ORT's quantize_static (without quant_pre_process) quantizes each BatchNormalization as an operator
    of its own: Conv -> QuantizeLinear/DequantizeLinear -> BatchNormalization -> QuantizeLinear. Folding
    it into the convolution's quantized weights would change the model's integers (fold_batchnorm leaves
    such convolutions alone), so it runs as written: float arithmetic between a dequantize and a
    quantize, fused with them into a scheduled element-wise kernel (the outputs match ORT's QDQ graph
    in test_qdq_form_compiles_to_integer_convolutions_and_matches_ort)."""
    model = textdet["qdq"]
    producer = {o: n for n in model.graph.node for o in n.output}
    readers = {}
    for n in model.graph.node:
        for name in n.input:
            readers.setdefault(name, []).append(n)
    bns = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    assert bns and all(producer[bn.input[0]].op_type == "DequantizeLinear" for bn in bns)
    assert all(r.op_type == "QuantizeLinear" for bn in bns for r in readers[bn.output[0]])
    assert _batch_norms(tvm_lowprec.from_onnx(model, shape_dict={"images": list(SHAPE)})) == len(bns)
    assert not [k.name for k in _compile(model).kernels() if k.schedule == "none"]


def test_a_dynamic_dimension_is_named_with_the_fix(textdet):
    with pytest.raises(DynamicShapeError, match=r"'images' dimension 2 \(height\).*stem.conv.*--shape images="):
        tvm_lowprec.compile(tvm_lowprec.from_onnx(textdet["fp32"]), target="native")


def test_shape_subgraphs_of_the_resizes_fold_to_constants(textdet):
    folded = fold_shapes(textdet["fp32"], {"images": list(SHAPE)})
    assert not {n.op_type for n in folded.graph.node} & {"Shape", "Gather", "Slice", "Unsqueeze"}
    inits = {t.name for t in folded.graph.initializer}
    resizes = [n for n in folded.graph.node if n.op_type == "Resize"]
    assert len(resizes) == 6 and all(n.input[-1] in inits for n in resizes)  # scales or sizes, constant


@pytest.fixture(scope="module", params=["pre-processed", "as exported"])
def decomposed_qdq(request, tmp_path_factory):
    """The QDQ file of ``db_like(activation="decomposed")`` pinned to SHAPE: quantized as
    benchmarks/models/build.py quantizes ``textdet-decomposed`` (ORT's quant_pre_process, which folds
    every BatchNormalization, then quantize_static: QDQ, per-channel int8 weights, uint8 activations),
    or by quantize_static straight on the export (the BatchNormalizations stay, the head's after its
    ConvTranspose too, each between a DequantizeLinear and a QuantizeLinear). ``(form, path)``."""
    folder = tmp_path_factory.mktemp("textdet_decomposed")
    pinned = fix_input_shapes(db_like(activation="decomposed"), {"images": list(SHAPE)})
    fp32 = folder / "fp32.onnx"
    if request.param == "pre-processed":
        preprocess(pinned, fp32)
    else:
        onnx.save(pinned, str(fp32))
    rng = np.random.default_rng(0)
    samples = [{"images": rng.standard_normal(SHAPE).astype(np.float32)} for _ in range(4)]
    quantize_static(fp32, folder / "int8.onnx", samples)
    return request.param, folder / "int8.onnx"


def test_decomposed_hard_swish_qdq_compiles_and_matches_ort(decomposed_qdq, rng):
    """Hard-swish as paddle2onnx writes it, ``x * Clip(x + 3, 0, 6) / 6``, with ORT's QuantizeLinear ->
    DequantizeLinear pair after every Add, Mul and Div of the chain (ORT drops each Clip and quantizes
    the Add's output to its [0, 6] range instead; Div, which ORT does not quantize, runs in float
    between its neighbours' pairs): compiled from the file, every convolution an integer kernel and
    every kernel scheduled, the map matches ORT running the QDQ graph as written."""
    form, path = decomposed_qdq
    model = onnx.load(str(path))
    ops = Counter(n.op_type for n in model.graph.node)
    assert (ops["Add"], ops["Mul"], ops["Div"], ops["HardSigmoid"]) == (17, 17, 11, 6)  # 11 hard-swishes, 6 SE gates
    readers = {}
    for n in model.graph.node:
        for name in n.input:
            readers.setdefault(name, []).append(n)
    for n in model.graph.node:
        if n.op_type in ("Add", "Mul", "Div"):
            assert {r.op_type for r in readers[n.output[0]]} == {"QuantizeLinear"}, n.name
    producer = {o: n for n in model.graph.node for o in n.output}
    head_bn = [n for n in model.graph.node if n.op_type == "BatchNormalization"
               and producer[producer[producer[n.input[0]].input[0]].input[0]].op_type == "ConvTranspose"]
    assert len(head_bn) == (0 if form == "pre-processed" else 1)  # ConvTranspose -> Q -> DQ -> BN

    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(str(path)), target="native")
    names = [k.name for k in compiled.kernels()]
    assert len([n for n in names if n.startswith("qdepthwise")]) == 7
    assert not [n for n in names if re.search(r"(?<![a-z])conv2d", n)]
    assert not [k.name for k in compiled.kernels() if k.schedule == "none"]
    x = rng.standard_normal(SHAPE).astype(np.float32)
    (got,), (want,) = compiled(x), ort_session(model, optimized=False).run(None, {"images": x})
    assert got.shape == want.shape == SHAPE[:1] + (1,) + SHAPE[2:]
    assert 0.1 < want.std()
    assert cosine(got, want) >= 0.9999
