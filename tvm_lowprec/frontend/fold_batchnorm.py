"""BatchNormalization after a convolution, folded into the convolution's weights and bias at import.

Runs on the ONNX graph in :func:`tvm_lowprec.from_onnx`, after shape folding. A ``Conv`` with
constant float weights (and bias, if any) whose output only feeds an inference-mode
``BatchNormalization`` with constant parameters becomes one ``Conv``::

    k = scale / sqrt(var + epsilon)          (per output channel)
    W' = W * k,   b' = (b - mean) * k + beta

computed in float64 and stored as float32. Convolutions whose weights are quantized
(``DequantizeLinear`` in a QDQ model) are left alone: changing quantized weights would change the
model's integers, and there the normalization runs as a fused elementwise kernel instead.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .fold_shapes import prune_initializers
from .graph_index import consumers as graph_consumers, producers


def _foldable(conv, bn, consts, consumers, outputs) -> bool:
    if bn.op_type != "BatchNormalization" or len(bn.output) > 1 and any(bn.output[1:]):
        return False  # training mode (running statistics as outputs)
    if conv.output[0] in outputs or len(consumers.get(conv.output[0], [])) != 1:
        return False
    if any(a.name == "training_mode" and a.i for a in bn.attribute):
        return False
    weights = [conv.input[1], *(conv.input[2:3] if len(conv.input) > 2 and conv.input[2] else [])]
    return all(name in consts and consts[name].dtype == np.float32 for name in weights + list(bn.input[1:5]))


def fold_batchnorm(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every foldable ``Conv -> BatchNormalization`` pair made one ``Conv``."""
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    consumers = graph_consumers(model.graph)
    outputs = {o.name for o in model.graph.output}
    producer = producers(model.graph)
    replaced, dropped, new_inits = {}, set(), []
    for bn in model.graph.node:
        conv = producer.get(bn.input[0]) if bn.op_type == "BatchNormalization" else None
        if conv is None or conv.op_type != "Conv" or not _foldable(conv, bn, consts, consumers, outputs):
            continue
        scale, beta, mean, var = (consts[n].astype(np.float64) for n in bn.input[1:5])
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        k = scale / np.sqrt(var + eps)
        w = consts[conv.input[1]].astype(np.float64)
        bias = consts[conv.input[2]].astype(np.float64) if len(conv.input) > 2 and conv.input[2] else np.zeros(w.shape[0])
        name = conv.name or conv.output[0]
        w_name, b_name = f"{name}.bn_folded.weight", f"{name}.bn_folded.bias"
        new_inits += [numpy_helper.from_array((w * k.reshape(-1, *[1] * (w.ndim - 1))).astype(np.float32), w_name),
                      numpy_helper.from_array(((bias - mean) * k + beta).astype(np.float32), b_name)]
        fused = helper.make_node("Conv", [conv.input[0], w_name, b_name], [bn.output[0]], name=name)
        fused.attribute.extend(conv.attribute)
        replaced[id(conv)] = fused
        dropped.add(id(bn))
    if not replaced:
        return model
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    nodes = [replaced.get(id(n), n) for n in model.graph.node if id(n) not in dropped]
    del folded.graph.node[:]
    folded.graph.node.extend(nodes)
    folded.graph.initializer.extend(new_inits)
    return prune_initializers(folded)
