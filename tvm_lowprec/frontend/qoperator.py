"""ONNX-level rewrite of QOperator nodes into the QDQ form TVM's importer reads.

``QLinearMatMul(a, sa, za, b, sb, zb, sy, zy)`` becomes ``QuantizeLinear(MatMul(DQ(a), DQ(b)), sy, zy)``,
the same computation by the ONNX definition. The integer rewrite (:mod:`tvm_lowprec.quant.qdq_to_integer`)
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


QOPERATOR_REWRITES = {
    "QLinearMatMul": _qlinear_matmul,
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
