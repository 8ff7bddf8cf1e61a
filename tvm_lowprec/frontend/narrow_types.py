"""Sub-byte tensors (ONNX ``int4``, ``uint4``, ``int2``, ``uint2``, ``float4e2m1``) carried as 8-bit ones.

TVM's Relax importer and runtime have no usable 4- or 2-bit tensors, so before import every such
tensor of the graph (inputs, outputs, initializers, constants, value infos) is given an 8-bit
carrier type holding the same values (``int8`` for the signed types, ``uint8`` for the unsigned).
Arithmetic on the values is unchanged: DequantizeLinear reads them as they are. Where a tensor is
*made* in the narrow type, its range is enforced: a QuantizeLinear that saturates to a narrow type
saturates to the carrier and then to the narrow range (a Clip after it: nested clamps are one
clamp), so the values are those ONNX defines. float4 e2m1 is carried as float8 e4m3fn (which holds
its 15 values exactly), and a QuantizeLinear into float4 rounds to the float4 grid (the converter
reads the node's ``lowprec_round_to`` attribute) before storing the e4m3fn code. :func:`tvm_lowprec.compile` converts inputs given
in the narrow ``ml_dtypes`` types to the carrier and outputs back (``from_onnx`` records which).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# ONNX type -> (carrier ONNX type, carrier numpy dtype, lowest, highest, ml_dtypes name)
NARROW = {
    TensorProto.INT4: (TensorProto.INT8, "int8", -8, 7, "int4"),
    TensorProto.UINT4: (TensorProto.UINT8, "uint8", 0, 15, "uint4"),
    TensorProto.INT2: (TensorProto.INT8, "int8", -2, 1, "int2"),
    TensorProto.UINT2: (TensorProto.UINT8, "uint8", 0, 3, "uint2"),
}
RANGES = {name: (carrier, lo, hi) for _, carrier, lo, hi, name in NARROW.values()}
# float4 e2m1: carried as float8 e4m3fn, which holds every float4 value exactly; a QuantizeLinear into
# float4 is marked (ROUND_TO) so that its converter rounds to the float4 grid before storing
FLOAT4 = {TensorProto.FLOAT4E2M1: (TensorProto.FLOAT8E4M3FN, "float8_e4m3fn", "float4_e2m1fn")}
CARRIERS = {**{name: carrier for name, (carrier, _, _) in RANGES.items()},
            **{name: carrier for _, carrier, name in FLOAT4.values()}}
ROUND_TO = "lowprec_round_to"  # node attribute read by tvm_lowprec.frontend.converters.QuantizeLinear
_CARRIER_TYPE = {**{t: v[0] for t, v in NARROW.items()}, **{t: v[0] for t, v in FLOAT4.items()}}
_NAME = {**{t: v[4] for t, v in NARROW.items()}, **{t: v[2] for t, v in FLOAT4.items()}}


def _widen_tensor(t: TensorProto) -> TensorProto | None:
    if t.data_type not in _CARRIER_TYPE:
        return None
    import ml_dtypes

    carrier = getattr(ml_dtypes, CARRIERS[_NAME[t.data_type]], None) or CARRIERS[_NAME[t.data_type]]
    return numpy_helper.from_array(np.asarray(numpy_helper.to_array(t)).astype(carrier), t.name)


def _widen_value_info(vi: onnx.ValueInfoProto) -> str | None:
    tt = vi.type.tensor_type
    if tt.elem_type in _CARRIER_TYPE:
        name = _NAME[tt.elem_type]
        tt.elem_type = _CARRIER_TYPE[tt.elem_type]
        return name
    return None


def widen_narrow_types(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict, list]:
    """The model with 8-bit carriers; ``{input name: narrow type}`` and, per output, its narrow type
    name or ``""``. The model is returned unchanged (the same object) when it has no narrow tensor."""
    types = {t.data_type for t in model.graph.initializer}
    types |= {vi.type.tensor_type.elem_type for vi in (*model.graph.input, *model.graph.output, *model.graph.value_info)}
    for node in model.graph.node:
        types |= {a.t.data_type for a in node.attribute if a.type == onnx.AttributeProto.TENSOR}
        types |= {a.i for a in node.attribute if a.name in ("output_dtype", "to")}
    if not types & set(_CARRIER_TYPE):
        return model, {}, [""] * len(model.graph.output)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    narrow_of = {}  # tensor name -> narrow type name (for every narrow tensor we can see)
    inputs = {}
    for vi in g.input:
        name = _widen_value_info(vi)
        if name:
            inputs[vi.name] = narrow_of[vi.name] = name
    outputs = []
    for vi in g.output:
        name = _widen_value_info(vi)
        outputs.append(name or "")
        if name:
            narrow_of[vi.name] = name
    for vi in g.value_info:
        name = _widen_value_info(vi)
        if name:
            narrow_of[vi.name] = name
    for i, t in enumerate(g.initializer):
        wide = _widen_tensor(t)
        if wide is not None:
            narrow_of[t.name] = _NAME[t.data_type]
            g.initializer[i].CopyFrom(wide)
    nodes = []
    for index, node in enumerate(g.node):
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in _CARRIER_TYPE:
                narrow_of[node.output[0]] = _NAME[attr.t.data_type]
                attr.t.CopyFrom(_widen_tensor(attr.t))
            if attr.name == "to" and attr.i in _CARRIER_TYPE:
                raise NotImplementedError(f"Cast to {_NAME[attr.i]} (node {node.name or index}) is not supported")
        made = None
        if node.op_type == "QuantizeLinear":
            for attr in node.attribute:
                if attr.name == "output_dtype" and attr.i in _CARRIER_TYPE:
                    made = _NAME[attr.i]
                    attr.i = _CARRIER_TYPE[attr.i]
            if made is None and len(node.input) > 2 and node.input[2] in narrow_of:
                made = narrow_of[node.input[2]]
        if made is None:
            nodes.append(node)
            continue
        if made not in RANGES:  # float4: the converter rounds to its grid
            node.attribute.append(helper.make_attribute(ROUND_TO, made))
            nodes.append(node)
            narrow_of[node.output[0]] = made
            continue
        # saturate to the narrow range: QuantizeLinear into a temporary, then a Clip to the output
        carrier, lo, hi = RANGES[made]
        final = node.output[0]
        node.output[0] = f"{final}__lowprec_{carrier}"
        bounds = [f"{final}__lowprec_min", f"{final}__lowprec_max"]
        g.initializer.extend([numpy_helper.from_array(np.array(v, carrier), n) for n, v in zip(bounds, (lo, hi))])
        nodes += [node, helper.make_node("Clip", [node.output[0], *bounds], [final], name=f"{node.name or index}_{made}_range")]
        narrow_of[final] = made
    del g.node[:]
    g.node.extend(nodes)
    return out, inputs, outputs
