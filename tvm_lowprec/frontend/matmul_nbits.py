"""ONNX Runtime's ``com.microsoft.MatMulNBits`` (what its ``MatMulNBitsQuantizer`` and model builders
emit for 4-bit weight-only models) rewritten, before import, into the standard QDQ form:

``Y = A @ DequantizeLinear(W_q, scales, zero_points, axis=0, block_size=block_size) (+ bias)``

with ``W_q`` the unpacked weights as an ``uint4`` (bits 4) or ``uint8`` (bits 8) ``[K, N]``
initializer and the per-block scales and zero points ``[ceil(K / block_size), N]``. ORT's layout
(its contrib operator's documentation): ``B`` is uint8 ``[N, k_blocks, block_size * bits / 8]``,
two 4-bit values a byte, the first in the low nibble; ``scales`` ``[N * k_blocks]``; the optional
``zero_points`` are packed the same way per row of ``N`` (``ceil(k_blocks * bits / 8)`` bytes), or
given in the scales' float type; absent, they are ``2**(bits - 1)``. Float zero points have no QDQ
form: those weights are dequantized here, exactly as ORT defines them (``(q - zp) * scale`` in
float32), into a float initializer. Only constant weights are supported (as ORT requires).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import UnsupportedOperatorError
from .graph_index import attributes

DOMAIN = "com.microsoft"


def unpack(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """``packed[..., bytes]`` (uint8) -> ``[..., count]`` unsigned values, low bits first."""
    packed = np.asarray(packed, np.uint8)
    if bits == 8:
        return packed[..., :count]
    per_byte = 8 // bits
    mask = (1 << bits) - 1
    parts = [(packed >> (bits * j)) & mask for j in range(per_byte)]
    return np.stack(parts, axis=-1).reshape(*packed.shape[:-1], -1)[..., :count]


def _rewrite(node, consts: dict, index: int):
    attrs = attributes(node)
    k, n = int(attrs["K"]), int(attrs["N"])
    bits, block = int(attrs.get("bits", 4)), int(attrs["block_size"])
    name = node.name or f"MatMulNBits_{index}"
    if bits not in (4, 8):
        raise UnsupportedOperatorError(f"MatMulNBits {name}: bits={bits} (4 and 8 are supported)")
    if block < 16 or block & (block - 1):
        raise UnsupportedOperatorError(f"MatMulNBits {name}: block_size {block} is not a power of 2 of at least 16")
    inputs = list(node.input) + [""] * (6 - len(node.input))
    a, b, scales, zps, g_idx, bias = inputs[:6]
    if b not in consts or scales not in consts:
        raise UnsupportedOperatorError(f"MatMulNBits {name}: the weights and scales must be initializers")
    if g_idx:
        raise UnsupportedOperatorError(f"MatMulNBits {name}: g_idx (act-order) is not supported")
    k_blocks = -(-k // block)
    q = unpack(consts[b].reshape(n, k_blocks, -1), bits, block).reshape(n, k_blocks * block)[:, :k]  # [N, K]
    scale = consts[scales].reshape(n, k_blocks)
    if not np.all(np.isfinite(scale)) or np.any(scale == 0):
        raise UnsupportedOperatorError(f"MatMulNBits {name}: scales must be finite and non-zero")
    zp = consts.get(zps) if zps else None
    if zps and zp is None:
        raise UnsupportedOperatorError(f"MatMulNBits {name}: the zero points must be an initializer")
    base = f"{name}__nbits"
    w_f = f"{base}_w"
    inits, nodes = [], []
    if zp is not None and zp.dtype != np.uint8:  # float zero points: dequantized here, as ORT does
        w = (q.astype(np.float32) - zp.reshape(n, k_blocks).repeat(block, axis=1)[:, :k]) * scale.repeat(block, axis=1)[:, :k]
        inits.append(numpy_helper.from_array(np.ascontiguousarray(w.T.astype(scale.dtype)), w_f))
    else:
        zp_q = (unpack(zp.reshape(n, -1), bits, k_blocks) if zp is not None
                else np.full((n, k_blocks), 1 << (bits - 1), np.uint8))
        elem = TensorProto.UINT4 if bits == 4 else TensorProto.UINT8
        inits += [
            helper.make_tensor(f"{base}_q", elem, [k, n], np.ascontiguousarray(q.T).ravel().tolist()),
            numpy_helper.from_array(np.ascontiguousarray(scale.T), f"{base}_scale"),
            helper.make_tensor(f"{base}_zp", elem, [k_blocks, n], np.ascontiguousarray(zp_q.T).ravel().tolist()),
        ]
        nodes.append(helper.make_node("DequantizeLinear", [f"{base}_q", f"{base}_scale", f"{base}_zp"], [w_f],
                                      name=f"{base}_dq", axis=0, block_size=block))
    out = node.output[0]
    if bias:
        nodes += [helper.make_node("MatMul", [a, w_f], [f"{base}_y"], name=f"{base}_matmul"),
                  helper.make_node("Add", [f"{base}_y", bias], [out], name=f"{base}_bias")]
    else:
        nodes.append(helper.make_node("MatMul", [a, w_f], [out], name=f"{base}_matmul"))
    return nodes, inits


def rewrite_matmul_nbits(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with every ``com.microsoft.MatMulNBits`` in QDQ form (the model itself when
    it has none). The opset is left as it is: the blocked DequantizeLinear and the ``uint4`` tensors
    exist from opset 21, but they never reach an ONNX checker (:mod:`.narrow_types` widens the
    ``uint4`` tensors next, and the importer takes ``block_size`` at any opset)."""
    if not any(n.op_type == "MatMulNBits" and n.domain == DOMAIN for n in model.graph.node):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    used = set()
    nodes = []
    for index, node in enumerate(model.graph.node):
        if node.op_type == "MatMulNBits" and node.domain == DOMAIN:
            new_nodes, inits = _rewrite(node, consts, index)
            nodes += new_nodes
            out.graph.initializer.extend(inits)
            used |= {node.input[1], node.input[2]} | ({node.input[3]} if len(node.input) > 3 and node.input[3] else set())
        else:
            nodes.append(node)
    still = {i for nd in nodes for i in nd.input}
    kept = [t for t in out.graph.initializer if t.name not in used or t.name in still]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    if not any(n.domain == DOMAIN for n in nodes):
        kept_opsets = [o for o in out.opset_import if o.domain != DOMAIN]
        del out.opset_import[:]
        out.opset_import.extend(kept_opsets)
    return out
