"""tvm_lowprec.llm.Generator on a decoder exported by ORT GenAI's builder (2 layers, hidden 64, int4):
one prefill compile and one decode compile over an in-place KV cache serve prompts of every length and
every decode step, and match ONNX Runtime running the builder's file step by step (separate past and
present tensors, the past concatenated)."""

from __future__ import annotations

import numpy as np
import pytest

from reference import benchmark_module, cosine

pytest.importorskip("transformers", reason="the decoder is made by transformers: pip install -e '.[llm]'")
pytest.importorskip("onnxruntime_genai", reason="ORT GenAI's model builder exports it: pip install -e '.[llm]'")

import tvm_lowprec  # noqa: E402
from tvm_lowprec.errors import InputError, UnsupportedOperatorError  # noqa: E402
from tvm_lowprec.llm import Generator, cache_in_place  # noqa: E402

MAX_LENGTH, CHUNK, STEPS = 48, 8, 12


def _build():
    return benchmark_module("models/llm.py").build


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def decoder(request, tmp_path_factory):
    return _build()("tiny", tmp_path_factory.mktemp("gen"), tied=request.param)


@pytest.fixture(scope="module")
def generator(decoder):
    return Generator(decoder, max_length=MAX_LENGTH, chunk=CHUNK)


def _ort_teacher_forced(path, layout, prompt, steps):
    """ORT on the builder's file: the prompt, then ``steps`` greedy tokens one by one, the past carried
    as the presents it returns. Per step: the logits of the last position and the greedy token."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    past = {n: np.zeros((1, layout.kv_heads, 0, layout.head_size), np.float32) for pair in layout.caches for n in pair}
    ids, total, logits = np.asarray([prompt], np.int64), len(prompt), []
    for _ in range(steps):
        out = dict(zip(names, session.run(None, {"input_ids": ids, "attention_mask": np.ones((1, total), np.int64), **past})))
        logits.append(out["logits"][0, -1])
        for layer, (key, value) in enumerate(layout.caches):
            past[key], past[value] = out[f"present.{layer}.key"], out[f"present.{layer}.value"]
        ids, total = np.asarray([[int(logits[-1].argmax())]], np.int64), total + 1
    return logits


@pytest.mark.parametrize("length", [1, 7, CHUNK, 13, 3 * CHUNK + 5])
def test_generator_matches_ort_at_every_prompt_length(decoder, generator, length):
    rng = np.random.default_rng(length)
    prompt = rng.integers(0, 512, length).tolist()
    want = _ort_teacher_forced(decoder, generator.layout, prompt, STEPS)
    generator.reset()
    got, agree = generator.prefill(prompt), 0
    for step, expected in enumerate(want):
        assert cosine(got, expected) >= 0.9999, (length, step)
        token = int(expected.argmax())
        # the greedy choice is ORT's, or a near tie the logits' own difference explains
        assert got[token] >= got.max() - 2 * np.abs(got - expected).max(), (length, step)
        agree += int(got.argmax()) == token
        got = generator.step(token)  # ORT's token: the same sequence on both sides
    assert generator.length == length + STEPS and agree >= STEPS - 2


def test_one_compile_pair_serves_every_length(generator):
    """The two compiles are all there is: the cache is written in place (one small kernel per cache and
    call shape: one row, or the prompt compile's rows known at each call, ``S``) and never concatenated;
    the arrays the generator owns hold the written steps, and no more (a prompt is not padded)."""
    for compiled, rows in ((generator.decode_model, 1), (generator.prefill_model, "S")):
        writes = [k for k in compiled.kernels() if k.name.startswith("kv_cache_write")]
        assert writes and all(k.name.endswith(f"_rows{rows}") for k in writes)
        assert all(k.schedule != "none" for k in compiled.kernels())
    # a chunk's logits are its last row's: the output head runs on one row, not CHUNK
    heads = [k for k in generator.prefill_model.kernels() if k.op == "nbits_gemm" and k.shape[1] == 512]
    assert heads and all(k.shape[0] == 1 for k in heads), [k.shape for k in heads]
    # a decode step writes no whole cache besides its rows (no past concatenated with them, no transposed
    # copy of the keys for the scores); a prompt chunk's score matmul reads the keys transposed, once a chunk
    layout = generator.layout
    cache = layout.kv_heads * layout.head_size * 4  # bytes of one step of one cache
    others = [k for k in generator.decode_model.kernels() if not k.name.startswith("kv_cache_write")]
    assert not [k.name for k in others if k.writes in (cache * MAX_LENGTH, cache * (MAX_LENGTH + 1))]
    generator.reset()
    for cache in generator.cache.values():
        cache[:] = 0
    generator.prefill([3, 4, 5])
    generator.step(6)
    for cache in generator.cache.values():
        assert np.abs(cache[:, :, :4]).sum() > 0 and not cache[:, :, 4:].any()


def test_generate_is_greedy_decoding(generator):
    prompt = [11, 12, 13, 14, 15]
    tokens = generator.generate(prompt, 6)
    generator.reset()
    logits, again = generator.prefill(prompt), []
    for _ in range(6):
        again.append(int(logits.argmax()))
        logits = generator.step(again[-1])
    assert tokens == again
    sampled = generator.generate(prompt, 6, top_k=5, seed=1)
    assert sampled == generator.generate(prompt, 6, top_k=5, seed=1) and len(sampled) == 6


def test_full_cache_is_an_error_not_a_crash(generator):
    generator.reset()
    with pytest.raises(InputError, match="max_length"):
        generator.prefill(list(range(MAX_LENGTH + 1)))
    generator.prefill(list(range(MAX_LENGTH)))
    with pytest.raises(InputError, match="max_length"):
        generator.step(1)
    # past the generator: a mask of 2 positions for a chunk of CHUNK tokens puts the chunk's first row
    # before the cache (start = 2 - CHUNK): an error (the rotary table's index check, or the cache write's
    # own where a model has no rotary), and the process goes on
    mask = np.zeros((1, MAX_LENGTH), np.int64)
    mask[0, :2] = 1
    with pytest.raises(Exception, match="KV cache|outside"):
        generator.prefill_model(dict(generator.cache, input_ids=np.zeros((1, CHUNK), np.int64), attention_mask=mask,
                                     lowprec_last_row=np.zeros(1, np.int64)))
    generator.reset()
    assert generator.prefill([1, 2, 3]).shape == (512,)


def test_plain_export_is_declined_by_name(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    with pytest.raises(UnsupportedOperatorError, match="GroupQueryAttention"):
        cache_in_place(helper.make_model(graph))
    with pytest.raises(InputError, match="chunk"):
        Generator(str(tmp_path / "missing.onnx"), max_length=4, chunk=8)


def test_cache_write_kernel_writes_rows_in_place_and_checks_its_bounds():
    import tvm

    from tvm_lowprec.kernels.kv_cache import cache_write_kernel

    lib = tvm.compile(tvm.IRModule({"main": cache_write_kernel(2, 3, 10, 4, 8, "float32").with_attr("global_symbol", "main")}),
                      target="llvm")
    rng = np.random.default_rng(0)
    cache = rng.standard_normal((2, 3, 10, 8)).astype(np.float32)
    rows = rng.standard_normal((2, 3, 4, 8)).astype(np.float32)
    want = cache.copy()
    want[0, :, 1:5], want[1, :, 6:10] = rows[0], rows[1]
    buffers = [tvm.runtime.tensor(a) for a in (cache, rows, np.asarray([1, 6], np.int64))]
    lib["main"](*buffers)
    np.testing.assert_array_equal(buffers[0].numpy(), want)
    for start in ([1, 7], [-1, 0]):  # past the end, before the start
        with pytest.raises(Exception, match="KV cache"):
            lib["main"](buffers[0], buffers[1], tvm.runtime.tensor(np.asarray(start, np.int64)))


def test_cli_generate_reports_tokens_per_second(decoder, capsys):
    from tvm_lowprec.cli import main

    assert main(["generate", str(decoder.parent), "--prompt-tokens", "12", "--new-tokens", "4", "--chunk", "8",
                 "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "prefill tokens/s" in out and "decode tokens/s" in out and "weights GB/s" in out
    assert main(["generate", str(decoder.parent), "--prompt-tokens", "12", "--max-length", "8"]) == 2
    assert "max_length 8" in capsys.readouterr().err
