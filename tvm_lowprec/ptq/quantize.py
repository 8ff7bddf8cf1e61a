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
from .config import (
    DEFAULT_WEIGHTS, FLOAT_WEIGHTS, GPTQ, RTN, ConfigError, PerChannel, PerGroup, PerTensor, QuantConfig, QuantSpec,
)
from .insert_qdq import Bf16Weight, BlockedWeight, ConstWeight, LayerPlan, TensorQuant, insert_qdq
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
    if spec.dtype in FLOAT_WEIGHTS:  # rounded to bf16 as vcvtneps2bf16 rounds: to nearest even
        from ..kernels.bf16_gemm import round_to_bf16

        return Bf16Weight(round_to_bf16(layer.weight), conv=layer.kind == "conv2d")
    if _blocked(layer, spec) or not isinstance(spec.method, RTN):
        return _grouped_weight(layer, spec, hessian)
    quant = _channel_quant(layer, spec)
    return ConstWeight(quant.quantize(layer.weight), quant)


def _check_activation_spec(where: str, spec: QuantSpec) -> None:
    if spec.dtype in FLOAT_WEIGHTS:
        raise ConfigError(f"{where}: {spec.dtype} is a weight spec (weights={spec.dtype!r} keeps the layer's "
                          f"activations float)")
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
    if layer.activation is not None:
        tensors.append((f"layer {layer.name!r} activation (SiLU)", layer.activation))
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


# False: leave such channels' scales as calibrated; the integer rewrite then keeps the layer in float QDQ
# arithmetic (exact to the QDQ graph, slower). For measuring the two treatments (docs/ptq.md).
WIDEN_OVERFLOWING_BIAS = True
BIAS_LIMIT = 2**30  # the most accumulator units a quantized bias may take: half of int32, the rest left to
# the zero-point corrections and the accumulator itself (K * 255 * 127 < 2**30 for K up to 33000)


def _fit_bias(layer: Layer, x: TensorQuant, weight: ConstWeight) -> tuple[ConstWeight, str]:
    """Widen the weight scale of each output channel whose bias, in accumulator units ``s_x * s_w``, would
    exceed :data:`BIAS_LIMIT` (a near-zero weight channel, e.g. after BatchNormalization folding, meeting a
    large bias), to ``|bias| / (s_x * BIAS_LIMIT)``, and round that channel's weights again, as ONNX
    Runtime's quantizer does; returns the weight and a note naming the channels ("" when none)."""
    if layer.bias is None or x is None:
        return weight, ""
    q = weight.quant
    channels = layer.weight.shape[layer.channel_axis]
    bias = np.abs(np.broadcast_to(layer.bias.astype(np.float64), (channels,)))
    s_x = float(np.asarray(x.scale).reshape(-1)[0])
    scale = np.broadcast_to(q.scale.astype(np.float64), (channels,))
    need = bias / (s_x * BIAS_LIMIT)
    bad = np.flatnonzero(need > scale)
    if not bad.size:
        return weight, ""
    if q.scale.ndim == 0:  # one scale for the tensor: widen it for every channel
        new_scale = np.asarray(np.float32(need.max()))
    else:
        new_scale = q.scale.copy()
        new_scale[bad] = need[bad].astype(np.float32)
    quant = dataclasses.replace(q, scale=np.asarray(new_scale, np.float32))
    values = weight.values.copy()
    axis = layer.channel_axis
    fresh = quant.quantize(layer.weight)
    index = [slice(None)] * values.ndim
    index[axis] = bad if q.scale.ndim else slice(None)
    values[tuple(index)] = fresh[tuple(index)]
    widest = float(np.max(need[bad] / scale[bad]))
    shown = [int(c) for c in bad[:8]] + (["..."] if bad.size > 8 else [])
    note = (f"layer {layer.name!r}: weight scale of output channel(s) {shown} ({bad.size} of {channels}) widened "
            f"(up to x{widest:.3g}) so that the bias fits int32 at s_x * s_w (largest |bias| {bias[bad].max():.4g}, "
            f"weights there at most {np.abs(np.moveaxis(layer.weight, axis, 0)[bad]).max():.3g})")
    return ConstWeight(values, quant), note


def plan_layers(layers, stats_by_var, config: QuantConfig, keep_fp32=(), moments=None) -> list[LayerPlan]:
    """One plan per layer to quantize. ``moments``: var -> :class:`~.observers.SecondMoments` of the
    layer inputs (for GPTQ). Weight-only settings leave ``x``/``output`` None (and skip layers whose
    second operand is an activation: they have no constant weights)."""
    plans = []
    for layer in layers:
        settings = config.for_layer(layer.name)
        if settings.weights.dtype in FLOAT_WEIGHTS:  # bfloat16 weights: the activations stay float
            settings = dataclasses.replace(settings, activations=None)
        act = settings.activations
        if settings.skip or layer.name in keep_fp32 or (act is None and layer.runtime_weights):
            continue
        weight = (_activation_quant(stats_by_var[layer.b], act, layer.b_range) if layer.runtime_weights
                  else _weight_quant(layer, settings.weights, _hessian(layer, settings.weights, moments)))
        x = None if act is None else _activation_quant(stats_by_var[layer.x], act, layer.x_range)
        output = None if act is None else _activation_quant(stats_by_var[layer.output], act)
        activation = None if act is None or layer.activation is None else \
            _activation_quant(stats_by_var[layer.activation], act)
        note = ""
        if isinstance(weight, ConstWeight) and WIDEN_OVERFLOWING_BIAS:
            weight, note = _fit_bias(layer, x, weight)
        plans.append(LayerPlan(layer, x, weight, output, _scheme(settings, layer), note, activation))
    return plans


def _with_layer_record(qmod, layers, plans):
    schemes = {p.layer.name: p.scheme for p in plans}
    record = [[layer.name, layer.kind, layer.output.name, "1" if layer.name in schemes else "0",
               schemes.get(layer.name, "float")] for layer in layers]
    gvar = qmod.get_global_var("main")
    qmod[gvar] = qmod["main"].with_attr("lowprec.ptq_layers", record)
    return qmod


def output_names(mod) -> list[str]:
    """The names of ``mod["main"]``'s outputs: the ONNX graph's (``lowprec.output_names``, set by
    :func:`tvm_lowprec.from_onnx`), else ``output 0``, ``output 1``, ..."""
    main = mod["main"]
    ret = main.ret_ty
    count = len(ret.fields) if isinstance(ret, relax.TupleType) else 1
    attrs = main.attrs
    names = [str(n) for n in attrs["lowprec.output_names"]] if attrs is not None and "lowprec.output_names" in attrs \
        else []
    return names if len(names) == count else [f"output {i}" for i in range(count)]


def _selected_outputs(mod, config: QuantConfig) -> list[int]:
    """Indices of the outputs ``config.target_sqnr`` must hold on (all, or ``config.target_outputs``)."""
    names = output_names(mod)
    if config.target_outputs is None:
        return list(range(len(names)))
    unknown = [n for n in config.target_outputs if n not in names]
    if unknown:
        raise ConfigError(f"target_outputs {unknown} are not outputs of the model; its outputs are {names}")
    return [names.index(n) for n in config.target_outputs]


def _per_output_sqnr(mod, reference: list[list[np.ndarray]], feeds, target) -> list[float]:
    """Each output's own SQNR against FP32 over all ``feeds``."""
    import tvm_lowprec

    from .report import _Accumulator

    compiled = tvm_lowprec.compile(mod, target=target)
    accs = [_Accumulator() for _ in reference[0]] if reference else []
    for feed, ref in zip(feeds, reference):
        for acc, r, q in zip(accs, ref, compiled(feed)):
            acc.add(r, q)
    return [acc.sqnr_db for acc in accs]


def _output_sqnr(mod, reference: list[list[np.ndarray]], feeds, target, outputs=None) -> float:
    """The binding (lowest) SQNR among ``outputs`` (indices; default all)."""
    per = _per_output_sqnr(mod, reference, feeds, target)
    return min(per[i] for i in (range(len(per)) if outputs is None else outputs))


def _reference(prepared, feeds, target) -> list[list[np.ndarray]]:
    import tvm_lowprec

    fp32 = tvm_lowprec.compile(relax.transform.ConvertToDataflow()(prepared), target=target)
    return [fp32(feed) for feed in feeds]


@dataclass
class FallbackResult:
    """What :func:`fallback` did: the plans left, the layers kept in FP32 (in the order kept), the
    binding output (lowest SQNR among those the target is for) and every output's SQNR after it
    (by name), and ``alone``: each planned layer's isolated harm, the binding output's SQNR with only
    that layer quantized."""

    plans: list
    kept: list[str]
    reached: float
    binding: str
    per_output: dict[str, float]
    alone: dict[str, float]


def _binding(per: list[float], outputs: list[int], names: list[str]) -> tuple[str, float]:
    index = min(outputs, key=lambda i: per[i])
    return names[index], per[index]


def fallback(prepared, layers, plans, target_sqnr: float, feeds, target, progress=True, outputs=None,
             names=None) -> FallbackResult:
    """Keep layers in FP32, the most harmful first, until every output in ``outputs`` (indices; default
    all) reaches ``target_sqnr``, each output's SQNR measured on its own.

    Harm is measured one layer at a time: the lowest SQNR among ``outputs`` with only that layer
    quantized (lowest first); it is measured even when the target already holds, for the report."""
    from tqdm.auto import tqdm

    reference = _reference(prepared, feeds, target)
    names = names or [f"output {i}" for i in range(len(reference[0]))]
    outputs = list(range(len(names))) if outputs is None else list(outputs)
    per = _per_output_sqnr(insert_qdq(prepared, plans), reference, feeds, target)
    alone = {}
    for p in tqdm(plans, desc="sensitivity", disable=not progress, leave=False):
        alone[p.layer.name] = _binding(_per_output_sqnr(insert_qdq(prepared, [p]), reference, feeds, target),
                                       outputs, names)[1]
    kept: list[str] = []
    for name in sorted(alone, key=lambda n: alone[n]):
        if _binding(per, outputs, names)[1] >= target_sqnr:
            break
        kept.append(name)
        left = [p for p in plans if p.layer.name not in kept]
        per = _per_output_sqnr(insert_qdq(prepared, left), reference, feeds, target) if left \
            else [float("inf")] * len(names)
        binding, reached = _binding(per, outputs, names)
        log.info("kept %s in FP32: lowest output SQNR %.2f dB (%s)", name, reached, binding)
    binding, reached = _binding(per, outputs, names)
    return FallbackResult([p for p in plans if p.layer.name not in kept], kept, reached, binding,
                          dict(zip(names, per)), alone)


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
    return quantize_with_plans(mod, calibration_data, config, observations=observations,
                               validation_data=validation_data, target=target, progress=progress)[0]


def quantize_with_plans(mod: tvm.IRModule, calibration_data=None, config: QuantConfig | None = None, *,
                        observations=None, validation_data=None, target="native", progress: bool = True):
    """:func:`quantize`, also returning the :class:`~.insert_qdq.LayerPlan` of every layer left quantized
    (what :func:`~.export_onnx.export_qdq` writes into the ONNX graph)."""
    from ..frontend.relax_module import prepare_module
    from .calibrate import CalibrationError

    mod = prepare_module(mod)  # a TVM frontend's weights kept as inputs: bound as constants
    explicit = config is not None
    config = config if explicit else QuantConfig.for_target(target)
    _selected_outputs(mod, config)  # unknown target_outputs: an error before calibration
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
    notes = [p.note for p in plans if p.note]
    for note in notes:
        log.warning("%s", note)
    if not explicit and config.weights.bits < DEFAULT_WEIGHTS.bits:
        feeds = [normalise_sample(s, names, i) for i, s in enumerate(data[:COST_SAMPLES])]
        notes.append(_reduced_weights_note(prepared, active, observations, config, plans, feeds, target))
        log.warning("%s", notes[-1])
    isolated = None
    if config.target_sqnr is not None:
        selected = _selected_outputs(mod, config)
        feeds = [normalise_sample(s, names, i) for i, s in enumerate(data)]
        result = fallback(prepared, layers, plans, config.target_sqnr, feeds, target, progress, selected,
                          output_names(mod))
        plans, isolated = result.plans, result.alone
        notes = [n for n in notes if not any(n.startswith(f"layer {k!r}:") for k in result.kept)]  # now FP32
        notes.append(_fallback_note(config, result, [output_names(mod)[i] for i in selected], len(feeds)))
        (log.warning if result.kept or result.reached < config.target_sqnr else log.info)("%s", notes[-1])
    qmod = _with_layer_record(insert_qdq(prepared, plans), layers, plans)
    main = qmod["main"]
    if notes:  # read by accuracy_report
        main = main.with_attr("lowprec.ptq_notes", notes)
    if isolated is not None:
        main = main.with_attr("lowprec.ptq_isolated", [[n, repr(float(v))] for n, v in isolated.items()])
    if main is not qmod["main"]:
        qmod[qmod.get_global_var("main")] = main
    return qmod, plans


def _fallback_note(config: QuantConfig, result: FallbackResult, selected: list[str], samples: int) -> str:
    per = ", ".join(f"{n} {v:.2f} dB" for n, v in result.per_output.items())
    what = f"outputs {selected}" if config.target_outputs is not None else "every output"
    if result.kept:
        done = f"kept {len(result.kept)} layer(s) in FP32 ({', '.join(result.kept)})"
    else:
        done = "kept no layer in FP32"
    status = "reached" if result.reached >= config.target_sqnr else "NOT reached"
    return (f"target_sqnr {config.target_sqnr:g} dB on {what}: {done}; {status}: binding output {result.binding!r} "
            f"at {result.reached:.2f} dB (per output: {per}; {samples} validation sample(s))")


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


__all__ = ["FallbackResult", "Observations", "fallback", "observe", "output_names", "plan_layers", "quantize",
           "quantize_with_plans"]
