"""A normalization over the frames of an 8-bit NWC tensor (wav2vec2's group norm, written as ONNX's
InstanceNormalization after a 1-D convolution) takes its mean and factor from one integer kernel of the
codes (:mod:`tvm_lowprec.quant.norm_stats`, :mod:`tvm_lowprec.kernels.qnorm_stats`): the kernel's values
exactly as numpy computes the same arithmetic, the model within one step of ONNX Runtime's QDQ graph."""

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper

import tvm_lowprec
from tvm_lowprec.kernels.qnorm_stats import build_qnorm_stats
from tvm_lowprec.schedule.rows import RowOpRule
from tvm_lowprec.targets import resolve_target

from models import quantize_qdq
from reference import assert_within_one_step, ort_session, output_scale


def _conv_norm(channels=8, out=32, length=203, affine=True, seed=0) -> onnx.ModelProto:
    """x -> Conv1d (k3 stride 2) -> InstanceNormalization (one group per channel) -> GELU: wav2vec2's
    first feature-extractor layer, smaller."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((out, channels, 3)) / np.sqrt(channels * 3)).astype(np.float32)
    gamma = (1 + 0.3 * rng.standard_normal(out)).astype(np.float32) if affine else np.ones(out, np.float32)
    beta = (0.2 * rng.standard_normal(out)).astype(np.float32) if affine else np.zeros(out, np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(gamma, "gamma"), numpy_helper.from_array(beta, "beta")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3], strides=[2]),
             helper.make_node("InstanceNormalization", ["c", "gamma", "beta"], ["n"], epsilon=1e-5),
             helper.make_node("Relu", ["n"], ["y"])]
    graph = helper.make_graph(nodes, "conv_norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, length])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _moments(codes, axes, scale, eps):
    """The kernel's arithmetic in numpy: int64 sums (exact), then float64, then float32."""
    n = int(np.prod([codes.shape[a] for a in axes]))
    s1 = codes.astype(np.int64).sum(axis=tuple(axes), keepdims=True).astype(np.float64)
    s2 = (codes.astype(np.int64) ** 2).sum(axis=tuple(axes), keepdims=True).astype(np.float64)
    mean = s1 / n
    var = np.maximum(s2 / n - mean * mean, 0.0)
    return mean.astype(np.float32), (scale / np.sqrt(scale * scale * var + eps)).astype(np.float32)


@pytest.mark.parametrize("shape, axes, dtype", [((1, 1599, 64), (1,), "uint8"), ((1, 37, 48), (1,), "int8"),
                                                ((2, 5, 7, 32), (1, 2), "uint8")],
                         ids=["wav2vec2-frames", "int8", "two-axes"])
def test_the_statistics_kernel_is_exact(shape, axes, dtype, rng):
    """Scheduled as compile schedules it (vectors along the innermost axis, which the sums carry), its
    mean and factor equal numpy's float64 arithmetic on the exact sums, rounded once to float32."""
    spec = resolve_target("native")
    scale, eps = 0.0857901573, 1e-5
    sch = RowOpRule().apply(build_qnorm_stats(shape, axes, dtype, scale, eps), spec)
    assert sch is not None
    for name in ("norm_sums_update", "norm_mean", "norm_factor"):
        assert sch.get(sch.get_loops(sch.get_sblock(name))[-1]).kind == tvm.tirx.ForKind.VECTORIZED, name
    lib = tvm.compile(sch.mod, target=spec.tvm_target(1))
    info = np.iinfo(dtype)
    codes = rng.integers(info.min, info.max + 1, size=shape).astype(dtype)
    codes.flat[:7] = info.max  # the largest squares
    kept = [1 if i in axes else n for i, n in enumerate(shape)]
    mean, factor = np.zeros(kept, np.float32), np.zeros(kept, np.float32)
    args = [tvm.runtime.tensor(a) for a in (codes, mean, factor)]
    lib["main"](*args)
    want_mean, want_factor = _moments(codes, axes, scale, eps)
    np.testing.assert_array_equal(args[1].numpy(), want_mean)
    np.testing.assert_array_equal(args[2].numpy(), want_factor)


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
def test_a_group_norm_over_frames_reads_the_codes_once(affine, rng):
    fp32 = _conv_norm(affine=affine)
    shape = (1, 8, 203)
    qdq = quantize_qdq(fp32, [rng.standard_normal(shape).astype(np.float32) for _ in range(4)])
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq), target="native")
    kernels = compiled.kernels()
    names = [k.name for k in kernels]
    stats = [k for k in kernels if k.op == "qnorm_stats"]
    assert len(stats) == 1 and stats[0].schedule != "none", names
    assert not any(k.op == "dequantize" for k in kernels), names  # no float copy of the tensor
    assert not any("variance" in n or "sqrt" in n for n in names), names
    x = rng.standard_normal(shape).astype(np.float32)
    want = ort_session(qdq, optimized=False).run(None, {"x": x})[0]
    assert_within_one_step(compiled(x)[0], want, output_scale(qdq))


def test_a_normalization_along_the_innermost_axis_keeps_the_float_graph(rng):
    """An instance norm of an NCW tensor with no convolution before it reduces its innermost axis (a row
    reduction): the pass declines and the graph computes as written."""
    out = 16
    nodes = [helper.make_node("InstanceNormalization", ["x", "gamma", "beta"], ["y"], epsilon=1e-5)]
    inits = [numpy_helper.from_array(np.ones(out, np.float32), "gamma"), numpy_helper.from_array(np.zeros(out, np.float32), "beta")]
    graph = helper.make_graph(nodes, "norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, out, 50])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    fp32 = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    qdq = quantize_qdq(fp32, [rng.standard_normal((1, out, 50)).astype(np.float32) for _ in range(4)])
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq), target="native")
    assert not any(k.op == "qnorm_stats" for k in compiled.kernels())
    x = rng.standard_normal((1, out, 50)).astype(np.float32)
    assert_within_one_step(compiled(x)[0], ort_session(qdq, optimized=False).run(None, {"x": x})[0], output_scale(qdq))
