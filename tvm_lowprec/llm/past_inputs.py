"""A plain decoder export's cache: past inputs fed, each call, with the previous call's present outputs.

torch's exporter (as ``optimum`` and ``benchmarks/models/llm_plain.py`` call it) writes a decoder with
``input_ids [batch, sequence_length]``, ``attention_mask [batch, total_sequence_length]``, optionally
``position_ids``, and per layer ``past_key_values.N.key/value [batch, kv_heads, past_sequence_length,
head_size]`` as inputs, ``logits`` and ``present.N.key/value [batch, kv_heads, total_sequence_length,
head_size]`` as outputs: each layer concatenates its past with the call's keys and values. Nothing here
rewrites the graph: one compile with every length symbolic serves every call, and
:class:`tvm_lowprec.llm.Generator` hands each present back as the next call's past (the arrays the
compiled model returned, without a copy). :func:`past_inputs` finds that layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx
from onnx import helper

from ..errors import UnsupportedOperatorError
from .cache_graph import DecoderInputs

# How exporters name a layer's present output after its past input: optimum and torch
# (``past_key_values.0.key`` -> ``present.0.key``), older exports (``past_key_0`` -> ``present_key_0``)
_PRESENT_NAMES = (("past_key_values", "present"), ("past_", "present_"), ("past", "present"))


@dataclass(frozen=True)
class PastLayout(DecoderInputs):
    """A plain export's inputs and outputs as :func:`past_inputs` found them; ``pasts``: ``(past input,
    present output)`` per cache tensor, in input order."""

    pasts: tuple[tuple[str, str], ...] = field(default=(), kw_only=True)


def _dims(value_info) -> list:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in value_info.type.tensor_type.shape.dim]


def _present_for(past: str, outputs: set[str]) -> str | None:
    for old, new in _PRESENT_NAMES:
        if old in past and past.replace(old, new, 1) in outputs:
            return past.replace(old, new, 1)
    return None


def past_inputs(model: onnx.ModelProto) -> PastLayout:
    """The :class:`PastLayout` of a plain decoder export.

    Raises :class:`~tvm_lowprec.errors.UnsupportedOperatorError`, naming what is missing, where the graph
    has no past input with a present output of the matching name, lacks ``input_ids`` or
    ``attention_mask``, has inputs a generator does not feed, or its caches' heads and head size are not
    fixed numbers."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    inputs = {vi.name: vi for vi in graph.input if vi.name not in initializers}
    outputs = {vi.name: vi for vi in graph.output}
    pasts = tuple((name, present) for name in inputs if (present := _present_for(name, set(outputs))))
    if not pasts:
        raise UnsupportedOperatorError(
            f"the decoder has no past input with a matching present output (inputs {sorted(inputs)}, outputs "
            f"{sorted(outputs)}): a plain export names them past_key_values.N.key -> present.N.key")
    tokens = "input_ids" if "input_ids" in inputs else None
    mask = "attention_mask" if "attention_mask" in inputs else None
    if tokens is None or mask is None:
        raise UnsupportedOperatorError(f"the decoder's inputs {sorted(inputs)} lack input_ids or attention_mask")
    positions = "position_ids" if "position_ids" in inputs else None
    extra = set(inputs) - {name for name, _ in pasts} - {tokens, mask, positions}
    if extra:
        raise UnsupportedOperatorError(f"the decoder has inputs the generator does not feed: {sorted(extra)}")
    shapes = {tuple(_dims(inputs[name])[1::2]) for name, _ in pasts}
    if len(shapes) != 1 or any(not isinstance(d, int) for d in next(iter(shapes))) or any(
            len(_dims(inputs[name])) != 4 for name, _ in pasts):
        raise UnsupportedOperatorError(f"the past inputs are not all [batch, heads, length, head_size] with the same "
                                       f"fixed heads and head size: {[_dims(inputs[n]) for n, _ in pasts]}")
    kv_heads, head_size = next(iter(shapes))
    elem = inputs[pasts[0][0]].type.tensor_type.elem_type
    kept = [name for name in outputs if name not in {present for _, present in pasts}]
    if not kept:
        raise UnsupportedOperatorError("the decoder has no output besides its present caches (no logits)")
    logits = "logits" if "logits" in kept else kept[0]
    dims = _dims(outputs[logits])
    return PastLayout(int(kv_heads), int(head_size), tokens, mask, positions, logits, pasts=pasts,
                      dtype=str(helper.tensor_dtype_to_np_dtype(elem)),
                      vocab=dims[-1] if dims and isinstance(dims[-1], int) else None)


__all__ = ["PastLayout", "past_inputs"]
