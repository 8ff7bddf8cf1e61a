"""Calibration: run the FP32 model, compiled by TVM, on the calibration inputs and observe the tensors
that feed and leave every quantized layer.

The model is compiled once with those tensors as extra outputs (:func:`with_outputs`); each sample's
values update a :class:`~.observers.TensorStats` per tensor. Bad data stops it with an error naming
the sample and the input or layer: NaN/Inf in an input or in an observed tensor, an empty set, an
input with the wrong name.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable

import numpy as np
import tvm
from tvm import relax

from ..errors import LowPrecError
from ..quant.patterns import bindings
from .observers import TensorStats


class CalibrationError(LowPrecError, ValueError):
    """Calibration data that cannot be used (names the sample and the input or layer)."""


def with_outputs(mod: tvm.IRModule, extra: list[relax.Var]) -> tvm.IRModule:
    """``mod`` (plain bindings) whose ``main`` also returns ``extra`` after its own outputs, as one tuple.

    The original result becomes the tuple's first field (itself a tuple if the model has several)."""
    func = mod["main"]
    body = func.body
    result = relax.Tuple([body.body, *extra])
    new_body = relax.BlockBuilder().normalize(relax.SeqExpr(body.blocks, result))
    new_func = relax.Function(func.params, new_body, None, func.is_pure, func.attrs)
    out = tvm.IRModule(dict(mod.functions))
    out[mod.get_global_var("main")] = new_func
    return out


def model_inputs(mod: tvm.IRModule) -> list[str]:
    main = mod["main"]
    names = main.attrs.get("lowprec.input_names", None) if main.attrs is not None else None
    return [str(n) for n in names] if names is not None else [p.name for p in main.params]


def normalise_sample(sample, names: list[str], index: int) -> dict[str, np.ndarray]:
    """A sample (dict by input name, one array for a one-input model, or a tuple in input order) as a
    dict, checked for NaN/Inf."""
    if isinstance(sample, dict):
        unknown = set(sample) - set(names)
        missing = [n for n in names if n not in sample]
        if unknown or missing:
            raise CalibrationError(f"calibration sample {index}: inputs are {names}; got unknown {sorted(unknown)}, "
                                   f"missing {missing}")
        feed = {n: np.asarray(sample[n]) for n in names}
    elif isinstance(sample, (tuple, list)):
        if len(sample) != len(names):
            raise CalibrationError(f"calibration sample {index}: {len(sample)} arrays for inputs {names}")
        feed = {n: np.asarray(a) for n, a in zip(names, sample)}
    else:
        if len(names) != 1:
            raise CalibrationError(f"calibration sample {index}: one array, but the model has inputs {names}")
        feed = {names[0]: np.asarray(sample)}
    for name, value in feed.items():
        if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
            bad = int(np.sum(~np.isfinite(value)))
            raise CalibrationError(f"calibration sample {index}, input {name!r}: {bad} NaN/Inf value(s)")
    return feed


def _bounds(values: np.ndarray) -> tuple[float, float]:
    """(min, max) of a tensor: one pass each, and NaN or Inf in it shows in them (NaN propagates)."""
    return (float(np.min(values)), float(np.max(values))) if values.size else (0.0, 0.0)


def _update(pool, stats: dict, keys: list, values: list, index: int) -> None:
    """Each key's statistics updated with its tensor, the keys in parallel: the statistics cost about
    half the model run per sample (benchmarks/results/models/calibration.md), and numpy releases the
    GIL in them. Each key has its own collector (with its own generator), so the results do not depend
    on the order. NaN/Inf stops it first, naming the first such key; the (min, max) that finds them is
    handed to the :class:`~.observers.TensorStats` (no second pass)."""
    bounds = list(pool.map(_bounds, values))
    for key, (lo, hi) in zip(keys, bounds):
        if not (np.isfinite(lo) and np.isfinite(hi)):
            raise CalibrationError(f"calibration sample {index}: {key} has NaN/Inf values (the FP32 model "
                                   f"overflows or divides by zero on this input)")

    def one(item):
        key, value, bound = item
        collector = stats[key]
        collector.update(value, bounds=bound) if isinstance(collector, TensorStats) else collector.update(value)

    for _ in pool.map(one, zip(keys, values, bounds)):
        pass


def calibrate(mod: tvm.IRModule, tensors: dict[str, relax.Var], samples: Iterable, *, progress: bool = True,
              target="native", collectors: dict | None = None) -> dict:
    """Run ``mod`` on every sample; statistics of each ``tensors`` entry (key: what errors call it).

    Each entry's values go to a :class:`~.observers.TensorStats`, or to the collector that
    ``collectors`` gives for its key (anything with ``update(values)``, e.g.
    :class:`~.observers.SecondMoments`); the collectors are returned by key. Entries may share a var."""
    import tvm_lowprec
    from tqdm.auto import tqdm

    keys = list(tensors)
    if not keys:
        raise CalibrationError("the model has no layer to quantize (no matmul or conv2d with constant weights)")
    outputs = list(dict.fromkeys(tensors[k] for k in keys))  # each var returned once
    position = {k: outputs.index(tensors[k]) for k in keys}
    observed = with_outputs(mod, outputs)
    compiled = tvm_lowprec.compile(relax.transform.ConvertToDataflow()(observed), target=target)
    names = model_inputs(mod)
    given = collectors or {}
    stats = {k: given[k] if k in given else TensorStats(seed=i) for i, k in enumerate(keys)}
    total = len(samples) if hasattr(samples, "__len__") else None
    count = 0
    bar = tqdm(samples, total=total, desc="calibrating", unit="sample", disable=not progress, leave=False)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for index, sample in enumerate(bar):  # the bar shows samples per second
            feed = normalise_sample(sample, names, index)
            values = [np.asarray(v) for v in compiled(feed)[-len(outputs):]]
            _update(pool, stats, keys, [values[position[k]] for k in keys], index)
            count += 1
    if count == 0:
        raise CalibrationError("the calibration set is empty")
    return stats


def tensor_vars(mod: tvm.IRModule) -> dict[str, relax.Var]:
    """Every var of ``main`` by name hint (names must be unique to be looked up)."""
    table = {}
    for p in mod["main"].params:
        table[p.name] = p
    for b in bindings(mod["main"]):
        table[b.var.name] = b.var
    return table
