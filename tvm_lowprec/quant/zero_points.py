"""Zero-point algebra for ``sum_k (A - za)(B - zb[n])`` on hardware that multiplies ``A' = A + a_off``
(unsigned on VNNI) by signed ``B' = B - b_off``::

    acc = D - zb'[n] * RA[m] - za' * CB[n] + K * za' * zb'[n]
    D = sum A'B' (the intrinsic),  za' = za + a_off,  zb' = zb - b_off,
    RA[m] = sum_k A'[m, k],  CB[n] = sum_k B'[k, n]

Everything but the ``RA`` term depends on ``n`` only and is folded with the bias into one int32
vector at compile time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GemmCorrections:
    b_signed: np.ndarray  # [K, N] int8: B' = B - b_off
    corr: np.ndarray  # [N] int32: bias - za'*CB + K*za'*zb'
    rowcoef: np.ndarray | None  # [N] int32: -zb', or None when zb' == 0 everywhere


def signed_weights(b: np.ndarray) -> tuple[np.ndarray, int]:
    """Weights as int8 plus the offset removed (128 for uint8 weights)."""
    if b.dtype == np.int8:
        return b, 0
    if b.dtype == np.uint8:
        return (b.astype(np.int16) - 128).astype(np.int8), 128
    raise ValueError(f"weights must be int8 or uint8, not {b.dtype}")


def zero_point_coefficient(b, zb) -> np.ndarray:
    """``zcoef[n] = K*zb'[n] - CB[n]``: the int32 term multiplied by a runtime activation zero point.

    With ``za`` known only at run time, :func:`gemm_corrections` is called with ``za = 0`` and the
    kernel adds ``za * zcoef[n]``.
    """
    k, n = b.shape
    b_signed, b_off = signed_weights(np.asarray(b))
    zb_p = np.broadcast_to(np.asarray(zb, np.int64), (n,)) - b_off
    return (k * zb_p - b_signed.astype(np.int64).sum(axis=0)).astype(np.int32)


INT32_LIMIT = 2**31


class CorrectionOverflow(ValueError):
    """A channel's folded bias and zero-point correction, plus the largest accumulator it is added to,
    does not fit int32 (a near-zero weight channel meeting a large bias: tiny ``s_x * s_w``)."""

    def __init__(self, channels, corr):
        self.channels = [int(c) for c in channels]
        self.corr = np.asarray(corr, np.int64)
        shown = self.channels[:8] + (["..."] if len(self.channels) > 8 else [])
        super().__init__(f"bias and zero-point corrections overflow int32 in output channel(s) {shown} "
                         f"(largest {int(np.max(np.abs(self.corr[self.channels])))} accumulator units)")


def overflowing_channels(corr, acc_bound=0) -> np.ndarray:
    """Indices of the channels where ``|corr| + acc_bound`` (the largest ``|sum A'B'|`` term, per
    channel or scalar) reaches 2**31."""
    total = np.abs(np.asarray(corr, np.int64)) + np.asarray(acc_bound, np.int64)
    return np.flatnonzero(np.broadcast_to(total, np.shape(corr)) >= INT32_LIMIT)


def gemm_corrections(b, za: int, zb, a_offset: int, bias_int=None) -> GemmCorrections:
    """Fold zero points and an int32 bias for constant weights ``b[K, N]`` (int8 or uint8); raises
    :class:`CorrectionOverflow` (naming the channels) when a channel's correction, plus the largest
    accumulator ``K * 255 * max|B'|`` of that channel, does not fit int32."""
    k, n = b.shape
    b_signed, b_off = signed_weights(np.asarray(b))
    za_p = int(za) + a_offset
    zb_p = np.broadcast_to(np.asarray(zb, np.int64), (n,)) - b_off
    cb = b_signed.astype(np.int64).sum(axis=0)
    corr = -za_p * cb + k * za_p * zb_p
    if bias_int is not None:
        corr = corr + np.broadcast_to(np.asarray(bias_int, np.int64), (n,))
    bad = overflowing_channels(corr, 255 * np.abs(b_signed.astype(np.int64)).sum(axis=0))
    if bad.size:
        raise CorrectionOverflow(bad, corr)
    rowcoef = None if not np.any(zb_p) else (-zb_p).astype(np.int32)
    return GemmCorrections(b_signed, corr.astype(np.int32), rowcoef)
