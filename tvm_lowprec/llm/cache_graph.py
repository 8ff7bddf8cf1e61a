"""ONNX rewrite: a decoder's ``GroupQueryAttention`` nodes with their KV cache in place.

ORT GenAI's builder writes each layer's attention as one ``com.microsoft.GroupQueryAttention`` node
reading ``past_key_values.N.key/value`` (graph inputs) and writing ``present.N.key/value`` (graph
outputs); its runtime, with ``past_present_share_buffer`` (the builder's own setting), hands the node
one buffer of the maximum length as both. Here the same form becomes the compiled graph's: each node
gets :data:`~tvm_lowprec.frontend.converters.CACHE_IN_PLACE` (its converter then writes the call's keys
and values into the past input in place and attends over it, masked by position), and the ``present``
outputs leave the graph (they are the inputs, updated). The attention mask is then ``[batch, length]``
with ones over the positions written so far and this call's (``seqlens_k`` = their count - 1, as the
builder's graph computes it).

:func:`cache_in_place` returns the rewritten model and its :class:`CacheLayout` (the cache inputs,
their heads and head size), which :class:`tvm_lowprec.llm.Generator` allocates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from onnx import helper

from ..errors import UnsupportedOperatorError
from ..frontend.converters import CACHE_IN_PLACE, CONTRIB_DOMAIN


@dataclass(frozen=True)
class DecoderInputs:
    """What a generator feeds a decoder and reads back, whatever form its cache takes: the caches' heads
    and head size (each cache ``[batch, kv_heads, length, head_size]`` of ``dtype``), ``tokens`` (the token
    id input), ``mask`` (the attention mask input), ``positions`` (a ``position_ids`` input or None),
    ``logits`` (the output kept) and ``vocab`` (its last dimension, where the file says it)."""

    kv_heads: int
    head_size: int
    tokens: str
    mask: str
    positions: str | None
    logits: str
    dtype: str = "float32"
    vocab: int | None = None


@dataclass(frozen=True)
class CacheLayout(DecoderInputs):
    """The decoder's inputs as :func:`cache_in_place` found them; ``caches``: per layer, the names of its
    past key and past value inputs (the buffers written in place)."""

    caches: tuple[tuple[str, str], ...] = field(default=(), kw_only=True)

    def shapes(self, batch: int, seq, length: int) -> dict[str, tuple]:
        """``shape_dict`` of a compile taking ``seq`` tokens per call into a cache of ``length`` steps
        (``seq`` a name: that many tokens as a symbolic length, known at each call)."""
        shapes = {self.tokens: (batch, seq), self.mask: (batch, length)}
        if self.positions is not None:
            shapes[self.positions] = (batch, seq)
        for key, value in self.caches:
            shapes[key] = shapes[value] = (batch, self.kv_heads, length, self.head_size)
        return shapes


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _producer_width(model: onnx.ModelProto, name: str) -> int | None:
    """The last dimension of tensor ``name`` where its producer says it: ``MatMulNBits``'s ``N``, a
    ``MatMul``/``Gemm`` with a constant weight, through an ``Add`` of a bias."""
    producers = {out: n for n in model.graph.node for out in n.output}
    constants = {t.name: t for t in model.graph.initializer}
    seen = 0
    while name in producers and seen < 8:
        node, seen = producers[name], seen + 1
        if node.op_type == "MatMulNBits":
            return int(_attr(node, "N"))
        if node.op_type in ("MatMul", "Gemm") and len(node.input) > 1 and node.input[1] in constants:
            dims = constants[node.input[1]].dims
            return int(dims[0] if node.op_type == "Gemm" and _attr(node, "transB", 0) else dims[-1])
        if node.op_type != "Add":
            return None
        name = node.input[0]
    return None


def _config_head_size(path) -> int | None:
    """``head_size`` from ORT GenAI's ``genai_config.json`` beside the model file, if there is one."""
    if path is None:
        return None
    config = Path(path).with_name("genai_config.json")
    try:
        return int(json.loads(config.read_text())["model"]["decoder"]["head_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


LAST_ROW = "lowprec_last_row"  # the input :func:`last_row_logits` adds: which row of a call gets its logits


def last_row_logits(model: onnx.ModelProto, logits: str) -> onnx.ModelProto:
    """``model`` (rewritten in place) computing the logits of one row of each call, the one the int64
    input :data:`LAST_ROW` ``[1]`` names, instead of every row's: a prompt chunk needs its last token's
    (Qwen2.5-0.5B's 151936-word head is 136 M multiply-adds a row: 64 rows cost a fifth of a chunk).
    The hidden states are gathered before the node that makes the logits (``MatMulNBits`` or ``MatMul``,
    with whatever ``Cast``/``Add`` follows); a graph whose logits come otherwise is returned as it is."""
    producers = {out: node for node in model.graph.node for out in node.output}
    node = producers.get(logits)
    while node is not None and node.op_type in ("Cast", "Add") and node.input[0] in producers:
        node = producers[node.input[0]]
    if node is None or node.op_type not in ("MatMulNBits", "MatMul"):
        return model
    hidden, gathered = node.input[0], node.input[0] + "_last_row"
    model.graph.input.append(helper.make_tensor_value_info(LAST_ROW, onnx.TensorProto.INT64, [1]))
    nodes = list(model.graph.node)
    nodes.insert(nodes.index(node), helper.make_node("Gather", [hidden, LAST_ROW], [gathered], axis=1,
                                                     name="lowprec_last_row_gather"))
    node.input[0] = gathered
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def cache_in_place(model: onnx.ModelProto, path=None) -> tuple[onnx.ModelProto, CacheLayout]:
    """A copy of ``model`` whose ``GroupQueryAttention`` nodes keep their cache in place (module
    docstring), and its :class:`CacheLayout`. ``path``: the model's file (its ``genai_config.json``
    gives the head size where the graph does not).

    Raises :class:`~tvm_lowprec.errors.UnsupportedOperatorError` for a graph without
    ``GroupQueryAttention`` (a plain export's attention concatenates its past: compile it with
    :func:`tvm_lowprec.from_onnx` and fixed lengths instead) or whose past inputs are not graph inputs."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    inputs = {vi.name: vi for vi in graph.input}
    nodes = [n for n in graph.node if n.op_type == "GroupQueryAttention" and n.domain == CONTRIB_DOMAIN]
    if not nodes:
        raise UnsupportedOperatorError("the decoder has no com.microsoft.GroupQueryAttention node (ORT GenAI's builder "
                                       "writes one per layer); an in-place KV cache needs that form")
    caches, presents, kv_heads, head_size = [], set(), None, None
    for node in nodes:
        past = list(node.input[3:5]) if len(node.input) >= 5 else []
        if len(past) != 2 or not all(p in inputs for p in past):
            raise UnsupportedOperatorError(f"GroupQueryAttention {node.name!r}: its past_key/past_value are not graph "
                                           "inputs; an in-place KV cache needs them as inputs")
        caches.append(tuple(past))
        presents.update(node.output[1:3])
        heads, kv_heads = int(_attr(node, "num_heads")), int(_attr(node, "kv_num_heads"))
        node.attribute.append(helper.make_attribute(CACHE_IN_PLACE, 1))
        if head_size is None:
            width = _producer_width(model, node.input[0])
            packed = len(node.input) < 2 or not node.input[1]
            if width is not None:
                head_size = width // (heads + 2 * kv_heads if packed else heads)
    head_size = _config_head_size(path) or head_size
    if head_size is None:
        raise UnsupportedOperatorError("the KV cache's head size is neither in genai_config.json beside the model nor "
                                       "readable from the attention's query projection")
    kept = [o for o in graph.output if o.name not in presents]
    del graph.output[:]
    graph.output.extend(kept)
    names = {vi.name for vi in graph.input} - {t.name for t in graph.initializer}
    cache_names = {n for pair in caches for n in pair}
    mask = next((n for n in ("attention_mask",) if n in names), None)
    tokens = next((n for n in ("input_ids",) if n in names), None)
    if mask is None or tokens is None:
        raise UnsupportedOperatorError(f"the decoder's inputs {sorted(names - cache_names)} lack input_ids or "
                                       "attention_mask (ORT GenAI's names)")
    extra = names - cache_names - {mask, tokens, "position_ids", LAST_ROW}
    if extra:
        raise UnsupportedOperatorError(f"the decoder has inputs the generator does not feed: {sorted(extra)}")
    dims = kept[0].type.tensor_type.shape.dim
    vocab = int(dims[-1].dim_value) if dims and dims[-1].HasField("dim_value") else None
    layout = CacheLayout(kv_heads, head_size, tokens, mask, "position_ids" if "position_ids" in names else None,
                         kept[0].name, vocab=vocab, caches=tuple(caches))
    return model, layout


__all__ = ["CacheLayout", "DecoderInputs", "LAST_ROW", "cache_in_place", "last_row_logits"]
