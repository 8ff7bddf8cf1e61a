"""Max pooling as two 1-D passes: the maximum over a ``KH x KW`` window is the maximum over ``KH``
rows of the maxima over ``KW`` columns (max is exact and associative, for codes and floats alike)::

    padded[n, h, w, c]   = x[n, h - top, w - left, c]  (the dtype's lowest value outside)
    pool_rows[n, h, j, c] = max_kw padded[n, h, j * sw + kw * dw, c]       # every padded row
    pool_max[n, i, j, c]  = max_kh pool_rows[n, i * sh + kh * dh, j, c]

``KH + KW`` loads and maxima per output instead of ``KH x KW``: SPPF's 5x5 pools 10 against 25,
ResNet's 3x3 pool 6 against 9. NHWC or NCHW (the two spatial axes found from ``layout``); ceil mode
and other layouts keep TVM's legalization (:func:`separable_max_pool` returns None). Scheduled by
:class:`~tvm_lowprec.schedule.pool.SeparablePoolRule`.
"""

from __future__ import annotations

from tvm import te, tirx

OP = "max_pool"


def separable_max_pool(x, pool_size, strides, padding, dilation, layout: str):
    """The TE output of the max pool of ``x`` (a te tensor), or None for a layout other than NHWC and
    NCHW. ``padding``: (top, left, bottom, right)."""
    if layout not in ("NHWC", "NCHW"):
        return None
    h_axis, w_axis = layout.index("H"), layout.index("W")
    (kh, kw), (sh, sw), (dh, dw) = pool_size, strides, dilation
    top, left, bottom, right = padding
    shape = list(x.shape)
    h_n, w_n = shape[h_axis], shape[w_axis]
    lowest = tirx.min_value(x.dtype)
    source = x
    if any(int(p) for p in padding):
        padded_shape = list(shape)
        padded_shape[h_axis] = h_n + top + bottom
        padded_shape[w_axis] = w_n + left + right

        def pad(*i):
            h, w = i[h_axis], i[w_axis]
            inside = tirx.all(h >= top, h < top + h_n, w >= left, w < left + w_n)
            at = list(i)
            at[h_axis] = tirx.max(tirx.min(h - top, h_n - 1), 0)
            at[w_axis] = tirx.max(tirx.min(w - left, w_n - 1), 0)
            return tirx.Select(inside, x[tuple(at)], lowest)

        source = te.compute(padded_shape, pad, name="padded")
    hp, wp = source.shape[h_axis], source.shape[w_axis]
    rows = _max_along(source, w_axis, (wp - dw * (kw - 1) - 1) // sw + 1, kw, sw, dw, "pool_rows")
    return _max_along(rows, h_axis, (hp - dh * (kh - 1) - 1) // sh + 1, kh, sh, dh, "pool_max")


def _max_along(source, axis: int, extent, taps: int, stride: int, dilation: int, name: str):
    """``out[..., i, ...] = max_t source[..., i * stride + t * dilation, ...]`` along ``axis``."""
    shape = list(source.shape)
    shape[axis] = extent
    t = te.reduce_axis((0, taps), "t")

    def element(*i):
        at = list(i)
        at[axis] = i[axis] * stride + t * dilation
        return te.max(source[tuple(at)], axis=t)

    return te.compute(shape, element, name=name)
