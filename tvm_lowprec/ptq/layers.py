"""The layers that post-training quantization works on, found in an FP32 Relax module.

A layer is a ``matmul`` or ``conv2d`` (NCHW/OIHW) whose second operand is a float32 constant, with
the ops that the integer kernel fuses after it: a constant bias ``add``, then ``relu`` / ``clip``.
Its *input* is the activation operand, its *output* the last op of that chain; both are observed
during calibration and quantized. A SiLU after the output (``y * sigmoid(y)``, as exporters write it)
whose result some reader other than a layer's input takes (EfficientNet's squeeze-and-excitation:
the block's mean and its scaling multiply) is the layer's *activation*, observed and quantized too:
without it those readers, and the SiLU, ran in float32 between two quantized layers. A ``matmul`` of two activations (attention's ``Q K^T`` and
``P V``) is a layer too, with ``weight=None``: its second operand is observed and quantized like an
activation. Names come from the ONNX nodes (``lowprec.linear_nodes``, set by
:func:`tvm_lowprec.from_onnx`) when the module came from ONNX, else ``<op>_<index>``.

The module is first put in a canonical form (:func:`prepare`): constants folded, and dataflow blocks
turned into plain bindings so that any tensor can be returned as an extra output.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from ..quant.patterns import bindings, constant, static_shape

_CORE = {"relax.matmul": "matmul", "relax.nn.conv2d": "conv2d"}
_EPILOGUE = ("relax.nn.relu", "relax.clip")
BOUNDED = {"relax.nn.softmax": (0.0, 1.0), "relax.sigmoid": (0.0, 1.0), "relax.tanh": (-1.0, 1.0)}


def _known_range(expr, lookup):
    """The output range of the op that produces ``expr``, when the op bounds it (:data:`BOUNDED`)."""
    value = lookup(expr) if isinstance(expr, relax.Var) else None
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        return BOUNDED.get(value.op.name)
    return None


@dataclass(frozen=True)
class Layer:
    name: str
    kind: str  # "matmul" or "conv2d"
    core: relax.Call
    x: relax.Expr  # the activation operand
    weight: np.ndarray | None  # float32, as the op takes it: [K, N] (matmul) or [O, I, KH, KW] (conv2d)
    output: relax.Var  # bound to the chain's last op
    output_call: relax.Call
    b: relax.Expr | None = None  # the second activation operand of a matmul of two activations
    # the operands' ranges where their producer bounds them (softmax, sigmoid: [0, 1]; tanh: [-1, 1])
    x_range: tuple[float, float] | None = None
    b_range: tuple[float, float] | None = None
    bias: np.ndarray | None = None  # the constant bias the chain adds (float32, flattened), if any
    # the SiLU after the output (``output * sigmoid(output)``) where a reader other than a layer's input
    # takes it: quantized as well (its var and call), so those readers get 8-bit codes
    activation: relax.Var | None = None
    activation_call: relax.Call | None = None

    @property
    def channel_axis(self) -> int:
        """The weight's output-channel axis."""
        return 0 if self.kind == "conv2d" else self.weight.ndim - 1

    @property
    def runtime_weights(self) -> bool:
        return self.weight is None


def prepare(mod: tvm.IRModule) -> tvm.IRModule:
    """Constants folded, dataflow blocks as plain binding blocks (every var can be returned)."""
    mod = relax.transform.FoldConstant()(mod)
    return relax.transform.ToNonDataflow()(mod)


def _uses(func) -> dict:
    """var -> number of uses (in binding values and the function's result)."""
    counts: dict = {}

    def visit(expr):
        if isinstance(expr, relax.Var):
            counts[expr] = counts.get(expr, 0) + 1

    for b in bindings(func):
        relax.analysis.post_order_visit(b.value, visit)
    relax.analysis.post_order_visit(func.body.body, visit)
    return counts


def _is_op(value, names) -> bool:
    return isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in names


def _small_constant(expr, lookup, channels: int) -> bool:
    """A constant that broadcasts as a per-channel (or scalar) bias."""
    value = constant(expr, lookup)
    return value is not None and value.dtype == np.float32 and value.size in (1, channels)


def _silu_after(var, table, readers, core_inputs):
    """``(y, call)`` where ``y = multiply(var, sigmoid(var))`` (either order) and ``var`` is read by the
    sigmoid and the multiply alone, if some reader of ``y`` is not a layer's input (``core_inputs``:
    the bindings whose first argument is their input); else ``(None, None)``."""
    users = readers.get(var, [])
    if len(users) != 2:
        return None, None
    sigmoid = next((u for u in users if _is_op(table.get(u), ("relax.sigmoid",))), None)
    product = next((u for u in users if _is_op(table.get(u), ("relax.multiply",))), None)
    if sigmoid is None or product is None or readers.get(sigmoid, []) != [product]:
        return None, None
    args = table[product].args
    if not (any(a.same_as(var) for a in args) and any(a.same_as(sigmoid) for a in args)):
        return None, None
    if all(r in core_inputs and table[r].args[0].same_as(product) for r in readers.get(product, [])):
        return None, None  # the next layer quantizes it as its input anyway
    return product, table[product]


def _readers(func) -> dict:
    """var -> the vars of the bindings that read it, in order (each once)."""
    readers: dict = {}
    for b in bindings(func):
        seen = []
        relax.analysis.post_order_visit(b.value, lambda e: seen.append(e) if isinstance(e, relax.Var) else None)
        for v in dict.fromkeys(seen):
            readers.setdefault(v, []).append(b.var)
    return readers


def find_layers(mod: tvm.IRModule) -> list[Layer]:
    """The quantizable layers of ``mod["main"]`` (a :func:`prepare`-d module), in execution order."""
    func = mod["main"]
    table = {b.var: b.value for b in bindings(func)}
    lookup = table.get
    uses, readers = _uses(func), _readers(func)
    by_var = {b.var: b for b in bindings(func)}
    consumer = {v: by_var[users[0]] for v, users in readers.items()}  # the first binding that reads v
    cores = [b for b in bindings(func) if _is_op(b.value, _CORE)]
    core_inputs = {b.var for b in cores}
    attrs = func.attrs
    onnx_names = [str(n) for n in attrs["lowprec.linear_nodes"]] if attrs is not None and "lowprec.linear_nodes" in attrs else []
    layers = []
    for index, b in enumerate(cores):
        kind = _CORE[b.value.op.name]
        name = onnx_names[index] if len(onnx_names) == len(cores) else f"{kind}_{index}"
        weight = constant(b.value.args[1], lookup)
        if static_shape(b.value.args[0]) is None:
            continue
        if weight is None:
            operand = b.value.args[1]
            if kind == "matmul" and isinstance(operand, relax.Var) and str(operand.ty.dtype) == "float32" \
                    and static_shape(operand) is not None:
                layers.append(Layer(name, kind, b.value, b.value.args[0], None, b.var, b.value, operand,
                                    _known_range(b.value.args[0], lookup), _known_range(operand, lookup)))
            continue
        if weight.dtype != np.float32:
            continue
        if kind == "conv2d" and (str(b.value.attrs.data_layout) != "NCHW" or str(b.value.attrs.kernel_layout) != "OIHW"):
            continue
        if kind == "matmul" and weight.ndim != 2:
            continue
        channels = weight.shape[0] if kind == "conv2d" else weight.shape[-1]
        out_var, out_call, bias_value = b.var, b.value, None
        while uses.get(out_var, 0) == 1 and out_var in consumer:
            nxt = consumer[out_var]
            value = nxt.value
            bias = _is_op(value, ("relax.add",)) and any(
                a.same_as(out_var) for a in value.args) and _small_constant(
                value.args[1] if value.args[0].same_as(out_var) else value.args[0], lookup, channels)
            if not (bias or (_is_op(value, _EPILOGUE) and value.args[0].same_as(out_var))):
                break
            if bias and bias_value is None:
                operand = value.args[1] if value.args[0].same_as(out_var) else value.args[0]
                bias_value = np.asarray(constant(operand, lookup), np.float32).reshape(-1)
            out_var, out_call = nxt.var, value
        act_var, act_call = _silu_after(out_var, table, readers, core_inputs)
        layers.append(Layer(name, kind, b.value, b.value.args[0], weight, out_var, out_call,
                            x_range=_known_range(b.value.args[0], lookup), bias=bias_value,
                            activation=act_var, activation_call=act_call))
    return layers
