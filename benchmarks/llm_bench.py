"""One decoder step and one prefill of an ORT GenAI export: tvm-lowprec against ONNX Runtime on the same file.

    python benchmarks/llm_bench.py --config qwen2.5-0.5b --threads 1,2 --out benchmarks/results/llm

The model comes from ``benchmarks/models/llm.py`` (random weights, ORT GenAI's builder, int4). Each point
pins the lengths (``shape_dict``: batch 1, ``--seq`` new tokens after ``--past`` cached ones) and compiles
once; tvm-lowprec's ``Compiled`` and ``onnxruntime.InferenceSession.run`` on the same inputs are timed
interleaved and quiesced, each with its default thread policy, each thread count in a process of its own
(``TVM_NUM_THREADS`` set at its start; ``--same-process`` switches ``Compiled.num_threads`` instead); tvm-lowprec's 4-bit layers take int8
activations per block (``--activations int8``, ORT's ``accuracy_level`` 4, which the builder writes) or float. Decode: 1 token after ``--past``; prefill:
``--prompt`` tokens after a past of 1 (an empty past is not accepted yet). Reported: ms per call,
tokens/s, the 4-bit weights' bytes per call (``MatMulNBits`` weights, scales and zero points, read once
per call) as GB/s, and the ratio ORT / tvm-lowprec. ``--export plain``: the same model exported plainly
(``models/llm_plain.py``: torch's exporter, ``MatMulNBitsQuantizer``), compiled once with every length
symbolic for both points (a prefill then runs after an empty past). ``--generate``: ORT GenAI's own
generator loop against :class:`tvm_lowprec.llm.Generator`; with ``--export plain``, which ORT GenAI has no
config for, an ONNX Runtime session loop feeding each call's presents back as pasts (:func:`ort_plain_loop`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from models.llm import CONFIGS, build  # noqa: E402
from models.llm_plain import build_plain  # noqa: E402

from tvm_lowprec.bench.cli_args import parse_threads  # noqa: E402
from model_bench import LOWPREC_ROOT, git_revision  # noqa: E402
from tvm_lowprec.bench.hostinfo import collect_metadata, host_line  # noqa: E402
from tvm_lowprec.bench.report import markdown_table  # noqa: E402


def nbits_bytes(path: Path) -> int:
    """Bytes of every MatMulNBits' weights, scales and zero points (what one call reads of them)."""
    import onnx

    from tvm_lowprec.llm import nbits_weight_bytes

    return nbits_weight_bytes(onnx.load(str(path)))


def feed_for(config: str, seq: int, past: int, seed: int = 0) -> dict:
    cfg = CONFIGS[config]
    kv, head = cfg["num_key_value_heads"], cfg["hidden_size"] // cfg["num_attention_heads"]
    rng = np.random.default_rng(seed)
    feed = {"input_ids": rng.integers(0, cfg["vocab_size"], (1, seq)).astype(np.int64),
            "attention_mask": np.ones((1, past + seq), np.int64)}
    for layer in range(cfg["num_hidden_layers"]):
        for part in ("key", "value"):
            feed[f"past_key_values.{layer}.{part}"] = rng.standard_normal((1, kv, past, head)).astype(np.float32)
    return feed


_SYMBOLIC: dict = {}  # (path, activations) -> (Compiled, compile seconds): one compile serves every point


def compile_for(path: Path, feed: dict, activations: str, symbolic: bool):
    """``(Compiled, seconds)``: the model with its lengths pinned to ``feed``'s, or (``symbolic``) with every
    length symbolic, compiled once for all points."""
    import tvm_lowprec

    key = (str(path), activations)
    if symbolic and key in _SYMBOLIC:
        return _SYMBOLIC[key]
    start = time.perf_counter()
    shapes = None if symbolic else {k: v.shape for k, v in feed.items()}
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(str(path), shape_dict=shapes), target="native",
                                   weight_only=tvm_lowprec.WeightOnlyConfig(activations=activations))
    made = compiled, time.perf_counter() - start
    if symbolic:
        _SYMBOLIC[key] = made
    return made


def measure(path: Path, config: str, name: str, seq: int, past: int, threads: list[int], weight_bytes: int,
            activations: str = "float", symbolic: bool = False) -> list[dict]:
    import onnxruntime as ort

    from tvm_lowprec.bench.timing import measure_interleaved, wall_loop

    feed = feed_for(config, seq, past)
    compiled, compile_s = compile_for(path, feed, activations, symbolic)
    rows = []
    for t in threads:
        options = ort.SessionOptions()
        options.intra_op_num_threads = t
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        compiled.num_threads = t
        want, got = session.run(None, feed)[0], np.asarray(compiled(**feed)[0])
        cos = float((want * got).sum() / np.linalg.norm(want) / np.linalg.norm(got))
        times = measure_interleaved({"tvm-lowprec": wall_loop(lambda: compiled(**feed)),
                                     "ort": wall_loop(lambda: session.run(None, feed))}, quiesce=True)
        ours, theirs = times["tvm-lowprec"].seconds, times["ort"].seconds
        rows.append({"point": name, "activations": activations, "symbolic": symbolic, "seq": seq, "past": past, "threads": t,
                     "compile_s": round(compile_s, 1),
                     "tvm_ms": ours * 1e3, "ort_ms": theirs * 1e3, "ratio": theirs / ours,
                     "tvm_tokens_s": seq / ours, "ort_tokens_s": seq / theirs,
                     "tvm_weight_gbs": weight_bytes / ours / 1e9, "ort_weight_gbs": weight_bytes / theirs / 1e9,
                     "logits_cosine": cos})
        print(rows[-1], flush=True)
    return rows


def ort_plain_loop(path: Path, threads: int, layout):
    """A plain export on an ONNX Runtime session, as ORT GenAI runs a decoder without its builder's config:
    the prompt in one call, then a token per call, each call's presents fed back as the next call's pasts.
    Returns ``run(prompt, new_tokens) -> (prefill s, decode s per token, tokens)``."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def run(prompt, new_tokens):
        past = {p: np.zeros((1, layout.kv_heads, 0, layout.head_size), np.float32) for p, _ in layout.pasts}
        ids, total, tokens = [int(t) for t in prompt], 0, []
        t0 = t1 = time.perf_counter()
        for step in range(new_tokens + 1):
            out = dict(zip(names, session.run(None, {layout.tokens: np.asarray([ids], np.int64),
                                                      layout.mask: np.ones((1, total + len(ids)), np.int64), **past})))
            total += len(ids)
            past = {p: out[q] for p, q in layout.pasts}
            if step == 0:
                t1 = time.perf_counter()
            if step == new_tokens:
                break
            tokens.append(int(np.argmax(out[layout.logits][0, -1])))
            ids = [tokens[-1]]
        return t1 - t0, (time.perf_counter() - t1) / new_tokens, tokens

    return run


def measure_generation(path: Path, threads: int, prompt_len: int, new_tokens: int, rounds: int, chunk: int,
                       weight_bytes: int, plain: bool = False) -> list[dict]:
    """``tvm_lowprec.llm.Generator`` against ORT GenAI's own generator loop (``og.Generator``:
    ``append_tokens`` of the prompt, then ``generate_next_token``; a plain export, which ORT GenAI has no
    config for: :func:`ort_plain_loop`), greedy, on the same folder and prompt,
    ``threads`` threads each (ORT GenAI's through its config overlay; TVM's pool set by the process),
    ``rounds`` interleaved rounds, quiesced before each; the median round. Prefill: the prompt's call(s);
    decode: per token of ``new_tokens``. The read bandwidth of ``threads`` streams over as many bytes
    as the 4-bit weights is measured in the same run (``int4_bench.read_bandwidth``)."""
    from int4_bench import compile_read_bw, read_bandwidth
    from tvm_lowprec.bench.quiesce import quiesce
    from tvm_lowprec.llm import Generator

    folder = path.parent
    start = time.perf_counter()
    gen = Generator(str(path), max_length=prompt_len + new_tokens, chunk=min(chunk, prompt_len))
    compile_s = time.perf_counter() - start
    prompt = np.random.default_rng(0).integers(0, gen.layout.vocab or 1000, prompt_len)
    if plain:
        ort_loop = ort_plain_loop(path, threads, gen.layout)
    else:
        import onnxruntime_genai as og

        config = og.Config(str(folder))
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads}}}}))
        model = og.Model(config)

    def ours():
        gen.reset()
        t0 = time.perf_counter()
        logits = gen.prefill(prompt)
        t1, tokens = time.perf_counter(), []
        for _ in range(new_tokens):
            tokens.append(int(np.argmax(logits)))
            logits = gen.step(tokens[-1])
        return t1 - t0, (time.perf_counter() - t1) / new_tokens, tokens

    def theirs():
        if plain:
            return ort_loop(prompt, new_tokens)
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=prompt_len + new_tokens + 1, do_sample=False)
        generator = og.Generator(model, params)
        t0 = time.perf_counter()
        generator.append_tokens(prompt.astype(np.int32))
        t1, tokens = time.perf_counter(), []
        for _ in range(new_tokens):
            generator.generate_next_token()
            tokens.append(int(generator.get_next_tokens()[0]))
        return t1 - t0, (time.perf_counter() - t1) / new_tokens, tokens

    ours(), theirs()  # warm-up
    results = {"tvm": [], "ort": []}
    for _ in range(rounds):
        for name, run in (("tvm", ours), ("ort", theirs)):
            quiesce()
            results[name].append(run())
    (tp, td, tokens), (op, od, their_tokens) = (
        (float(np.median([r[0] for r in rs])), float(np.median([r[1] for r in rs])), rs[-1][2])
        for rs in (results["tvm"], results["ort"]))
    same = next((i for i, (a, b) in enumerate(zip(tokens, their_tokens)) if a != b), len(tokens))
    with tempfile.TemporaryDirectory() as tmp:
        read_gbs = read_bandwidth(compile_read_bw(Path(tmp)), max(weight_bytes, 256 << 20), threads, 5)
    row = {"point": "generate", "threads": threads, "prompt": prompt_len, "new_tokens": new_tokens,
           "compile_s": round(compile_s, 1), "tvm_prefill_ms": tp * 1e3, "ort_prefill_ms": op * 1e3,
           "tvm_decode_ms": td * 1e3, "ort_decode_ms": od * 1e3, "prefill_ratio": op / tp, "decode_ratio": od / td,
           "tvm_weight_gbs": weight_bytes / td / 1e9, "ort_weight_gbs": weight_bytes / od / 1e9,
           "read_gbs": read_gbs, "greedy_tokens_identical": same}
    print(row, flush=True)
    return [row]


def _child_rows(argv: list[str], threads: int) -> list[dict]:
    """This benchmark for one thread count in a new process whose TVM thread pool starts with that many
    threads (switching ``Compiled.num_threads`` inside one process left the 2-thread decode bimodal:
    12.8-18.4 ms a step, against 12.3-13.9 ms in a process started with two; Zen 4)."""
    import os
    import subprocess
    import tempfile

    rest, skip = [], False
    for arg in argv:  # this run's options but its thread list
        if skip:
            skip = False
            continue
        if arg == "--threads":
            skip = True
            continue
        if not arg.startswith("--threads="):
            rest.append(arg)
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "rows.json"
        subprocess.run([sys.executable, str(Path(__file__).resolve()), *rest, "--threads", str(threads),
                        "--rows-json", str(out)], check=True, env={**os.environ, "TVM_NUM_THREADS": str(threads)})
        return json.loads(out.read_text())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    parser.add_argument("--threads", type=parse_threads, default=[1, 2])
    parser.add_argument("--past", type=int, default=128, help="cached tokens before the decode step")
    parser.add_argument("--prompt", type=int, default=128, help="prefill tokens (after one cached token)")
    parser.add_argument("--activations", choices=["float", "int8"], default="int8",
                        help="tvm-lowprec's 4-bit layers: int8 activations per block (as ORT's accuracy_level 4, "
                             "which ORT GenAI's builder writes; default) or float")
    parser.add_argument("--models", type=Path, default=Path("/tmp/tvm-lowprec-llm"))
    parser.add_argument("--export", choices=["builder", "plain"], default="builder",
                        help="ORT GenAI's builder (lengths pinned per point), or the plain torch export quantized by "
                             "MatMulNBitsQuantizer (models/llm_plain.py; every length symbolic, one compile)")
    parser.add_argument("--block", type=int, default=32, choices=[32, 128], help="the plain export's 4-bit block")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/llm"))
    parser.add_argument("--same-process", action="store_true",
                        help="every thread count in this process (Compiled.num_threads switched between them); by "
                             "default each thread count runs in a process of its own started with TVM_NUM_THREADS set")
    parser.add_argument("--generate", action="store_true",
                        help="tvm_lowprec.llm.Generator (builder: a KV cache in place, one prefill and one decode "
                             "compile; plain: one compile, presents fed back) against ORT GenAI's generator loop "
                             "(plain: an ORT session loop): --prompt tokens, then --new-tokens greedy steps")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=64, help="most prompt tokens per prefill call (--generate)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (--generate)")
    parser.add_argument("--rows-json", type=Path, help=argparse.SUPPRESS)  # a child's rows, for its parent
    args = parser.parse_args(argv)
    path = build(args.config, args.models) if args.export == "builder" else build_plain(args.config, args.models, args.block)
    symbolic = args.export == "plain"  # its lengths stay symbolic: one compile for both points
    weight_bytes = nbits_bytes(path)
    if len(args.threads) > 1 and not args.same_process:
        rows = [row for t in args.threads for row in _child_rows(argv if argv is not None else sys.argv[1:], t)]
    elif args.generate:
        rows = [row for t in args.threads for row in measure_generation(path, t, args.prompt, args.new_tokens,
                                                                        args.rounds, args.chunk, weight_bytes,
                                                                        plain=args.export == "plain")]
    else:
        rows = measure(path, args.config, "decode", 1, args.past, args.threads, weight_bytes, args.activations, symbolic)
        rows += measure(path, args.config, "prefill", args.prompt, 0 if symbolic else 1, args.threads, weight_bytes,
                        args.activations, symbolic)
    if args.rows_json is not None:
        args.rows_json.write_text(json.dumps(rows))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    meta = collect_metadata(benchmark=f"llm_bench {args.config} {args.export}", git=git_revision(LOWPREC_ROOT))
    (args.out / "results.json").write_text(json.dumps({"config": args.config, "weight_bytes": weight_bytes,
                                                       "meta": meta, "rows": rows}, indent=1))
    if args.generate:
        return write_generation_report(args, rows, weight_bytes)
    head = ["point", "threads", "compile s", "tvm-lowprec ms", "ORT ms", "ORT / tvm-lowprec", "tvm tokens/s",
            "ORT tokens/s", "tvm weight GB/s", "ORT weight GB/s", "logits cosine"]
    body = [[r["point"] + f" ({r['seq']} after {r['past']})", r["threads"], r["compile_s"], f"{r['tvm_ms']:.3f}",
             f"{r['ort_ms']:.3f}", f"**{r['ratio']:.2f}x**", f"{r['tvm_tokens_s']:.1f}", f"{r['ort_tokens_s']:.1f}",
             f"{r['tvm_weight_gbs']:.1f}", f"{r['ort_weight_gbs']:.1f}", f"{r['logits_cosine']:.6f}"] for r in rows]
    export = ("ORT GenAI builder, int4" if args.export == "builder" else
              f"plain torch export + MatMulNBitsQuantizer block {args.block}, every length symbolic: one compile")
    text = "\n".join([f"# {args.config} decoder ({export}): tvm-lowprec vs ONNX Runtime", "", host_line(meta), "",
                      f"tvm-lowprec's activations: {args.activations}", "",
                      f"4-bit weights read per call: {weight_bytes / 1e6:.1f} MB", "", *markdown_table(head, body)])
    (args.out / "report.md").write_text(text + "\n")
    print(text)


def write_generation_report(args, rows: list[dict], weight_bytes: int) -> None:
    peer = "ORT GenAI" if args.export == "builder" else "ORT loop"
    head = ["threads", "compile s", "prefill tokens/s tvm", peer, "ratio", "decode tokens/s tvm", peer,
            "ratio", "weight GB/s tvm", peer, "read GB/s", "tvm % of read", "greedy tokens identical"]
    body = [[r["threads"], r["compile_s"], f"{r['prompt'] / r['tvm_prefill_ms'] * 1e3:.1f}",
             f"{r['prompt'] / r['ort_prefill_ms'] * 1e3:.1f}", f"**{r['prefill_ratio']:.2f}x**",
             f"{1e3 / r['tvm_decode_ms']:.1f}", f"{1e3 / r['ort_decode_ms']:.1f}", f"**{r['decode_ratio']:.2f}x**",
             f"{r['tvm_weight_gbs']:.1f}", f"{r['ort_weight_gbs']:.1f}", f"{r['read_gbs']:.1f}",
             f"{100 * r['tvm_weight_gbs'] / r['read_gbs']:.0f}%", f"{r['greedy_tokens_identical']} of {r['new_tokens']}"]
            for r in rows]
    against = ("(ORT GenAI builder, int4): tvm_lowprec.llm.Generator vs ORT GenAI's generator loop"
               if args.export == "builder" else f"(plain export, MatMulNBitsQuantizer block {args.block}): "
               "tvm_lowprec.llm.Generator vs an ONNX Runtime session loop, presents fed back as pasts")
    text = "\n".join([f"# {args.config} decoder {against}", "", f"Prompt {args.prompt} tokens, then {args.new_tokens} greedy tokens; "
                      f"4-bit weights read per decode step: {weight_bytes / 1e6:.1f} MB", "",
                      *markdown_table(head, body)])
    (args.out / "report.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
