"""1-D convolutions as 2-D convolutions of height one, on the ONNX graph before the Relax importer.

TVM's importer makes an ONNX ``Conv`` over ``[N, C, L]`` a ``relax.nn.conv1d``, which no integer kernel
takes: Whisper's two Conv1d ran as float, 1.5 s of the encoder's 1.8 s. Here such a ``Conv`` becomes
``Unsqueeze(axis 2) -> Conv (kernel [1, K], pads [0, b, 0, e], strides [1, s], dilations [1, d]) ->
Squeeze(axis 2)``, and its weight a ``[O, C/g, 1, K]`` initializer. In the QDQ form ONNX Runtime writes,
the moves go where the integer rewrite still sees its pattern (``quantize(conv2d(dequantize(x),
dequantize(W)))``): the input's ``Unsqueeze`` before its ``DequantizeLinear`` (on the 8-bit codes, a
new dequantize after it), the ``Squeeze`` after the output's ``QuantizeLinear`` where that is the
convolution's only reader (a move commutes with a per-tensor quantize), and the weight's initializer
reshaped under its ``DequantizeLinear`` (per-channel along axis 0 still). The graph's values are the same.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .graph_index import attributes, consumers, producers


class _Graph:
    """Name lookups over one ONNX graph, and fresh names."""

    def __init__(self, graph: onnx.GraphProto):
        self.graph = graph
        self.inits = {t.name: t for t in graph.initializer}
        self.producer = producers(graph)
        self.readers = consumers(graph)
        self.outputs = {o.name for o in graph.output}
        self.count = 0

    def fresh(self, base: str) -> str:
        self.count += 1
        return f"{base}__conv1d_{self.count}"

    def rank3_weight(self, name):
        """The initializer under ``name`` (directly or as a per-channel DequantizeLinear's input), if 3-D."""
        init = self.inits.get(name)
        if init is None and (dq := self.producer.get(name)) is not None and dq.op_type == "DequantizeLinear":
            init = self.inits.get(dq.input[0])
        return init if init is not None and len(init.dims) == 3 else None


def _one_d_convs(g: _Graph) -> list:
    return [n for n in g.graph.node if n.op_type == "Conv" and n.domain in ("", "ai.onnx") and len(n.input) >= 2
            and g.rank3_weight(n.input[1]) is not None]


def _unsqueeze(g, name, new_nodes, axes):
    out = g.fresh(name)
    new_nodes.append(helper.make_node("Unsqueeze", [name, axes], [out]))
    return out


def _input_4d(g, name, new_nodes, axes):
    """``name`` with a unit axis 2: unsqueezed before its per-tensor DequantizeLinear where it has one."""
    dq = g.producer.get(name)
    if dq is not None and dq.op_type == "DequantizeLinear" and attributes(dq).get("axis", 1) == 1 and \
            all(g.inits.get(p) is not None and len(g.inits[p].dims) == 0 for p in dq.input[1:]):
        codes = _unsqueeze(g, dq.input[0], new_nodes, axes)
        out = g.fresh(name)
        new_nodes.append(helper.make_node("DequantizeLinear", [codes, *dq.input[1:]], [out]))
        return out
    return _unsqueeze(g, name, new_nodes, axes)


def _weight_4d(g, name, new_inits, new_nodes):
    """The weight as ``[O, C/g, 1, K]``: its initializer reshaped, under its DequantizeLinear if any."""
    init = g.inits.get(name)
    dq = None if init is not None else g.producer[name]
    init = init if init is not None else g.inits[dq.input[0]]
    value = numpy_helper.to_array(init)
    reshaped = numpy_helper.from_array(value.reshape(value.shape[0], value.shape[1], 1, value.shape[2]),
                                       g.fresh(init.name))
    new_inits.append(reshaped)
    if dq is None:
        return reshaped.name
    out = g.fresh(name)
    new_nodes.append(helper.make_node("DequantizeLinear", [reshaped.name, *dq.input[1:]], [out],
                                      axis=attributes(dq).get("axis", 1)))
    return out


def conv1d_as_conv2d(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every 1-D ``Conv`` written as a 2-D one of height one (the model itself when none)."""
    g = _Graph(model.graph)
    convs = _one_d_convs(g)
    if not convs:
        return model
    axes = g.fresh("axis2")
    new_inits = [numpy_helper.from_array(np.array([2], np.int64), axes)]
    replaced: dict = {}  # (op type, first output) of an original node -> the nodes that replace it
    for conv in convs:
        nodes: list = []
        x = _input_4d(g, conv.input[0], nodes, axes)
        w = _weight_4d(g, conv.input[1], new_inits, nodes)
        y2 = g.fresh(conv.output[0])
        given = attributes(conv)
        pads = list(given.get("pads", [0, 0]))
        attrs = {"strides": [1, *given.get("strides", [1])], "dilations": [1, *given.get("dilations", [1])],
                 "group": given.get("group", 1)}
        if given.get("auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET"):
            attrs["pads"] = [0, pads[0], 0, pads[1]]
        else:
            attrs["auto_pad"] = given["auto_pad"]
        kernel = given.get("kernel_shape")
        if kernel is not None:
            attrs["kernel_shape"] = [1, *kernel]
        nodes.append(helper.make_node("Conv", [x, w, *conv.input[2:]], [y2], name=conv.name, **attrs))
        readers = g.readers.get(conv.output[0], [])
        q = readers[0] if len(readers) == 1 else None
        if q is not None and q.op_type == "QuantizeLinear" and conv.output[0] not in g.outputs and \
                all(g.inits.get(p) is not None and len(g.inits[p].dims) == 0 for p in q.input[1:]):
            q4 = g.fresh(q.output[0])  # quantize first, then squeeze the codes
            nodes += [helper.make_node("QuantizeLinear", [y2, *q.input[1:]], [q4], **attributes(q)),
                      helper.make_node("Squeeze", [q4, axes], [q.output[0]])]
            replaced[(q.op_type, q.output[0])] = []
        else:
            nodes.append(helper.make_node("Squeeze", [y2, axes], [conv.output[0]]))
        replaced[(conv.op_type, conv.output[0])] = nodes
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = []
    for node in model.graph.node:
        kept.extend(replaced.get((node.op_type, node.output[0] if node.output else None), [node]))
    del out.graph.node[:]
    out.graph.node.extend(kept)
    out.graph.initializer.extend(new_inits)
    return out
