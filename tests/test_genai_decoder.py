"""A decoder exported by ONNX Runtime GenAI's model builder (issue: language models with 4-bit weights):
a 2-layer Qwen2-shaped model with random weights (benchmarks/models/llm.py), int4, compiles with its
lengths pinned by shape_dict and matches ONNX Runtime on the same file (logits and the presents),
for a few tokens after a past and for one decode step."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import tvm_lowprec

from reference import benchmark_module, cosine

pytest.importorskip("transformers", reason="the decoder is made by transformers: pip install -e '.[llm]'")
pytest.importorskip("onnxruntime_genai", reason="ORT GenAI's model builder exports it: pip install -e '.[llm]'")

_LLM = benchmark_module("models/llm.py")
CONFIGS, build = _LLM.CONFIGS, _LLM.build


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def decoder(request, tmp_path_factory):
    """The builder's export; tied: the output projection shares the embedding, which the builder then
    writes as a 4-bit ``GatherBlockQuantized`` of the projection's packed weights."""
    return build("tiny", tmp_path_factory.mktemp("llm"), tied=request.param)


@pytest.mark.parametrize("seq,past", [(5, 3), (1, 8)], ids=["tokens-after-past", "decode-step"])
def test_genai_int4_decoder_matches_ort(decoder, seq, past):
    cfg = CONFIGS["tiny"]
    kv, head = cfg["num_key_value_heads"], cfg["hidden_size"] // cfg["num_attention_heads"]
    rng = np.random.default_rng(0)
    feed = {"input_ids": rng.integers(0, cfg["vocab_size"], (1, seq)).astype(np.int64),
            "attention_mask": np.ones((1, past + seq), np.int64)}
    for layer in range(cfg["num_hidden_layers"]):
        for part in ("key", "value"):
            feed[f"past_key_values.{layer}.{part}"] = rng.standard_normal((1, kv, past, head)).astype(np.float32)
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(decoder), options, providers=["CPUExecutionProvider"])  # its external data beside it
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(str(decoder), shape_dict={k: v.shape for k, v in feed.items()}),
                                   target="native")
    assert any(k.op == "nbits_gemm" for k in compiled.kernels())  # the 4-bit weights stay 4-bit
    tied = decoder.parent.name.endswith("-tied")
    assert tied == any(n.op_type == "GatherBlockQuantized" for n in onnx.load(str(decoder), load_external_data=False).graph.node)
    got = compiled(**feed)
    for name, value in zip(want, got):
        value = np.asarray(value)
        assert value.shape == want[name].shape, name
        assert cosine(value, want[name]) >= 0.9999, name  # ORT's MatMulNBits: int8 activations (level 4)
    logits = np.asarray(got[0])
    assert (logits[0, -1].argmax() == want["logits"][0, -1].argmax())
