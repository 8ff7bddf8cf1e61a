"""Shape folding at import: once the inputs' shapes are fixed, every shape computation becomes a constant.

Exports from torch and the training frameworks compute shapes in the graph (``Shape -> Gather ->
Unsqueeze -> Concat -> Reshape``, ``Resize`` with computed sizes, ``Slice`` with computed ends,
anchor grids from ``Range``). With dynamic axes, TVM's Relax importer carries those computations as
symbolic expressions that its legalization then cannot lower. They are constant once the input shape
is known, so this pass, run on the ONNX graph before the Relax importer (first step of
:func:`tvm_lowprec.from_onnx`), makes them constants:

1. the graph inputs take the shapes given in ``shape_dict`` (each checked against the input's rank);
2. ONNX shape inference with data propagation gives every tensor its shape;
3. ``Shape``/``Size`` of a tensor with a static shape, and any node whose inputs are all constants
   (except quantize/dequantize, which the integer rewrite must see, and very large tensors), are
   evaluated with ``onnx.reference`` and replaced by initializers; 2-3 repeat until nothing changes.

:func:`dynamic_report` then says which inputs' dimensions and which first node remain dynamic, for
an error that names what to fix.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import InputError

# The integer rewrite matches these on constant weights: never folded away.
NEVER_FOLD = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearMatMul", "QLinearConv",
              "MatMulInteger", "ConvInteger", "RandomNormal", "RandomUniform", "RandomNormalLike",
              "RandomUniformLike", "Multinomial", "Bernoulli"}
MAX_FOLD_ELEMENTS = 1 << 20  # larger constant computations are left to the Relax constant folder
# Inputs that are a parameter of the operator, never a tensor the integer rewrite quantizes: a constant
# DequantizeLinear read only there is folded too (ORT's quantize_static quantizes a Pad's constant_value,
# which TVM's importer needs as a constant: timm's efficientvit_b0)
PARAMETER_INPUTS = {"Pad": {2}}


def fix_input_shapes(model: onnx.ModelProto, shape_dict: dict | None) -> onnx.ModelProto:
    """A copy of ``model`` whose graph inputs named in ``shape_dict`` have those shapes: per dimension an
    int (fixed) or a name (kept symbolic under that name, one variable wherever it appears). A key that
    is not an input but a dimension name of the inputs (``"batch_size": 1``) fixes that dimension in
    every input that has it."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    if not shape_dict:
        return fixed
    inits = {t.name for t in fixed.graph.initializer}
    inputs = {vi.name: vi for vi in fixed.graph.input if vi.name not in inits}
    named = {d.dim_param for vi in inputs.values() for d in vi.type.tensor_type.shape.dim if d.dim_param}
    for name, shape in shape_dict.items():
        if name not in inputs and name in named and isinstance(shape, (int, np.integer)):
            for vi in inputs.values():
                for dim in vi.type.tensor_type.shape.dim:
                    if dim.dim_param == name:
                        dim.Clear()
                        dim.dim_value = _positive(int(shape), name)
            continue
        if name not in inputs:
            raise InputError(f"shape_dict names {name!r}, which is not an input of the model (inputs: "
                             f"{sorted(inputs)}) nor one of their named dimensions ({sorted(named)})")
        dims = inputs[name].type.tensor_type.shape.dim
        shape = [d if isinstance(d, str) else int(d) for d in shape]
        if len(dims) != len(shape) or min((d for d in shape if isinstance(d, int)), default=1) < 1:
            raise InputError(f"shape_dict[{name!r}] = {shape}: the input has rank {len(dims)} "
                             f"({_dims_text(dims)}) and every dimension must be positive or a name")
        for dim, value in zip(dims, shape):
            if dim.HasField("dim_value") and (isinstance(value, str) or dim.dim_value != value):
                raise InputError(f"shape_dict[{name!r}] = {shape} contradicts the model's static shape {_dims_text(dims)}")
            dim.Clear()
            if isinstance(value, str):
                dim.dim_param = value
            else:
                dim.dim_value = value
    return fixed


def _positive(value: int, name: str) -> int:
    if value < 1:
        raise InputError(f"shape_dict[{name!r}] = {value}: a dimension must be positive")
    return value


def _dims_text(dims) -> str:
    return "[" + ", ".join(str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in dims) + "]"


def _static_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...] | None]:
    """Tensor name -> static shape, or None where a dimension is unknown."""
    shapes = {}
    for vi in (*model.graph.input, *model.graph.value_info, *model.graph.output):
        if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            shapes.setdefault(vi.name, None)
            continue
        dims = vi.type.tensor_type.shape.dim
        static = all(d.HasField("dim_value") for d in dims)
        shapes[vi.name] = tuple(d.dim_value for d in dims) if static else None
    for t in model.graph.initializer:
        shapes[t.name] = tuple(t.dims)
    return shapes


def _infer(model: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except onnx.shape_inference.InferenceError:
        return model  # folding works with what is known; the importer reports the rest


def _shape_value(node, shapes):
    shape = shapes.get(node.input[0])
    if shape is None:
        return None
    if node.op_type == "Size":
        return [np.array(int(np.prod(shape)), np.int64)]
    attrs = {a.name: a.i for a in node.attribute}
    start, end = attrs.get("start", 0), attrs.get("end", len(shape))
    return [np.array(shape[start:end], np.int64)]


def _evaluate(node, consts, opsets):
    from onnx.reference import ReferenceEvaluator

    inputs = [name for name in node.input if name]
    if any(name not in consts for name in inputs):
        return None
    if sum(consts[name].size for name in inputs) > MAX_FOLD_ELEMENTS:
        return None
    graph = helper.make_graph([node], "fold", [], [helper.make_value_info(o, onnx.TypeProto()) for o in node.output],
                              [numpy_helper.from_array(consts[name], name) for name in dict.fromkeys(inputs)])
    model = helper.make_model(graph, opset_imports=opsets)
    try:
        return [np.asarray(v) for v in ReferenceEvaluator(model).run(None, {})]
    except Exception:  # noqa: BLE001 - onnx.reference's own limits (its GatherElements takes at most 64
        return None  # choices: a TorchScript BERT's position ids): the node stays, for the importer


def _foldable(node, parameters_only=frozenset()) -> bool:
    """Whether ``node`` may be evaluated when its inputs are constants; ``parameters_only``: the tensors
    read only as an operator's parameter (:data:`PARAMETER_INPUTS`), whose dequantize may be."""
    if node.op_type == "DequantizeLinear" and node.domain in ("", "ai.onnx"):
        return all(o in parameters_only for o in node.output)
    return (node.op_type not in NEVER_FOLD and node.domain in ("", "ai.onnx")
            and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute))


def _parameters_only(graph: onnx.GraphProto) -> frozenset:
    """The tensors every reader of which reads as a parameter (:data:`PARAMETER_INPUTS`), none a graph output."""
    as_parameter, elsewhere = set(), {o.name for o in graph.output}
    for node in graph.node:
        for index, name in enumerate(node.input):
            (as_parameter if index in PARAMETER_INPUTS.get(node.op_type, ()) else elsewhere).add(name)
    return frozenset(as_parameter - elsewhere)


def _detach_parameters(model: onnx.ModelProto, consts: dict, opsets) -> None:
    """A parameter input (:data:`PARAMETER_INPUTS`) read from a DequantizeLinear of constants that other
    operators read as a tensor too (torch's exporter shares one constant 0 between a ``Pad``'s value and
    ``Where``s: MobileBERT) gets the dequantized value as an initializer of its own; the others keep the
    DequantizeLinear."""
    producers = {out: node for node in model.graph.node for out in node.output}
    parameters_only = _parameters_only(model.graph)  # those fold as they are
    for node in model.graph.node:
        for index in PARAMETER_INPUTS.get(node.op_type, ()):
            source = producers.get(node.input[index]) if index < len(node.input) else None
            if (source is None or source.op_type != "DequantizeLinear" or source.domain not in ("", "ai.onnx")
                    or node.input[index] in parameters_only):
                continue
            value = _evaluate(source, consts, opsets)
            if value is None:
                continue
            name = f"{node.input[index]}_as_{node.op_type.lower()}_parameter"
            if name not in consts:
                consts[name] = value[0]
                model.graph.initializer.append(numpy_helper.from_array(value[0], name))
            node.input[index] = name


def fold_shapes(model: onnx.ModelProto, shape_dict: dict | None = None) -> onnx.ModelProto:
    """The model with its inputs' shapes fixed and every shape computation folded to initializers."""
    model = fix_input_shapes(model, shape_dict)
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    opsets = list(model.opset_import)
    _detach_parameters(model, consts, opsets)
    while True:
        model = _infer(model)
        shapes = _static_shapes(model)
        kept, folded = [], {}
        parameters_only = _parameters_only(model.graph)
        for node in model.graph.node:
            value = None
            if _foldable(node, parameters_only):
                if node.op_type in ("Shape", "Size"):
                    value = _shape_value(node, shapes)
                elif node.input or node.op_type == "Constant":
                    value = _evaluate(node, consts, opsets)
            if value is None:
                kept.append(node)
                continue
            for name, array in zip(node.output, value):
                consts[name] = folded[name] = array
        if not folded:
            return prune_initializers(model)
        del model.graph.node[:]
        model.graph.node.extend(kept)
        model.graph.initializer.extend(numpy_helper.from_array(a, n) for n, a in folded.items())
        outputs = {o.name for o in model.graph.output}
        keep_info = [vi for vi in model.graph.value_info if vi.name not in folded or vi.name in outputs]
        del model.graph.value_info[:]
        model.graph.value_info.extend(keep_info)


def _names_read(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name a graph's nodes read, subgraphs (If, Loop) included."""
    names = set()
    for node in graph.node:
        names.update(node.input)
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                names |= _names_read(sub)
    return names


def prune_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """Drop initializers nothing reads (the inputs of folded nodes)."""
    used = _names_read(model.graph) | {o.name for o in model.graph.output} | {vi.name for vi in model.graph.input}
    kept = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return model


@dataclass(frozen=True)
class DynamicReport:
    """What stays dynamic after folding: graph input dimensions, and the first node whose output
    shape is unknown (the one a fix must reach)."""

    inputs: tuple[tuple[str, int, str], ...]  # (input, axis, dim_param)
    first_node: str | None

    def __bool__(self) -> bool:
        return bool(self.inputs)

    def message(self) -> str:
        dims = ", ".join(f"{name!r} dimension {axis} ({param or '?'})" for name, axis, param in self.inputs)
        fix = ", ".join(f"--shape {name}=..." for name in dict.fromkeys(n for n, _, _ in self.inputs))
        node = f"; node {self.first_node!r} is the first whose output shape depends on it" if self.first_node else ""
        return (f"dynamic input dimension(s) {dims}{node}: fix them with from_onnx(model, shape_dict={{...}}) "
                f"or {fix} on the command line")


def dynamic_report(model: onnx.ModelProto) -> DynamicReport:
    """The graph input dimensions that are not static, and the first node with an unknown output shape."""
    inits = {t.name for t in model.graph.initializer}
    dims = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        for axis, dim in enumerate(vi.type.tensor_type.shape.dim):
            if not dim.HasField("dim_value"):
                dims.append((vi.name, axis, dim.dim_param))
    if not dims:
        return DynamicReport((), None)  # static inputs: nothing to name (and no second inference)
    shapes = _static_shapes(_infer(model))
    first = next((node.name or f"{node.op_type}({node.output[0]})" for node in model.graph.node
                  if any(shapes.get(o) is None for o in node.output if o)), None)
    return DynamicReport(tuple(dims), first)
