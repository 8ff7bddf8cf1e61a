"""Inference batch norms on activations (MobileOne's identity branches) become ``x * a + b`` with ONNX
Runtime's folding of the statistics (:mod:`tvm_lowprec.quant.batch_norm`), so the layout pass carries
NHWC through them: no transpose is left between the convolutions around a batch norm."""

import re

import numpy as np
import tvm
from tvm import relax

import tvm_lowprec
from tvm_lowprec.quant.batch_norm import batch_norm_module

from models import _Graph, quantize_qdq
from reference import assert_within_one_step, ort_session, output_scale


def _bn_branch_net(shape=(1, 8, 12, 12), seed=0):
    """conv -> relu, then a MobileOne block: BN(x) + conv(x) -> relu -> conv."""
    g = _Graph(seed)
    node, conv, const = g.node, g.conv, g.const
    c = shape[1]
    a = node("Relu", [conv("x", c, 16, 3, "conv0")], "relu0")
    stats = [const(f"stat_{k}", v) for k, v in (("gamma", g.rng.uniform(0.5, 2.0, 16)), ("beta", g.rng.standard_normal(16)),
                                             ("mean", g.rng.standard_normal(16)), ("var", g.rng.uniform(0.2, 3.0, 16)))]
    bn = node("BatchNormalization", [a, *stats], "bn", epsilon=1e-3)
    r = node("Relu", [node("Add", [bn, conv(a, 16, 16, 3, "conv1")], "sum")], "relu1")
    conv(r, 16, 8, 1, "y")
    return g.model("bn_branch", shape)


def _batch_norm_calls(mod):
    calls = []
    relax.analysis.post_order_visit(mod["main"], lambda e: calls.append(e) if isinstance(e, relax.Call)
                                    and isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.nn.batch_norm" else None)
    return calls


def test_a_batch_norm_on_activations_keeps_the_block_in_nhwc(rng):
    shape = (1, 8, 12, 12)
    qdq = quantize_qdq(_bn_branch_net(shape), [rng.standard_normal(shape).astype(np.float32) for _ in range(8)])
    mod = tvm_lowprec.from_onnx(qdq)
    assert len(_batch_norm_calls(mod)) == 1
    assert not _batch_norm_calls(batch_norm_module(mod))
    compiled = tvm_lowprec.compile(mod, target="native")
    names = [k.name for k in compiled.kernels()]
    assert not [n for n in names if "batch_norm" in n], names
    # the input's transpose into NHWC and the output's back: none around the batch norm
    assert len([n for n in names if "transpose" in n]) == 2, names
    session = ort_session(qdq, optimized=False)
    for _ in range(3):
        x = rng.standard_normal(shape).astype(np.float32)
        assert_within_one_step(compiled(x)[0], session.run(None, {"x": x})[0], output_scale(qdq), exact_fraction=0.9)


def test_the_folded_statistics_are_onnx_runtimes(rng):
    """a = (1 / sqrt(var + eps)) * gamma and b = beta - mean * a in float32, then x * a + b: the values of
    ORT's BatchNormalization on float inputs (its statistics dequantized from int8/int32, as the QDQ
    quantizer writes them)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 5, 3, 4), "float32"))
    gamma_q = rng.integers(-127, 128, 5).astype(np.int8)
    beta_q = rng.integers(-5000, 5000, 5).astype(np.int32)
    mean, var = rng.standard_normal(5).astype(np.float32), rng.uniform(0.1, 2.0, 5).astype(np.float32)
    with bb.function("main", [x]):
        with bb.dataflow():
            gamma = bb.emit(relax.op.dequantize(relax.const(gamma_q), relax.const(np.float32(0.02)), relax.const(np.int8(0)), axis=0))
            beta = bb.emit(relax.op.dequantize(relax.const(beta_q), relax.const(np.float32(1e-3)), relax.const(np.int32(0)), axis=0))
            bn = bb.emit(relax.op.nn.batch_norm(x, gamma, beta, relax.const(mean), relax.const(var), axis=1, epsilon=1e-5, training=False))
            out = bb.emit_output(relax.TupleGetItem(bn, 0))
        bb.emit_func_output(out)
    mod = bb.get()
    folded = relax.transform.DeadCodeElimination()(batch_norm_module(mod))
    assert not _batch_norm_calls(folded)
    xs = rng.standard_normal((1, 5, 3, 4)).astype(np.float32)
    exe = tvm.compile(folded, target=tvm.target.Target({"kind": "llvm"}))
    got = relax.VirtualMachine(exe, tvm.cpu())["main"](tvm.runtime.tensor(xs)).numpy()
    g, b = gamma_q.astype(np.float32) * np.float32(0.02), beta_q.astype(np.float32) * np.float32(1e-3)
    a = (np.float32(1) / np.sqrt(var + np.float32(1e-5))) * g
    want = xs * a[:, None, None] + (b - mean * a)[:, None, None]
    np.testing.assert_allclose(got, want, rtol=2e-7, atol=1e-6)


def test_a_batch_norm_with_run_time_statistics_is_left_alone():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 3, 3), "float32"))
    gamma = relax.Var("gamma", relax.TensorType((4,), "float32"))
    with bb.function("main", [x, gamma]):
        with bb.dataflow():
            ones, zeros = relax.const(np.ones(4, np.float32)), relax.const(np.zeros(4, np.float32))
            bn = bb.emit(relax.op.nn.batch_norm(x, gamma, zeros, zeros, ones, axis=1, training=False))
            out = bb.emit_output(relax.TupleGetItem(bn, 0))
        bb.emit_func_output(out)
    assert len(_batch_norm_calls(batch_norm_module(bb.get()))) == 1
