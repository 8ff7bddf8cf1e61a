"""Layer normalization over the last axis of an 8-bit tensor, to an 8-bit tensor.

With ``x = s * (q - z)`` per tensor, the row's mean and variance come from exact integer sums of
``q - z`` and ``(q - z)²`` (int32: exact for rows up to 33025 long), turned once per row into
``mean_q`` and ``a = s / sqrt(s² var_q + eps)`` in float64; then per element, in float32,
``y = (q - z - mean_q) * a * (gamma / sy) + beta / sy`` and the output quantization ``rint(y) + zy``,
clamped: the caller passes gamma and beta divided by the output scale ``sy`` (a vector division per
16 elements, instead: Whisper's 250x384 rows 27 -> 23 us, ConvNeXt's 28x28x96 30 -> 24 us; Zen 4, one
thread, alone). What is left is arithmetic: about 14 vector operations per 16 elements for the output
and 5 per 16 for the two sums, at two 512-bit operations a cycle on Zen 4 (8-9 % of copy bandwidth).
The kernel reads the 8-bit input and writes the 8-bit output: the float tensor of the graph as written
(dequantize -> LayerNormalization -> quantize) never exists.
"""

from __future__ import annotations

from tvm import te, tirx

from .qgemm import quantize_linear, target_round_to_int

MAX_ROW = (2**31 - 1) // (255 * 255)  # the squares' int32 sum stays exact


def code_sums(shape, code, axes, name: str):
    """Int32 sums of ``code(i, axes)`` and of its square over the reduce axes ``axes`` at each position
    ``i`` of ``shape``: one block computing both, so each code is read and widened once."""
    pair_sum = te.comm_reducer(lambda a, b: (a[0] + b[0], a[1] + b[1]),
                               lambda t0, t1: (tirx.const(0, t0), tirx.const(0, t1)), name="pair_sum")
    return te.compute(shape, lambda *i: pair_sum((code(i, axes), code(i, axes) * code(i, axes)), axis=axes), name=name)


def code_moments(s1, s2, count: int, in_scale: float, epsilon: float, shape, prefix: str):
    """From ``s1``, ``s2`` (int32 sums of ``count`` codes and of their squares, at each position of
    ``shape``): ``<prefix>_mean``, the codes' mean (float32), and ``<prefix>_factor``,
    ``a = s / sqrt(s² var_q + eps)`` (float32, computed in float64), so that the normalized value of a
    code ``q`` is ``(q - mean) * a``. The variance of the codes is that of the values over ``s²``; a
    zero point cancels in it."""
    s64, eps64 = tirx.const(float(in_scale), "float64"), tirx.const(float(epsilon), "float64")

    def mean(*i):
        return s1[i].astype("float64") / float(count)

    def factor(*i):
        m = mean(*i)
        var = s2[i].astype("float64") / float(count) - m * m
        return (s64 / tirx.sqrt(s64 * s64 * tirx.max(var, 0.0) + eps64)).astype("float32")

    return (te.compute(shape, lambda *i: mean(*i).astype("float32"), name=f"{prefix}_mean"),
            te.compute(shape, factor, name=f"{prefix}_factor"))


def build_qlayernorm(shape, in_dtype: str, in_scale: float, in_zero_point: int, epsilon: float, out_dtype: str,
                     out_zero_point: int, qmin: int, qmax: int, name: str = "qlayernorm"):
    """Arguments: ``x`` ``shape`` in ``in_dtype``, ``gamma / out_scale`` and ``beta / out_scale`` float32
    ``[C]`` (the output scale is in them: the kernel computes in output steps), the output."""
    round_to_int = target_round_to_int()  # the CPU rows' conversion when built for one (compile's target scope)
    shape = tuple(int(s) for s in shape)
    lead, n = shape[:-1], shape[-1]
    if n > MAX_ROW:
        raise ValueError(f"layer norm rows of {n} exceed {MAX_ROW}, the int32 sums' exact range")
    x = te.placeholder(shape, in_dtype, name="x")
    gamma, beta = te.placeholder((n,), "float32", name="gamma"), te.placeholder((n,), "float32", name="beta")
    z = tirx.const(int(in_zero_point), "int32")

    def centred(i):
        return x[i].astype("int32") - z

    s1, s2 = code_sums(lead, lambda i, r: centred((*i, r[0])), [te.reduce_axis((0, n), "j")], "row_sums")
    mean_q, a = code_moments(s1, s2, n, in_scale, epsilon, lead, "row")
    def out(*i):
        y = (centred(i).astype("float32") - mean_q[i[:-1]]) * a[i[:-1]] * gamma[i[-1]] + beta[i[-1]]
        return quantize_linear(y, 1.0, out_zero_point, qmin, qmax, out_dtype, round_to_int)  # y in output steps

    y = te.compute(shape, out, name="out")
    func = te.create_prim_func([x, gamma, beta, y])
    return func.with_attr("global_symbol", name).with_attrs({"lowprec.op": "qlayernorm", "op_pattern": 8})
