"""QDQ ConvTranspose as integer kernels: the row's GEMM (int32 epilogue, zero points folded) and a col2im
that sums each output pixel's taps, adds the bias and requantizes (tvm_lowprec.quant.conv_transpose).

Checked exactly against a numpy model of the integer arithmetic (int64 transposed convolution of the
zero-point-shifted operands, the int32 bias, the epilogue's rounding), and within one quantization step
of ONNX Runtime running the QDQ graph as written (float).
"""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_lowprec

from models import quantize_qdq
from reference import assert_within_one_step, ort_session, output_scale

CASES = {  # ConvTranspose attributes; x is [1, C_IN, 6, 7], C_OUT output channels unless given
    "k2-s2": dict(kernel=2, strides=2),  # the upsampler of DB heads: no two taps overlap
    "k3-s2-p1-op1": dict(kernel=3, strides=2, pads=(1, 1, 1, 1), output_padding=1),
    "k4-s2-p1": dict(kernel=4, strides=2, pads=(1, 1, 1, 1)),
    "k3-s1-p1-no-relu": dict(kernel=3, strides=1, pads=(1, 1, 1, 1), relu=False),
    "k3-s2-dilated-asym-pads": dict(kernel=3, strides=2, dilations=2, pads=(1, 0, 0, 2)),
    "k2-s2-per-tensor-no-bias": dict(kernel=2, strides=2, per_channel=False, bias=False),
    "k2-s2-one-channel": dict(kernel=2, strides=2, c_out=1),  # a DB head's last upsampler: the probability map
    "k2-s2-p1-op1": dict(kernel=2, strides=2, pads=(1, 1, 1, 1), output_padding=1),  # one tap per pixel, or none
}
C_IN, C_OUT, X_SHAPE = 16, 12, (1, 16, 6, 7)


def conv_transpose_model(kernel, strides, pads=(0, 0, 0, 0), output_padding=0, dilations=1, relu=True, bias=True,
                         c_out=C_OUT, seed=0, **_):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((C_IN, c_out, kernel, kernel)) / np.sqrt(C_IN * kernel)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "W")]
    inputs = ["x", "W"]
    if bias:
        inits.append(numpy_helper.from_array((rng.standard_normal(c_out) * 0.2).astype(np.float32), "B"))
        inputs.append("B")
    nodes = [helper.make_node("ConvTranspose", inputs, ["t" if relu else "y"], name="up", strides=[strides] * 2,
                              pads=list(pads), output_padding=[output_padding] * 2, dilations=[dilations] * 2)]
    if relu:
        nodes.append(helper.make_node("Relu", ["t"], ["y"]))
    graph = helper.make_graph(nodes, "convT", [helper.make_tensor_value_info("x", TensorProto.FLOAT, X_SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _initializers(model):
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def integer_reference(qdq, x, cfg):
    """The arithmetic the kernels promise, in numpy: quantize x as the graph's first QuantizeLinear,
    int64 transposed convolution of (x - zx) and (w - zw), + the int32 bias, requantize with the
    float32 multiplier sx * sw / sy rounded once (half to even), ReLU as the clamp, dequantize."""
    inits = _initializers(qdq)
    q_x = next(n for n in qdq.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
    sx, zx = inits[q_x.input[1]], inits[q_x.input[2]].astype(np.int64)
    conv = next(n for n in qdq.graph.node if n.op_type == "ConvTranspose")
    w_dq = next(n for n in qdq.graph.node if n.output[0] == conv.input[1])
    wq, sw, zw = (inits[w_dq.input[i]] for i in range(3))
    q_y = next(n for n in qdq.graph.node if n.op_type == "QuantizeLinear" and n.input[0] != "x")
    sy, zy = inits[q_y.input[1]], int(inits[q_y.input[2]])
    xq = np.clip(np.rint(x / sx) + zx, 0, 255).astype(np.int64) - zx
    w = wq.astype(np.int64) - np.asarray(zw, np.int64).reshape((1, -1, 1, 1) if np.ndim(zw) else ())
    c_out = wq.shape[1]
    k, s, d = cfg["kernel"], cfg["strides"], cfg.get("dilations", 1)
    top, left, bottom, right = cfg.get("pads", (0, 0, 0, 0))
    op = cfg.get("output_padding", 0)
    _, _, h, wd = xq.shape
    oh, ow = ((h - 1) * s - top - bottom + d * (k - 1) + op + 1, (wd - 1) * s - left - right + d * (k - 1) + op + 1)
    acc = np.zeros((1, c_out, oh, ow), np.int64)
    for ih in range(h):
        for iw in range(wd):
            for kh in range(k):
                for kw in range(k):
                    y, x_ = ih * s - top + kh * d, iw * s - left + kw * d
                    if 0 <= y < oh and 0 <= x_ < ow:
                        acc[0, :, y, x_] += xq[0, :, ih, iw] @ w[:, :, kh, kw]
    acc_scale = np.float32(sx) * np.broadcast_to(np.asarray(sw, np.float32), (c_out,))
    if len(conv.input) > 2:
        b_dq = next(n for n in qdq.graph.node if n.output[0] == conv.input[2])
        acc += inits[b_dq.input[0]].astype(np.int64).reshape(1, -1, 1, 1)
    mult = (acc_scale / np.float32(sy)).astype(np.float32).astype(np.float64).reshape(1, -1, 1, 1)
    lo = zy if cfg.get("relu", True) else 0
    yq = np.clip(np.rint(acc.astype(np.float64) * mult) + zy, lo, 255)
    return ((yq - zy) * sy).astype(np.float32)


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    cfg = {"per_channel": True, **CASES[request.param]}
    rng = np.random.default_rng(1)
    qdq = quantize_qdq(conv_transpose_model(**cfg), [rng.standard_normal(X_SHAPE).astype(np.float32) for _ in range(4)],
                       per_channel=cfg["per_channel"])
    return request.param, cfg, qdq, tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq), target="native")


def test_conv_transpose_becomes_a_gemm_and_a_col2im(case):
    _, _, qdq, compiled = case
    assert "ConvTranspose" in {n.op_type for n in qdq.graph.node}
    kernels = compiled.kernels()
    gemm = [k for k in kernels if k.op == "qgemm"]
    assert len(gemm) == 1 and gemm[0].name.endswith("_int32") and gemm[0].intrinsic.startswith("lowprec_")
    assert [k.op for k in kernels].count("col2im") == 1
    assert not [k.name for k in kernels if "conv2d_transpose" in k.name]
    assert all(k.schedule != "none" for k in kernels), [(k.name, k.schedule) for k in kernels]


def test_exact_against_the_integer_arithmetic(case, rng):
    name, cfg, qdq, compiled = case
    for _ in range(3):
        x = (rng.standard_normal(X_SHAPE) * 1.5).astype(np.float32)
        want = integer_reference(qdq, x, cfg)
        got = compiled(x)[0]
        assert got.shape == want.shape, (got.shape, want.shape)
        np.testing.assert_array_equal(got, want)
    assert len(np.unique(got)) > 10  # not all clamped


def test_within_one_step_of_ort_graph_as_written(case, rng):
    _, _, qdq, compiled = case
    x = rng.standard_normal(X_SHAPE).astype(np.float32)
    want = ort_session(qdq, optimized=False).run(None, {"x": x})[0]
    assert_within_one_step(compiled(x)[0], want, output_scale(qdq), exact_fraction=0.98)


def test_fixed_point_requantization_within_one_step(rng):
    cfg = {"per_channel": True, **CASES["k4-s2-p1"]}
    qdq = quantize_qdq(conv_transpose_model(**cfg), [rng.standard_normal(X_SHAPE).astype(np.float32) for _ in range(4)])
    mod = tvm_lowprec.from_onnx(qdq)
    x = rng.standard_normal(X_SHAPE).astype(np.float32)
    exact = tvm_lowprec.compile(mod, target="native")(x)[0]
    fixed = tvm_lowprec.compile(mod, target="native", requant_mode="fixed_point")(x)[0]
    assert_within_one_step(fixed, exact, output_scale(qdq), exact_fraction=0.99)


def _col2im_func(compiled):
    (name,) = [k.name for k in compiled.kernels() if k.op == "col2im"]
    return compiled._lowered[name]


def _compiled_col2im(name):
    cfg = {"per_channel": True, **CASES[name]}
    rng = np.random.default_rng(1)
    qdq = quantize_qdq(conv_transpose_model(**cfg), [rng.standard_normal(X_SHAPE).astype(np.float32) for _ in range(4)])
    return _col2im_func(tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq), target="native"))


@pytest.mark.parametrize("name", ["k2-s2", "k3-s2-p1-op1"])
def test_col2im_requantizes_in_float32_where_the_weights_make_it_exact(name):
    """These weights and 8-bit activations bound every output's sum far below 2**24: the col2im
    requantizes with one float32 FMA (exact: the tests above), not in float64."""
    script = _compiled_col2im(name).script()
    assert "llvm.fma" in script and "float64" not in script


def test_col2im_float32_bound_declines_large_sums():
    from tvm_lowprec.kernels.col2im import col2im_float32_exact

    class G:  # a 2x2 stride-2 upsampler of 3 channels, and a 3x3 stride-2 one
        out_channels, kernel, strides, dilation = 3, (2, 2), (2, 2), (1, 1)

    class G3(G):
        kernel = (3, 3)

    columns = np.full(12, 2.0**15 / 255)  # a tap's sum_k |w - zw|: 255 * it = 2**15 per tap
    mult = np.full(3, 1e-3, np.float32)
    assert col2im_float32_exact(G, columns, 255.0, 0, mult)  # one tap: 2**15
    columns = np.full(27, 2.0**24 / 255 / 8)  # nine taps of 2**21 each: their sum passes 2**24
    assert not col2im_float32_exact(G3, columns, 255.0, 0, mult)
    assert col2im_float32_exact(G3, columns[:3].repeat(9) / 2, 255.0, 0, mult)  # 9 * 2**20 < 2**24


def test_an_upsampler_row_is_vectorized_in_runs_of_its_taps_and_channels():
    """k2-s2, 12 channels: each output row is 2 * 12-element runs, each read from one GEMM row, with
    the parameters repeated per tap (24 entries, padded to 32: whole 64-byte lines)."""
    script = _compiled_col2im("k2-s2").script()
    assert 'bias: T.Buffer((32,), "int32")' in script and 'mult: T.Buffer((32,), "float32")' in script, script
    assert "T.vectorized(" in script


@pytest.mark.parametrize("channels", [1, 3, 6, 12, 16, 20])
@pytest.mark.parametrize("k", [2, 3])
def test_col2im_parameters_fill_whole_64_byte_lines_padded_with_zeros(channels, k):
    """LLVM widens a run that is no power of two long (an upsampler's KW*C = 12 at six channels) to the
    next power of two, reading past the run as far as the buffer's 64-byte alignment allows: each
    parameter buffer is whole 64-byte lines, its padding zeros (not a denormal that stalls the float32
    FMA: measured 20x slower on the text detector's 6-channel upsampler), in both requantization modes."""
    from tvm_lowprec.kernels.col2im import col2im_params, param_length, param_run
    from tvm_lowprec.kernels.qgemm import Epilogue

    class G:
        out_channels, kernel, strides, dilation = channels, (k, k), (2, 2), (1, 1)

    run = channels * (2 if k == 2 else 1)  # an upsampler repeats its parameters per column tap
    assert param_run(G) == run and param_length(G) % 16 == 0 and run <= param_length(G) < run + 16
    mult = np.linspace(1e-3, 2e-3, channels, dtype=np.float32)
    for mode in ("float", "fixed_point"):
        arrays = col2im_params(np.arange(1, channels + 1), mult, Epilogue(kind="requant", mode=mode), G)
        for a in arrays:
            assert a.shape == (param_length(G),) and a.dtype.itemsize == 4
            assert np.all(a[run:] == 0) and np.all(a[:run].reshape(-1, channels)[:, 0] == a[0])
        assert np.array_equal(arrays[0][:run].reshape(-1, channels)[0], np.arange(1, channels + 1))
