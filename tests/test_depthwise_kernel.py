"""The depthwise kernel built and run on its own (kernels/depthwise.py, schedule/depthwise.py): exact
against a numpy int64 convolution and the numpy requantization, for borders (the loop-partitioned
selects), strides, dilation, odd channel counts, both activation types, and the float32 epilogue on
exact ties, where the float32 shortcut would be wrong if it rounded twice."""

import re

import numpy as np
import pytest
import tvm

from tvm_lowprec.kernels.depthwise import DepthwiseProblem, build_depthwise, depthwise_params, float32_exact
from tvm_lowprec.kernels.qgemm import Epilogue
from tvm_lowprec.quant.patterns import ConvGeometry
from tvm_lowprec.quant.requant import requantize_ref
from tvm_lowprec.schedule.depthwise import DepthwiseRule
from tvm_lowprec.schedule.depthwise_dot import DepthwiseDotRule
from tvm_lowprec.qemu import is_aarch64
from tvm_lowprec.targets import resolve_target

from conftest import TARGETS, kernel_module


def _geometry(c, hw, k, s=1, pads=(1, 1, 1, 1), dil=1, batch=1):
    (h, w), (top, left, bottom, right) = hw, pads
    oh = (h + top + bottom - dil * (k - 1) - 1) // s + 1
    ow = (w + left + right - dil * (k - 1) - 1) // s + 1
    return ConvGeometry(batch, c, (h, w), (oh, ow), (k, k), (s, s), pads, (dil, dil), groups=c)


def _reference(x, w_taps, zw, zx, bias, mult, ep, g):
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = g.kernel, g.strides, g.dilation, g.out_hw
    top, left, bottom, right = g.padding
    xp = np.pad(x.astype(np.int64), ((0, 0), (top, bottom), (left, right), (0, 0)), constant_values=zx)
    w = w_taps.astype(np.int64).reshape(kh, kw, -1) - np.asarray(zw, np.int64)
    acc = np.zeros((x.shape[0], oh, ow, x.shape[3]), np.int64)
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + sh * (oh - 1) + 1, sh)
            cols = slice(j * dw, j * dw + sw * (ow - 1) + 1, sw)
            acc += (xp[:, rows, cols, :] - zx) * w[i, j]
    acc += np.asarray(bias, np.int64)
    if ep.kind == "int32":
        return acc.astype(np.int32)
    return requantize_ref(acc, mult, ep.zero_point, ep.out_dtype, ep.qmin, ep.qmax, ep.mode)


def _run(g, a_dtype, ep, x, w_taps, zw, zx, bias, mult, threads=1, spec=None, rule=None, asm=None):
    spec = spec or resolve_target("native")
    params = depthwise_params(w_taps, zw, zx, bias, mult, ep)
    sch = (rule or DepthwiseRule()).apply(build_depthwise(DepthwiseProblem(g, a_dtype, ep), "dw", params), spec)
    assert sch is not None
    lib = tvm.compile(sch.mod, target=spec.tvm_target(threads))
    if asm is not None:
        asm.append(lib.mod.inspect_source("asm"))
    out = tvm.runtime.tensor(np.zeros((g.batch, *g.out_hw, g.channels), ep.out_dtype))
    module = kernel_module(lib if is_aarch64(spec) else lib.mod, spec)  # an x86 row off its host: emulated
    module["dw"](*[tvm.runtime.tensor(np.ascontiguousarray(v)) for v in [x, *params]], out)
    return out.numpy(), params


# this host's row, and the AArch64 rows (cross-compiled, run under qemu-aarch64)
SPECS = [resolve_target("native"), *(t for t in TARGETS if is_aarch64(t))]


GEOMETRIES = {
    "16ch-s1": dict(c=16, hw=(14, 13), k=3),
    "24ch-s2": dict(c=24, hw=(13, 11), k=3, s=2),
    "48ch-s2-asym": dict(c=48, hw=(9, 10), k=3, s=2, pads=(0, 1, 1, 0)),
    "32ch-unpadded": dict(c=32, hw=(10, 9), k=3, pads=(0, 0, 0, 0)),
    "8ch-dilated": dict(c=8, hw=(12, 12), k=3, dil=2, pads=(2, 2, 2, 2)),
    "5ch-odd": dict(c=5, hw=(7, 7), k=3),
    "24ch-5x5-batch2": dict(c=24, hw=(11, 9), k=5, s=2, pads=(2, 1, 1, 2), batch=2),
    # channel counts no vector width divides (MixNet's 90 and 300): whole vectors and a partitioned tail
    "90ch-7x7-ragged": dict(c=90, hw=(8, 8), k=7, pads=(3, 3, 3, 3)),
    "90ch-9x9-border-only": dict(c=90, hw=(8, 8), k=9, pads=(4, 4, 4, 4)),  # no interior: no row/column partition
    "300ch-5x5-s2-ragged": dict(c=300, hw=(7, 6), k=5, s=2, pads=(2, 2, 2, 2)),
    "20ch-ragged": dict(c=20, hw=(9, 9), k=3),
}


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.row)
@pytest.mark.parametrize("name", list(GEOMETRIES))
@pytest.mark.parametrize("a_dtype", ["uint8", "int8"])
def test_depthwise_kernel_is_exact(name, a_dtype, spec, rng):
    g = _geometry(**GEOMETRIES[name])
    lo, hi = (0, 256) if a_dtype == "uint8" else (-128, 128)
    x = rng.integers(lo, hi, (g.batch, *g.in_hw, g.channels)).astype(a_dtype)
    w_taps = rng.integers(0, 256, (g.kernel[0] * g.kernel[1], g.channels)).astype(np.uint8)
    zx, zw = (7, 131) if a_dtype == "uint8" else (-5, 128)
    bias = rng.integers(-5000, 5000, g.channels)
    mult = (rng.uniform(0.5, 2.0, g.channels) / 600).astype(np.float32)
    ep = Epilogue("requant", "uint8", zero_point=3, qmin=3)
    got, params = _run(g, a_dtype, ep, x, w_taps, zw, zx, bias, mult, spec=spec)
    assert float32_exact(params, a_dtype, ep)
    want = _reference(x, w_taps, zw, zx, bias, mult, ep, g)
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(want)) > 20


@pytest.mark.parametrize("mult", [0.5, 0.25, 0.375, 1.0])
def test_float32_requantization_rounds_exact_ties_to_even(mult, rng):
    """Small weights and power-of-two-ish multipliers: many products are exact half-integers."""
    g = _geometry(16, (12, 12), 3)
    x = rng.integers(0, 256, (1, 12, 12, 16)).astype(np.uint8)
    w_taps = (128 + rng.integers(-2, 3, (9, 16))).astype(np.uint8)
    bias = rng.integers(-3, 4, 16)
    ep = Epilogue("requant", "int8", zero_point=-1)
    got, params = _run(g, "uint8", ep, x, w_taps, 128, 9, bias, np.full(16, mult, np.float32))
    assert float32_exact(params, "uint8", ep)
    want = _reference(x, w_taps, 128, 9, bias, np.full(16, mult, np.float32), ep, g)
    np.testing.assert_array_equal(got, want)
    acc = _reference(x, w_taps, 128, 9, bias, None, Epilogue("int32"), g).astype(np.int64)
    frac = np.abs(acc * mult - np.floor(acc * mult))
    ties = ((frac == 0.5) & (np.abs(acc * mult) < 100)).sum()  # exact ties inside the output range
    assert ties > 50 if mult < 1 else ties == 0


def test_float32_requantization_where_a_float32_product_would_round_twice(rng):
    """Multipliers with full mantissas and accumulators whose float32 product lands on a half-integer
    though the exact product does not (``rint(fl32(a * m)) != rint(a * m)``): one per channel, reached
    through the centre tap (w' = 1 there, 0 elsewhere) and the bias. The kernel's single rounding
    gets them right; a float32 multiply then rint would not."""
    cases = []
    while len(cases) < 16:
        m = np.float32(rng.uniform(1 / 1000, 1 / 100))
        a = np.arange(-int(120 / m), int(120 / m) + 1)
        bad = np.nonzero(np.rint(a * np.float64(m)) != np.rint((a.astype(np.float32) * m).astype(np.float64)))[0]
        if len(bad):
            cases.append((m, int(a[bad[0]])))
    mult = np.array([m for m, _ in cases], np.float32)
    g = _geometry(16, (16, 16), 3)
    x = rng.integers(0, 256, (1, 16, 16, 16)).astype(np.uint8)
    x[0, 5, 5, :] = 128  # output (5, 5) hits every channel's bad accumulator
    w_taps = np.full((9, 16), 128, np.uint8)
    w_taps[4] = 129
    zx = 3
    bias = np.array([a - (128 - zx) for _, a in cases])
    ep = Epilogue("requant", "int8", zero_point=2)
    got, params = _run(g, "uint8", ep, x, w_taps, 128, zx, bias, mult)
    assert float32_exact(params, "uint8", ep)
    want = _reference(x, w_taps, 128, zx, bias, mult, ep, g)
    np.testing.assert_array_equal(got, want)
    acc = np.array([a for _, a in cases], np.float32)
    naive = np.clip(np.rint((acc * mult).astype(np.float64)) + 2, -128, 127)
    assert np.all(naive != want[0, 5, 5])


def test_float64_epilogue_where_float32_is_not_exact(rng):
    """A bias near 2**25 puts the accumulator outside float32's integers: the kernel keeps float64."""
    g = _geometry(16, (9, 9), 3, s=2)
    x = rng.integers(0, 256, (1, 9, 9, 16)).astype(np.uint8)
    w_taps = rng.integers(0, 256, (9, 16)).astype(np.uint8)
    bias = np.full(16, 2**25 + 3)
    mult = np.full(16, 2.0**-17, np.float32)
    ep = Epilogue("requant", "uint8", zero_point=0)
    got, params = _run(g, "uint8", ep, x, w_taps, 128, 0, bias, mult)
    assert not float32_exact(params, "uint8", ep)
    np.testing.assert_array_equal(got, _reference(x, w_taps, 128, 0, bias, mult, ep, g))


@pytest.mark.parametrize("kind", ["fixed_point", "int32"])
def test_other_epilogues_and_two_threads(kind, rng):
    g = _geometry(24, (16, 15), 3, s=2)
    x = rng.integers(0, 256, (1, 16, 15, 24)).astype(np.uint8)
    w_taps = rng.integers(0, 256, (9, 24)).astype(np.uint8)
    bias = rng.integers(-5000, 5000, 24)
    mult = (rng.uniform(0.5, 2.0, 24) / 600).astype(np.float32)
    ep = Epilogue("requant", "uint8", zero_point=3, mode="fixed_point") if kind == "fixed_point" else Epilogue("int32")
    got, _ = _run(g, "uint8", ep, x, w_taps, 131, 7, bias, mult, threads=2)
    np.testing.assert_array_equal(got, _reference(x, w_taps, 131, 7, bias, mult, ep, g))


def test_schedule_partitions_the_borders_and_vectorizes():
    spec = resolve_target("native")
    g = _geometry(16, (20, 20), 3)
    func = build_depthwise(DepthwiseProblem(g, "uint8", Epilogue("requant", "uint8")), "dw")
    sch = DepthwiseRule().apply(func, spec)
    kinds = [inst.kind.name for inst in sch.trace.insts]
    assert "Parallel" in kinds and "Vectorize" in kinds
    hints = [inst for inst in sch.trace.insts if inst.kind.name == "Annotate"
             and "pragma_loop_partition_hint" in str(inst.attrs)]
    assert len(hints) == 2
    assert DepthwiseRule().apply(func.with_attr("lowprec.op", "qgemm"), spec) is None  # not ours: declined


def test_ragged_channels_get_whole_vectors_and_a_partitioned_tail():
    """90 channels: no vector width divides them; the channel loops are split by the row's lanes with
    a partitioned tail, so the interior is vector code (zmm on AVX-512) instead of scalar loops."""
    spec = resolve_target("native")
    g = _geometry(90, (16, 16), 3)
    sch = DepthwiseRule().apply(build_depthwise(DepthwiseProblem(g, "uint8", Epilogue("requant", "uint8")), "dw"), spec)
    splits = [inst for inst in sch.trace.insts if inst.kind.name == "Split"]
    assert any(spec.gemm.lanes in [int(getattr(f, "value", -1)) for f in inst.inputs[1:]] for inst in splits)
    hints = [inst for inst in sch.trace.insts if inst.kind.name == "Annotate"
             and "pragma_loop_partition_hint" in str(inst.attrs)]
    assert len(hints) == 4  # rows, column steps, and the channel vectors of the sum and of the epilogue
    assert [inst.kind.name for inst in sch.trace.insts].count("Vectorize") >= 3


@pytest.mark.parametrize("hw, k, pad, partitioned", [((8, 8), 9, 4, False), ((8, 8), 7, 3, False), ((8, 8), 5, 2, True),
                                                     ((8, 8), 3, 1, True), ((4, 4), 9, 4, False)])
def test_rows_and_columns_are_partitioned_only_where_the_interior_is_most_of_them(hw, k, pad, partitioned):
    """MixNet's 9x9 window over an 8x8 input has no output row whose taps all lie inside: LoopPartition
    made a copy of the body per border case (3.9 s of TVM's TIR passes for one kernel) for a border
    that is all the work. Under half the rows (columns) interior, that loop keeps its selects."""
    spec = resolve_target("native")
    g = _geometry(32, hw, k, pads=(pad,) * 4)
    sch = DepthwiseRule().apply(build_depthwise(DepthwiseProblem(g, "uint8", Epilogue("requant", "uint8")), "dw"), spec)
    hints = [inst for inst in sch.trace.insts if inst.kind.name == "Annotate"
             and "pragma_loop_partition_hint" in str(inst.attrs)]
    assert len(hints) == (2 if partitioned else 0)


# The four-taps-a-lane kernel (kernels/depthwise_dot.py): every CPU row whose GEMM instruction has a
# lane-wise form (GemmIntrin.lane_product), its instruction as the registry names it
DOT_ROWS = [(t, r.intrin) for t in TARGETS for r in t.recipes()
            if r.intrin.lane_product is not None and r.intrin.kstep == 4 and r.intrin.rows == 1]
DOT_ROWS = [pair for i, pair in enumerate(DOT_ROWS) if pair[0].name not in {t.name for t, _ in DOT_ROWS[:i]}]
DOT_GEOMETRIES = {  # stride 1, output widths of 12 and up (what the kernel takes)
    "16ch-w13": dict(c=16, hw=(14, 13), k=3),
    "40ch-w16-overlapping-groups": dict(c=40, hw=(9, 16), k=3),
    "24ch-5x5-asym-batch2": dict(c=24, hw=(11, 14), k=5, pads=(2, 1, 1, 2), batch=2),
    "32ch-dilated": dict(c=32, hw=(12, 14), k=3, dil=2, pads=(2, 2, 2, 2)),
    "48ch-unpadded": dict(c=48, hw=(8, 14), k=3, pads=(0, 0, 0, 0)),
}


def _dot_case(rng, g, a_dtype):
    lo, hi = (0, 256) if a_dtype == "uint8" else (-128, 128)
    x = rng.integers(lo, hi, (g.batch, *g.in_hw, g.channels)).astype(a_dtype)
    x[0, 0, : min(4, g.in_hw[1]), :] = hi - 1  # the extremes: a saturating product would show
    w_taps = rng.integers(0, 256, (g.kernel[0] * g.kernel[1], g.channels)).astype(np.uint8)
    w_taps[:, 0] = 0  # w - zw = -128 on a whole channel
    bias = rng.integers(-5000, 5000, g.channels)
    mult = (rng.uniform(0.5, 2.0, g.channels) / 600).astype(np.float32)
    return x, w_taps, 128, (7 if a_dtype == "uint8" else -5), bias, mult


@pytest.mark.parametrize("pair", DOT_ROWS, ids=lambda p: f"{p[0].name}-{p[1].name}")
@pytest.mark.parametrize("name", list(DOT_GEOMETRIES))
@pytest.mark.parametrize("a_dtype", ["uint8", "int8"])
def test_four_tap_depthwise_kernel_is_exact_and_uses_the_rows_instruction(pair, name, a_dtype, rng):
    """Four taps of a channel in each int32 lane of the row's dot product: exact against numpy for
    borders, a 5x5 window (two quads a kernel row), dilation, a channel count no vector divides (the
    last group overlapping), both activation types (flipped where the instruction takes the other
    signedness), and the row's instruction in the assembly."""
    spec, intrin = pair
    g = _geometry(**DOT_GEOMETRIES[name])
    x, w_taps, zw, zx, bias, mult = _dot_case(rng, g, a_dtype)
    ep = Epilogue("requant", "uint8", zero_point=3, qmin=3)
    asm = []
    got, _ = _run(g, a_dtype, ep, x, w_taps, zw, zx, bias, mult, spec=spec, rule=DepthwiseDotRule(), asm=asm)
    np.testing.assert_array_equal(got, _reference(x, w_taps, zw, zx, bias, mult, ep, g))
    mnemonic = intrin.name.split("_")[0]
    assert re.search(rf"\b{mnemonic}\b", asm[0]), f"{spec.name}: {mnemonic} not in the kernel"


@pytest.mark.parametrize("kind", ["fixed_point", "int32", "float64"])
def test_four_tap_kernel_other_epilogues_and_two_threads(kind, rng):
    spec = resolve_target("native")
    if not any(r.intrin.lane_product is not None for r in spec.recipes()):
        pytest.skip(f"{spec.name} has no lane-wise dot product")
    g = _geometry(24, (16, 15), 3)
    x, w_taps, zw, zx, bias, mult = _dot_case(rng, g, "uint8")
    if kind == "float64":  # a bias past float32's integers: the float64 requantization
        bias = np.full(24, 2**25 + 3)
        mult = np.full(24, 2.0**-17, np.float32)
    ep = {"fixed_point": Epilogue("requant", "uint8", zero_point=3, mode="fixed_point"),
          "int32": Epilogue("int32"), "float64": Epilogue("requant", "uint8")}[kind]
    got, params = _run(g, "uint8", ep, x, w_taps, zw, zx, bias, mult, threads=2, rule=DepthwiseDotRule())
    assert kind != "float64" or not float32_exact(params, "uint8", ep)
    np.testing.assert_array_equal(got, _reference(x, w_taps, zw, zx, bias, mult, ep, g))


def test_four_tap_kernel_declines_what_it_does_not_take(rng):
    """Stride 2, an output narrower than MIN_WIDTH, fewer channels than the lanes, and weights whose
    w - zw leaves int8 go to the one-tap kernel."""
    from tvm_lowprec.kernels.depthwise_dot import MIN_WIDTH

    spec = next((t for t, _ in DOT_ROWS), None)
    if spec is None:
        pytest.skip("no row has a lane-wise dot product")
    lanes = next(r.intrin.lanes for r in spec.recipes() if r.intrin.lane_product is not None)
    ep = Epilogue("requant", "uint8")

    def func(g, zw=128):
        w = rng.integers(0, 256, (9, g.channels)).astype(np.uint8)
        params = depthwise_params(w, zw, 7, None, np.full(g.channels, 1e-3, np.float32), ep)
        return build_depthwise(DepthwiseProblem(g, "uint8", ep), "dw", params)

    wide = _geometry(2 * lanes, (MIN_WIDTH + 2, MIN_WIDTH + 2), 3)
    assert DepthwiseDotRule().apply(func(wide), spec) is not None
    assert DepthwiseDotRule().apply(func(wide, zw=131), spec) is None  # w - 131 down to -131
    assert DepthwiseDotRule().apply(func(_geometry(2 * lanes, (2 * MIN_WIDTH, 2 * MIN_WIDTH), 3, s=2)), spec) is None
    assert DepthwiseDotRule().apply(func(_geometry(2 * lanes, (MIN_WIDTH - 2, MIN_WIDTH - 2), 3)), spec) is None
    if lanes > 1:
        assert DepthwiseDotRule().apply(func(_geometry(lanes - 1, (MIN_WIDTH, MIN_WIDTH), 3)), spec) is None
