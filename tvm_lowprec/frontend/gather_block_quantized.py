"""ONNX Runtime's ``com.microsoft.GatherBlockQuantized`` (the token embedding of a 4-bit language model,
as ONNX Runtime GenAI's model builder writes it when the embedding is quantized or tied to the
output projection) rewritten, before import, into standard operators.

``Y = (unpack(data[indices]) - zero_points[indices]) * scales[indices]`` per block of ``block_size``
along the quantized axis: the rows are gathered first, still packed, and only they are unpacked and
dequantized (Qwen2.5-0.5B's 151936 x 896 table stays 68 MB of packed nibbles; dequantized whole it
would be 545 MB of float32). ORT's definition (its contrib operator's documentation, and checked
against ORT 1.32): ``data`` uint8, two 4-bit values a byte with the first in the low nibble (bits 4)
or one value a byte (bits 8); ``scales`` ``[rows, ceil(columns / block_size)]`` in the output's float
type; ``zero_points`` uint8, packed as ``data``, or absent: then ``2**(bits - 1)`` (8 or 128). The
arithmetic is ORT's: ``(q - zp)``, exact, times the scale, one rounding.

The unpacking in the graph is float arithmetic that is exact on bytes (``hi = floor(b / 16)``, ``lo =
b - 16 * hi``), so TVM's importer needs no bitwise operators. Supported: 2-D ``data``, ``gather_axis``
0 and ``quantize_axis`` 1 (the embedding form); anything else raises
:class:`~tvm_lowprec.errors.UnsupportedOperatorError` naming the node.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import UnsupportedOperatorError
from .graph_index import attributes
from .matmul_nbits import DOMAIN, unpack

OP = "GatherBlockQuantized"


def _rewrite(node, consts: dict, index: int):
    attrs = attributes(node)
    bits, block = int(attrs.get("bits", 4)), int(attrs.get("block_size", 128))
    gather_axis, quantize_axis = int(attrs.get("gather_axis", 0)), int(attrs.get("quantize_axis", 1))
    name = node.name or f"{OP}_{index}"
    inputs = list(node.input) + [""] * (4 - len(node.input))
    data, indices, scales, zps = inputs[:4]
    if data not in consts or scales not in consts or (zps and zps not in consts):
        raise UnsupportedOperatorError(f"{OP} {name}: data, scales and zero points must be constants")
    packed, scale = consts[data], consts[scales]
    if packed.dtype != np.uint8 or packed.ndim != 2 or bits not in (4, 8):
        raise UnsupportedOperatorError(f"{OP} {name}: uint8 2-D data of 4 or 8 bits is supported, not "
                                       f"{packed.dtype} {packed.ndim}-D with bits={bits}")
    if gather_axis != 0 or quantize_axis not in (1, -1):
        raise UnsupportedOperatorError(f"{OP} {name}: gather_axis 0 and quantize_axis 1 are supported, not "
                                       f"{gather_axis} and {quantize_axis}")
    rows, columns = packed.shape[0], packed.shape[1] * (8 // bits)
    k_blocks = -(-columns // block)
    if scale.shape != (rows, k_blocks) or columns % block:
        raise UnsupportedOperatorError(f"{OP} {name}: scales {scale.shape} for {rows} rows of {columns} values "
                                       f"in blocks of {block}")
    if not np.all(np.isfinite(scale)):
        raise UnsupportedOperatorError(f"{OP} {name}: scales must be finite")
    zp = (unpack(consts[zps], bits, k_blocks) if zps else np.full((rows, k_blocks), 1 << (bits - 1), np.uint8))
    float_type = helper.np_dtype_to_tensor_dtype(scale.dtype)
    base = f"{name}__gbq"
    inits = [numpy_helper.from_array(np.ascontiguousarray(zp.astype(np.uint8)), f"{base}_zp"),
             numpy_helper.from_array(np.array([16.0], np.float32), f"{base}_16"),
             numpy_helper.from_array(np.array([-1, columns], np.int64), f"{base}_flat"),
             numpy_helper.from_array(np.array([-1, k_blocks, block], np.int64), f"{base}_blocks"),
             numpy_helper.from_array(np.array([-1, k_blocks, 1], np.int64), f"{base}_per_block"),
             numpy_helper.from_array(np.array([-1], np.int64), f"{base}_last")]
    g = lambda suffix: f"{base}_{suffix}"  # noqa: E731
    nodes = [
        helper.make_node("Gather", [data, indices], [g("rows")], axis=0),
        helper.make_node("Cast", [g("rows")], [g("bytes")], to=TensorProto.FLOAT),
        helper.make_node("Reshape", [g("bytes"), g("flat") if bits == 8 else g("last_bytes_shape")],
                         [g("q")] if bits == 8 else [g("bytes_flat")]),
    ]
    if bits == 4:  # low nibble first: [n, columns / 2] bytes -> [n, columns / 2, 2] -> [n, columns]
        inits.append(numpy_helper.from_array(np.array([-1, columns // 2, 1], np.int64), f"{base}_last_bytes_shape"))
        nodes += [
            helper.make_node("Div", [g("bytes_flat"), g("16")], [g("sixteenths")]),
            helper.make_node("Floor", [g("sixteenths")], [g("hi")]),
            helper.make_node("Mul", [g("hi"), g("16")], [g("hi16")]),
            helper.make_node("Sub", [g("bytes_flat"), g("hi16")], [g("lo")]),
            helper.make_node("Concat", [g("lo"), g("hi")], [g("pairs")], axis=-1),
            helper.make_node("Reshape", [g("pairs"), g("flat")], [g("q")]),
        ]
    nodes += [
        helper.make_node("Gather", [g("zp"), indices], [g("zp_rows")], axis=0),
        helper.make_node("Cast", [g("zp_rows")], [g("zp_f")], to=TensorProto.FLOAT),
        helper.make_node("Reshape", [g("q"), g("blocks")], [g("q_blocks")]),
        helper.make_node("Reshape", [g("zp_f"), g("per_block")], [g("zp_blocks")]),
        helper.make_node("Sub", [g("q_blocks"), g("zp_blocks")], [g("centered")]),  # exact: small integers
        helper.make_node("Cast", [g("centered")], [g("centered_t")], to=float_type),
        helper.make_node("Gather", [scales, indices], [g("scale_rows")], axis=0),
        helper.make_node("Reshape", [g("scale_rows"), g("per_block")], [g("scale_blocks")]),
        helper.make_node("Mul", [g("centered_t"), g("scale_blocks")], [g("values")]),
        helper.make_node("Shape", [indices], [g("index_shape")]),
        helper.make_node("Concat", [g("index_shape"), g("columns")], [g("out_shape")], axis=0),
        helper.make_node("Reshape", [g("values"), g("out_shape")], [node.output[0]]),
    ]
    inits.append(numpy_helper.from_array(np.array([columns], np.int64), f"{base}_columns"))
    return nodes, inits


def _constants(graph) -> dict:
    """Initializers, ``Constant`` outputs and reshapes of those (the builder's tied embedding reads the
    output projection's packed weights through a Reshape from ``[N, blocks, bytes]`` to ``[N, bytes]``)."""
    consts = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:  # in graph order: producers first
        if node.op_type == "Constant" and not node.domain and len(node.attribute) == 1 and node.attribute[0].name == "value":
            consts[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        elif (node.op_type == "Reshape" and not node.domain and len(node.input) == 2
              and all(i in consts for i in node.input) and not attributes(node).get("allowzero", 0)):
            data, shape = consts[node.input[0]], [int(d) for d in consts[node.input[1]]]
            shape = [data.shape[i] if d == 0 else d for i, d in enumerate(shape)]
            consts[node.output[0]] = data.reshape(shape)
    return consts


def rewrite_gather_block_quantized(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with every ``com.microsoft.GatherBlockQuantized`` in standard operators (the
    model itself when it has none)."""
    if not any(n.op_type == OP and n.domain == DOMAIN for n in model.graph.node):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    consts = _constants(model.graph)
    nodes, inits = [], []
    for index, node in enumerate(model.graph.node):
        if node.op_type == OP and node.domain == DOMAIN:
            new_nodes, new_inits = _rewrite(node, consts, index)
            nodes += new_nodes
            inits += new_inits
        else:
            nodes.append(node)
    out.graph.initializer.extend(inits)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


__all__ = ["rewrite_gather_block_quantized"]
