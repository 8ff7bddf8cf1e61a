"""Language-model decoding on a compiled decoder: a KV cache written in place, prefill and decode steps.

``Generator`` compiles a decoder exported by ONNX Runtime GenAI's builder twice, once for a prompt
piece whose length is symbolic (known at each call: :data:`PROMPT_TOKENS`) and once for one token,
both over a KV cache of ``max_length`` steps that it owns (numpy arrays the compiled kernels write
into: :mod:`.cache_graph`). These two compiles serve every prompt length and every decode step up to
``max_length``: a prompt runs in pieces of at most ``chunk`` tokens, each as long as it is (no padding,
no overlap), a token in one call. A plain export (torch's exporter, optimum: ``past_key_values.N.key``
inputs, ``present.N.key`` outputs, :mod:`.past_inputs`) is compiled once with every length symbolic,
and each call's presents are the next call's pasts: the same methods, its concatenation as the graph has it.

    gen = tvm_lowprec.llm.Generator("model_dir/model.onnx", max_length=256)
    tokens = gen.generate(prompt_ids, new_tokens=32)           # greedy; top_k=... samples
    logits = gen.prefill(prompt_ids); logits = gen.step(token)  # or step by step
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import numpy as np

from ..compiled import aligned_empty
from ..errors import InputError
from ..frontend.converters import CONTRIB_DOMAIN
from .cache_graph import LAST_ROW, CacheLayout, cache_in_place, last_row_logits
from .past_inputs import PastLayout, past_inputs


def _model_file(model) -> Path | None:
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        return path / "model.onnx" if path.is_dir() else path
    return None


def default_activations(model) -> str:
    """``"int8"`` where every ``MatMulNBits`` of ``model`` asks for ``accuracy_level`` 4 (int8 activations
    per block: what ORT GenAI's builder writes for CPU, and what ONNX Runtime then computes), else
    ``"float"``."""
    levels = [next((a.i for a in node.attribute if a.name == "accuracy_level"), 0)
              for node in model.graph.node if node.op_type == "MatMulNBits"]
    return "int8" if levels and all(level == 4 for level in levels) else "float"


def nbits_weight_bytes(model) -> int:
    """Bytes of every ``MatMulNBits``' weights, scales and zero points: what one decode step reads of them."""
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    return sum(numpy_helper.to_array(inits[name]).nbytes for node in model.graph.node if node.op_type == "MatMulNBits"
               for name in node.input[1:4] if name in inits)


# The name of the prompt compile's symbolic length (tokens per call)
PROMPT_TOKENS = "prompt_tokens"


class _InPlaceCache:
    """ORT GenAI's builder export: its ``GroupQueryAttention`` nodes rewritten to write into buffers of
    ``max_length`` steps that the generator owns (:func:`.cache_graph.cache_in_place`); two compiles, a
    prompt piece of symbolic length and one token. The mask spans the whole buffer."""

    @staticmethod
    def accepts(proto) -> bool:
        return any(n.op_type == "GroupQueryAttention" and n.domain == CONTRIB_DOMAIN for n in proto.graph.node)

    def __init__(self, proto, path, max_length: int, chunk: int, compile_one):
        rewritten, self.layout = cache_in_place(proto, path)

        def build(graph, seq):  # seq: tokens per call, or the name of a symbolic length
            shapes = self.layout.shapes(1, seq, max_length)
            if any(vi.name == LAST_ROW for vi in graph.graph.input):
                shapes[LAST_ROW] = (1,)
            return compile_one(graph, shapes)

        self.decode_model = build(rewritten, 1)
        if chunk > 1:  # a chunk's logits: its last row's only (the decode compile is done with the graph)
            self.prefill_model = build(last_row_logits(rewritten, self.layout.logits), PROMPT_TOKENS)
        else:
            self.prefill_model = self.decode_model
        shape = (1, self.layout.kv_heads, max_length, self.layout.head_size)
        # 64-byte aligned: the compiled model takes them without a copy, so its cache writes land in them
        self.arrays = {name: aligned_empty(shape, self.layout.dtype) for pair in self.layout.caches for name in pair}
        for cache in self.arrays.values():
            cache[:] = 0
        self._mask = np.zeros((1, max_length), np.int64)

    def mask(self, length: int) -> np.ndarray:
        self._mask[0, :length] = 1
        self._mask[0, length:] = 0
        return self._mask

    def keep(self, outputs: dict) -> None:
        """Nothing to keep: the kernels wrote the call's keys and values into :attr:`arrays`."""

    def reset(self) -> None:
        """The old contents stay; the mask hides them."""


class _PastFeed:
    """A plain export (:mod:`.past_inputs`): one compile with every length symbolic; each call's present
    outputs are the next call's past inputs (the returned arrays themselves, no copy)."""

    @staticmethod
    def accepts(proto) -> bool:
        return True  # the last form: past_inputs names what a graph lacks

    def __init__(self, proto, path, max_length: int, chunk: int, compile_one):
        self.layout = past_inputs(proto)
        # batch pinned to 1, the lengths left as the file names them (symbolic on purpose: no warning)
        initializers = {t.name for t in proto.graph.initializer}
        shapes = {vi.name: (1, *[d.dim_value if d.HasField("dim_value") else d.dim_param
                                 for d in vi.type.tensor_type.shape.dim[1:]])
                  for vi in proto.graph.input if vi.name not in initializers}
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*has dynamic dimension")
            self.decode_model = self.prefill_model = compile_one(proto, shapes)
        self.reset()

    def mask(self, length: int) -> np.ndarray:
        return np.ones((1, length), np.int64)

    def keep(self, outputs: dict) -> None:
        for past, present in self.layout.pasts:
            self.arrays[past] = outputs[present]

    def reset(self) -> None:
        empty = (1, self.layout.kv_heads, 0, self.layout.head_size)
        self.arrays = {past: aligned_empty(empty, self.layout.dtype) for past, _ in self.layout.pasts}


_CACHE_FORMS = (_InPlaceCache, _PastFeed)  # the first that accepts the graph


class Generator:
    """A decoder with its KV cache: ``prefill(tokens)``, ``step(token)``, ``generate(prompt, n)``.

    Parameters
    ----------
    model : str, path or onnx.ModelProto
        ORT GenAI's export (``model.onnx``, or the folder holding it and ``genai_config.json``): its
        cache is written in place; or a plain export (``past_key_values.N.key`` inputs, ``present.N.key``
        outputs, as torch's exporter and optimum write them: :mod:`.past_inputs`), compiled once with
        every length symbolic, each call's presents fed back as the next call's pasts.
    max_length : int
        Cache length: prompt and generated tokens together.
    chunk : int
        Most prompt tokens per prefill call (1: the prompt runs token by token on the decode compile);
        a call takes any number up to it on the one prompt compile.
    target, num_threads, **compile_options
        As :func:`tvm_lowprec.compile`; ``weight_only`` defaults to int8 activations where the file's
        ``MatMulNBits`` ask for ``accuracy_level`` 4 (:func:`default_activations`).

    Attributes
    ----------
    layout : CacheLayout or PastLayout
        The cache inputs found in the graph.
    prefill_model, decode_model : Compiled
        The two compiles (the same object where ``chunk == 1``, and for a plain export).
    compile_s : float
        Seconds spent importing and compiling both.
    """

    def __init__(self, model, max_length: int = 512, chunk: int = 64, target="native", num_threads=None,
                 **compile_options):
        import onnx

        import tvm_lowprec

        if not 1 <= chunk <= max_length:
            raise InputError(f"chunk must be between 1 and max_length ({max_length}), got {chunk}")
        path = _model_file(model)
        proto = onnx.load(str(path)) if path is not None else model
        if "weight_only" not in compile_options:
            compile_options["weight_only"] = tvm_lowprec.WeightOnlyConfig(activations=default_activations(proto))
        self.max_length, self.chunk = int(max_length), int(chunk)
        start = time.perf_counter()

        def compile_one(graph, shapes):
            mod = tvm_lowprec.from_onnx(graph, shape_dict=shapes)
            return tvm_lowprec.compile(mod, target=target, num_threads=num_threads, **compile_options)

        form = next(f for f in _CACHE_FORMS if f.accepts(proto))
        self._cache = form(proto, path, self.max_length, self.chunk, compile_one)
        self.layout = self._cache.layout
        self.decode_model, self.prefill_model = self._cache.decode_model, self._cache.prefill_model
        self._last_row = self.chunk > 1 and any(spec.name == LAST_ROW for spec in self.prefill_model.inputs)
        self.compile_s = time.perf_counter() - start
        self.tokens: list[int] = []

    @property
    def cache(self) -> dict[str, np.ndarray]:
        """The cache arrays by input name: the buffers written in place, or the pasts the next call takes."""
        return self._cache.arrays

    # -- state -------------------------------------------------------------------------------------
    @property
    def length(self) -> int:
        """Tokens in the cache."""
        return len(self.tokens)

    def reset(self) -> None:
        """Forget the cache (its old contents stay; the mask hides them)."""
        self.tokens = []
        self._cache.reset()

    def _run(self, compiled, ids: list[int], start: int, last: int | None = None) -> np.ndarray:
        """Tokens ``ids`` at positions ``start ..``: the logits ``[len(ids), vocab]``, or of row ``last``
        alone ``[1, vocab]`` where the compile takes :data:`~.cache_graph.LAST_ROW`."""
        seq = len(ids)
        feed = dict(self._cache.arrays)
        if last is not None:
            feed[LAST_ROW] = np.asarray([last], np.int64)
        feed[self.layout.tokens] = np.asarray(ids, np.int64).reshape(1, seq)
        feed[self.layout.mask] = self._cache.mask(start + seq)
        if self.layout.positions is not None:
            feed[self.layout.positions] = np.arange(start, start + seq, dtype=np.int64).reshape(1, seq)
        outputs = dict(zip(compiled.output_names, compiled(feed)))
        self._cache.keep(outputs)
        logits = np.asarray(outputs[self.layout.logits])
        return logits.reshape(-1, logits.shape[-1])

    # -- decoding ----------------------------------------------------------------------------------
    def prefill(self, tokens) -> np.ndarray:
        """Append ``tokens`` (after whatever is cached) and return the last one's logits ``[vocab]``."""
        tokens = [int(t) for t in np.asarray(tokens).reshape(-1)]
        if not tokens:
            raise InputError("prefill needs at least one token")
        end = self.length + len(tokens)
        if end > self.max_length:
            raise InputError(f"{end} tokens exceed the cache's max_length {self.max_length}")
        history = self.tokens + tokens
        if self.chunk == 1:
            for pos in range(self.length, end):
                logits = self._run(self.decode_model, [history[pos]], pos)[-1]
            self.tokens = history
            return logits
        logits = None
        for first in range(self.length, end, self.chunk):  # pieces of at most chunk tokens, each as it is
            ids = history[first:min(first + self.chunk, end)]
            if self._last_row:
                logits = self._run(self.prefill_model, ids, first, len(ids) - 1)[0]
            else:
                logits = self._run(self.prefill_model, ids, first)[-1]
        self.tokens = history
        return logits

    def step(self, token: int) -> np.ndarray:
        """Append one token; its logits ``[vocab]``."""
        if self.length + 1 > self.max_length:
            raise InputError(f"the cache's max_length {self.max_length} is reached")
        logits = self._run(self.decode_model, [int(token)], self.length)[-1]
        self.tokens.append(int(token))
        return logits

    @staticmethod
    def choose(logits: np.ndarray, top_k: int = 1, temperature: float = 1.0, rng=None) -> int:
        """Greedy (``top_k`` 1) or sampled among the ``top_k`` most likely tokens."""
        if top_k <= 1:
            return int(np.argmax(logits))
        rng = rng if rng is not None else np.random.default_rng()
        best = np.argpartition(logits, -top_k)[-top_k:]
        scores = logits[best].astype(np.float64) / max(temperature, 1e-6)
        probs = np.exp(scores - scores.max())
        return int(best[rng.choice(top_k, p=probs / probs.sum())])

    def generate(self, prompt, new_tokens: int, top_k: int = 1, temperature: float = 1.0, seed: int = 0,
                 eos: int | None = None) -> list[int]:
        """Prefill ``prompt`` (after a :meth:`reset`), then ``new_tokens`` steps: the new tokens."""
        self.reset()
        rng = np.random.default_rng(seed)
        logits = self.prefill(prompt)
        out = []
        for i in range(new_tokens):
            token = self.choose(logits, top_k, temperature, rng)
            out.append(token)
            if token == eos or i == new_tokens - 1:
                break
            logits = self.step(token)
        return out


__all__ = ["PROMPT_TOKENS", "CacheLayout", "Generator", "PastLayout", "cache_in_place", "default_activations",
           "nbits_weight_bytes", "past_inputs"]
