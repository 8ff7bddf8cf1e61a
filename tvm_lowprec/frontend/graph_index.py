"""Lookups over an ONNX graph that the frontend's rewrites share: who produces a tensor, who reads
it, and a node's attributes as Python values."""

from __future__ import annotations

import onnx
from onnx import helper


def attributes(node: onnx.NodeProto) -> dict:
    """``node``'s attributes, name -> Python value."""
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    """Tensor name -> the node that writes it."""
    return {o: n for n in graph.node for o in n.output}


def consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    """Tensor name -> the nodes that read it, in graph order (a node reading it twice, twice)."""
    out: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            out.setdefault(name, []).append(node)
    return out
