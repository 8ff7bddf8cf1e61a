"""Write a :func:`~tvm_lowprec.ptq.quantize` result as an ONNX QDQ model, for ONNX Runtime and other runtimes.

The original FP32 graph is kept, node for node (after the importer's own canonicalisation: shape
computations folded for the given input shapes, BatchNormalization folded into the convolution before
it, so that the weights are the ones quantize saw), and for every layer that quantize left quantized,
QuantizeLinear/DequantizeLinear nodes with the scales and zero points that calibration chose are
inserted where :func:`~tvm_lowprec.ptq.insert_qdq.insert_qdq` put them in the Relax module:

* the layer's activation input (and the second input of a matmul of two activations): Q -> DQ,
  per tensor;
* its constant weight: replaced by the integer weights quantize rounded (int8/uint8; int4 values
  carried in int8) and one DequantizeLinear, per channel with ``axis`` (the output channel: 0 for a
  Conv weight and a ``transB=1`` Gemm weight, 1 for a MatMul weight) or per tensor;
* its output, after the bias and the ReLU/Clip that follow it: Q -> DQ (the tensor keeps its name).

The bias of a layer with quantized activations and constant weights is written as ONNX Runtime's
QDQ tools write it, and as the integer kernel adds it: int32 in accumulator units ``s_x * s_w``
(``rint(bias / (s_x * s_w))``) with a DequantizeLinear (per channel, axis 0) in place of the float
constant (the Conv/Gemm bias input, or the constant operand of the Add after a MatMul); a bias that
does not fit int32 there stays float. Other biases stay float. Layers kept in FP32 (overrides, the target_sqnr
fallback) are left as they were. Blocked (per-group) 4-bit weights raise :class:`ExportError`: this
exporter does not write opset 21's blocked DequantizeLinear.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import LowPrecError
from .insert_qdq import BlockedWeight, ConstWeight, LayerPlan, TensorQuant

MIN_OPSET = 13  # per-axis QuantizeLinear/DequantizeLinear


class ExportError(LowPrecError, ValueError):
    """The quantized model cannot be written as ONNX QDQ (says which layer and why)."""


def canonical_model(model, shape_dict=None) -> onnx.ModelProto:
    """The FP32 graph as :func:`tvm_lowprec.from_onnx` imports it (shape computations folded,
    BatchNormalization folded into convolutions): the graph whose weights quantize saw."""
    from ..frontend.fold_batchnorm import fold_batchnorm
    from ..frontend.fold_shapes import fold_shapes
    from ..frontend.onnx import _load

    return fold_batchnorm(fold_shapes(_load(model), shape_dict))


def _default_opset(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


class _Writer:
    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.inits = {i.name: i for i in model.graph.initializer}
        self.new_inits: list[onnx.TensorProto] = []
        self.names = {n for node in model.graph.node for n in (*node.input, *node.output)} | set(self.inits)
        self.names |= {v.name for v in model.graph.input}

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.names:
            name, k = f"{base}_{k}", k + 1
        self.names.add(name)
        return name

    def const(self, base: str, array: np.ndarray) -> str:
        name = self.fresh(base)
        self.new_inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def qparams(self, base: str, q: TensorQuant) -> tuple[str, str]:
        scale = np.asarray(q.scale, np.float32)
        zp = np.asarray(q.zero_point).astype(q.dtype)
        return self.const(base + "_scale", scale), self.const(base + "_zero_point", zp)

    def qdq(self, tensor: str, q: TensorQuant, into: str | None = None) -> tuple[list, str]:
        """Nodes ``Q(tensor) -> DQ`` (per tensor) and the dequantized tensor's name (``into`` if given)."""
        scale, zp = self.qparams(tensor, q)
        quantized = self.fresh(tensor + "_quantized")
        out = into or self.fresh(tensor + "_dequantized")
        return [helper.make_node("QuantizeLinear", [tensor, scale, zp], [quantized], name=self.fresh(tensor + "_Q")),
                helper.make_node("DequantizeLinear", [quantized, scale, zp], [out],
                                 name=self.fresh(tensor + "_DQ"))], out


def _layer_nodes(model) -> dict[str, onnx.NodeProto]:
    from ..frontend.onnx import LINEAR_NODES

    return {n.name or f"{n.op_type}_{i}": n for i, n in enumerate(model.graph.node) if n.op_type in LINEAR_NODES}


def _attr(node, name, default):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _is_constant(name, inits, producers) -> bool:
    p = producers.get(name)
    return name in inits or (p is not None and p.op_type == "Constant")


def _output_tensor(node, channels: int, consumers, producers, inits, graph_outputs) -> tuple[onnx.NodeProto, str]:
    """The last node of the chain the layer fuses (a constant bias Add, then Relu / Clip), as
    :func:`~tvm_lowprec.ptq.layers.find_layers` follows it, and that node's output."""
    last, tensor = node, node.output[0]
    while tensor not in graph_outputs and len(consumers.get(tensor, [])) == 1:
        nxt = consumers[tensor][0]
        if nxt.op_type == "Add":
            other = [t for t in nxt.input if t != tensor]
            if len(other) != 1 or not _is_constant(other[0], inits, producers):
                break
            if other[0] in inits and numpy_helper.to_array(inits[other[0]]).size not in (1, channels):
                break
        elif nxt.op_type == "Clip":
            if any(t and not _is_constant(t, inits, producers) for t in nxt.input[1:]):
                break
        elif nxt.op_type != "Relu":
            break
        last, tensor = nxt, nxt.output[0]
    return last, tensor


def _bias_site(node, consumers, inits, graph_outputs) -> tuple[onnx.NodeProto, int] | None:
    """(node, input index) of the layer's constant bias: a Conv/Gemm's third input, or the constant
    operand of the Add right after a MatMul."""
    if node.op_type in ("Conv", "Gemm"):
        return (node, 2) if len(node.input) > 2 and node.input[2] in inits else None
    out = node.output[0]
    users = consumers.get(out, [])
    if out in graph_outputs or len(users) != 1 or users[0].op_type != "Add":
        return None
    add = users[0]
    index = 1 if add.input[0] == out else 0
    return (add, index) if add.input[index] in inits else None


def _int32_bias(writer, site, x: TensorQuant, weight: ConstWeight, channels: int) -> list:
    """Replace the float bias at ``site`` by DequantizeLinear(int32, s_x * s_w); [] (left float) when it
    does not fit int32 or is not a per-channel (or scalar) vector."""
    node, index = site
    name = node.input[index]
    bias = numpy_helper.to_array(writer.inits[name]).astype(np.float64).reshape(-1)
    if bias.size not in (1, channels):
        return []
    acc_scale = np.broadcast_to(np.float32(np.asarray(x.scale).reshape(-1)[0]) * weight.quant.scale.astype(np.float32),
                                (channels,)).astype(np.float32)
    values = np.rint(np.broadcast_to(bias, (channels,)) / acc_scale.astype(np.float64))
    if np.any(np.abs(values) >= 2**31):
        return []
    qname = writer.const(name + "_quantized", values.astype(np.int32))
    scale = writer.const(name + "_scale", acc_scale)
    zp = writer.const(name + "_zero_point", np.zeros(channels, np.int32))
    out = writer.fresh(name + "_dequantized")
    node.input[index] = out
    return [helper.make_node("DequantizeLinear", [qname, scale, zp], [out], name=writer.fresh(name + "_DQ"), axis=0)]


def _onnx_weight(node, plan: LayerPlan, w: np.ndarray) -> tuple[np.ndarray, int]:
    """The integer weights in the ONNX initializer's layout, and the per-channel axis there."""
    if node.op_type == "Conv":
        return w, 0
    if node.op_type == "Gemm":
        if _attr(node, "transA", 0) or _attr(node, "alpha", 1.0) != 1.0 or _attr(node, "beta", 1.0) != 1.0:
            raise ExportError(f"layer {plan.layer.name!r}: a Gemm with transA or alpha/beta != 1 is not written "
                              f"as QDQ by this exporter")
        return (w.T, 0) if _attr(node, "transB", 0) else (w, 1)
    return w, w.ndim - 1


def _silu_node(tensor: str, consumers) -> onnx.NodeProto | None:
    """The Mul node of ``tensor * Sigmoid(tensor)`` (either order), if the graph has it."""
    sigmoids = {n.output[0] for n in consumers.get(tensor, []) if n.op_type == "Sigmoid"}
    return next((n for n in consumers.get(tensor, []) if n.op_type == "Mul" and tensor in n.input
                 and any(i in sigmoids for i in n.input)), None)


def export_qdq(model, plans: list[LayerPlan], path=None, shape_dict=None) -> onnx.ModelProto:
    """``model`` (the FP32 ONNX model or its path, as given to :func:`tvm_lowprec.from_onnx` with
    ``shape_dict``) with ``plans`` (from :func:`~tvm_lowprec.ptq.quantize.quantize_with_plans`) written in
    as QDQ nodes; saved to ``path`` if given."""
    model = canonical_model(model, shape_dict)
    if _default_opset(model) < MIN_OPSET:
        raise ExportError(f"the model's opset {_default_opset(model)} has no per-channel DequantizeLinear; "
                          f"convert it to opset {MIN_OPSET} or later first (onnx.version_converter)")
    graph = model.graph
    nodes_by_name = _layer_nodes(model)
    unknown = [p.layer.name for p in plans if p.layer.name not in nodes_by_name]
    if unknown:
        raise ExportError(f"layer(s) {unknown} have no MatMul/Gemm/Conv node of that name in the ONNX graph "
                          f"(the module was not imported from this model?)")
    writer = _Writer(model)
    inits = writer.inits
    producers = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in graph.node:
        for t in n.input:
            consumers.setdefault(t, []).append(n)
    graph_outputs = {o.name for o in graph.output}
    before: dict[int, list] = {}
    after: dict[int, list] = {}
    for plan in plans:
        node = nodes_by_name[plan.layer.name]
        where = f"layer {plan.layer.name!r}"
        pre = before.setdefault(id(node), [])
        if plan.x is not None:
            qdq, node.input[0] = writer.qdq(node.input[0], plan.x)
            pre += qdq
        weight = plan.weight
        if isinstance(weight, BlockedWeight):
            raise ExportError(f"{where}: blocked (per-group) 4-bit weights are not written as ONNX QDQ by this "
                              f"exporter (opset 21 blocked DequantizeLinear); use PerChannel weights, or keep the "
                              f"layer in FP32 with LayerOverride(skip=True)")
        if isinstance(weight, TensorQuant):  # a matmul of two activations: its second input, per tensor
            qdq, node.input[1] = writer.qdq(node.input[1], weight)
            pre += qdq
        elif isinstance(weight, ConstWeight):
            name = node.input[1]
            if name not in inits:
                raise ExportError(f"{where}: its weight {name!r} is not an initializer of the graph")
            values, axis = _onnx_weight(node, plan, weight.values)
            original = numpy_helper.to_array(inits[name])
            q = weight.quant
            if values.shape != original.shape:
                raise ExportError(f"{where}: quantized weights {list(values.shape)} do not match the ONNX weight "
                                  f"{name!r} {list(original.shape)}")
            shape = [1] * values.ndim
            if q.scale.ndim:
                shape[axis] = -1
            dq = (values.astype(np.float64) - np.asarray(q.zero_point, np.float64).reshape(shape)) * \
                np.asarray(q.scale, np.float64).reshape(shape)
            # a layout mismatch (a transposed weight) is far off; rounding (GPTQ included) is not
            if np.linalg.norm(dq - original) > 0.5 * np.linalg.norm(original) + 1e-30:
                raise ExportError(f"{where}: the quantized weights do not round-trip to the ONNX weight {name!r} "
                                  f"(layout mismatch)")
            scale, zp = writer.qparams(name, q)
            qname = writer.const(name + "_quantized", values)
            dq_out = writer.fresh(name + "_dequantized")
            attrs = {"axis": axis} if q.scale.ndim else {}
            pre.append(helper.make_node("DequantizeLinear", [qname, scale, zp], [dq_out],
                                        name=writer.fresh(name + "_DQ"), **attrs))
            node.input[1] = dq_out
        else:
            raise ExportError(f"{where}: {type(weight).__name__} ({plan.scheme}) is not written as ONNX QDQ by this "
                              f"exporter (integer QuantizeLinear/DequantizeLinear only); keep the layer in FP32 with "
                              f"LayerOverride(skip=True)")
        channels = plan.layer.weight.shape[plan.layer.channel_axis] if plan.layer.weight is not None else 0
        # the chain the layer fuses, found before its bias initializer is replaced
        if plan.layer.runtime_weights:  # a matmul of two activations: its own output (layers.find_layers)
            last, tensor = node, node.output[0]
        else:
            last, tensor = _output_tensor(node, channels, consumers, producers, inits, graph_outputs)
        if plan.x is not None and isinstance(weight, ConstWeight):
            site = _bias_site(node, consumers, inits, graph_outputs)
            if site is not None:
                pre += _int32_bias(writer, site, plan.x, weight, channels)
        if plan.output is not None:
            raw = writer.fresh(tensor + "_float")
            last.output[0] = raw
            qdq, _ = writer.qdq(raw, plan.output, into=tensor)
            after.setdefault(id(last), []).extend(qdq)
        if plan.activation is not None:  # the SiLU after the output: Q/DQ after its Mul
            product = _silu_node(tensor, consumers)
            if product is None:
                raise ExportError(f"{where}: its SiLU (Mul of the output and its Sigmoid) is not in the ONNX graph")
            silu = product.output[0]
            product.output[0] = writer.fresh(silu + "_float")
            qdq, _ = writer.qdq(product.output[0], plan.activation, into=silu)
            after.setdefault(id(product), []).extend(qdq)
    ordered = []
    for n in graph.node:
        ordered += before.get(id(n), []) + [n] + after.get(id(n), [])
    del graph.node[:]
    graph.node.extend(ordered)
    graph.initializer.extend(writer.new_inits)
    used = {t for n in graph.node for t in n.input}
    kept = [i for i in graph.initializer if i.name in used or i.name in graph_outputs]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    onnx.checker.check_model(model)
    if path is not None:
        onnx.save(model, str(path))
    return model


__all__ = ["ExportError", "canonical_model", "export_qdq"]
