"""ONNX model -> Relax IRModule (QDQ form), with initializers bound as constants.

Steps: load and check operators (an unsupported one is reported with its node before any work),
rewrite QOperator nodes to QDQ (:mod:`.qoperator`), import with TVM's Relax importer, record the
ONNX input names on ``main`` (TVM sanitizes names; :class:`tvm_lowprec.Compiled` maps them back).
"""

from __future__ import annotations

import os
from collections import defaultdict

import onnx

from ..errors import DynamicShapeError, LowPrecError, UnsupportedOperatorError
from .converters import CONTRIB_CONVERTERS, CONTRIB_DOMAIN, EXTRA_CONVERTERS, extra_converters
from .fold_batchnorm import fold_batchnorm
from .conv1d import conv1d_as_conv2d
from .fold_shapes import dynamic_report, fold_shapes
from .gather_block_quantized import rewrite_gather_block_quantized
from .matmul_nbits import rewrite_matmul_nbits
from .narrow_types import widen_narrow_types
from .qoperator import QOPERATOR_REWRITES, rewrite_qoperators

# Unsupported QOperator ops (and a block_size on any operator but Q/DQ) are reported here rather than
# deep inside the importer.
KNOWN_UNSUPPORTED: dict[str, str] = {}


def _load(model_or_path) -> onnx.ModelProto:
    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path
    if isinstance(model_or_path, (str, os.PathLike)):
        if not os.path.exists(model_or_path):
            raise FileNotFoundError(f"ONNX model not found: {model_or_path}")
        return onnx.load(os.fspath(model_or_path))
    raise TypeError(f"from_onnx takes an onnx.ModelProto or a path, not {type(model_or_path).__name__}")


def supported_operators() -> set[str]:
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    return (set(_get_convert_map()) | set(QOPERATOR_REWRITES) | set(EXTRA_CONVERTERS)) - set(KNOWN_UNSUPPORTED)


def check_operators(model: onnx.ModelProto) -> None:
    """Raise :class:`UnsupportedOperatorError` naming every unsupported operator and its nodes."""
    supported = supported_operators()
    bad = defaultdict(list)
    for i, node in enumerate(model.graph.node):
        domain_ok = node.domain in ("", "ai.onnx") or (node.domain == CONTRIB_DOMAIN and node.op_type in CONTRIB_CONVERTERS)
        if not domain_ok or node.op_type not in supported:
            bad[(node.domain, node.op_type)].append(node.name or f"#{i} -> {', '.join(node.output)}")
        for attr in node.attribute:  # blocked Q/DQ: integer types (converters.py), not float8 yet
            if attr.name == "block_size" and attr.i and node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
                bad[(node.domain, f"{node.op_type}(block_size={attr.i})")].append(node.name or f"#{i}")
    if bad:
        lines = []
        for (domain, op), nodes in bad.items():
            why = KNOWN_UNSUPPORTED.get(op, "no converter")
            qual = f"{domain}::{op}" if domain not in ("", "ai.onnx") else op
            lines.append(f"  {qual} ({why}) at node(s): {', '.join(nodes[:5])}{' ...' if len(nodes) > 5 else ''}")
        raise UnsupportedOperatorError("unsupported ONNX operator(s):\n" + "\n".join(lines))


LINEAR_NODES = ("MatMul", "Gemm", "Conv")  # one relax matmul / conv2d each, in graph order


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def from_onnx(model_or_path, shape_dict: dict | None = None):
    """Import an ONNX model (FP32, QDQ or QOperator form) as a Relax ``IRModule``.

    Parameters
    ----------
    model_or_path : onnx.ModelProto or str
        The model or its file.
    shape_dict : dict, optional
        ``{input_name: shape}`` fixing dynamic dimensions. With every input's shape fixed (here or in
        the file), every shape computation of the graph is folded to constants before the Relax
        importer runs (:mod:`.fold_shapes`); a dimension left dynamic where the import needs it raises
        :class:`~tvm_lowprec.errors.DynamicShapeError`, naming the input dimension and the first node
        that depends on it.

    Returns
    -------
    tvm.IRModule
        ``main`` takes the graph inputs in order; initializers are bound as constants. The
        attribute ``lowprec.input_names`` keeps the ONNX input names, and ``lowprec.linear_nodes`` the
        names of the MatMul, Gemm and Conv nodes in graph order (layer names for :mod:`tvm_lowprec.ptq`).
        4- and 2-bit integer tensors are carried as 8-bit ones (:mod:`.narrow_types`);
        ``lowprec.narrow_inputs`` and ``lowprec.narrow_outputs`` say which, for :func:`~tvm_lowprec.compile`.

    Examples
    --------
    >>> mod = tvm_lowprec.from_onnx("model_qdq.onnx")          # doctest: +SKIP
    >>> compiled = tvm_lowprec.compile(mod, target="native")   # doctest: +SKIP
    """
    from tvm.relax.frontend.onnx import from_onnx as relax_from_onnx

    model = rewrite_matmul_nbits(_load(model_or_path))  # com.microsoft.MatMulNBits -> blocked DQ + MatMul
    model = rewrite_gather_block_quantized(model)  # com.microsoft.GatherBlockQuantized -> Gather, then dequantize
    model = rewrite_qoperators(model)  # QOperator nodes (and ORT's QLinear contrib operators) -> Q/DQ form
    check_operators(model)
    try:
        model, narrow_inputs, narrow_outputs = widen_narrow_types(model)
    except NotImplementedError as err:
        raise UnsupportedOperatorError(str(err)) from None
    model = conv1d_as_conv2d(fold_batchnorm(fold_shapes(model, shape_dict)))
    names = [vi.name for vi in _graph_inputs(model)]
    dynamic = dynamic_report(model)
    try:
        with extra_converters():
            mod = relax_from_onnx(model, keep_params_in_input=False)
    except LowPrecError:
        raise
    except (AssertionError, AttributeError, TypeError, ValueError, IndexError, KeyError, RuntimeError) as err:
        if dynamic:  # TVM's importer fails inside on symbolic shapes (a Resize's sizes): say what to fix instead
            raise DynamicShapeError(dynamic.message()) from err
        raise
    linear = [n.name or f"{n.op_type}_{i}" for i, n in enumerate(model.graph.node) if n.op_type in LINEAR_NODES]
    attrs = {"lowprec.input_names": names, "lowprec.linear_nodes": linear}
    attrs["lowprec.output_names"] = [o.name for o in model.graph.output]  # for tvm_lowprec.ptq's per-output SQNR
    if narrow_inputs or any(narrow_outputs):  # int4/uint4/int2/uint2 tensors carried as 8-bit ones
        attrs["lowprec.narrow_inputs"] = narrow_inputs
        attrs["lowprec.narrow_outputs"] = narrow_outputs
    if dynamic:
        attrs["lowprec.dynamic"] = dynamic.message()
    main = mod["main"].with_attrs(attrs)
    mod.update_func(mod.get_global_var("main"), main)
    return mod
