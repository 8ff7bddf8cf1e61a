"""Pass: float32 matmuls and convolutions with constant weights  ==>  the scheduled float32 kernels.

Taken, each with the ``add`` of a constant bias and a ReLU/GELU after it when nothing else reads the
values in between (folded into the kernel's epilogue):

- ``matmul(x, W)``, ``W[K, N]`` constant: :func:`~tvm_lowprec.kernels.fp32_gemm.build_fp32_gemm`,
  the weights packed into column panels at compile time;
- ``conv2d(x, W)``, NCHW/OIHW, batch 1, one group: the same GEMM over output pixels
  (:func:`~tvm_lowprec.kernels.fp32_gemm.build_fp32_conv`); depthwise:
  :mod:`tvm_lowprec.kernels.fp32_depthwise`;
- ``conv2d_transpose`` whose kernel equals its strides (one tap per output pixel, no padding):
  :func:`~tvm_lowprec.kernels.fp32_gemm.build_fp32_deconv`.

Without this, TVM's default CPU lowering runs them as scalar loops (100x slower than ONNX Runtime).

Runs in phase 1 of :mod:`tvm_lowprec.pipeline` *after* the integer rewrites (qdq_to_integer,
weight-only, row operators, lookup tables), so it takes only what stays float: FP32 models, layers
the PTQ fallback keeps in FP32, the calibration model. Runs before FoldConstant, so a weight may
still be ``permute_dims``/``reshape`` of a constant (ONNX Gemm with ``transB``): those are followed.
Declines (the layer stays as it was: float, correct, unscheduled) a target without an FMA recipe
(:attr:`~tvm_lowprec.hwspec.TargetSpec.fma`: GPU rows), a non-static shape, another dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import tvm
from tvm import relax

from ..kernels.fp32_depthwise import DepthwiseLayout, build_fp32_depthwise
from ..kernels.fp32_gemm import (
    FloatConvGeometry,
    FloatGemmLayout,
    build_fp32_conv,
    build_fp32_deconv,
    build_fp32_gemm,
    conv_weight_columns,
    k_block,
    pack_fp32_weights,
    padded_bias,
)
from .patterns import (
    conv_geometry,
    dtype_of,
    deconv_geometry,
    deconv_weight_matrix,
    mutate_relax_functions,
    op,
    static_shape,
    use_counts,
)

_ACTS = {"relax.nn.relu": "relu", "relax.nn.gelu": "gelu", "relax.nn.gelu_tanh": "gelu_tanh"}


def _bound(expr, lookup):
    while isinstance(expr, relax.Var):
        expr = lookup(expr)
    return expr


def _dequantized_constant(call, lookup) -> np.ndarray | None:
    """``dequantize(q, scale, zero_point)`` of constants, as ONNX defines it in float32: ``(q - zp) *
    scale`` along ``axis`` (an imported QDQ layer left in float: a channel whose bias and zero-point
    corrections overflow int32, :class:`~tvm_lowprec.quant.zero_points.CorrectionOverflow`)."""
    values = [_bound(arg, lookup) for arg in call.args]
    if len(values) != 3 or not all(isinstance(v, tvm.ir.expr.Constant) for v in values) or dtype_of(call) != "float32":
        return None
    q, scale, zero = (v.value.numpy() for v in values)
    if q.dtype.kind not in "iu" or scale.dtype != np.float32:
        return None
    axis = int(call.attrs.axis) % max(q.ndim, 1)

    def along(v):
        return v.reshape([-1 if i == axis else 1 for i in range(q.ndim)]) if v.size > 1 else v.reshape(())

    return ((q.astype(np.int64) - along(zero).astype(np.int64)).astype(np.float32) * along(scale)).astype(np.float32)


def float_constant(expr, lookup) -> np.ndarray | None:
    """A float32 constant's value, also through var bindings, ``permute_dims``, ``reshape`` and a
    ``dequantize`` of constants."""
    while isinstance(expr, relax.Var):
        bound = lookup(expr)
        if bound is None:
            return None
        expr = bound
    if isinstance(expr, tvm.ir.expr.Constant):
        value = expr.value.numpy()
        return value if value.dtype == np.float32 else None
    if not isinstance(expr, relax.Call) or not isinstance(expr.op, tvm.ir.Op):
        return None
    if expr.op.same_as(op("relax.dequantize")):
        return _dequantized_constant(expr, lookup)
    if expr.op.same_as(op("relax.permute_dims")):
        inner = float_constant(expr.args[0], lookup)
        axes = expr.attrs.axes
        if inner is None:
            return None
        return np.ascontiguousarray(inner.transpose(None if axes is None else [int(a) for a in axes]))
    if expr.op.same_as(op("relax.reshape")):
        inner, shape = float_constant(expr.args[0], lookup), static_shape(expr)
        return None if inner is None or shape is None else inner.reshape(shape)
    return None


@dataclass
class _Chain:
    """A matmul/conv2d and the epilogue ops folded into it (by their original calls)."""

    head: relax.Call
    bias: np.ndarray | None = None
    act: str = "none"


def _bias_of(call, var, lookup, width: int, conv: bool) -> np.ndarray | None:
    """The constant other operand of ``add(var, c)`` when it is a bias along the output channels."""
    if not call.op.same_as(op("relax.add")):
        return None
    a, b = call.args
    other = b if a.same_as(var) else a if b.same_as(var) else None
    value = None if other is None else float_constant(other, lookup)
    if value is None or value.size != width or static_shape(call) != static_shape(var):
        return None
    axis = -3 if conv else -1  # NCHW: [1, O, 1, 1] or [O, 1, 1]; a matmul: [..., N]
    if value.ndim and value.shape[axis if value.ndim >= -axis else -1] != width:
        return None
    return value.reshape(-1)


def find_chains(func, is_head) -> dict:
    """Original call -> its :class:`_Chain` for every head (``is_head(call) -> output width or None``);
    the ops folded into a chain map to the same object."""
    bound = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    users: dict = {}
    for var, value in bound.items():
        for used in relax.analysis.free_vars(value):
            users.setdefault(used, []).append(var)
    counts = use_counts(func)
    chains: dict = {}
    for var, value in bound.items():
        width = is_head(value) if isinstance(value, relax.Call) else None
        if width is None:
            continue
        chain = chains[value] = _Chain(value)
        conv = value.op.same_as(op("relax.nn.conv2d")) or value.op.same_as(op("relax.nn.conv2d_transpose"))
        tail = var
        for step in ("bias", "act"):
            if counts.get(tail, 0) != 1 or len(users.get(tail, ())) != 1:
                break
            nxt = users[tail][0]
            call = bound[nxt]
            if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
                break
            if step == "bias" and (bias := _bias_of(call, tail, bound.get, width, conv)) is not None:
                chain.bias = bias
            elif call.op.name in _ACTS and static_shape(call) == static_shape(tail):
                chain.act = _ACTS[call.op.name]
            else:
                continue  # no bias: the same op may still be the activation
            chains[call] = chain
            tail = nxt
            if chain.act != "none":
                break
    return chains


def _matmul_width(call, lookup, spec) -> int | None:
    if not call.op.same_as(op("relax.matmul")):
        return None
    x, w = call.args
    shape, w_shape = static_shape(x), static_shape(w)
    if shape is None or w_shape is None or len(w_shape) != 2 or len(shape) < 1 or shape[-1] != w_shape[0]:
        return None
    if str(x.ty.dtype) != "float32" or str(call.ty.dtype) != "float32":
        return None
    return w_shape[1]


def _conv_width(call) -> int | None:
    if not call.op.same_as(op("relax.nn.conv2d")) or str(call.ty.dtype) != "float32":
        return None
    g = conv_geometry(call)  # one group, or depthwise (groups == channels == outputs)
    if g is None or g.batch != 1 or str(call.args[0].ty.dtype) != "float32":
        return None
    return static_shape(call.args[1])[0]


def _deconv_width(call) -> int | None:
    """A transposed convolution with one tap per output pixel (kernel == strides, no padding, batch 1)."""
    if not call.op.same_as(op("relax.nn.conv2d_transpose")) or str(call.ty.dtype) != "float32":
        return None
    g = deconv_geometry(call)
    if g is None or g.batch != 1 or g.kernel != g.strides or any(g.padding) or g.dilation != (1, 1):
        return None
    if g.out_hw != (g.in_hw[0] * g.strides[0], g.in_hw[1] * g.strides[1]) or str(call.args[0].ty.dtype) != "float32":
        return None  # an output_padding
    return g.out_channels


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod, spec):
        super().__init__(mod)
        self.spec, self.chains, self.done, self.rewritten = spec, {}, {}, 0

    def visit_function_(self, func):
        self.chains = find_chains(func, self._width)
        return super().visit_function_(func)

    def _width(self, call):
        if not isinstance(call.op, tvm.ir.Op) or len(call.args) != 2 or float_constant(call.args[1], self._lookup_orig) is None:
            return None
        return _matmul_width(call, self._lookup_orig, self.spec) or _conv_width(call) or _deconv_width(call)

    def _lookup_orig(self, var):
        return self._orig_bound.get(var)

    def visit_call_(self, call):
        chain = self.chains.get(call)
        new = super().visit_call_(call)
        if chain is None:
            return new
        if not chain.head.same_as(call):  # an epilogue op: its input already holds the fused result
            return next(v for v in map(self._fused, new.args) if v is not None and self.done.get(v) is chain)
        emitted = self._emit(chain, new)
        if emitted is None:
            self.chains = {k: v for k, v in self.chains.items() if v is not chain}
            return new
        self.rewritten += 1
        return emitted

    def _fused(self, arg):
        """The var holding a fused result that ``arg`` is (or aliases), else None."""
        while isinstance(arg, relax.Var) and arg not in self.done:
            arg = self.lookup_binding(arg)
        return arg if isinstance(arg, relax.Var) else None

    def _emit(self, chain, call):
        w = float_constant(chain.head.args[1], self._lookup_orig)
        emit = _emit_conv if call.op.same_as(op("relax.nn.conv2d")) else _emit_matmul
        if call.op.same_as(op("relax.nn.conv2d_transpose")):
            emit = _emit_deconv
        out = emit(self.builder_, call, w, chain, self.spec)
        if out is not None:
            out = self.builder_.emit(out)
            self.done[out] = chain
        return out


def _emit_matmul(builder, call, w, chain, spec):
    x = call.args[0]
    shape = static_shape(x)
    k, n = w.shape
    m = int(np.prod(shape[:-1], dtype=np.int64))
    layout = FloatGemmLayout.choose(spec.fma, m, n, k, chain.bias is not None, chain.act)
    if layout is None:
        return None
    name = f"fp32_gemm_{m}x{n}x{k}" + (f"_{layout.act}" if layout.act != "none" else "")
    gvar = builder.add_func(build_fp32_gemm(layout, name), name)
    x2 = x if len(shape) == 2 else builder.emit(relax.op.reshape(x, (m, k)))
    args = [x2, relax.const(pack_fp32_weights(w, layout))]
    if layout.bias:
        args.append(relax.const(padded_bias(chain.bias, layout)))
    y = relax.call_tir(gvar, args, relax.TensorType((m, n), "float32"))
    return y if len(shape) == 2 else relax.op.reshape(builder.emit(y), (*shape[:-1], n))


def _emit_depthwise(builder, call, w, chain, spec, g):
    layout = DepthwiseLayout.choose(spec.fma, g, chain.bias is not None, chain.act)
    if layout is None:
        return None
    kh, kw = g.kernel
    name = f"fp32_depthwise_{g.channels}x{g.in_hw[0]}x{g.in_hw[1]}_k{kh}x{kw}s{g.strides[0]}"
    gvar = builder.add_func(build_fp32_depthwise(layout, name), name)
    args = [call.args[0], relax.const(np.ascontiguousarray(w.reshape(g.channels, kh, kw)))]
    if layout.bias:
        args.append(relax.const(np.asarray(chain.bias, np.float32).reshape(-1)))
    return relax.call_tir(gvar, args, relax.TensorType((1, g.channels, *g.out_hw), "float32"))


def _emit_conv(builder, call, w, chain, spec):
    g = conv_geometry(call)
    if g.depthwise:
        return _emit_depthwise(builder, call, w, chain, spec, g)
    out_channels = w.shape[0]
    geometry = FloatConvGeometry(g.channels, g.in_hw, out_channels, g.out_hw, g.kernel, g.strides, g.padding,
                                 g.dilation)
    layout = FloatGemmLayout.choose(spec.fma, geometry.rows, out_channels, geometry.depth, chain.bias is not None,
                                    chain.act)
    if layout is None:
        return None
    window = g.kernel[0] * g.kernel[1]
    tile_kblock = spec.fma.tile_for(geometry.rows).kblock
    # a block of channels: twice the GEMM's depth (measured, 64x56x56 3x3: 72 deep 47 GFLOPS, 144 60, 288 42)
    layout = replace(layout, k_unroll=1, kblock=window * k_block(g.channels, 2 * tile_kblock // window))
    kh, kw = g.kernel
    name = f"fp32_conv_{g.channels}x{g.in_hw[0]}x{g.in_hw[1]}_{out_channels}k{kh}x{kw}s{g.strides[0]}"
    gvar = builder.add_func(build_fp32_conv(geometry, layout, name), name)
    args = [call.args[0], relax.const(pack_fp32_weights(conv_weight_columns(w), layout))]
    if layout.bias:
        args.append(relax.const(padded_bias(chain.bias, layout)))
    return relax.call_tir(gvar, args, relax.TensorType((1, out_channels, *g.out_hw), "float32"))


def _emit_deconv(builder, call, w, chain, spec):
    g = deconv_geometry(call)
    taps = g.kernel[0] * g.kernel[1]
    layout = FloatGemmLayout.choose(spec.fma, g.rows, taps * g.out_channels, g.in_channels, chain.bias is not None,
                                    chain.act)
    if layout is None:
        return None
    tile_kblock = spec.fma.tile_for(g.rows).kblock
    layout = replace(layout, k_unroll=1, kblock=k_block(g.in_channels, 2 * tile_kblock))
    kh, kw = g.kernel
    name = f"fp32_deconv_{g.in_channels}x{g.in_hw[0]}x{g.in_hw[1]}_{g.out_channels}k{kh}x{kw}"
    gvar = builder.add_func(build_fp32_deconv(g, layout, name), name)
    args = [call.args[0], relax.const(pack_fp32_weights(deconv_weight_matrix(w), layout))]
    if layout.bias:
        args.append(relax.const(padded_bias(np.tile(np.asarray(chain.bias, np.float32).reshape(-1), taps), layout)))
    return relax.call_tir(gvar, args, relax.TensorType((1, g.out_channels, *g.out_hw), "float32"))


def float_gemm_module(mod, spec):
    """Apply the rewrite to every Relax function of ``mod``; unchanged where the target has no FMA
    recipe (plain Python: errors keep their type)."""
    if getattr(spec, "fma", None) is None:
        return mod
    rewriter = _Rewriter(mod, spec)
    rewriter._orig_bound = {}
    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            rewriter._orig_bound.update({b.var: b.value for blk in func.body.blocks for b in blk.bindings})
    return mutate_relax_functions(mod, rewriter)
