"""The bf16 GEMM on ``vdpbf16ps`` (AVX512_BF16): float8 weights (and bfloat16 PTQ layers) on the AVX-512 VNNI
row where the CPU has it, the float32 path elsewhere.

Proves:

- the instruction's emulated semantics (``tvm_lowprec.intrin.semantics.Bf16DotSemantics``) equal an
  independent numpy model of Intel's pseudo-code (odd pair first, FMA, denormals in read as zero,
  results flushed when tiny after rounding) on random bits and on the edge cases, and, where this host
  has AVX512_BF16, the instruction itself;
- an ONNX model with float8 ``DequantizeLinear`` weights compiled for the VNNI row runs the bf16 kernel
  (its assembly has ``vdpbf16ps`` on zmm), natively or emulated, and equals the numpy model of exactly
  its arithmetic (activations rounded to bf16 once, the pairs summed in the instruction's order, the
  scale after) bit for bit, at M = 1, 3, 16 with K odd and N not a multiple of the tile;
- its difference from the float32 path stays within the activation rounding's bound (2**-9 per product);
- a spec derived for a CPU without AVX512_BF16 (a Cascade Lake, a user target) has no bf16 recipe and
  takes the float32 path; the registered row runs natively only where the host has AVX512_BF16.
"""

import re

import ml_dtypes
import numpy as np
import pytest
import tvm
from onnx.reference import ReferenceEvaluator
from tvm.script import tirx as T

import tvm_lowprec
from conftest import kernel_module
from test_fp8_weights import MDT, _model, _scale, _weights
from test_targets import XEON_FLAGS
from tvm_lowprec import targets
from tvm_lowprec.emulation import execution_mode
from tvm_lowprec.intrin.x86_bf16 import IMPORT_PRAGMA
from tvm_lowprec.kernels.bf16_gemm import OP, bf16_to_float32, float8_to_bf16, round_to_bf16
from tvm_lowprec.targets import host_supports, registered_targets, resolve_target

ROWS = [s for s in registered_targets("cpu").values() if s.bf16 is not None]
VNNI = registered_targets()["x86-avx512-vnni"]
F32, F64 = np.float32, np.float64


# ------------------------------------------------------------------------------ the numpy model


def _daz(x):
    """A float32 denormal read as a zero of its sign."""
    x = np.asarray(x, F32)
    return np.where((x.view(np.uint32) & 0x7F800000) == 0, np.copysign(F32(0), x), x)


def _fma(a, b, c):
    """``a * b + c`` as one step of VDPBF16PS: inputs DAZ, one rounding to nearest even, FTZ of a result
    tiny after rounding (x86: rounded to 24 bits with an unbounded exponent, below 2**-126). float64
    holds the bf16 product exactly, and a float64 sum rounded again to float32 is the correctly rounded
    float32 sum (53 >= 2 * 24 + 2); scaled by 2**24 the same holds for the tininess test."""
    v = _daz(a).astype(F64) * _daz(b).astype(F64) + _daz(c).astype(F64)
    with np.errstate(over="ignore", invalid="ignore"):
        r = v.astype(F32)
        tiny = np.abs((v * 2.0**24).astype(F32)) < F32(2.0**-102)
    return np.where(tiny, np.copysign(F32(0), r), r)


def _vdpbf16ps(acc, a_bits, b_bits):
    """The SDM's pseudo-code per float32 lane: the odd pair (2i+1) first, then the even one."""
    a, b = bf16_to_float32(a_bits), bf16_to_float32(b_bits)
    return _fma(a[0::2], b[0::2], _fma(a[1::2], b[1::2], acc))


def _to_bf16(x):
    """VCVTNEPS2BF16 (per the SDM): a denormal to a zero of its sign, else round to nearest even (ml_dtypes)."""
    with np.errstate(invalid="ignore"):  # NaN stays NaN
        return _daz(x).astype(ml_dtypes.bfloat16).astype(F32)


def _gemm_model(x, w, scale):
    """The bf16 GEMM, exactly: ``w[K, N]`` bf16 values; K padded to pairs with zeros."""
    xb = _to_bf16(x)
    if x.shape[1] % 2:
        xb, w = np.pad(xb, ((0, 0), (0, 1))), np.pad(w, ((0, 1), (0, 0)))
    acc = np.zeros((x.shape[0], w.shape[1]), F32)
    for j in range(0, xb.shape[1], 2):
        acc = _fma(xb[:, j + 1, None], w[None, j + 1], acc)
        acc = _fma(xb[:, j, None], w[None, j], acc)
    return (acc * np.asarray(scale, F32)).astype(F32)


def _bits(values):
    return np.asarray(values, F32).view(np.uint32) >> 16


def test_the_model_is_the_documented_arithmetic():
    """The cases the pseudo-code decides, written out: the order of the two products, flushing, DAZ."""
    one, big = _bits([1.0]), _bits([2.0**24])
    # odd pair first: (2**24 + 1) rounds to 2**24 (ties to even), then - 2**24: 0; the other order gives 1
    assert _vdpbf16ps(F32([2.0**24]), np.r_[_bits([-1.0]), one], np.r_[big, one])[0] == 0
    # a denormal bf16 operand reads as 0, a denormal accumulator too
    assert _vdpbf16ps(F32([1.5e-40]), np.uint16([0x0001, 0x3F80]), np.uint16([0x3F80, 0x0003]))[0] == 0
    # -2**-130 (the even pair's product, added last) is flushed to a zero of its sign
    assert np.signbit(_vdpbf16ps(F32([0.0]), _bits([-(2.0**-65), 0.0]), _bits([2.0**-65, 0.0]))[0])
    # tiny *after* rounding: 2**-126 - 1.5 * 2**-151 rounds (24 bits, unbounded exponent) to
    # 2**-126 - 2**-150, tiny: flushed, though IEEE gradual underflow rounds it up to 2**-126
    edge = _vdpbf16ps(F32([2.0**-126]), _bits([0.0, -1.5 * 2.0**-75]), _bits([0.0, 2.0**-76]))[0]
    assert edge == 0 and F32(2.0**-126 - 1.5 * 2.0**-151) == F32(2.0**-126)


# ------------------------------------------------------------------------------ the instruction


def _probe(spec):
    """A kernel applying the row's instruction once to 16 lanes: ``out = vdpbf16ps(acc, a, b)``."""
    intrin = spec.bf16.intrin
    n, n2 = intrin.lanes, 2 * intrin.lanes
    helper = re.search(r"define <\d+ x float> @(\w+)\(", intrin.llvm_import).group(1)

    @T.prim_func
    def probe(a: T.Buffer((n2,), "uint16"), b: T.Buffer((n2,), "uint16"), acc: T.Buffer((n,), "float32"),
              out: T.Buffer((n,), "float32")):
        T.func_attr({"global_symbol": "probe"})
        with T.attr(0, IMPORT_PRAGMA, intrin.llvm_import):
            out[T.ramp(0, 1, n)] = T.call_pure_extern(f"float32x{n}", helper, acc.vload([0], f"float32x{n}"),
                                                      a.vload([0], f"uint16x{n2}"), b.vload([0], f"uint16x{n2}"))

    return tvm.compile(tvm.IRModule({"probe": probe}), target=spec.tvm_target(1)).mod


def _operand_sets(rng, n):
    def bf16(values):
        return round_to_bf16(np.asarray(values, F32))

    normal = lambda: bf16(rng.standard_normal(2 * n) * 4)  # noqa: E731
    denormal = rng.integers(1, 0x80, 2 * n).astype(np.uint16) | (rng.integers(0, 2, 2 * n).astype(np.uint16) << 15)
    tiny = bf16(rng.choice([-1, 1], 2 * n) * 2.0 ** rng.integers(-75, -55, 2 * n))
    return {
        "random bits": (rng.integers(0, 1 << 16, 2 * n).astype(np.uint16), rng.integers(0, 1 << 16, 2 * n).astype(np.uint16),
                        rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(F32)),
        "normal values": (normal(), normal(), rng.standard_normal(n).astype(F32)),
        "denormal operands": (denormal, normal(), rng.standard_normal(n).astype(F32)),
        "denormal accumulator": (normal(), normal(), (rng.integers(1, 1 << 23, n).astype(np.uint32)).view(F32)),
        "tiny results": (tiny, tiny, np.zeros(n, F32)),
        "cancellation": (np.r_[bf16([1.0]), bf16([3.0])].repeat(n), np.r_[bf16([1.0]), bf16([-1.0])].repeat(n)[::-1],
                         np.full(n, 2.0**24, F32)),
        "overflow": (bf16(np.full(2 * n, 2.0**100)), bf16(np.full(2 * n, -(2.0**100))), np.zeros(n, F32)),
        # 2**-126 - m * 2**-151: tiny after rounding for m in (1, 3), whatever IEEE gradual underflow says
        "tininess after rounding": (bf16(np.stack([np.zeros(n), -np.resize([0.5, 1, 1.25, 1.5, 2, 2.5, 3], n) * 2.0**-75], 1).ravel()),
                                    bf16(np.resize([0.0, 2.0**-76], 2 * n)), np.full(n, 2.0**-126, F32)),
    }


@pytest.mark.parametrize("spec", ROWS, ids=lambda s: s.name)
def test_semantics_equal_the_sdm_pseudo_code(spec, rng):
    lib = _probe(spec)
    modules = {"emulated": kernel_module(lib, spec, emulate=True)}
    if execution_mode(spec) == "native":
        modules["native"] = lib
    n = spec.bf16.intrin.lanes
    for case, (a, b, acc) in _operand_sets(rng, n).items():
        with np.errstate(invalid="ignore"):
            want = _vdpbf16ps(acc, a, b)
        for how, module in modules.items():
            args = [tvm.runtime.tensor(v) for v in (a, b, acc, np.zeros(n, F32))]
            module["probe"](*args)
            got = args[-1].numpy()
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{case} ({how}): NaN lanes")
            keep = ~np.isnan(want)
            np.testing.assert_array_equal(got[keep].view(np.uint32), want[keep].view(np.uint32), err_msg=f"{case} ({how})")


def test_bf16_conversions_are_exact():
    """float8 -> bf16 is exact for every code; float32 -> bf16 is VCVTNEPS2BF16's rounding."""
    codes = np.arange(256, dtype=np.uint8)
    for fmt, mdt in MDT.items():
        want = codes.view(mdt).astype(F32)
        got = bf16_to_float32(float8_to_bf16(codes, fmt))
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(got[~np.isnan(want)].view(np.uint32), want[~np.isnan(want)].view(np.uint32))
    x = np.random.default_rng(0).integers(0, 1 << 32, 1 << 16, dtype=np.uint64).astype(np.uint32).view(F32)
    x[:4] = [np.inf, -np.inf, 1.5e-40, F32(3.4028235e38)]  # a denormal, the largest finite (rounds to inf)
    got, want = bf16_to_float32(round_to_bf16(x)), _to_bf16(x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~np.isnan(want)].view(np.uint32), want[~np.isnan(want)].view(np.uint32))
    assert (round_to_bf16(x)[np.isnan(x)] & 0x40).all()  # NaN quieted, as the instruction does


# ------------------------------------------------------------------------------ float8 weights on the bf16 kernel


def _bf16_kernels(compiled):
    return [k for k in compiled.kernels() if k.op == OP]


CASES = [  # (format, M, K, N): GEMV, M padded to the 2-row tile, 16 rows; K odd (a padded pair); N not a whole tile
    ("float8_e4m3fn", 1, 37, 45),
    ("float8_e5m2", 3, 64, 100),
    ("float8_e4m3fn", 16, 33, 20),
    ("float8_e5m2", 16, 96, 136),
]


@pytest.mark.parametrize("fmt, m, k, n", CASES, ids=[f"{c[0][7:]}-{c[1]}x{c[2]}x{c[3]}" for c in CASES])
def test_fp8_model_on_the_vnni_row_equals_the_numpy_model(fmt, m, k, n, rng):
    w = _weights(fmt, k, n, rng)
    scale = _scale("channel", n)
    model = _model(fmt, w, scale, (m, k))
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target=VNNI)
    assert compiled.execution == ("native" if host_supports(VNNI) else "emulated")
    [kernel] = _bf16_kernels(compiled)
    assert kernel.intrinsic == VNNI.bf16.intrin.intrin and kernel.shape == (m, n, k)
    assert not [k for k in compiled.kernels() if k.op == "fp8_weights"]
    assert re.search(r"vdpbf16ps\s+[^\n]*%zmm\d+, %zmm\d+$", compiled.inspect_source("asm"), re.MULTILINE)
    x = (rng.standard_normal((m, k)) * 3).astype(F32)
    x[0, :3] = [1.5e-40, -0.0, 1 + 2.0**-8]  # a denormal (to zero), -0, a tie (to even)
    got = compiled(x)[0]
    want = _gemm_model(x, w.view(MDT[fmt]).astype(F32), scale)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    if compiled.emulation is not None:
        assert compiled.emulation.replaced == {"llvm.x86.avx512bf16.dpbf16ps.512": compiled.emulation.found[
            "llvm.x86.avx512bf16.dpbf16ps.512"]}


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the model's inf - inf
def test_e5m2_infinities_and_nan_weights_widen_exactly(rng):
    w = _weights("float8_e5m2", 24, 16, rng)
    w[3, 2], w[5, 7], w[9, 7], w[1, 11] = 0x7C, 0xFC, 0x7C, 0x7E  # +inf, -inf, +inf (NaN sum), NaN
    scale = _scale("channel", 16)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(_model("float8_e5m2", w, scale, (3, 24))), target=VNNI)
    assert _bf16_kernels(compiled)
    x = rng.standard_normal((3, 24)).astype(F32) + 0.5
    got, want = compiled(x)[0], _gemm_model(x, w.view(MDT["float8_e5m2"]).astype(F32), scale)
    assert np.isnan(want[:, [7, 11]]).all() and np.isinf(want[:, 2]).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    keep = ~np.isnan(want)
    np.testing.assert_array_equal(got[keep].view(np.uint32), want[keep].view(np.uint32))


def test_bf16_path_is_within_the_activation_rounding_of_the_float32_path(rng):
    """Each product's activation is rounded to bf16 (relative error at most 2**-9); the weights are exact.
    So ``|y_bf16 - y| <= (2**-9 + K * 2**-23) * (|x| @ |w|) * |scale|`` per output (the second term: both
    float32 sums' rounding). Measured here and quoted in docs/numerics.md: the relative error of the
    whole output (Frobenius) against float64."""
    fmt, m, k, n = "float8_e4m3fn", 16, 256, 64
    w = _weights(fmt, k, n, rng)
    scale = _scale("channel", n)
    model = _model(fmt, w, scale, (m, k))
    x = rng.standard_normal((m, k)).astype(F32)
    bf16 = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target=VNNI)(x)[0]
    fp32 = ReferenceEvaluator(model).run(None, {"x": x})[0]
    wv = w.view(MDT[fmt]).astype(F64)
    exact = (x.astype(F64) @ wv) * scale
    bound = (2.0**-9 + k * 2.0**-23) * (np.abs(x).astype(F64) @ np.abs(wv)) * np.abs(scale)
    assert (np.abs(bf16 - exact) <= bound).all() and (np.abs(bf16 - fp32) <= bound).all()
    rel = np.linalg.norm(bf16 - exact) / np.linalg.norm(exact)
    assert 2.0**-12 < rel < 2.0**-8, rel  # about 2**-10 (docs/numerics.md): rounded, not truncated, nor exact


# ------------------------------------------------------------------------------ rows and derived specs


@pytest.mark.parametrize("spec", ROWS, ids=lambda s: s.name)
def test_the_rows_cpu_has_the_recipe_and_the_row_needs_it_to_run_natively(spec):
    llvm_features = {str(f) for f in tvm.target.codegen.llvm_get_cpu_features(spec.tvm_target())}
    assert set(spec.bf16.intrin.features) <= llvm_features  # the row's mcpu emits vdpbf16ps
    assert not set(spec.bf16.intrin.features) <= set(spec.features)  # optional: not needed to pick the row
    assert set(spec.bf16.intrin.features) <= set(spec.code_features)


def test_a_bf16_recipe_checks_itself():
    import dataclasses

    from tvm_lowprec.hwspec import GemmRecipe, Tile

    intrin = VNNI.bf16.intrin
    with pytest.raises(ValueError, match="does not fit 32 registers"):  # 28 accumulators + 4 weights + a broadcast
        dataclasses.replace(VNNI, bf16=GemmRecipe(intrin, (Tile(1, mr=7, nr=4),)))
    with pytest.raises(ValueError, match="needs a Bf16Intrin"):
        dataclasses.replace(VNNI, bf16=GemmRecipe(VNNI.gemm, VNNI.tiles))
    with pytest.raises(ValueError, match="lanes"):
        dataclasses.replace(intrin, lanes=8)


def test_a_target_without_avx512bf16_drops_the_recipe_and_takes_the_float32_path(rng):
    cascade = resolve_target({"kind": "llvm", "mcpu": "cascadelake"})
    assert cascade.name == "x86-avx512-vnni@cascadelake" and cascade.bf16 is None and cascade.int16 is not None
    for mcpu in ("sapphirerapids", "znver4"):
        assert resolve_target({"kind": "llvm", "mcpu": mcpu}).bf16 == VNNI.bf16
    fmt = "float8_e4m3fn"
    model = _model(fmt, _weights(fmt, 40, 24, rng), _scale("channel", 24), (3, 40))
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target={"kind": "llvm", "mcpu": "cascadelake"})
    assert not _bf16_kernels(compiled) and [k.op for k in compiled.kernels() if k.op == "fp8_weights"]
    assert "vdpbf16ps" not in compiled.inspect_source("asm")
    x = rng.standard_normal((3, 40)).astype(F32)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(compiled(x)[0], want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_native_keeps_the_recipe_only_where_the_host_has_it(monkeypatch):
    xeon = targets.cpuinfo_features(XEON_FLAGS)  # an Emerald Rapids: avx512_bf16
    cascade_lake = xeon - {"avx512bf16", "amxbf16", "avx512fp16"}
    monkeypatch.setattr(targets, "host_features", lambda: xeon)
    assert targets.native_target().bf16 == VNNI.bf16 and targets.host_supports(VNNI)
    monkeypatch.setattr(targets, "host_features", lambda: cascade_lake)
    native = targets.native_target()
    assert native.row == "x86-avx512-vnni" and native.bf16 is None
    assert targets.host_supports(native) and not targets.host_supports(VNNI)  # the row's build may call vdpbf16ps


@pytest.mark.parametrize("cpu", ["rocketlake", "x86-64"])
def test_native_switches_on_its_kernels_features_whatever_cpu_llvm_names(monkeypatch, rng, cpu):
    """A 2-core KVM Xeon with AMX and AVX512_BF16 (family 6, model 167) is "rocketlake" to LLVM, which has
    no AVX512_BF16: with only that mcpu, the bf16 GEMM's vdpbf16ps aborted LLVM ("Do not know how to
    split this operator's operand!"). The native target names its kernels' features itself."""
    monkeypatch.delenv("TVM_LOWPREC_HOST_FEATURES", raising=False)  # this test names the host itself
    monkeypatch.setattr(targets, "host_features", lambda: targets.cpuinfo_features(XEON_FLAGS))
    monkeypatch.setattr(tvm.target.codegen, "llvm_get_system_cpu", lambda: cpu)
    native = targets.native_target()
    assert native.llvm["mcpu"] == cpu and native.bf16 == VNNI.bf16
    enabled = {str(f) for f in tvm.target.codegen.llvm_get_cpu_features(native.tvm_target())}
    assert set(native.code_features) <= enabled
    fmt = "float8_e4m3fn"
    model = _model(fmt, _weights(fmt, 40, 24, rng), _scale("channel", 24), (3, 40))
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target=native)
    assert _bf16_kernels(compiled) and "vdpbf16ps" in compiled.inspect_source("asm")


# ------------------------------------------------------------------------------ PTQ: QuantSpec("bfloat16")


def test_a_ptq_layer_in_bfloat16_runs_on_the_bf16_kernel(rng):
    """``LayerOverride(name, weights=QuantSpec("bfloat16"))``: that layer keeps float activations and
    bf16-rounded weights, runs on the bf16 GEMM on the VNNI row (emulated here unless the host has
    AVX512_BF16), and is far more accurate than the int8 layers; a row without the recipe runs the
    same layer in float32 on the same rounded weights, equal up to the activation rounding."""
    from models import fp32_linear
    from tvm_lowprec.kernels.fp8_weights import DECISION_ATTR
    from tvm_lowprec.ptq import LayerOverride, QuantConfig, QuantSpec, accuracy_report, quantize

    model = fp32_linear((16, 64), 64, act="relu", layers=3)
    cal = [rng.standard_normal((16, 64)).astype(F32) for _ in range(8)]
    held = [rng.standard_normal((16, 64)).astype(F32) for _ in range(4)]
    mod = tvm_lowprec.from_onnx(model)
    config = QuantConfig(overrides=(LayerOverride("matmul0", weights=QuantSpec("bfloat16")),))
    qmod = quantize(mod, cal, config, progress=False)
    report = accuracy_report(mod, qmod, held, target=VNNI, progress=False)
    rows = {r.name: r for r in report.layers}
    assert rows["matmul0"].scheme == "W bfloat16, A float" and rows["matmul0"].quantized
    assert rows["matmul1"].scheme.startswith("W int8") and "| W bfloat16, A float |" in report.table()
    # the first layer (no error upstream of it): about 52 dB in bf16 (2**-9 per product), 39 dB in int8
    int8 = accuracy_report(mod, quantize(mod, cal, QuantConfig(), progress=False), held, progress=False)
    assert rows["matmul0"].sqnr_db > 45 and rows["matmul0"].sqnr_db > int8.layers[0].sqnr_db + 10
    assert rows["matmul0"].sqnr_db > max(rows["matmul1"].sqnr_db, rows["matmul2"].sqnr_db)

    compiled = tvm_lowprec.compile(qmod, target=VNNI)
    [kernel] = _bf16_kernels(compiled)
    assert kernel.shape == (16, 64, 64) and kernel.intrinsic == VNNI.bf16.intrin.intrin
    sources = {str(f.attrs[DECISION_ATTR]) for f in compiled._lowered.functions.values()
               if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and DECISION_ATTR in f.attrs}
    assert sources == {"bfloat16"}
    assert any(k.op == "qgemm" for k in compiled.kernels())  # the int8 layers (one PrimFunc: the same shape)
    elsewhere = tvm_lowprec.compile(qmod, target={"kind": "llvm", "mcpu": "cascadelake"})
    assert not _bf16_kernels(elsewhere) and "vdpbf16ps" not in elsewhere.inspect_source("asm")
    x = held[0]
    ours, theirs = compiled(x)[0], elsewhere(x)[0]
    # the same bf16 weights; only the bf16 rounding of matmul0's activations differs (then requantized)
    assert np.linalg.norm(ours - theirs) / np.linalg.norm(theirs) < 2.0**-6


def test_bfloat16_is_a_weight_spec_and_round_trips(rng):
    """A JSON round trip; refused as an activation spec; a conv2d layer in bfloat16 runs float32 math on
    bf16-rounded weights (no bf16 kernel: the bf16 GEMM takes matmuls)."""
    from models import fp32_cnn
    from tvm_lowprec.ptq import ConfigError, LayerOverride, QuantConfig, QuantSpec, accuracy_report, quantize

    config = QuantConfig(overrides=(LayerOverride("conv2", weights=QuantSpec("bfloat16")),))
    assert QuantConfig.from_json(config.to_json()) == config and QuantSpec("bfloat16").describe() == "bfloat16"
    mod = tvm_lowprec.from_onnx(fp32_cnn())
    cal = [rng.standard_normal((1, 3, 16, 16)).astype(F32) for _ in range(4)]
    with pytest.raises(ConfigError, match="bfloat16 is a weight spec"):
        quantize(mod, cal, QuantConfig(overrides=(LayerOverride("conv2", activations=QuantSpec("bfloat16")),)),
                 progress=False)
    qmod = quantize(mod, cal, config, progress=False)
    report = accuracy_report(mod, qmod, cal, progress=False)
    conv2 = next(r for r in report.layers if r.name == "conv2")
    assert conv2.scheme == "W bfloat16, A float" and conv2.sqnr_db > 30
    compiled = tvm_lowprec.compile(qmod, target=VNNI)
    assert not _bf16_kernels(compiled)
    np.testing.assert_allclose(compiled(cal[0])[0], tvm_lowprec.compile(qmod, target="native")(cal[0])[0], rtol=1e-5,
                               atol=1e-5)
