"""ONNX-level rewrite of QOperator nodes into the QDQ form TVM's importer reads.

``QLinearMatMul(a, sa, za, b, sb, zb, sy, zy)`` becomes ``QuantizeLinear(MatMul(DQ(a), DQ(b)), sy, zy)``,
and ``QLinearConv`` likewise ``Q(Conv(DQ(x), DQ(w)[, DQ(bias)]))``: the same computations by the ONNX
definitions. The integer rewrite (:mod:`tvm_lowprec.quant.qdq_to_integer`)
turns it back into one integer kernel. Runs before import; one function per operator, found in a table.
"""

from __future__ import annotations

import onnx
from onnx import helper


def _dq(name, x, scale, zp, axis=None):
    kwargs = {} if axis is None else {"axis": axis}
    return helper.make_node("DequantizeLinear", [x, scale, zp], [name], name=name, **kwargs)


def _qlinear_matmul(node, ranks):
    a, sa, za, b, sb, zb, sy, zy = node.input
    base = node.name or node.output[0]
    a_f, b_f, y_f = f"{base}__a_dq", f"{base}__b_dq", f"{base}__y_f32"
    b_rank = ranks.get(b, 2)
    return [
        _dq(a_f, a, sa, za),
        # a per-column weight scale runs along b's last axis
        _dq(b_f, b, sb, zb, axis=b_rank - 1),
        helper.make_node("MatMul", [a_f, b_f], [y_f], name=f"{base}__matmul"),
        helper.make_node("QuantizeLinear", [y_f, sy, zy], list(node.output), name=f"{base}__q"),
    ]


def _qlinear_conv(node, ranks):
    """QLinearConv(x, sx, zx, w, sw, zw, sy, zy[, B]) = Q(Conv(DQ(x), DQ(w, axis 0)[, DQ(B, sx*sw)]))."""
    x, sx, zx, w, sw, zw, sy, zy = node.input[:8]
    bias = node.input[8] if len(node.input) > 8 and node.input[8] else None
    base = node.name or node.output[0]
    x_f, w_f, y_f = f"{base}__x_dq", f"{base}__w_dq", f"{base}__y_f32"
    nodes = [_dq(x_f, x, sx, zx), _dq(w_f, w, sw, zw, axis=0)]
    conv_inputs = [x_f, w_f]
    if bias is not None:  # int32 bias at scale x_scale * w_scale (per output channel), zero point 0
        b_scale, b_f = f"{base}__b_scale", f"{base}__b_dq"
        nodes.append(helper.make_node("Mul", [sx, sw], [b_scale], name=b_scale))
        nodes.append(helper.make_node("DequantizeLinear", [bias, b_scale], [b_f], name=b_f, axis=0))
        conv_inputs.append(b_f)
    conv = helper.make_node("Conv", conv_inputs, [y_f], name=f"{base}__conv")
    conv.attribute.extend(node.attribute)
    nodes += [conv, helper.make_node("QuantizeLinear", [y_f, sy, zy], list(node.output), name=f"{base}__q")]
    return nodes


QOPERATOR_REWRITES = {
    "QLinearMatMul": _qlinear_matmul,
    "QLinearConv": _qlinear_conv,
}


def _ranks(model) -> dict:
    ranks = {t.name: len(t.dims) for t in model.graph.initializer}
    for vi in list(model.graph.input) + list(model.graph.value_info):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            ranks[vi.name] = len(vi.type.tensor_type.shape.dim)
    return ranks


def rewrite_qoperators(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with every QOperator node in :data:`QOPERATOR_REWRITES` in QDQ form."""
    if not any(n.op_type in QOPERATOR_REWRITES for n in model.graph.node):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    ranks = _ranks(model)
    nodes = []
    for node in model.graph.node:
        rewrite = QOPERATOR_REWRITES.get(node.op_type)
        nodes.extend(rewrite(node, ranks) if rewrite else [node])
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out
