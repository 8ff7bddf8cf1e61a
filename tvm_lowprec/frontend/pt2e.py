"""PyTorch's own quantization in: PT2E models through TVM's PyTorch frontend.

PyTorch quantizes a model for export with its PT2E flow (``prepare_pt2e`` / ``convert_pt2e``, in
torchao since torch 2.10: ``torchao.quantization.pt2e.quantize_pt2e`` with, for x86,
``X86InductorQuantizer``). The converted model, captured with ``torch.export``, holds the quantization
as ``quantized_decomposed`` operators: ``quantize_per_tensor``, ``dequantize_per_tensor``,
``dequantize_per_channel`` (weights) and ``quantize_per_channel``, each with its scale, zero point,
code range and code dtype as arguments. TVM 0.27's ``from_exported_program`` has no converter for
them; :func:`convert_map` makes one for an exported program (``custom_convert_map``), and
:func:`from_pt2e` imports with it.
They become ``R.quantize`` / ``R.dequantize``, what TVM's ONNX importer makes of a QDQ model, so a PT2E
model compiles to the same integer kernels.

The arithmetic is PyTorch's: ``quantize`` is ``clamp(round(x * (1 / scale)) + zero_point, qmin, qmax)``
there and ``round(x / scale)`` in ONNX and in our kernels; the two can differ by one step where
``x / scale`` lies within a float32 rounding of a tie. A code range narrower than the dtype's
(``quant_min``/``quant_max``, e.g. 0..127 with ``reduce_range``) is a clip after the quantize.
Scales and zero points must be constants: numbers in the graph, or the exported program's buffers and
constants (which TVM's importer binds only after converting the graph, so the converters read them from
the program); anything else is an :class:`~tvm_lowprec.errors.UnsupportedOperatorError` naming the node.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..errors import UnsupportedOperatorError

_TORCH_DTYPES = {"torch.uint8": "uint8", "torch.int8": "int8", "torch.int16": "int16", "torch.uint16": "uint16",
                 "torch.int32": "int32", "torch.float8_e4m3fn": "float8_e4m3fn", "torch.float8_e5m2": "float8_e5m2"}


def _dtype(node, value) -> str:
    name = _TORCH_DTYPES.get(str(value))
    if name is None:
        raise UnsupportedOperatorError(f"{node.target}: code dtype {value} (node {node.name}) has no converter; "
                                       f"supported: {sorted(set(_TORCH_DTYPES.values()))}")
    return name


def program_tensors(exported_program) -> dict:
    """The values of an exported program's buffers, constants and parameters, by the name of the graph
    placeholder that reads each."""
    values = {**dict(exported_program.named_parameters()), **dict(exported_program.named_buffers()),
              **dict(exported_program.constants)}
    out = {}
    for spec in exported_program.graph_signature.input_specs:
        if spec.target is not None and spec.target in values:
            out[spec.arg.name] = values[spec.target].detach().cpu().numpy()
    return out


def _constant(node, tensors: dict, position: int, value, what: str) -> np.ndarray:
    """A scale's or zero point's values: a Python number, a constant, or a tensor the program holds."""
    if isinstance(value, (int, float)):
        return np.asarray(value)
    if isinstance(value, tvm.ir.expr.Constant):
        return value.value.numpy()
    source = node.args[position]
    if getattr(source, "op", None) == "placeholder" and source.name in tensors:
        return tensors[source.name]
    raise UnsupportedOperatorError(
        f"{node.target}: the {what} of node {node.name} is not a constant ({type(value).__name__}); PT2E models "
        "compile with constant quantization parameters (import with keep_params_as_input=False, or bind the "
        "parameters first)")


def _arguments(node, importer, tensors: dict):
    """(input, scale, zero point, axis or None, qmin, qmax, code dtype) of a quantized_decomposed node."""
    args = importer.retrieve_args(node)
    per_channel = "per_channel" in node.target.__name__
    x, scale, zero_point = args[0], args[1], args[2]
    rest = args[3:]
    axis = int(rest[0]) if per_channel else None
    qmin, qmax, dtype = rest[1:4] if per_channel else rest[0:3]
    code = _dtype(node, dtype)
    return (x, _constant(node, tensors, 1, scale, "scale").astype(np.float32),
            _constant(node, tensors, 2, zero_point, "zero point"), axis, int(qmin), int(qmax), code)


def _parameters(scale, zero_point, code):
    zp = zero_point.astype(code if code in ("uint8", "int8", "int16", "uint16") else np.int32)
    return relax.const(scale.reshape(-1) if scale.ndim else scale), relax.const(zp.reshape(-1) if zp.ndim else zp)


def _quantize(node, importer, tensors: dict):
    x, scale, zero_point, axis, qmin, qmax, code = _arguments(node, importer, tensors)
    s, z = _parameters(scale, zero_point, code)
    bb = importer.block_builder
    axis = axis if axis is not None else -1
    y = bb.emit(relax.op.quantize(x, s, z, axis=axis, out_dtype=code))
    info = np.iinfo(code) if code in ("uint8", "int8", "int16", "uint16", "int32") else None
    if info is not None and (qmin > info.min or qmax < info.max):
        y = bb.emit(relax.op.clip(y, qmin, qmax))
    return y


def _dequantize(node, importer, tensors: dict):
    x, scale, zero_point, axis, _qmin, _qmax, code = _arguments(node, importer, tensors)
    s, z = _parameters(scale, zero_point, code)
    out_dtype = "float32"
    for keyword in ("out_dtype", "output_dtype"):
        if node.kwargs.get(keyword) is not None:
            out_dtype = {"torch.float32": "float32", "torch.float16": "float16",
                         "torch.bfloat16": "bfloat16"}.get(str(node.kwargs[keyword]), "float32")
    return importer.block_builder.emit(relax.op.dequantize(x, s, z, axis=axis if axis is not None else -1,
                                                           out_dtype=out_dtype))


_CONVERTERS = {
    "quantize_per_tensor.default": _quantize,
    "quantize_per_tensor.tensor": _quantize,
    "quantize_per_channel.default": _quantize,
    "dequantize_per_tensor.default": _dequantize,
    "dequantize_per_tensor.tensor": _dequantize,
    "dequantize_per_channel.default": _dequantize,
}


def convert_map(exported_program) -> dict:
    """``custom_convert_map`` for TVM's ``from_exported_program`` of ``exported_program``: its
    ``quantized_decomposed`` operators as ``R.quantize`` / ``R.dequantize``."""
    tensors = program_tensors(exported_program)
    return {name: (lambda node, importer, fn=fn: fn(node, importer, tensors)) for name, fn in _CONVERTERS.items()}


def from_pt2e(exported_program, **kwargs):
    """A PT2E-quantized model captured by ``torch.export`` as a Relax module (TVM's
    ``from_exported_program`` with :func:`convert_map`); ``kwargs`` go to that function."""
    from tvm.relax.frontend.torch import from_exported_program

    custom = {**convert_map(exported_program), **kwargs.pop("custom_convert_map", {})}
    return from_exported_program(exported_program, custom_convert_map=custom, **kwargs)
