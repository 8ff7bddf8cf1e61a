"""``quantize``: an FP32 Relax module plus calibration data -> a QDQ module for :func:`tvm_lowprec.compile`.

Steps: find the layers (:mod:`.layers`); run the FP32 model compiled by TVM on the calibration data,
observing each layer's input and output (:mod:`.calibrate`); turn the observations into scales and
zero points (:mod:`.observers`) and quantize the weights (4-bit, per-group and GPTQ-rounded matmul
weights: :mod:`.rounding`, :mod:`.gptq`); write the QDQ form (:mod:`.insert_qdq`). Weight-only
configs (``activations=None``) skip calibration unless GPTQ needs the layers' input statistics.
With ``config.target_sqnr``, layers are then kept in FP32, the most harmful first, until the output
SQNR against FP32 reaches the target (:func:`fallback`).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from .calibrate import calibrate, normalise_sample, model_inputs
from .config import DEFAULT_WEIGHTS, GPTQ, RTN, ConfigError, PerChannel, PerGroup, PerTensor, QuantConfig, QuantSpec
from .insert_qdq import BlockedWeight, ConstWeight, LayerPlan, TensorQuant, insert_qdq
from .layers import Layer, find_layers, prepare
from .observers import SecondMoments, TensorStats, observed_range, qparams, qrange
from .rounding import NEEDS_MOMENTS, round_weights

log = logging.getLogger("tvm_lowprec.ptq")


def _activation_quant(stats: TensorStats, spec: QuantSpec, known=None) -> TensorQuant:
    """From the observer, or from ``known``, the range an operator guarantees (a softmax's [0, 1]):
    calibration may not have seen its extremes, and clipping a held-out 0.99 to a calibrated 0.8 hurts."""
    if known is not None:
        lo, hi = known
    else:
        lo, hi = observed_range(spec.observer, stats.lo, stats.hi, stats.sample, spec.dtype, spec.symmetric, spec.bits)
    scale, zp = qparams(lo, hi, spec.dtype, spec.symmetric, spec.bits)
    return TensorQuant(np.asarray(scale, np.float32), np.asarray(zp, spec.dtype), spec.dtype)


def _channel_quant(layer: Layer, spec: QuantSpec) -> TensorQuant:
    """Per-tensor or per-channel scales, each weight rounded to nearest (Relax's dequantize takes them)."""
    w, dtype = layer.weight, spec.carrier
    limits = qrange(dtype, spec.symmetric, spec.bits)
    if isinstance(spec.granularity, PerTensor):
        lo, hi = observed_range(spec.observer, w.min(), w.max(), w.reshape(-1), dtype, spec.symmetric, spec.bits)
        scale, zp = qparams(lo, hi, dtype, spec.symmetric, spec.bits)
        return TensorQuant(np.asarray(scale, np.float32), np.asarray(zp, dtype), dtype, limits=limits)
    axis = _channel_axis(layer, spec)
    per_channel = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
    scales, zps = [], []
    for values in per_channel:
        lo, hi = observed_range(spec.observer, values.min(), values.max(), values, dtype, spec.symmetric, spec.bits)
        s, z = qparams(lo, hi, dtype, spec.symmetric, spec.bits)
        scales.append(s)
        zps.append(z)
    return TensorQuant(np.asarray(scales, np.float32), np.asarray(zps, dtype), dtype, axis, limits)


def _channel_axis(layer: Layer, spec: QuantSpec) -> int:
    w = layer.weight
    axis = layer.channel_axis if spec.granularity.axis is None else spec.granularity.axis % w.ndim
    if axis != layer.channel_axis:
        raise ConfigError(f"layer {layer.name!r}: per-channel weights need the output-channel axis "
                          f"{layer.channel_axis} of its {layer.kind} weight {list(w.shape)}, not axis {axis}")
    return axis


def _blocked(layer: Layer, spec: QuantSpec) -> bool:
    """Whether a matmul's weights are written as a blocked dequantize (4-bit or per-group weights)."""
    return layer.kind == "matmul" and (isinstance(spec.granularity, PerGroup) or spec.carrier != spec.dtype)


def _grouped_weight(layer: Layer, spec: QuantSpec, hessian) -> BlockedWeight | ConstWeight:
    """Matmul weights [K, N] rounded in groups along K (a PerChannel group is all of K) by ``spec.method``."""
    k = layer.weight.shape[0]
    if isinstance(spec.granularity, PerChannel):
        _channel_axis(layer, spec)
    block = spec.granularity.size if isinstance(spec.granularity, PerGroup) else k
    g = round_weights(layer.weight, spec, block, hessian)
    dtype = spec.carrier
    if _blocked(layer, spec):
        zp = None if spec.symmetric and dtype == "int8" else g.zero_point.astype(dtype)
        return BlockedWeight(g.values.astype(dtype), g.scale, zp, block)
    quant = TensorQuant(g.scale[0], g.zero_point[0].astype(dtype), dtype, 1, qrange(dtype, spec.symmetric, spec.bits))
    return ConstWeight(g.values.astype(dtype), quant)


def _weight_quant(layer: Layer, spec: QuantSpec, hessian=None) -> BlockedWeight | ConstWeight:
    if _blocked(layer, spec) or not isinstance(spec.method, RTN):
        return _grouped_weight(layer, spec, hessian)
    quant = _channel_quant(layer, spec)
    return ConstWeight(quant.quantize(layer.weight), quant)


def _check_activation_spec(where: str, spec: QuantSpec) -> None:
    if spec.carrier != spec.dtype:
        raise ConfigError(f"{where}: {spec.dtype} is for weights; activations are uint8 or int8, or None to keep "
                          f"them float (weight-only quantization)")
    if isinstance(spec.granularity, PerGroup):
        raise ConfigError(f"{where}: PerGroup (block) quantization is for weights; activations are quantized "
                          f"per tensor (or None: weight-only)")
    if not isinstance(spec.method, RTN):
        raise ConfigError(f"{where}: {type(spec.method).__name__} is a weight rounding method; activations are "
                          f"rounded to nearest")
    if spec.bits != 8:
        raise ConfigError(f"{where}: bits={spec.bits} is for weights; activations use their dtype's whole "
                          f"range (Relax's quantize clips to it at run time)")
    if isinstance(spec.granularity, PerChannel):
        raise ConfigError(f"{where}: activations are quantized per tensor (the integer kernels take one "
                          f"activation zero point); use PerTensor")


def _check_weight_spec(where: str, spec: QuantSpec) -> None:
    if isinstance(spec.granularity, PerGroup) and spec.carrier == spec.dtype:
        raise ConfigError(f"{where}: PerGroup (block) quantization is for 4-bit weights (int4/uint4) of matmul "
                          f"layers; {spec.dtype} weights use PerChannel or PerTensor")
    if isinstance(spec.method, GPTQ) and isinstance(spec.granularity, PerTensor):
        raise ConfigError(f"{where}: GPTQ needs PerGroup or PerChannel weights, not PerTensor")


def _check_layer(layer: Layer, spec: QuantSpec) -> None:
    """What a conv2d's weights cannot have (blocked scales and GPTQ are for matmul weights [K, N])."""
    if layer.kind != "conv2d":
        return
    problem = ("PerGroup weights" if isinstance(spec.granularity, PerGroup) else
               "GPTQ rounding" if isinstance(spec.method, GPTQ) else "uint4 weights" if spec.dtype == "uint4" else None)
    if problem is not None:
        raise ConfigError(f"layer {layer.name!r}: {problem}: for matmul layers only, not conv2d (conv2d takes "
                          f"int4 PerChannel RTN weights); quantize only matmuls with operators=('matmul',), or "
                          f"override the layer")


def _check_config(config: QuantConfig, layers: list[Layer]) -> None:
    known = [layer.name for layer in layers]
    unknown = [o.layer for o in config.overrides if o.layer not in known]
    if unknown:
        raise ConfigError(f"override(s) for unknown layer(s) {unknown}; the model's layers are {known}")
    specs = [("activations", config.activations), ("weights", config.weights)]
    specs += [(f"override {o.layer!r} {kind}", s) for o in config.overrides
              for kind, s in (("activations", o.activations), ("weights", o.weights)) if s is not None]
    for where, spec in specs:
        if spec is not None:
            (_check_activation_spec if where.endswith("activations") else _check_weight_spec)(where, spec)
    for layer in layers:
        settings = config.for_layer(layer.name)
        if not settings.skip and not layer.runtime_weights:
            _check_layer(layer, settings.weights)


def _observed(layer: Layer) -> list[tuple[str, object]]:
    """(what errors call it, var) of every tensor of ``layer`` that calibration observes."""
    tensors = [(f"layer {layer.name!r} input", layer.x), (f"layer {layer.name!r} output", layer.output)]
    if layer.runtime_weights:
        tensors.append((f"layer {layer.name!r} second input", layer.b))
    return tensors


def _hessian(layer: Layer, spec: QuantSpec, moments) -> np.ndarray | None:
    """The mean ``x^T x`` of the layer's input when its weight rounding needs it."""
    if not isinstance(spec.method, NEEDS_MOMENTS):
        return None
    found = (moments or {}).get(layer.x)
    if found is None:
        from .calibrate import CalibrationError

        raise CalibrationError(f"layer {layer.name!r}: {type(spec.method).__name__} needs the second moments of "
                               f"the layer's input; give calibration_data, or observations from "
                               f"observe(..., moments=True)")
    if isinstance(spec.method, GPTQ) and spec.method.shrink:
        from .gptq import shrink_off_diagonal

        hessian, lam = shrink_off_diagonal(found.mean(), found.rows)
        log.debug("layer %s: GPTQ second moments shrunk by %.3f (%d rows)", layer.name, lam, found.rows)
        return hessian
    return found.mean()


def _scheme(settings, layer: Layer) -> str:
    act = settings.activations
    a = "float" if act is None else act.describe()
    if layer.runtime_weights:
        return f"A {a} x A {a}"
    return f"W {settings.weights.describe()}, A {a}"


def plan_layers(layers, stats_by_var, config: QuantConfig, keep_fp32=(), moments=None) -> list[LayerPlan]:
    """One plan per layer to quantize. ``moments``: var -> :class:`~.observers.SecondMoments` of the
    layer inputs (for GPTQ). Weight-only settings leave ``x``/``output`` None (and skip layers whose
    second operand is an activation: they have no constant weights)."""
    plans = []
    for layer in layers:
        settings = config.for_layer(layer.name)
        act = settings.activations
        if settings.skip or layer.name in keep_fp32 or (act is None and layer.runtime_weights):
            continue
        weight = (_activation_quant(stats_by_var[layer.b], act, layer.b_range) if layer.runtime_weights
                  else _weight_quant(layer, settings.weights, _hessian(layer, settings.weights, moments)))
        x = None if act is None else _activation_quant(stats_by_var[layer.x], act, layer.x_range)
        output = None if act is None else _activation_quant(stats_by_var[layer.output], act)
        plans.append(LayerPlan(layer, x, weight, output, _scheme(settings, layer)))
    return plans


def _with_layer_record(qmod, layers, plans):
    schemes = {p.layer.name: p.scheme for p in plans}
    record = [[layer.name, layer.kind, layer.output.name, "1" if layer.name in schemes else "0",
               schemes.get(layer.name, "float")] for layer in layers]
    gvar = qmod.get_global_var("main")
    qmod[gvar] = qmod["main"].with_attr("lowprec.ptq_layers", record)
    return qmod


def _output_sqnr(mod, reference: list[list[np.ndarray]], feeds, target) -> float:
    import tvm_lowprec

    from .report import _Accumulator

    compiled = tvm_lowprec.compile(mod, target=target)
    acc = _Accumulator()
    for feed, ref in zip(feeds, reference):
        for r, q in zip(ref, compiled(feed)):
            acc.add(r, q)
    return acc.sqnr_db


def _reference(prepared, feeds, target) -> list[list[np.ndarray]]:
    import tvm_lowprec

    fp32 = tvm_lowprec.compile(relax.transform.ConvertToDataflow()(prepared), target=target)
    return [fp32(feed) for feed in feeds]


def fallback(prepared, layers, plans, target_sqnr: float, feeds, target, progress=True):
    """Keep layers in FP32, the most harmful first, until the output SQNR reaches ``target_sqnr``.

    Harm is measured one layer at a time: the output SQNR with only that layer quantized (lowest
    first). Returns (plans left, names kept in FP32, SQNR reached)."""
    from tqdm.auto import tqdm

    reference = _reference(prepared, feeds, target)
    current = _output_sqnr(insert_qdq(prepared, plans), reference, feeds, target)
    if current >= target_sqnr:
        return plans, [], current
    alone = {p.layer.name: _output_sqnr(insert_qdq(prepared, [p]), reference, feeds, target)
             for p in tqdm(plans, desc="sensitivity", disable=not progress, leave=False)}
    order = sorted(alone, key=lambda name: alone[name])
    kept: list[str] = []
    for name in order:
        kept.append(name)
        left = [p for p in plans if p.layer.name not in kept]
        current = _output_sqnr(insert_qdq(prepared, left), reference, feeds, target) if left else float("inf")
        log.info("kept %s in FP32: output SQNR %.2f dB", name, current)
        if current >= target_sqnr:
            break
    return [p for p in plans if p.layer.name not in kept], kept, current


@dataclass
class Observations:
    """What calibration saw: the prepared FP32 module, its layers, statistics of every layer's input and
    output, and the samples; with ``moments``, the second moments ``x^T x`` of the matmul layers'
    inputs (for :class:`~.config.GPTQ`). Independent of the observer choice, so several configs can
    share one (expensive) calibration run: ``quantize(mod, config=c, observations=obs)``."""

    prepared: tvm.IRModule
    layers: list[Layer]
    stats_by_var: dict
    samples: list
    moments: dict = field(default_factory=dict)  # layer input var -> SecondMoments


def _has_matmul_weights(layer: Layer) -> bool:
    """A matmul with constant weights (what GPTQ rounds)."""
    return layer.kind == "matmul" and not layer.runtime_weights


def _calibrate(prepared, layers, samples, *, stats: bool, moments_for: list[Layer], target, progress) -> Observations:
    """Run calibration for what is asked: ``stats`` of every layer's tensors, second moments of the
    inputs of ``moments_for``."""
    tensors, keys_by_var, collectors, moment_keys = {}, {}, {}, {}
    for layer in layers if stats else []:
        for key, var in _observed(layer):
            if var not in keys_by_var:
                keys_by_var[var] = key
                tensors[key] = var
    for layer in moments_for:
        if layer.x not in moment_keys:
            key = f"layer {layer.name!r} input (second moments)"
            moment_keys[layer.x], tensors[key], collectors[key] = key, layer.x, SecondMoments()
    found = calibrate(prepared, tensors, samples, progress=progress, target=target, collectors=collectors)
    return Observations(prepared, layers, {var: found[key] for var, key in keys_by_var.items()}, samples,
                        {var: found[key] for var, key in moment_keys.items()})


def observe(mod: tvm.IRModule, calibration_data, *, target="native", progress: bool = True,
            moments: bool = False) -> Observations:
    """Run the FP32 model (compiled by TVM) on ``calibration_data`` and observe every layer; with
    ``moments=True`` also the second moments of every matmul input (what :class:`~.config.GPTQ` needs;
    K x K float64 per distinct input)."""
    from .calibrate import CalibrationError

    samples = list(calibration_data)
    prepared = prepare(mod)
    layers = find_layers(prepared)
    if not layers:
        raise CalibrationError("nothing to quantize: no matmul or conv2d with constant weights")
    moments_for = [layer for layer in layers if _has_matmul_weights(layer)] if moments else []
    return _calibrate(prepared, layers, samples, stats=True, moments_for=moments_for, target=target, progress=progress)


def _observe_for(mod, calibration_data, config: QuantConfig, *, target, progress) -> Observations:
    """Calibrate for ``config`` only: activation statistics when some layer quantizes activations, second
    moments for the layers whose weight rounding needs them, nothing at all for weight-only RTN."""
    from .calibrate import CalibrationError

    prepared = prepare(mod)
    layers = find_layers(prepared)
    if not layers:
        raise CalibrationError("nothing to quantize: no matmul or conv2d with constant weights")
    selected = [layer for layer in layers if layer.kind in config.operators]
    _check_config(config, selected)
    active = [(layer, config.for_layer(layer.name)) for layer in selected if not config.for_layer(layer.name).skip]
    stats = any(s.activations is not None for _, s in active)
    moments_for = [layer for layer, s in active
                   if isinstance(s.weights.method, NEEDS_MOMENTS) and _has_matmul_weights(layer)]
    samples = list(calibration_data) if calibration_data is not None else None
    if not stats and not moments_for:
        return Observations(prepared, layers, {}, samples or [])
    if samples is None:
        raise CalibrationError("quantize needs calibration_data or observations")
    return _calibrate(prepared, layers, samples, stats=stats, moments_for=moments_for, target=target,
                      progress=progress)


def quantize(mod: tvm.IRModule, calibration_data=None, config: QuantConfig | None = None, *, observations=None,
             validation_data=None, target="native", progress: bool = True) -> tvm.IRModule:
    """Post-training quantization of an FP32 Relax module (e.g. from :func:`tvm_lowprec.from_onnx`).

    Parameters
    ----------
    mod : tvm.IRModule
        The FP32 model.
    calibration_data : iterable
        Samples: dicts by input name, or one array each for a one-input model, or tuples in input order.
        Not needed for weight-only configs (``activations=None``) that round to nearest.
    config : QuantConfig, optional
        Defaults to ONNX Runtime ``quantize_static``'s: uint8 asymmetric per-tensor activations, int8
        symmetric per-channel weights, MinMax. Weight-only int4, for example:
        ``QuantConfig(activations=None, weights=QuantSpec("int4", True, PerGroup(128), method=GPTQ()))``.
    observations : Observations, optional
        From :func:`observe`, instead of calibrating again (``calibration_data`` is then not needed).
    validation_data : iterable, optional
        Inputs for the ``target_sqnr`` fallback (default: the calibration data).

    Returns
    -------
    tvm.IRModule
        The QDQ module; :func:`tvm_lowprec.compile` makes integer kernels of it. ``main`` carries
        ``lowprec.ptq_layers`` (each layer's name, op, output tensor and whether it is quantized),
        read by :func:`~tvm_lowprec.ptq.accuracy_report`.
    """
    from .calibrate import CalibrationError

    explicit = config is not None
    config = config if explicit else QuantConfig.for_target(target)
    if observations is None:
        observations = _observe_for(mod, calibration_data, config, target=target, progress=progress)
    prepared = observations.prepared
    layers = [layer for layer in observations.layers if layer.kind in config.operators]
    _check_config(config, layers)
    active = [layer for layer in layers if not config.for_layer(layer.name).skip]
    if not active:
        raise CalibrationError("nothing to quantize: every layer is skipped by the config")
    plans = plan_layers(active, observations.stats_by_var, config, moments=observations.moments)
    names = model_inputs(mod)
    data = observations.samples if validation_data is None else list(validation_data)
    if config.target_sqnr is not None and not data:
        raise CalibrationError("target_sqnr needs inputs to measure the output SQNR on: give validation_data "
                               "(or calibration_data)")
    notes = []
    if not explicit and config.weights.bits < DEFAULT_WEIGHTS.bits:
        feeds = [normalise_sample(s, names, i) for i, s in enumerate(data[:COST_SAMPLES])]
        notes.append(_reduced_weights_note(prepared, active, observations, config, plans, feeds, target))
        log.warning("%s", notes[-1])
    if config.target_sqnr is not None:
        feeds = [normalise_sample(s, names, i) for i, s in enumerate(data)]
        plans, kept, reached = fallback(prepared, layers, plans, config.target_sqnr, feeds, target, progress)
        if kept:
            log.warning("kept %d layer(s) in FP32 to reach output SQNR %.1f dB (now %.2f dB): %s",
                        len(kept), config.target_sqnr, reached, ", ".join(kept))
    qmod = _with_layer_record(insert_qdq(prepared, plans), layers, plans)
    if notes:  # read by accuracy_report
        qmod[qmod.get_global_var("main")] = qmod["main"].with_attr("lowprec.ptq_notes", notes)
    return qmod


COST_SAMPLES = 4  # samples over which quantize measures what a target's reduced weight range costs


def _reduced_weights_note(prepared, layers, observations, config, plans, feeds, target) -> str:
    """What :meth:`QuantConfig.for_target`'s narrower weights cost: the output SQNR against FP32 with them
    and with full 8-bit weights, on the first :data:`COST_SAMPLES` validation samples."""
    from ..targets import resolve_target

    spec = resolve_target(target)
    full = dataclasses.replace(config, weights=dataclasses.replace(config.weights, bits=DEFAULT_WEIGHTS.bits))
    reference = _reference(prepared, feeds, target)
    reduced_db = _output_sqnr(insert_qdq(prepared, plans), reference, feeds, target)
    full_db = _output_sqnr(insert_qdq(prepared, plan_layers(layers, observations.stats_by_var, full)), reference,
                           feeds, target)
    recipe = spec.bounded[0].intrin
    return (f"weights quantized to {config.weights.bits} bits for target {spec.name}: its fast exact recipe "
            f"({recipe.name}) needs each pair of weights within +-{recipe.weight_pair_bound}, and without VNNI the "
            f"exact alternative is slower; output SQNR against FP32 {reduced_db:.2f} dB, with 8-bit weights "
            f"{full_db:.2f} dB ({reduced_db - full_db:+.2f} dB, {len(feeds)} samples). "
            f"config=QuantConfig() keeps 8-bit weights.")


__all__ = ["Observations", "fallback", "observe", "plan_layers", "quantize"]
