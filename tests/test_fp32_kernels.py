"""The float32 kernels for every layer left float (tvm_lowprec.kernels.fp32_gemm, schedule.fp32_gemm,
schedule.fp32_matmul, quant.float_gemm).

Proves: the packed GEMM matches a float64 numpy reference (rtol 1e-5) for M = 1, 7, 64, odd N and
K, with bias and ReLU/GELU fused; convolutions (3x3 stride 1 and 2 with padding, 1x1, the 7x7 stem
shape), depthwise ones (3x3 stride 1 and 2, 5x5), transposed ones with one tap per output pixel
(kernel = stride) and attention's batched matmuls of two run-time operands match numpy; the decision is on the
IR; every CPU row's build uses its own FMA registers (vfmadd ymm, zmm; fmla on Arm) and the x86 rows
run it, natively or emulated; FP32 models (MLP, CNN, a transformer layer) compile with no heavy
kernel left unscheduled and match ONNX Runtime; an int8 QDQ model still takes the integer kernels.
"""

import re

import numpy as np
import onnxruntime as ort
import pytest
import tvm
from models import fp32_and_qdq, fp32_block_net, fp32_cnn, fp32_linear
from onnx import TensorProto, helper, numpy_helper

import tvm_lowprec
from tvm_lowprec.kernels.fp32_gemm import (
    FloatConvGeometry,
    FloatGemmLayout,
    build_fp32_conv,
    build_fp32_gemm,
    conv_weight_columns,
    pack_fp32_weights,
    padded_bias,
)
from tvm_lowprec.qemu import is_aarch64
from tvm_lowprec.schedule.fp32_gemm import Fp32GemmRule
from tvm_lowprec.schedule.fp32_matmul import Fp32MatmulRule
from tvm_lowprec.targets import host_supports, registered_targets

NATIVE = tvm_lowprec.native_target()
ROWS = [s for s in registered_targets("cpu").values() if s.fma is not None]
X86 = [s for s in ROWS if not is_aarch64(s)]
ARM = [s for s in ROWS if is_aarch64(s)]
REGISTER = {256: "ymm", 512: "zmm"}
HEAVY = ("matmul", "conv2d", "fused_matmul", "fused_conv2d")  # what must never run as scalar loops


def _run(func, args, out_shape):
    """Build one kernel for this host's row (one thread) and run it."""
    lib = tvm.compile(Fp32GemmRule().apply(func, NATIVE).mod, target=NATIVE.tvm_target(1))
    out = tvm.runtime.tensor(np.zeros(out_shape, np.float32))
    lib[str(func.attrs["global_symbol"])](*[tvm.runtime.tensor(a) for a in args], out)
    return out.numpy(), lib.mod.inspect_source("asm")


def _act(y, act):
    if act == "relu":
        return np.maximum(y, 0)
    if act == "gelu":
        from math import erf

        return y * 0.5 * (1 + np.vectorize(erf)(y / np.sqrt(2)))
    return y


def _close(got, want, rtol=1e-5):
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * float(np.abs(want).max()))


# ------------------------------------------------------------------------------ kernels, natively


@pytest.mark.parametrize("m, n, k, act", [(1, 37, 45, "relu"), (7, 19, 33, "gelu"), (64, 70, 257, "none"),
                                          (64, 45, 300, "relu")])
def test_gemm_matches_float64_with_bias_and_activation(m, n, k, act, rng):
    lay = FloatGemmLayout.choose(NATIVE.fma, m, n, k, bias=True, act=act)
    if k == 300:  # K blocked: 100 divides 300 (257, prime, is kept whole)
        assert lay.kblock and k % lay.kblock == 0
    x, w = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    y, asm = _run(build_fp32_gemm(lay), [x, pack_fp32_weights(w, lay), padded_bias(b, lay)], (m, n))
    _close(y, _act(x.astype(np.float64) @ w + b, act))
    assert re.search(rf"vfmadd\d+ps\s+[^\n]*%{REGISTER[NATIVE.fma.intrin.vector_bits]}\d+", asm)


def _conv_ref(x, w, b, stride, pad):
    o, _, kh, kw = w.shape
    xp = np.pad(x[0].astype(np.float64), ((0, 0), (pad, pad), (pad, pad)))
    oh, ow = (xp.shape[1] - kh) // stride + 1, (xp.shape[2] - kw) // stride + 1
    y = np.zeros((o, oh, ow))
    for i in range(kh):
        for j in range(kw):
            y += np.einsum("chw,oc->ohw", xp[:, i:i + stride * oh:stride, j:j + stride * ow:stride], w[:, :, i, j])
    return (y + b[:, None, None])[None]


@pytest.mark.parametrize("c, hw, o, kernel, stride, pad", [(5, 9, 19, 3, 1, 1), (6, 11, 16, 3, 2, 1), (24, 8, 10, 1, 1, 0),
                                                            (3, 20, 8, 7, 2, 3)])
def test_conv_matches_float64(c, hw, o, kernel, stride, pad, rng):
    oh = (hw + 2 * pad - kernel) // stride + 1
    g = FloatConvGeometry(c, (hw, hw), o, (oh, oh), (kernel, kernel), (stride, stride), (pad,) * 4, (1, 1))
    lay = FloatGemmLayout.choose(NATIVE.fma, g.rows, o, g.depth, bias=True, act="relu")
    x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
    w, b = rng.standard_normal((o, c, kernel, kernel)).astype(np.float32), rng.standard_normal(o).astype(np.float32)
    lay = FloatGemmLayout(lay.m, lay.n, lay.k, lay.lanes, lay.mr, lay.nr, 1, True, "relu", 0)
    y, _ = _run(build_fp32_conv(g, lay), [x, pack_fp32_weights(conv_weight_columns(w), lay), padded_bias(b, lay)],
                (1, o, oh, oh))
    _close(y, np.maximum(_conv_ref(x, w, b, stride, pad), 0))


def _onnx(nodes, inputs, inits, opset=17):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _ort(model, feed):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)[0]


def _kernels(compiled):
    return {k.name: k for k in compiled.kernels()}


def _unscheduled_heavy(compiled):
    return [k.name for k in compiled.kernels() if k.schedule == "none" and k.name.startswith(HEAVY)]


def test_batched_matmul_of_two_runtime_operands(rng):
    """Q @ K^T scaled and P @ V shapes (heads as a batch axis): the register-tile rule, epilogue fused."""
    model = _onnx([helper.make_node("MatMul", ["a", "b"], ["s"]), helper.make_node("Mul", ["s", "c"], ["y"])],
                  [("a", [1, 3, 12, 16]), ("b", [1, 3, 16, 24])], [numpy_helper.from_array(np.float32(0.25), "c")])
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    a, b = rng.standard_normal((1, 3, 12, 16)).astype(np.float32), rng.standard_normal((1, 3, 16, 24)).astype(np.float32)
    _close(compiled(a, b)[0], (a.astype(np.float64) @ b) * 0.25)
    assert not _unscheduled_heavy(compiled)
    assert re.search(r"vfmadd\d+ps\s+[^\n]*%ymm\d+", compiled.inspect_source("asm"))


@pytest.mark.parametrize("hw, kernel, stride, pad", [(13, 3, 1, 1), (14, 3, 2, 1), (9, 5, 1, 2)])
def test_depthwise_conv_matches_onnxruntime(hw, kernel, stride, pad, rng):
    c = 12
    w = rng.standard_normal((c, 1, kernel, kernel)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    model = _onnx([helper.make_node("Conv", ["x", "w", "b"], ["h"], group=c, strides=[stride] * 2, pads=[pad] * 4),
                   helper.make_node("Relu", ["h"], ["y"])], [("x", [1, c, hw, hw])],
                  [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    dw = [k for k in compiled.kernels() if k.op == "fp32_depthwise"]
    assert len(dw) == 1 and dw[0].schedule == "default" and not _unscheduled_heavy(compiled)
    x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
    _close(compiled(x)[0], _ort(model, {"x": x}))
    assert re.search(rf"vfmadd\d+ps\s+[^\n]*%{REGISTER[NATIVE.fma.intrin.vector_bits]}\d+", compiled.inspect_source("asm"))


@pytest.mark.parametrize("kernel", [2, 3])
def test_conv_transpose_with_one_tap_per_pixel_matches_onnxruntime(kernel, rng):
    """ConvTranspose(k, stride k) + bias + ReLU (a segmentation head's upsampling): the GEMM with a
    scattering epilogue."""
    c, o, hw = 10, 6, 7
    w = rng.standard_normal((c, o, kernel, kernel)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    model = _onnx([helper.make_node("ConvTranspose", ["x", "w", "b"], ["h"], kernel_shape=[kernel] * 2,
                                    strides=[kernel] * 2), helper.make_node("Relu", ["h"], ["y"])],
                  [("x", [1, c, hw, hw])], [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    assert [k.schedule for k in compiled.kernels() if k.op == "fp32_gemm"] == ["default"]
    x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
    _close(compiled(x)[0], _ort(model, {"x": x}))


def test_matmul_rule_declines_what_is_not_a_float_product():
    from tvm import te

    x = te.placeholder((8, 8), "float32", name="x")
    func = te.create_prim_func([x, te.compute((8, 8), lambda i, j: x[i, j] * 2, name="y")])
    assert Fp32MatmulRule().apply(func, NATIVE) is None and Fp32GemmRule().apply(func, NATIVE) is None
    k = te.reduce_axis((0, 8), name="k")
    a, b = te.placeholder((8, 8), "int8", name="a"), te.placeholder((8, 8), "int8", name="b")
    c = te.compute((8, 8), lambda i, j: te.sum(a[i, k].astype("int32") * b[k, j].astype("int32"), axis=k), name="c")
    assert Fp32MatmulRule().apply(te.create_prim_func([a, b, c]), NATIVE) is None


# ------------------------------------------------------------------------------ every row


def _row_model():
    """A 3-D MatMul + bias + ReLU, then a Gemm with transB: the two ways weights arrive."""
    return fp32_linear((1, 7, 33), 19, act="relu", layers=2)


@pytest.mark.parametrize("spec", X86, ids=lambda s: s.name)
def test_every_x86_row_runs_in_its_vector_registers(spec, rng):
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(_row_model()), target=spec)
    assert compiled.execution == ("native" if host_supports(spec) else "emulated")
    reg = REGISTER[spec.fma.intrin.vector_bits]
    assert re.search(rf"vfmadd\d+ps\s+[^\n]*%{reg}\d+, %{reg}\d+", compiled.inspect_source("asm"))
    gemms = [k for k in compiled.kernels() if k.op == "fp32_gemm"]
    assert len(gemms) == 2 and all(k.schedule == "default" for k in gemms)
    x = rng.standard_normal((1, 7, 33)).astype(np.float32)
    _close(compiled(x)[0], _ort(_row_model(), {"x": x}), rtol=1e-5)


@pytest.mark.parametrize("spec", ARM, ids=lambda s: s.name)
def test_every_arm_row_builds_fmla(spec):
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(_row_model()), target=spec)
    assert re.search(r"fmla\s+v\d+\.4s", compiled.inspect_source("asm"))
    assert [k.schedule for k in compiled.kernels() if k.op == "fp32_gemm"] == ["default", "default"]


@pytest.mark.parametrize("spec", ARM[-1:], ids=lambda s: s.name)
def test_arm_gemm_runs_under_qemu(spec, rng):
    """The Neon build of the GEMM (K blocked, M padded, bias + ReLU) on the row's CPU model under
    qemu-aarch64 (one row: the three share the FMA table and the instruction)."""
    from tvm_lowprec.qemu import QemuModule, unavailable_reason

    if unavailable_reason():
        pytest.skip(unavailable_reason())
    m, n, k = 13, 21, 256
    lay = FloatGemmLayout.choose(spec.fma, m, n, k, bias=True, act="relu")
    assert lay.kblock and lay.lanes == 4
    ex = tvm.compile(Fp32GemmRule().apply(build_fp32_gemm(lay), spec).mod, target=spec.tvm_target(2))
    assert re.search(r"fmla\s+v\d+\.4s", ex.mod.inspect_source("asm"))
    x, w = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    b, out = rng.standard_normal(n).astype(np.float32), np.zeros((m, n), np.float32)
    QemuModule(ex.mod, cpu=spec.qemu_cpu)["fp32_gemm"](x, pack_fp32_weights(w, lay), padded_bias(b, lay), out)
    _close(out, np.maximum(x.astype(np.float64) @ w + b, 0))


def test_gpu_rows_have_no_fma_recipe():
    assert all(getattr(s, "fma", None) is None for s in registered_targets("cuda").values())


# ------------------------------------------------------------------------------ models


def _transformer_layer(seq=16, d=32, heads=2, ff=64, seed=0):
    """One BERT layer: QKV projections with bias, heads split, scaled softmax attention, output
    projection, residual + LayerNorm, GELU (Erf form) feed-forward, residual + LayerNorm."""
    rng = np.random.default_rng(seed)
    inits, nodes, hd = [], [], d // heads

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32) if not isinstance(value, np.ndarray)
                                             else value, name))
        return name

    def linear(x, d_in, d_out, p):
        const(p + "W", (rng.standard_normal((d_in, d_out)) / np.sqrt(d_in)).astype(np.float32))
        const(p + "b", (rng.standard_normal(d_out) * 0.1).astype(np.float32))
        nodes.extend([helper.make_node("MatMul", [x, p + "W"], [p + "m"]), helper.make_node("Add", [p + "m", p + "b"], [p])])
        return p

    def layer_norm(x, p):
        const(p + "g", np.ones(d, np.float32))
        const(p + "be", np.zeros(d, np.float32))
        nodes.append(helper.make_node("LayerNormalization", [x, p + "g", p + "be"], [p], axis=-1))
        return p

    inits.append(numpy_helper.from_array(np.array([1, seq, heads, hd], np.int64), "split"))
    inits.append(numpy_helper.from_array(np.array([1, seq, d], np.int64), "merge"))
    q, k, v = (linear("x", d, d, n) for n in ("q", "k", "v"))
    for n, perm in ((q, [0, 2, 1, 3]), (k, [0, 2, 3, 1]), (v, [0, 2, 1, 3])):
        nodes += [helper.make_node("Reshape", [n, "split"], [n + "r"]), helper.make_node("Transpose", [n + "r"], [n + "h"], perm=perm)]
    nodes += [helper.make_node("MatMul", ["qh", "kh"], ["s"]), helper.make_node("Mul", ["s", const("sc", 1 / np.sqrt(hd))], ["ss"]),
              helper.make_node("Softmax", ["ss"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "vh"], ["ctx"]),
              helper.make_node("Transpose", ["ctx"], ["ctxt"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ctxt", "merge"], ["ctxm"])]
    o = linear("ctxm", d, d, "o")
    nodes.append(helper.make_node("Add", [o, "x"], ["res1"]))
    h = layer_norm("res1", "ln1")
    f = linear(h, d, ff, "f1")
    nodes += [helper.make_node("Div", [f, const("sq2", np.sqrt(2))], ["gd"]), helper.make_node("Erf", ["gd"], ["ge"]),
              helper.make_node("Add", ["ge", const("one", 1.0)], ["g1"]), helper.make_node("Mul", [f, "g1"], ["g2"]),
              helper.make_node("Mul", ["g2", const("half", 0.5)], ["gelu"])]
    f2 = linear("gelu", ff, d, "f2")
    nodes.append(helper.make_node("Add", [f2, h], ["res2"]))
    nodes.append(helper.make_node("Identity", [layer_norm("res2", "ln2")], ["y"]))
    return _onnx(nodes, [("x", [1, seq, d])], inits)


def _cosine(a, b):
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("name, build, shape", [("transformer", _transformer_layer, (1, 16, 32)),
                                                ("cnn", fp32_cnn, (1, 3, 16, 16)),
                                                ("block_net", fp32_block_net, (1, 8, 16, 16))])
def test_fp32_models_are_scheduled_and_match_onnxruntime(name, build, shape, rng):
    model = build()
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    assert not _unscheduled_heavy(compiled), _unscheduled_heavy(compiled)
    assert any(k.op == "fp32_gemm" for k in compiled.kernels())
    x = rng.standard_normal(shape).astype(np.float32)
    got, want = compiled(x)[0], _ort(model, {"x": x})
    assert _cosine(got, want) > 0.99999
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_int8_model_keeps_the_integer_kernels(rng):
    """The float pass runs after the integer rewrites: a QDQ model's layers stay qgemm."""
    models = fp32_and_qdq(fp32_linear((4, 32), 24, layers=2), (4, 32))
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(models["qdq"]), target="native")
    ops = [k.op for k in compiled.kernels()]
    assert "qgemm" in ops and "fp32_gemm" not in ops


def test_a_layer_ptq_keeps_in_fp32_takes_the_float_kernel(rng):
    """quantize() with one layer skipped: the other runs on the integer GEMM, the skipped one on the
    packed float kernel (the float pass only takes what the integer rewrites left float)."""
    from tvm_lowprec.ptq.config import LayerOverride

    model = fp32_linear((4, 32), 24, layers=2)
    fp32 = tvm_lowprec.from_onnx(model)
    calibration = [rng.standard_normal((4, 32)).astype(np.float32) for _ in range(4)]
    config = tvm_lowprec.QuantConfig(overrides=(LayerOverride("matmul1", skip=True),))
    compiled = tvm_lowprec.compile(tvm_lowprec.quantize(fp32, calibration, config, progress=False), target="native")
    ops = [k.op for k in compiled.kernels()]
    assert ops.count("fp32_gemm") == 1 and "qgemm" in ops and not _unscheduled_heavy(compiled)


def test_decision_is_on_the_ir():
    lay = FloatGemmLayout.choose(NATIVE.fma, 7, 19, 33, bias=True, act="gelu")
    func = build_fp32_gemm(lay)
    assert func.attrs["lowprec.op"] == "fp32_gemm" and str(func.attrs["lowprec.epilogue"]) == "bias+gelu"
    assert [int(v) for v in func.attrs["lowprec.tile"]] == [lay.mr, lay.nr, lay.kblock]
    assert lay.mp - 7 < lay.mr and lay.np_ - 19 < lay.panel
    with pytest.raises(ValueError, match="epilogue"):
        FloatGemmLayout(7, 19, 33, 8, 4, 2, 1, act="swish")
    assert FloatGemmLayout.choose(None, 7, 19, 33) is None  # a row without an FMA recipe declines
