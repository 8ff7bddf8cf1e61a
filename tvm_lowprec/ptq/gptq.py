"""GPTQ weight rounding (Frantar et al. 2022), in numpy, for a matmul ``y = x W`` with W [K, N].

The layer's output error on inputs like the calibration inputs is ``tr(dW^T H dW)`` with
``H = X^T X`` (:class:`~.observers.SecondMoments`). GPTQ rounds W one K row at a time; after rounding
row i it moves the rows not yet rounded by the amount that best compensates row i's error under H
(the optimal-brain-surgeon update, restricted to the remaining rows). With U the upper Cholesky
factor of ``H^-1`` (``H^-1 = U^T U``), that update is ``W[j] -= U[i, j] * (W[i] - Q[i]) / U[i, i]``
for j > i; one factorisation serves every step (:func:`inverse_cholesky`).

Rows are processed in lazy batches: inside a batch the update touches only the batch's rows, and
the batch's accumulated errors reach the later rows in one matrix product at its end (the result
is the same; only the memory traffic changes). A group's scale (and zero point) is computed when
the group starts, from the already-corrected weights; batches are laid out so that the rows of a
group are up to date at that moment (a batch holds whole groups, or a group starts a batch).
"""

from __future__ import annotations

import numpy as np

from .calibrate import CalibrationError
from .config import GPTQ, QuantSpec
from .observers import quantize_values
from .rounding import GroupedWeights, group_params, limits


def _upper_inverse(r: np.ndarray) -> np.ndarray:
    """The inverse of an upper-triangular matrix, by halves (matrix products instead of a general solve)."""
    n = r.shape[0]
    if n <= 64:
        return np.triu(np.linalg.inv(r))
    h = n // 2
    a_inv, c_inv = _upper_inverse(r[:h, :h]), _upper_inverse(r[h:, h:])
    out = np.zeros_like(r)
    out[:h, :h], out[h:, h:] = a_inv, c_inv
    out[:h, h:] = -(a_inv @ r[:h, h:]) @ c_inv
    return out


def inverse_cholesky(h: np.ndarray, damp: float) -> np.ndarray:
    """U, upper triangular with ``(H + d I)^-1 = U^T U``, ``d = damp * mean(diag H)``.

    With R upper triangular and ``H = R R^T`` (the Cholesky factor of H with its index order reversed),
    ``H^-1 = R^-T R^-1``, so ``U = R^-1``: one factorisation and one triangular inverse.
    Inputs that are always zero (a zero diagonal) get the mean diagonal: their weights do not change
    the output, and H has no coupling to them, so their rounding error goes nowhere.
    A factorisation that fails (H numerically indefinite) is retried with ten times the damping.
    """
    h = np.array(h, np.float64)
    diag = np.diag(h).copy()
    live = diag > 0
    mean = float(diag[live].mean()) if live.any() else 1.0
    h[~live, ~live] = mean
    for attempt in range(6):
        damped = h + np.diag(np.full(h.shape[0], damp * mean * 10.0**attempt))
        try:
            upper = np.linalg.cholesky(damped[::-1, ::-1])[::-1, ::-1]
        except np.linalg.LinAlgError:
            continue
        return _upper_inverse(np.ascontiguousarray(upper))
    raise CalibrationError("GPTQ: the layer input's second-moment matrix is not positive definite even with "
                           "damping 1e5 times the configured one (NaN or huge calibration values?)")


def shrink_off_diagonal(h: np.ndarray, rows: int) -> tuple[np.ndarray, float]:
    """``H`` with its off-diagonal scaled by ``1 - lam`` (the diagonal kept), and ``lam``: the sampling
    variance of the off-diagonal entries (for Gaussian rows, ``(H_ii H_jj + H_ij^2) / rows``) over
    their squared size, clipped to [0, 1]. Independent inputs give lam near 1 (H is then diagonal and
    GPTQ rounds like RTN); strongly correlated ones, lam near 0."""
    h = np.asarray(h, np.float64)
    diag = np.diag(h)
    off = ~np.eye(h.shape[0], dtype=bool)
    noise = float(np.sum((np.outer(diag, diag) + h * h)[off])) / max(rows, 1)
    size = float(np.sum((h * h)[off]))
    lam = 1.0 if size == 0.0 else min(1.0, noise / size)
    shrunk = h * (1.0 - lam)
    np.fill_diagonal(shrunk, diag)
    return shrunk, lam


def _batches(k: int, block: int, lazy: int):
    """(start, stop) of the lazy batches: whole groups per batch, or batches inside one group."""
    if block <= lazy:
        step = lazy // block * block
        for start in range(0, k, step):
            yield start, min(start + step, k)
        return
    for group in range(0, k, block):
        for start in range(group, min(group + block, k), lazy):
            yield start, min(start + lazy, group + block, k)


def _round_batch(w, u, start, stop, spec, block, out, params):
    """Round rows [start, stop) of ``w`` in place order, updating the batch's later rows; returns the
    scaled errors [stop - start, N] for the update of the rows after the batch."""
    lim = limits(spec)
    errors = np.empty((stop - start, w.shape[1]))
    scale = zp = None
    for row in range(start, stop):
        if row % block == 0 or scale is None:
            if row % block == 0:
                params.append(group_params(w[row:row + block], spec))
            scale, zp = (p.astype(np.float64) for p in params[-1])
        q = quantize_values(w[row], scale, zp, lim)
        out[row] = q
        err = (w[row] - (q - zp) * scale) / u[row, row]
        w[row + 1:stop] -= np.outer(u[row, row + 1:stop], err)
        errors[row - start] = err
    return errors


def gptq(w: np.ndarray, spec: QuantSpec, block: int, hessian: np.ndarray | None) -> GroupedWeights:
    """``w`` [K, N] rounded by GPTQ in groups of ``block`` K rows; ``hessian``: X^T X [K, K] (any scale)."""
    method = spec.method if isinstance(spec.method, GPTQ) else GPTQ()
    if hessian is None:
        raise CalibrationError("GPTQ needs the second moments of the layer's input from calibration")
    k = w.shape[0]
    if hessian.shape != (k, k):
        raise CalibrationError(f"GPTQ: second moments {list(hessian.shape)} do not match the weight's K = {k}")
    u = inverse_cholesky(hessian, method.damp)
    w = np.array(w, np.float64)
    values = np.empty(w.shape, np.int32)
    params: list = []
    for start, stop in _batches(k, block, method.block):
        errors = _round_batch(w, u, start, stop, spec, block, values, params)
        w[stop:] -= u[start:stop, stop:].T @ errors
    scale, zp = (np.stack(p) for p in zip(*params))
    return GroupedWeights(values, scale, zp, block)
