"""ONNX-level rewrite of QOperator nodes into the QDQ form TVM's importer reads.

``QLinearMatMul(a, sa, za, b, sb, zb, sy, zy)`` becomes ``QuantizeLinear(MatMul(DQ(a), DQ(b)), sy, zy)``,
and ``QLinearConv`` likewise ``Q(Conv(DQ(x), DQ(w)[, DQ(bias)]))``: the same computations by the ONNX
definitions. The integer rewrite (:mod:`tvm_lowprec.quant.qdq_to_integer`)
turns it back into one integer kernel. Runs before import; one function per operator, found in a table.

ONNX Runtime's QOperator format also writes its ``com.microsoft`` contrib operators around the
convolutions (``QLinearAdd``, ``QLinearMul``, ``QLinearSigmoid``, ``QLinearLeakyRelu``,
``QLinearGlobalAveragePool``, ``QLinearAveragePool``, ``QLinearConcat``, ``QLinearSoftmax``, and
``QGemm`` for a Gemm): each is
``Q(op(DQ(x1), DQ(x2), ...))`` by its definition in ONNX Runtime's ContribOperators.md, with the
operator's own attributes (``channels_last`` pools, which have no ONNX counterpart, stay as they are:
the importer then names them). The Q/DQ passes fold them as they fold the QDQ format.
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


def _dq_input(name, x, scale, zp):
    """A DequantizeLinear of an input whose zero point may be omitted (the contrib operators' optional inputs)."""
    return helper.make_node("DequantizeLinear", [x, scale] + ([zp] if zp else []), [name], name=name)


def _contrib(op: str, inputs: int, drop=(), decline=None):
    """``Q(op(DQ(x_1), ..., DQ(x_n)))`` for a contrib operator whose inputs are ``(x, scale, zero point)``
    triples followed by the output's ``(scale, zero point)``; ``drop``: attributes the ONNX operator does
    not have; ``decline(node)``: True where no ONNX form exists (the node is kept)."""

    def rewrite(node, ranks):
        if decline is not None and decline(node):
            return [node]
        args = list(node.input) + [""] * (3 * inputs + 2 - len(node.input))
        if not all(args[3 * i] and args[3 * i + 1] for i in range(inputs)) or not all(args[3 * inputs:3 * inputs + 2]):
            # an input or a scale missing (malformed), or the output's zero point, which gives its type:
            # kept for the operator check to name
            return [node]
        base = node.name or node.output[0]
        floats = [f"{base}__in{i}_dq" for i in range(inputs)]
        nodes = [_dq_input(f, *args[3 * i:3 * i + 3]) for i, f in enumerate(floats)]
        return nodes + _apply(node, op, floats, args[3 * inputs], args[3 * inputs + 1], drop)

    return rewrite


def _apply(node, op, floats, y_scale, y_zero_point, drop=()):
    """``op`` of the dequantized inputs with the node's attributes, then its output's QuantizeLinear."""
    base = node.name or node.output[0]
    y_f = f"{base}__y_f32"
    core = helper.make_node(op, floats, [y_f], name=f"{base}__{op.lower()}")
    core.attribute.extend(a for a in node.attribute if a.name not in drop)
    return [core, helper.make_node("QuantizeLinear", [y_f, y_scale, y_zero_point], list(node.output), name=f"{base}__q")]


def _qlinear_concat(node, ranks):
    """QLinearConcat(Y_scale, Y_zero_point, (X, X_scale, X_zero_point)...) = Q(Concat(DQ(X)...))."""
    y_scale, y_zero_point, *triples = list(node.input) + ["", ""]
    triples = triples[:len(node.input) - 2]
    if not y_scale or not y_zero_point or not triples or any(not triples[i] or not (triples[i + 1:i + 2] or [""])[0]
                                         for i in range(0, len(triples), 3)):
        return [node]  # malformed, kept for the operator check to name
    base = node.name or node.output[0]
    floats, nodes = [], []
    for i in range(0, len(triples), 3):
        x, scale, zp = (triples[i:i + 3] + ["", ""])[:3]
        floats.append(f"{base}__in{i // 3}_dq")
        nodes.append(_dq_input(floats[-1], x, scale, zp))
    return nodes + _apply(node, "Concat", floats, y_scale, y_zero_point)


def _qgemm(node, ranks):
    """QGemm(A, sa, za, B, sb, zb[, C[, sy, zy]]) = [Q](Gemm(DQ(A), DQ(B)[, DQ(C, sa * sb)])): ``alpha``
    and the transposes as Gemm's; a per-channel B scale along B's N axis (0 with ``transB``); C int32
    at scale ``sa * sb``; no output scale: the float result itself."""
    args = list(node.input) + [""] * (9 - len(node.input))
    a, sa, za, b, sb, zb, c, sy, zy = args
    if not (a and sa and b and sb) or (sy and not zy):
        return [node]  # malformed (or no output type), kept for the operator check to name
    base = node.name or node.output[0]
    trans_b = any(at.name == "transB" and at.i for at in node.attribute)
    a_f, b_f = f"{base}__a_dq", f"{base}__b_dq"
    nodes = [_dq_input(a_f, a, sa, za),
             helper.make_node("DequantizeLinear", [b, sb] + ([zb] if zb else []), [b_f], name=b_f, axis=0 if trans_b else 1)]
    inputs = [a_f, b_f]
    if c:
        c_scale, c_f = f"{base}__c_scale", f"{base}__c_dq"
        nodes += [helper.make_node("Mul", [sa, sb], [c_scale], name=c_scale),
                  helper.make_node("DequantizeLinear", [c, c_scale], [c_f], name=c_f, axis=0)]
        inputs.append(c_f)
    if not sy:
        gemm = helper.make_node("Gemm", inputs, list(node.output), name=f"{base}__gemm")
        gemm.attribute.extend(node.attribute)
        return nodes + [gemm]
    return nodes + _apply(node, "Gemm", inputs, sy, zy)


def _channels_last(node) -> bool:
    return any(a.name == "channels_last" and a.i for a in node.attribute)


def _softmax_before_13(node) -> bool:
    """QLinearSoftmax's ``opset`` attribute below 13: Softmax over the flattened trailing axes."""
    return any(a.name == "opset" and a.i < 13 for a in node.attribute)


QOPERATOR_REWRITES = {
    "QLinearMatMul": _qlinear_matmul,
    "QLinearConv": _qlinear_conv,
}
# com.microsoft contrib operators, as ONNX Runtime's QOperator quantization writes them
CONTRIB_REWRITES = {
    "QLinearAdd": _contrib("Add", 2),
    "QLinearMul": _contrib("Mul", 2),
    "QLinearSigmoid": _contrib("Sigmoid", 1),
    "QLinearLeakyRelu": _contrib("LeakyRelu", 1),
    "QLinearGlobalAveragePool": _contrib("GlobalAveragePool", 1, drop=("channels_last",), decline=_channels_last),
    "QLinearAveragePool": _contrib("AveragePool", 1, drop=("channels_last",), decline=_channels_last),
    "QLinearSoftmax": _contrib("Softmax", 1, drop=("opset",), decline=_softmax_before_13),
    "QLinearConcat": _qlinear_concat,
    "QGemm": _qgemm,
}


def _rewrite_for(node):
    if node.domain == "com.microsoft":
        return CONTRIB_REWRITES.get(node.op_type)
    return QOPERATOR_REWRITES.get(node.op_type) if node.domain in ("", "ai.onnx") else None


def _ranks(model) -> dict:
    ranks = {t.name: len(t.dims) for t in model.graph.initializer}
    for vi in list(model.graph.input) + list(model.graph.value_info):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            ranks[vi.name] = len(vi.type.tensor_type.shape.dim)
    return ranks


def rewrite_qoperators(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with every QOperator node in :data:`QOPERATOR_REWRITES` and
    :data:`CONTRIB_REWRITES` in QDQ form."""
    if not any(_rewrite_for(n) for n in model.graph.node):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    ranks = _ranks(model)
    nodes = []
    for node in model.graph.node:
        rewrite = _rewrite_for(node)
        nodes.extend(rewrite(node, ranks) if rewrite else [node])
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out
