"""A decoder exported plainly (torch's exporter: MatMul, Softmax, the RMS norm and the rotary embedding
as plain operators, the past keys and values concatenated) and quantized by ONNX Runtime's
``MatMulNBitsQuantizer`` (benchmarks/models/llm_plain.py: the same 2-layer Qwen2-shaped model with
random weights as the builder's export): it compiles once with every length symbolic, and that one
compiled model runs prompts of several lengths after pasts of several lengths, matching ONNX Runtime
on the same file (logits and presents)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import tvm_lowprec

from reference import benchmark_module, cosine

pytest.importorskip("transformers", reason="the decoder is made by transformers: pip install -e '.[llm]'")


_PLAIN = benchmark_module("models/llm_plain.py")
CFG = _PLAIN.CONFIGS["tiny"]
KV, HEAD = CFG["num_key_value_heads"], CFG["hidden_size"] // CFG["num_attention_heads"]


@pytest.fixture(scope="module", params=[32, 128], ids=["block32", "block128"])
def decoder(request, tmp_path_factory):
    return _PLAIN.build_plain("tiny", tmp_path_factory.mktemp("plain"), block=request.param)


@pytest.fixture(scope="module")
def compiled(decoder):
    return tvm_lowprec.compile(tvm_lowprec.from_onnx(str(decoder)), target="native")


def _feed(seq: int, past: int, rng) -> dict:
    feed = {"input_ids": rng.integers(0, CFG["vocab_size"], (1, seq)).astype(np.int64),
            "attention_mask": np.ones((1, past + seq), np.int64)}
    for layer in range(CFG["num_hidden_layers"]):
        for part in ("key", "value"):
            feed[f"past_key_values.{layer}.{part}"] = rng.standard_normal((1, KV, past, HEAD)).astype(np.float32)
    return feed


def test_the_export_is_plain_with_symbolic_lengths_and_4bit_weights(decoder):
    model = onnx.load(str(decoder), load_external_data=False)
    ops = {n.op_type for n in model.graph.node}
    assert "MatMulNBits" in ops and "Softmax" in ops and "Concat" in ops
    assert not ops & {"GroupQueryAttention", "SimplifiedLayerNormalization", "RotaryEmbedding"}
    dims = {d.dim_param for i in model.graph.input for d in i.type.tensor_type.shape.dim if d.dim_param}
    assert {"sequence_length", "past_sequence_length", "total_sequence_length"} <= dims


@pytest.fixture(scope="module")
def ort_float(decoder):
    """ONNX Runtime on the same file with ``accuracy_level`` 0: ``MatMulNBits`` on float activations,
    the operator's definition and what tvm-lowprec computes by default (the quantizer writes level 4:
    ORT then quantizes the activations to int8 per block, about 1e-4 off in cosine)."""
    import onnxruntime as ort

    model = onnx.load(str(decoder))
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            for attr in node.attribute:
                if attr.name == "accuracy_level":
                    attr.i = 0
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("seq,past", [(7, 0), (1, 7), (5, 3), (1, 0), (12, 20)])
def test_one_compile_runs_every_length_and_matches_ort(compiled, ort_float, seq, past):
    feed = _feed(seq, past, np.random.default_rng(seq * 100 + past))
    want = dict(zip([o.name for o in ort_float.get_outputs()], ort_float.run(None, feed)))
    assert any(k.op == "nbits_gemm" for k in compiled.kernels())  # the 4-bit weights stay 4-bit
    got = compiled(**feed)
    assert len(got) == len(want)
    for name, value in zip(want, got):
        value = np.asarray(value)
        assert value.shape == want[name].shape, name
        assert cosine(value, want[name]) >= 0.99999, name
        np.testing.assert_allclose(value, want[name], rtol=1e-3, atol=1e-4, err_msg=name)
    assert (np.asarray(got[0])[0, -1].argmax() == want["logits"][0, -1].argmax())


def test_bad_lengths_and_token_ids_raise_and_name_the_problem(compiled):
    """A mask whose length is not past + sequence, or a token id past the vocabulary, stops the call
    with an error (ONNX Runtime refuses both); the process goes on."""
    feed = _feed(3, 4, np.random.default_rng(1))
    feed["attention_mask"] = np.ones((1, 9), np.int64)
    with pytest.raises(Exception, match="match_cast"):
        compiled(**feed)
    feed = _feed(3, 4, np.random.default_rng(1))
    feed["input_ids"][0, 1] = CFG["vocab_size"]
    with pytest.raises(Exception, match=rf"outside \[0, {CFG['vocab_size']}\)"):
        compiled(**feed)
    assert np.asarray(compiled(**_feed(3, 4, np.random.default_rng(1)))[0]).shape == (1, 3, CFG["vocab_size"])


def test_the_cache_is_neither_repeated_per_query_head_nor_copied_to_reshape_it(compiled):
    """The tiny decoder has 4 query heads over 2 key/value heads: its attention reads each cached head
    in place for both of its query heads (no ``broadcast_to`` kernel), and no kernel copies a tensor of
    the run-time lengths only to reshape it (``R.reshape`` views)."""
    kernels = compiled.kernels()
    assert not [k.name for k in kernels if k.op == "broadcast_to"]
    assert not [k.name for k in kernels if k.op == "reshape" and "sequence_length" in str(k.shape)]


def test_generator_runs_the_plain_export_on_one_compile_and_matches_ort(decoder):
    """``tvm_lowprec.llm.Generator`` takes the plain export too: one compile (prefill and decode the same
    object), each call's presents fed back as the next call's pasts, prompts in chunks; the logits of
    every step match ONNX Runtime running the file as written (its ``accuracy_level`` 4: int8 activations,
    as the generator compiles it), the past carried the same way, and the greedy tokens agree."""
    import onnxruntime as ort

    from tvm_lowprec.llm import Generator, PastLayout

    gen = Generator(str(decoder), max_length=40, chunk=4)
    assert isinstance(gen.layout, PastLayout) and gen.prefill_model is gen.decode_model
    assert len(gen.layout.pasts) == 2 * CFG["num_hidden_layers"] and gen.layout.vocab == CFG["vocab_size"]
    session = ort.InferenceSession(str(decoder), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    prompt = np.random.default_rng(3).integers(0, CFG["vocab_size"], 11).tolist()  # 3 chunks: 4, 4, 3
    past = {p: np.zeros((1, KV, 0, HEAD), np.float32) for p, _ in gen.layout.pasts}
    ids, total = prompt, 0
    got, agree = gen.prefill(prompt), 0
    for step in range(8):
        out = dict(zip(names, session.run(None, {"input_ids": np.asarray([ids], np.int64),
                                                 "attention_mask": np.ones((1, total + len(ids)), np.int64), **past})))
        want, total = out["logits"][0, -1], total + len(ids)
        past = {p: out[q] for p, q in gen.layout.pasts}
        assert cosine(got, want) >= 0.9999, step
        token = int(want.argmax())
        assert got[token] >= got.max() - 2 * np.abs(got - want).max(), step  # ORT's choice, or a near tie
        agree += int(got.argmax()) == token
        got, ids = gen.step(token), [token]
    assert agree >= 6 and gen.length == len(prompt) + 8
    for p, _ in gen.layout.pasts:  # the cache holds every position, as ORT's presents do
        assert gen.cache[p].shape == (1, KV, len(prompt) + 8, HEAD)
    gen.reset()
    assert gen.length == 0 and all(c.shape[2] == 0 for c in gen.cache.values())
    assert gen.generate(prompt, 3) == gen.generate(prompt, 3)


def test_a_graph_without_pasts_is_refused_by_name():
    from onnx import TensorProto, helper

    from tvm_lowprec.errors import UnsupportedOperatorError
    from tvm_lowprec.llm import Generator

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    with pytest.raises(UnsupportedOperatorError, match="past input with a matching present output"):
        Generator(helper.make_model(graph), max_length=4, chunk=1)
