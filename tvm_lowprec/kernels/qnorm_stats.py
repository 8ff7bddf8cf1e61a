"""The statistics of a normalization over axes of an 8-bit tensor that are not the innermost: per kept
position, the codes' mean and the factor ``a = s / sqrt(s² var_q + eps)``, from exact integer sums.

An instance or group norm over the frames of an NWC tensor (wav2vec2's first convolution: 512
channels over 1599 frames), as TVM's importer writes ``InstanceNormalization``, reduces a dequantized
float32 copy twice, for the mean and for the squared deviations, and takes a square root and a
division per element. Here the 8-bit codes are read once into two int32 sums per position (exact for
up to ``MAX_ROW`` codes), turned into the mean and the factor in float64, and the normalized value of
a code is ``(q - mean) * a``: a subtraction and a multiplication per element, in the element-wise
kernel that follows (:mod:`~tvm_lowprec.quant.norm_stats`). The kernel is opaque to fusion, so these
per-position values are computed once, not once per element of their consumer.
"""

from __future__ import annotations

from tvm import te

from .qlayernorm import MAX_ROW, code_moments, code_sums


def build_qnorm_stats(shape, axes, in_dtype: str, in_scale: float, epsilon: float, name: str = "qnorm_stats"):
    """Arguments: ``x`` ``shape`` in ``in_dtype``; outputs ``mean`` and ``factor``, float32, of
    ``shape`` with ``axes`` kept as 1 (keepdims). ``axes`` must leave the innermost axis out."""
    shape = tuple(int(s) for s in shape)
    axes = sorted(int(a) % len(shape) for a in axes)
    if not axes or len(shape) - 1 in axes:
        raise ValueError(f"qnorm_stats reduces axes other than the innermost, not {axes} of {shape}")
    count = 1
    for a in axes:
        count *= shape[a]
    if count > MAX_ROW:
        raise ValueError(f"a normalization over {count} codes exceeds {MAX_ROW}, the int32 sums' exact range")
    kept = tuple(1 if i in axes else n for i, n in enumerate(shape))
    x = te.placeholder(shape, in_dtype, name="x")

    def at(i, over):
        index, it = list(i), iter(over)
        for a in axes:
            index[a] = next(it)
        return x[tuple(index)].astype("int32")

    s1, s2 = code_sums(kept, at, [te.reduce_axis((0, shape[a]), f"r{a}") for a in axes], "norm_sums")
    mean, factor = code_moments(s1, s2, count, in_scale, epsilon, kept, "norm")
    func = te.create_prim_func([x, mean, factor])
    # |mean| <= the largest code; 0 < factor <= s / sqrt(eps): the values after it are bounded (no NaN test)
    attrs = {"lowprec.op": "qnorm_stats", "op_pattern": 8}
    if epsilon > 0:
        attrs["lowprec.bound"] = max(255.0, float(in_scale) / float(epsilon) ** 0.5)
    return func.with_attr("global_symbol", name).with_attrs(attrs)
