"""Grouped-query attention (:mod:`tvm_lowprec.quant.grouped_attention`): the key/value heads repeated
for the query heads (transformers' ``repeat_kv``) are read in place, each group's query rows against
its own head; the result is the attention's, and a repetition of another order is left alone."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax, tirx

import tvm_lowprec
from tvm_lowprec.quant.grouped_attention import grouped_attention_module

B, G, R, D = 1, 2, 3, 16


def _attention(seq, total, interleaved: bool = True, symbolic: bool = False):
    """``softmax(q @ rep(k)^T) @ rep(v)``: ``rep`` repeats each of the G heads R times in place
    (``interleaved``, as repeat_kv) or tiles the G heads R times."""
    t = tirx.Var("t", "int64") if symbolic else total
    q = relax.Var("q", relax.TensorType([B, G * R, seq, D], "float32"))
    k = relax.Var("k", relax.TensorType([B, G, t, D], "float32"))
    v = relax.Var("v", relax.TensorType([B, G, t, D], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            def repeat(x):
                if interleaved:
                    wide = bb.emit(relax.op.broadcast_to(relax.op.expand_dims(x, [2]), relax.ShapeExpr([B, G, R, t, D])))
                else:
                    wide = bb.emit(relax.op.broadcast_to(relax.op.expand_dims(x, [1]), relax.ShapeExpr([B, R, G, t, D])))
                return bb.emit(relax.op.reshape(wide, relax.ShapeExpr([B, G * R, t, D])))

            scores = bb.emit(relax.op.matmul(q, relax.op.permute_dims(repeat(k), [0, 1, 3, 2])))
            probs = bb.emit(relax.op.nn.softmax(scores, axis=-1))
            out = bb.emit_output(relax.op.matmul(probs, repeat(v)))
        bb.emit_func_output(out)
    return bb.get()


def _reference(q, k, v, interleaved=True):
    rep = (lambda x: np.repeat(x, R, axis=1)) if interleaved else (lambda x: np.tile(x, (1, R, 1, 1)))
    s = q @ rep(k).transpose(0, 1, 3, 2)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ rep(v)


def _ops(mod) -> set:
    return {str(b.value.op.name) for block in mod["main"].body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and hasattr(b.value.op, "name")}


@pytest.mark.parametrize("seq,total", [(1, 9), (4, 4)])
def test_the_repeated_cache_is_read_in_place_and_the_result_is_the_same(seq, total):
    mod = _attention(seq, total)
    rewritten = grouped_attention_module(mod)
    assert "relax.broadcast_to" in _ops(mod)
    assert "relax.broadcast_to" not in _ops(rewritten)
    rng = np.random.default_rng(seq)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ([B, G * R, seq, D], [B, G, total, D], [B, G, total, D]))
    got = np.asarray(tvm_lowprec.compile(mod, target="native")(q, k, v)[0])
    np.testing.assert_allclose(got, _reference(q, k, v), rtol=2e-5, atol=1e-6)


def test_a_symbolic_cache_length_compiles_once_without_copying_the_cache():
    compiled = tvm_lowprec.compile(_attention(1, None, symbolic=True), target="native")
    copies = [k.name for k in compiled.kernels() if k.op in ("broadcast_to", "reshape") and "t" in k.shape]
    assert not copies  # nothing of the cache's length (a reshape of the 16 outputs may stay a copy)
    rng = np.random.default_rng(0)
    for total in (5, 17):
        q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ([B, G * R, 1, D], [B, G, total, D], [B, G, total, D]))
        np.testing.assert_allclose(np.asarray(compiled(q, k, v)[0]), _reference(q, k, v), rtol=2e-5, atol=1e-6)


def test_heads_tiled_in_another_order_are_left_alone():
    mod = _attention(2, 6, interleaved=False)
    assert "relax.broadcast_to" in _ops(grouped_attention_module(mod))
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ([B, G * R, 2, D], [B, G, 6, D], [B, G, 6, D]))
    got = np.asarray(tvm_lowprec.compile(mod, target="native")(q, k, v)[0])
    np.testing.assert_allclose(got, _reference(q, k, v, interleaved=False), rtol=2e-5, atol=1e-6)
