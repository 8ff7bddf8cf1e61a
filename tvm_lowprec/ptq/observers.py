"""Observers: from observed values to a clipping range, and from a range to a scale and zero point.

Activations are observed over the calibration set: exact running min/max, plus a bounded uniform
sample of the values (:class:`TensorStats`) for the observers that need the distribution
(:class:`~.config.Percentile`, :class:`~.config.Entropy`, :class:`~.config.MSE`). Weights are known
whole, so their observers see every value (per channel when asked).
"""

from __future__ import annotations

import numpy as np

from .config import MSE, ConfigError, Entropy, MinMax, Percentile

SAMPLE_CAP = 1 << 16
_QRANGE = {"uint8": (0, 255), "int8": (-128, 127)}


def qrange(dtype: str, symmetric: bool, bits: int = 8) -> tuple[int, int]:
    """Integer range used: ``bits`` of ``dtype`` (7: [-64, 63] or [0, 127]); symmetric int8 leaves out
    the lowest value so that +-max are both representable ([-127, 127], [-63, 63])."""
    lo, hi = _QRANGE[dtype] if bits == 8 else (0, 2 ** bits - 1) if dtype == "uint8" else (-2 ** (bits - 1), 2 ** (bits - 1) - 1)
    return (-hi, hi) if symmetric and dtype == "int8" else (lo, hi)


class TensorStats:
    """Running min/max and a uniform random sample (at most :data:`SAMPLE_CAP` values) of one tensor."""

    def __init__(self, seed: int = 0):
        self.lo, self.hi, self.seen = np.inf, -np.inf, 0
        self.sample = np.empty(0, np.float32)
        self._rng = np.random.default_rng(seed)

    def update(self, values: np.ndarray, bounds: tuple[float, float] | None = None) -> None:
        """Add a tensor's values; ``bounds``: their (min, max) when the caller has them already."""
        flat = np.asarray(values, np.float32).reshape(-1)
        if flat.size == 0:
            return
        lo, hi = bounds if bounds is not None else (float(flat.min()), float(flat.max()))
        self.lo, self.hi = min(self.lo, lo), max(self.hi, hi)
        total = self.seen + flat.size
        keep_old = min(self.sample.size, round(SAMPLE_CAP * self.seen / total))
        keep_new = min(flat.size, SAMPLE_CAP - keep_old)
        old = self.sample
        if keep_old < old.size:  # drop a uniform random subset (choosing the fewer dropped: 0.3 ms, not 1.2)
            kept = np.ones(old.size, bool)
            kept[self._rng.choice(old.size, old.size - keep_old, replace=False, shuffle=False)] = False
            old = old[kept]
        # with replacement: i.i.d. draws from this tensor's values (what the observers estimate from), at
        # O(keep_new); without, numpy permutes all of a large tensor (800K values: 6.6 ms against 1.2)
        new = flat[self._rng.integers(0, flat.size, keep_new)] if keep_new < flat.size else flat
        self.sample, self.seen = np.concatenate([old, new]), total


def observed_range(observer, lo: float, hi: float, sample: np.ndarray, dtype: str, symmetric: bool, bits: int = 8):
    """The (low, high) clipping range that ``observer`` picks; always contains 0."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if isinstance(observer, MinMax) or hi - lo == 0.0 or sample.size == 0:
        return lo, hi
    if isinstance(observer, Percentile):
        if symmetric:
            t = float(np.percentile(np.abs(sample), observer.percentile))
            return max(lo, -t), min(hi, t)
        return min(float(np.percentile(sample, 100.0 - observer.percentile)), 0.0), \
            max(float(np.percentile(sample, observer.percentile)), 0.0)
    if isinstance(observer, Entropy):
        t = entropy_threshold(sample, observer.bins, levels=2 ** (bits - 1) if lo < 0 else 2 ** bits)
        return max(lo, -t), min(hi, t)
    if isinstance(observer, MSE):
        return mse_range(sample, lo, hi, observer, dtype, symmetric, bits)
    raise ConfigError(f"unknown observer {observer!r}")


def entropy_threshold(sample: np.ndarray, bins: int, levels: int) -> float:
    """TensorRT's KL calibration on |x|: the threshold whose clipped histogram, quantized to ``levels``
    levels, loses the least information (smallest KL divergence).

    Exact zeros are left out of the histogram: zero is exact at every threshold (the zero point), and a
    ReLU output's spike at zero would otherwise make every merge of the first bins look costly and
    push the threshold far down. Candidate thresholds are taken every ``bins // 256`` bins.
    """
    values = np.abs(sample.astype(np.float64))
    values = values[values > 0]
    if values.size == 0:
        return 0.0
    amax = float(values.max())
    hist, edges = np.histogram(values, bins=bins, range=(0.0, amax))
    hist = hist.astype(np.float64)
    nonzero = (hist > 0).astype(np.float64)
    best, best_i = np.inf, bins
    for i in range(levels, bins + 1, max(1, bins // 256)):
        p = hist[:i].copy()
        p[-1] += hist[i:].sum()
        starts = np.linspace(0, i, levels + 1).astype(int)[:-1]
        sizes = np.diff(np.append(starts, i))
        mass = np.add.reduceat(hist[:i], starts)
        filled = np.add.reduceat(nonzero[:i], starts)
        per_bin = np.divide(mass, filled, out=np.zeros_like(mass), where=filled > 0)
        kl = _kl(p, np.repeat(per_bin, sizes) * nonzero[:i])
        if kl < best:
            best, best_i = kl, i
    return float(edges[best_i]) if best_i < bins else amax


def _smooth(d: np.ndarray, eps: float = 1e-4) -> np.ndarray:
    """A normalised distribution with its empty bins given ``eps`` (taken from the others), so that a
    bin that only the clipped tail fills does not make the divergence infinite."""
    d = d / d.sum()
    zeros = d == 0
    n_zero, n_nonzero = int(zeros.sum()), int((~zeros).sum())
    if n_zero == 0 or n_nonzero == 0:
        return d
    return np.where(zeros, eps, d - eps * n_zero / n_nonzero)


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    if q.sum() == 0:
        return np.inf
    p, q = _smooth(p), _smooth(q)
    if np.any(q <= 0) or np.any(p <= 0):
        return np.inf
    return float(np.sum(p * np.log(p / q)))


def mse_range(sample: np.ndarray, lo: float, hi: float, observer: MSE, dtype: str, symmetric: bool, bits: int = 8):
    """Among the full range shrunk by fractions in [min_fraction, 1], the one whose quantization of
    ``sample`` has the smallest mean squared error."""
    x = sample.astype(np.float64)
    qmin, qmax = qrange(dtype, symmetric, bits)
    best, best_range = np.inf, (lo, hi)
    for fraction in np.linspace(observer.min_fraction, 1.0, observer.steps):
        cand = (lo * fraction, hi * fraction)
        scale, zp = qparams(*cand, dtype, symmetric, bits)
        err = np.mean(((np.clip(np.rint(x / scale) + zp, qmin, qmax) - zp) * scale - x) ** 2)
        if err < best:
            best, best_range = err, cand
    return best_range


def qparams(lo: float, hi: float, dtype: str, symmetric: bool, bits: int = 8) -> tuple[np.float32, int]:
    """Scale and zero point that map [lo, hi] (containing 0) onto ``bits`` of ``dtype``.

    A zero range (a tensor that is 0 everywhere) gets scale 1.0: zero is exact with any scale.
    """
    qmin, qmax = qrange(dtype, symmetric, bits)
    middle = (qmin + qmax + 1) // 2  # symmetric uint8's zero point: 128 (64 with 7 bits)
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if symmetric:
        amax = max(-lo, hi)
        zp = middle
        scale = 2.0 * amax / (qmax - qmin)
    else:
        scale = (hi - lo) / (qmax - qmin)
        zp = None
    scale32 = np.float32(scale)
    if not np.isfinite(scale32):
        raise ConfigError(f"range [{lo}, {hi}] gives a non-finite scale")
    if scale32 <= np.finfo(np.float32).tiny:  # zero range
        return np.float32(1.0), (middle if symmetric else 0)
    if zp is None:
        zp = int(np.clip(np.rint(qmin - lo / float(scale32)), qmin, qmax))
    return scale32, zp


# ---------------------------------------------------------------------------- many ranges at once (weight groups)


def qparams_array(lo: np.ndarray, hi: np.ndarray, dtype: str, symmetric: bool, bits: int = 8):
    """:func:`qparams` for arrays of ranges (one per weight group and column): float32 scales and int32
    zero points, element for element what :func:`qparams` gives."""
    qmin, qmax = qrange(dtype, symmetric, bits)
    middle = (qmin + qmax + 1) // 2
    lo = np.minimum(np.asarray(lo, np.float64), 0.0)
    hi = np.maximum(np.asarray(hi, np.float64), 0.0)
    scale = (2.0 * np.maximum(-lo, hi) if symmetric else hi - lo) / (qmax - qmin)
    scale32 = scale.astype(np.float32)
    if not np.all(np.isfinite(scale32)):
        raise ConfigError(f"a range gives a non-finite scale (largest |value| {np.max(np.abs([lo, hi]))})")
    empty = scale32 <= np.finfo(np.float32).tiny  # zero range: scale 1, zero exact
    scale32 = np.where(empty, np.float32(1.0), scale32)
    if symmetric:
        zp = np.full(scale32.shape, middle, np.int32)
    else:
        zp = np.clip(np.rint(qmin - lo / scale32.astype(np.float64)), qmin, qmax).astype(np.int32)
        zp = np.where(empty, 0, zp)
    return scale32, zp


def quantize_values(values: np.ndarray, scale: np.ndarray, zp: np.ndarray, limits: tuple[int, int]) -> np.ndarray:
    """``clip(round(values / scale) + zp)`` (int32), with ``scale``/``zp`` broadcasting against ``values``."""
    q = np.rint(np.asarray(values, np.float64) / scale.astype(np.float64)) + zp
    return np.clip(q, *limits).astype(np.int32)


def dequantize_values(q: np.ndarray, scale: np.ndarray, zp: np.ndarray) -> np.ndarray:
    """``(q - zp) * scale`` in float32, as the compiled dequantize computes it."""
    return (q.astype(np.float32) - zp.astype(np.float32)) * scale.astype(np.float32)


def group_range(observer, rows: np.ndarray, dtype: str, symmetric: bool, bits: int = 8):
    """The clipping range ``observer`` picks for each column of ``rows`` ([group, N]: one weight group
    per column), vectorised over the columns where the observer allows. Returns (lo[N], hi[N])."""
    lo, hi = np.minimum(rows.min(axis=0), 0.0), np.maximum(rows.max(axis=0), 0.0)
    if isinstance(observer, MinMax):
        return lo, hi
    if isinstance(observer, Percentile):
        if symmetric:
            t = np.percentile(np.abs(rows), observer.percentile, axis=0)
            return np.maximum(lo, -t), np.minimum(hi, t)
        return (np.minimum(np.percentile(rows, 100.0 - observer.percentile, axis=0), 0.0),
                np.maximum(np.percentile(rows, observer.percentile, axis=0), 0.0))
    if isinstance(observer, MSE):
        return _group_mse_range(rows, lo, hi, observer, dtype, symmetric, bits)
    pairs = [observed_range(observer, lo[n], hi[n], rows[:, n], dtype, symmetric, bits) for n in range(rows.shape[1])]
    return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


def _group_mse_range(rows, lo, hi, observer: MSE, dtype, symmetric, bits):
    """:func:`mse_range` for every column at once: each column's shrunk range with the smallest error."""
    limits = qrange(dtype, symmetric, bits)
    best = np.full(rows.shape[1], np.inf)
    best_lo, best_hi = lo.copy(), hi.copy()
    for fraction in np.linspace(observer.min_fraction, 1.0, observer.steps):
        scale, zp = qparams_array(lo * fraction, hi * fraction, dtype, symmetric, bits)
        err = np.sum((dequantize_values(quantize_values(rows, scale, zp, limits), scale, zp) - rows) ** 2, axis=0)
        better = err < best
        best = np.where(better, err, best)
        best_lo, best_hi = np.where(better, lo * fraction, best_lo), np.where(better, hi * fraction, best_hi)
    return best_lo, best_hi


class SecondMoments:
    """Running ``sum x x^T`` over the rows of one tensor's last axis (a layer input [..., K]): K x K
    float64, whatever the number of samples. :meth:`mean` is ``X^T X / rows``, the Hessian of the
    layer's output squared error (up to a factor 2) that :class:`~.config.GPTQ` uses."""

    def __init__(self):
        self.sum: np.ndarray | None = None
        self.rows = 0

    def update(self, values: np.ndarray) -> None:
        x = np.asarray(values, np.float64)
        x = x.reshape(-1, x.shape[-1])
        self.sum = x.T @ x if self.sum is None else self.sum + x.T @ x
        self.rows += x.shape[0]

    def mean(self) -> np.ndarray:
        return self.sum / max(self.rows, 1)
