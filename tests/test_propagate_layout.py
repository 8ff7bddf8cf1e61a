"""The NHWC layout of the integer convolutions is carried through the layers between them: the
transposes that remain sit at the graph's boundary (:mod:`tvm_lowprec.quant.propagate_layout`)."""

import re

import numpy as np
import onnx
import onnx.version_converter
import tvm
from onnx.reference import ReferenceEvaluator
from tvm import relax

import tvm_lowprec
from tvm_lowprec.quant.propagate_layout import propagate_layout_module

from models import fp32_block_net, quantize_qdq
from reference import assert_within_one_step, kernel_calls, ort_session, output_scale


def _calls(mod):
    calls = []
    relax.analysis.post_order_visit(mod["main"], lambda e: 
        calls.append(e) if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None
    )
    return calls


def _transposed_chain():
    """NCHW int8 -> NHWC -> per-channel dequantize (axis 3) -> relu -> + scalar -> * full-size constant
    -> back to NCHW."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 5, 6), "int8"))
    scale = relax.const(np.array([0.5, 0.25, 1.0, 2.0], np.float32))
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit(relax.op.permute_dims(x, (0, 2, 3, 1)))
            d = bb.emit(relax.op.dequantize(t, scale, relax.const(np.zeros(4, np.int8)), axis=3))
            r = bb.emit(relax.op.add(relax.op.nn.relu(d), relax.const(np.float32(1.5))))
            r = bb.emit(relax.op.multiply(r, relax.const(np.arange(120, dtype=np.float32).reshape(1, 5, 6, 4))))
            out = bb.emit_output(relax.op.permute_dims(r, (0, 3, 1, 2)))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod, x):
    exe = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}))
    return relax.VirtualMachine(exe, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def test_transposes_cancel_and_per_axis_parameters_follow(rng):
    mod = _transposed_chain()
    moved = propagate_layout_module(mod)
    moved = relax.transform.DeadCodeElimination()(moved)
    assert "relax.permute_dims" not in [c.op.name for c in _calls(moved)]
    deq = [c for c in _calls(moved) if c.op.name == "relax.dequantize"]
    assert len(deq) == 1 and int(deq[0].attrs.axis) == 1  # NHWC axis 3 is NCHW axis 1
    x = rng.integers(-128, 128, (1, 4, 5, 6)).astype(np.int8)
    np.testing.assert_array_equal(_run(moved, x), _run(mod, x))


def test_block_net_changes_layout_only_at_the_boundary(rng):
    shape = (1, 8, 16, 16)
    qdq = quantize_qdq(fp32_block_net(shape), [rng.standard_normal(shape).astype(np.float32) for _ in range(8)])
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq), target="native")
    names = [k.name for k in compiled.kernels()]
    # six convolution calls (layers of one shape share a kernel: their zero points are parameters)
    calls = kernel_calls(compiled, rng.standard_normal(shape).astype(np.float32))
    assert sum(c for n, c in calls.items() if n.startswith("qconv2d")) == 6
    # one transpose into NHWC after the input's quantize, one back before Flatten: none between layers
    transposes = sorted(re.sub(r"\d+", "", n) for n in names if "transpose" in n)  # TVM numbers them as it likes
    # (the pool's integer sum: its epilogue may end in the last transpose's kernel, quant/integer_mean.py)
    # (the first may write the next convolution's padded input too, where that reads its window in place)
    assert len(transposes) == 2 and transposes[0] in ("fused_quantize_transpose", "fused_quantize_transpose_pad_xx"), names
    assert transposes[1].endswith("_transpose_reshape") and transposes[1].startswith("fused_"), names
    # exact against onnx.reference (ORT's own kernels round a few of the 10 logits the other way)
    reference = ReferenceEvaluator(onnx.version_converter.convert_version(qdq, 21))
    session = ort_session(qdq, optimized=False)
    for _ in range(3):
        x = rng.standard_normal(shape).astype(np.float32)
        got = compiled(x)[0]
        np.testing.assert_array_equal(got, reference.run(None, {"x": x})[0])
        assert_within_one_step(got, session.run(None, {"x": x})[0], output_scale(qdq), exact_fraction=0.0)


def _conv1d_chain():
    """A Conv1d lifted to 2-D as importers write it, in NHWC: the output transposed back to NCHW, its unit
    height squeezed, reshaped to its own shape, normalized over time (mean, variance) with per-channel
    [C, 1] weights, the unit height expanded again and transposed into NHWC for the next convolution."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 1, 40, 8), "float32"))  # NHWC
    w = relax.Var("w", relax.TensorType((8, 1), "float32"))  # not a constant: moved by a small transpose
    with bb.function("main", [x, w]):
        with bb.dataflow():
            t = bb.emit(relax.op.permute_dims(x, (0, 3, 1, 2)))  # [1, 8, 1, 40]
            s = bb.emit(relax.op.reshape(relax.op.squeeze(t, [2]), (1, 8, 40)))
            mean = bb.emit(relax.op.mean(s, [2], keepdims=True))
            var = bb.emit(relax.op.variance(s, [2], keepdims=True))
            n = bb.emit(relax.op.divide(relax.op.subtract(s, mean), relax.op.sqrt(relax.op.add(var, relax.const(np.float32(1e-5))))))
            n = bb.emit(relax.op.multiply(n, w))
            e = bb.emit(relax.op.expand_dims(n, [2]))  # [1, 8, 1, 40]
            out = bb.emit_output(relax.op.permute_dims(e, (0, 2, 3, 1)))  # back to NHWC
        bb.emit_func_output(out)
    return bb.get()


def test_a_lifted_conv1d_and_its_norm_stay_in_nhwc(rng):
    mod = _conv1d_chain()
    moved = relax.transform.DeadCodeElimination()(propagate_layout_module(mod))
    transposes = [c for c in _calls(moved) if c.op.name == "relax.permute_dims"]
    # only the [8, 1] weight is transposed (to [1, 1, 8]); the [1, 40, 8] activations never are
    assert [tuple(int(d) for d in c.ty.shape) for c in transposes] == [(1, 1, 8)], moved.script()
    x = rng.standard_normal((1, 1, 40, 8)).astype(np.float32)
    w = rng.standard_normal((8, 1)).astype(np.float32)
    exe = tvm.compile(moved, target=tvm.target.Target({"kind": "llvm"}))
    got = relax.VirtualMachine(exe, tvm.cpu())["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w)).numpy()
    exe = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}))
    want = relax.VirtualMachine(exe, tvm.cpu())["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_transposes_move_through_a_channel_repeat(rng):
    """``repeat(permute_dims(x), m, axis=1)`` (a depthwise convolution's channel multiplier,
    quant/depthwise_multiplier.py): the repeat runs along NHWC's channel axis, the transposes cancel."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 5, 6, 4), "uint8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit(relax.op.permute_dims(x, (0, 3, 1, 2)))  # NHWC -> NCHW
            r = bb.emit(relax.op.repeat(t, 2, axis=1))
            out = bb.emit_output(relax.op.permute_dims(r, (0, 2, 3, 1)))  # back to NHWC
        bb.emit_func_output(out)
    mod = bb.get()
    moved = relax.transform.DeadCodeElimination()(propagate_layout_module(mod))
    calls = _calls(moved)
    assert "relax.permute_dims" not in [c.op.name for c in calls]
    (repeat,) = [c for c in calls if c.op.name == "relax.repeat"]
    assert int(repeat.attrs.axis) == 3
    x = rng.integers(0, 256, (1, 5, 6, 4)).astype(np.uint8)
    np.testing.assert_array_equal(_run(moved, x), _run(mod, x))
