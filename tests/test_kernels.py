"""The integer GEMM kernel on every registered target row.

Every case checks the emitted instruction in the assembly and executes the kernel: natively where
this host has the row's instruction set, emulated elsewhere (:mod:`tvm_lowprec.emulation`); either
way the results must equal a numpy int64 reference exactly. Where the host runs a row natively,
the emulated build must give the same results as the native one.
"""

import re

import numpy as np
import pytest
import tvm

from tvm_lowprec.kernels.qgemm import Epilogue, GemmLayout, QGemmProblem, build_qgemm, epilogue_params, pack_weights
from tvm_lowprec.quant.requant import requantize_ref
from tvm_lowprec.quant.zero_points import gemm_corrections
from tvm_lowprec.schedule import schedule_func

from conftest import NATIVE, TARGETS, kernel_module

# every (target, recipe) pair: bounded recipes get weights inside their bound
RECIPES = [(t, r) for t in TARGETS for r in t.recipes()]


def _recipe_id(pair):
    return f"{pair[0].name}/{pair[1].intrin.name}"


def _only(spec, recipe):
    """The target with just this recipe, so the kernel is built with it whatever the weights."""
    import dataclasses

    if recipe.intrin.weight_pair_bound is None:
        return dataclasses.replace(spec, bounded=())
    return dataclasses.replace(spec, bounded=(recipe,))

# (M, N, K): GEMV, odd sizes on every axis, a tile-aligned block, a K-blocked shape
SHAPES = [(1, 64, 64), (1, 37, 19), (3, 17, 5), (7, 33, 19), (16, 48, 64), (64, 96, 128), (260, 64, 1024)]
# (activation dtype, weight dtype, activation zero point, weight zero point)
OPERANDS = [
    ("uint8", "int8", 0, 0),
    ("uint8", "int8", 131, 0),
    ("int8", "int8", -5, 0),
    ("uint8", "uint8", 7, 128),  # u8 weights: shifted to s8 at pack time
    ("int8", "int8", 3, "per-channel"),  # nonzero per-channel weight zero points: row-sum term
]
EPILOGUES = {
    "requant-u8": Epilogue("requant", "uint8", zero_point=9),
    "requant-s8-relu": Epilogue("requant", "int8", zero_point=-3, qmin=-3),
    "requant-fixed": Epilogue("requant", "uint8", zero_point=100, mode="fixed_point"),
    "int32": Epilogue("int32"),
    "float": Epilogue("float"),
}


def _operands(rng, m, n, k, a_dtype, b_dtype, bound=None):
    info_a, info_b = np.iinfo(a_dtype), np.iinfo(b_dtype)
    a = rng.integers(info_a.min, info_a.max + 1, (m, k)).astype(a_dtype)
    lo, hi = info_b.min, info_b.max
    if bound is not None:  # pairs at the edge of the bound: 64 + 64 = 128
        mid = 0 if b_dtype == "int8" else 128
        lo, hi = mid - bound // 2, mid + bound // 2
    b = rng.integers(lo, hi + 1, (k, n)).astype(b_dtype)
    # extremes included: a saturating instruction would fail on these
    a[0, : min(k, 4)] = info_a.max
    b[: min(k, 4), 0] = hi
    return a, b


def _build(spec, problem, b_signed=None):
    layout = GemmLayout.choose(problem, spec, b_signed)
    sch = schedule_func(build_qgemm(problem, layout), spec)
    assert sch is not None
    ex = tvm.compile(sch.mod, target=spec.tvm_target(2))
    return layout, ex


def _mnemonic(intrin) -> str:
    return intrin.name.split("_")[0]


def _check_instruction(spec, layout, ex):
    """The recipe's instruction is emitted; no instruction that needs features the row lacks (the
    next Arm row's dot products in the one below it) and no vpmaddubsw outside its bounded recipe."""
    asm = ex.mod.inspect_source("asm")
    mnemonic = layout.intrin_row.split("_")[0]
    assert re.search(rf"\b{mnemonic}\b", asm), f"{spec.name}: {mnemonic} not emitted"
    if mnemonic != "vpmaddubsw":
        assert "vpmaddubsw" not in asm, "vpmaddubsw emitted by a recipe that must be exact for every weight"
    own = {_mnemonic(r.intrin) for r in spec.recipes()}  # vpmaddwd is one mnemonic for ymm and zmm
    for recipe in (r for other in TARGETS for r in other.recipes()):
        if not set(recipe.intrin.features) <= set(spec.features) and _mnemonic(recipe.intrin) not in own:
            assert not re.search(rf"\b{_mnemonic(recipe.intrin)}\b", asm), \
                f"{spec.name} emitted {_mnemonic(recipe.intrin)}, which needs {recipe.intrin.features}"


def _reference(a, b, za, zb, bias, mult, ep, fbias=None):
    acc = (a.astype(np.int64) - za) @ (b.astype(np.int64) - np.asarray(zb, np.int64)) + bias
    if ep.kind == "int32":
        return acc.astype(np.int32)
    if ep.kind == "float":
        return acc.astype(np.float32) * mult + fbias
    return requantize_ref(acc, mult, ep.zero_point, ep.out_dtype, ep.qmin, ep.qmax, mode=ep.mode)


def run_case(spec, rng, shape, operands, ep, bound=None, emulate=False):
    from tvm_lowprec.quant.zero_points import signed_weights

    m, n, k = shape
    a_dtype, b_dtype, za, zb = operands
    a, b = _operands(rng, m, n, k, a_dtype, b_dtype, bound)
    zb = rng.integers(-4, 5, n) if zb == "per-channel" else zb
    bias = rng.integers(-5000, 5000, n).astype(np.int32)
    mult = (rng.random(n) * 2e-4 + 1e-5).astype(np.float32)
    b_off = 128 if b_dtype == "uint8" else 0
    problem = QGemmProblem(m, n, k, a_dtype, ep, row_term=bool(np.any(np.asarray(zb) - b_off)))
    layout, ex = _build(spec, problem, signed_weights(b)[0])
    _check_instruction(spec, layout, ex)
    corr = gemm_corrections(b, za, zb, layout.a_offset, bias)
    fbias = (rng.standard_normal(n) * 10).astype(np.float32)
    params = epilogue_params(problem, layout, corr.corr, corr.rowcoef, mult, fbias)
    dev = tvm.cpu()
    out = np.zeros((m, n), ep.out_dtype)
    args = [tvm.runtime.tensor(x, dev) for x in [a, pack_weights(corr.b_signed, layout), *params, out]]
    kernel_module(ex.mod, spec, emulate)["qgemm"](*args)
    got, want = args[-1].numpy(), _reference(a, b, za, zb, bias, mult, ep, fbias)
    if ep.kind == "float":  # LLVM may contract the multiply-add into one FMA: one rounding fewer
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(got, want)
    return got


@pytest.mark.parametrize("pair", RECIPES, ids=_recipe_id)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_shapes(pair, shape, rng):
    spec, recipe = pair
    run_case(_only(spec, recipe), rng, shape, OPERANDS[1], EPILOGUES["requant-u8"], bound=recipe.intrin.weight_pair_bound)


@pytest.mark.host_dependent
@pytest.mark.parametrize("pair", [(t, r) for t in NATIVE for r in t.recipes()], ids=_recipe_id)
@pytest.mark.parametrize("shape", SHAPES[2:5], ids=lambda s: "x".join(map(str, s)))
def test_native_and_emulated_agree(pair, shape):
    """On rows this host runs, the emulated build (the same IR, intrinsics replaced by their
    semantics) gives exactly the native results: the semantics are checked against the hardware."""
    spec, recipe = pair
    runs = [run_case(_only(spec, recipe), np.random.default_rng(7), shape, OPERANDS[2], EPILOGUES["int32"],
                     bound=recipe.intrin.weight_pair_bound, emulate=emulate) for emulate in (False, True)]
    np.testing.assert_array_equal(*runs)


@pytest.mark.parametrize("pair", RECIPES, ids=_recipe_id)
@pytest.mark.parametrize("operands", OPERANDS, ids=lambda o: f"{o[0]}x{o[1]}-za{o[2]}-zb{o[3]}")
@pytest.mark.parametrize("ep", list(EPILOGUES), ids=str)
def test_operands_and_epilogues(pair, operands, ep, rng):
    spec, recipe = pair
    run_case(_only(spec, recipe), rng, (7, 40, 36), operands, EPILOGUES[ep], bound=recipe.intrin.weight_pair_bound)


@pytest.mark.parametrize("spec", [t for t in TARGETS if t.bounded], ids=lambda s: s.name)
def test_bounded_recipe_declines_weights_that_could_saturate(spec, rng):
    problem = QGemmProblem(8, 32, 64, "uint8", EPILOGUES["int32"])
    seven_bit = rng.integers(-64, 65, (64, 32)).astype(np.int8)
    full = seven_bit.copy()
    full[10, 3], full[11, 3] = 100, 29  # one pair: 129 > 128
    assert GemmLayout.choose(problem, spec, seven_bit).intrin_row == spec.bounded[0].intrin.name
    assert GemmLayout.choose(problem, spec, full).intrin_row == spec.gemm.name
    assert GemmLayout.choose(problem, spec, None).intrin_row == spec.gemm.name  # runtime weights


@pytest.mark.parametrize("spec", [t for t in TARGETS if t.bounded], ids=lambda s: s.name)
def test_exact_rows_are_exact_where_pmaddubsw_saturates(spec):
    """All-max operands: 255*127*2 overflows int16 pair sums; the rows' default (exact) recipe must
    still be exact, natively or emulated."""
    m, n, k = 4, 16, 64
    ep = EPILOGUES["int32"]
    problem = QGemmProblem(m, n, k, "uint8", ep)
    a = np.full((m, k), 255, np.uint8)
    b = np.full((k, n), 127, np.int8)
    layout, ex = _build(spec, problem, b)
    assert layout.intrin_row == spec.gemm.name
    corr = gemm_corrections(b, 0, 0, layout.a_offset)
    params = epilogue_params(problem, layout, corr.corr, corr.rowcoef, None)
    args = [tvm.runtime.tensor(x, tvm.cpu()) for x in [a, pack_weights(corr.b_signed, layout), *params, np.zeros((m, n), np.int32)]]
    kernel_module(ex.mod, spec)["qgemm"](*args)
    assert (args[-1].numpy() == 255 * 127 * k).all()


def test_vnni_is_chosen_for_large_problems_with_enough_accumulators():
    spec = next(t for t in TARGETS if t.name == "x86-avx512-vnni")
    layout = GemmLayout.choose(QGemmProblem(1024, 1024, 1024, "uint8", Epilogue()), spec)
    assert layout.mr * layout.nr >= 12
    assert layout.kblock and layout.kp % layout.kblock == 0
    gemv = GemmLayout.choose(QGemmProblem(1, 4096, 4096, "uint8", Epilogue()), spec)
    assert gemv.mr == 1 and gemv.nr >= 8


def _parallel_extents(sch, block="gemm_update_o"):
    return [int(sch.get(loop).extent) for loop in sch.get_loops(sch.get_sblock(block))
            if sch.get(loop).kind == tvm.tirx.ForKind.PARALLEL]


@pytest.mark.parametrize("spec", TARGETS, ids=lambda s: s.name)
def test_a_narrow_gemm_shares_its_row_tiles_among_threads(spec, rng):
    """A convolution with few output channels has one to three B panels: its threads take runs of row
    tiles (row_runs), not panels, and the result is still exact; a wide GEMM keeps its panels parallel."""
    from tvm_lowprec.schedule.qgemm import MIN_PANEL_TASKS, row_runs

    ep = EPILOGUES["requant-u8"]
    narrow = QGemmProblem(960, 16, 48, "uint8", ep)
    layout = GemmLayout.choose(narrow, spec)
    assert layout.np_ // layout.panel < MIN_PANEL_TASKS
    sch = schedule_func(build_qgemm(narrow, layout), spec)
    tiles = layout.mp // layout.mr
    assert _parallel_extents(sch) == [row_runs(tiles)[0]] and row_runs(tiles)[0] > 1
    run_case(spec, rng, (960, 16, 48), OPERANDS[1], ep)
    wide = QGemmProblem(960, 1024, 48, "uint8", ep)
    wide_layout = GemmLayout.choose(wide, spec)
    panels = wide_layout.np_ // wide_layout.panel
    assert _parallel_extents(schedule_func(build_qgemm(wide, wide_layout), spec)) == [panels] and panels >= MIN_PANEL_TASKS


@pytest.mark.parametrize("spec", [s for s in TARGETS if s.device == "cpu"], ids=lambda s: s.name)
def test_a_narrow_gemm_with_a_prime_number_of_row_tiles_pads_to_share_them(spec, rng):
    """A narrow GEMM whose row tiles number a prime (97) has no run to give a second thread: its layout
    pads M by a tile or two until they have a divisor of at least MIN_RUNS (kernels.qgemm.
    splittable_rows), the threads share those runs, and the padded rows change nothing in the result."""
    from tvm_lowprec.kernels.qgemm import MIN_RUNS, PAD_TILES_LIMIT, best_runs
    from tvm_lowprec.schedule.qgemm import row_runs

    ep = EPILOGUES["requant-u8"]
    mr = GemmLayout.choose(QGemmProblem(960, 16, 48, "uint8", ep), spec).mr
    m = 97 * mr  # 97 tiles of the tallest row tile the layout takes (mr divides M: it pads nothing)
    problem = QGemmProblem(m, 16, 48, "uint8", ep)
    layout = GemmLayout.choose(problem, spec)
    assert layout.mr == mr
    tiles = layout.mp // layout.mr
    assert 97 < tiles <= 97 * (1 + PAD_TILES_LIMIT) and best_runs(tiles) >= MIN_RUNS
    sch = schedule_func(build_qgemm(problem, layout), spec)
    assert _parallel_extents(sch) == [row_runs(tiles)[0]]
    run_case(spec, rng, (m, 16, 48), OPERANDS[1], ep)


def test_row_runs_divide_the_row_tiles():
    from tvm_lowprec.schedule.qgemm import MAX_RUNS, row_runs

    for tiles in (1, 2, 7, 64, 97, 267, 1067, 1600, 6400):
        runs, per_run = row_runs(tiles)
        assert runs * per_run == tiles and 1 <= runs <= MAX_RUNS
    assert row_runs(1600) == [64, 25] and row_runs(1067) == [11, 97] and row_runs(97) == [1, 97]


# convolutions whose GEMM reads its im2col in place (kernels.qgemm.ConvWindow): (batch, H, W, C, N,
# kernel, stride, dilation, padding): one row tile per output row, a tile crossing output rows (W = 13),
# a 4-channel stem at stride 2, a dilated batch of two, a 5x5 window
WINDOWS = {
    "3x3-s1-c8": (1, 10, 12, 8, 6, 3, 1, 1, 1),
    "3x3-s1-c8-odd-width": (1, 7, 13, 8, 24, 3, 1, 1, 1),
    "stem-3x3-s2-c4": (1, 16, 16, 4, 8, 3, 2, 1, 1),
    "dilated-c16-batch2": (2, 9, 9, 16, 20, 3, 1, 2, 2),
    "5x5-s2-c8": (1, 11, 13, 8, 16, 5, 2, 1, 2),
}


@pytest.mark.parametrize("case", list(WINDOWS))
@pytest.mark.parametrize("spec", [t for t in TARGETS if t.device == "cpu"], ids=lambda t: t.name)
def test_a_gemm_reading_a_convolution_window_in_place_is_exact(spec, case, rng):
    """A [B, Hp, Wp, C] padded input read through the window (no [M, K] im2col buffer): exact against
    numpy's im2col and int64 GEMM, the row's instruction emitted, on every CPU row whose K step divides
    the channels and whose instruction takes one row (the others read an im2col buffer)."""
    from tvm_lowprec.kernels.qgemm import ConvWindow

    batch, h, w, c, n, k_hw, s, d, pad = WINDOWS[case]
    oh, ow = (h + 2 * pad - d * (k_hw - 1) - 1) // s + 1, (w + 2 * pad - d * (k_hw - 1) - 1) // s + 1
    window = ConvWindow(batch, (h + 2 * pad, w + 2 * pad), (oh, ow), (k_hw, k_hw), (s, s), (d, d), c)
    m, k = window.rows, window.depth
    ep = EPILOGUES["requant-u8"]
    problem = QGemmProblem(m, n, k, "uint8", ep, window=window)
    za = 131
    x = np.full(window.shape, za, np.uint8)
    x[:, pad:pad + h, pad:pad + w] = rng.integers(0, 256, (batch, h, w, c))
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    layout = GemmLayout.choose(problem, spec, b)
    if layout.rows != 1 or c % layout.kstep or layout.needs_prepare(problem):
        pytest.skip(f"{spec.name}: {layout.intrin_row} reads an im2col buffer here (K step {layout.kstep}, "
                    f"{layout.rows} rows, activations stored as {layout.a_storage})")
    sch = schedule_func(build_qgemm(problem, layout), spec)
    assert [int(e) for e in sch.mod["main"].params[0].shape] == list(window.shape)
    ex = tvm.compile(sch.mod, target=spec.tvm_target(2))
    _check_instruction(spec, layout, ex)
    taps = [x[:, i * d:i * d + s * (oh - 1) + 1:s, j * d:j * d + s * (ow - 1) + 1:s, :]
            for i in range(k_hw) for j in range(k_hw)]
    a = np.stack(taps, axis=3).reshape(m, k)  # rows (b, oh, ow), columns (kh, kw, c)
    bias = rng.integers(-5000, 5000, n).astype(np.int32)
    mult = (rng.random(n) * 2e-4 + 1e-5).astype(np.float32)
    corr = gemm_corrections(b, za, 0, layout.a_offset, bias)
    params = epilogue_params(problem, layout, corr.corr, corr.rowcoef, mult)
    args = [tvm.runtime.tensor(v) for v in [x, pack_weights(corr.b_signed, layout), *params, np.zeros((m, n), np.uint8)]]
    kernel_module(ex.mod, spec)["qgemm"](*args)
    want = _reference(a, b, za, 0, bias, mult, ep)
    assert len(np.unique(want)) > 20  # not all clamped
    np.testing.assert_array_equal(args[-1].numpy(), want)


NARROW = [t for t in TARGETS if t.narrow is not None]


def _gemm_registers(asm, mnemonic) -> set:
    """The register kinds (``ymm``, ``zmm``) of every ``mnemonic`` instruction in ``asm``."""
    return {kind for line in asm.splitlines() if re.match(rf"\s*(\{{\w+\}}\s*)?{mnemonic}\b", line)
            for kind in re.findall(r"%([a-z]+)\d+", line)}


@pytest.mark.host_dependent
@pytest.mark.parametrize("spec", NARROW, ids=lambda s: s.name)
@pytest.mark.parametrize("columns", ["one", "a few", "all lanes", "one more", "the wide lanes"])
def test_a_gemm_with_few_output_columns_takes_the_row_narrow_recipe(spec, columns, rng):
    """A row's ``narrow`` recipe takes the GEMMs with at most its lanes output columns; wider ones
    keep the row's default. Exact against numpy, natively and emulated, and the instruction has the
    recipe's register width (from the perf model's assembly table, which is the rows' data)."""
    from tvm_lowprec.perfmodel import INTRIN_ASM

    narrow = spec.narrow.intrin.lanes
    n = {"one": 1, "a few": 3, "all lanes": narrow, "one more": narrow + 1, "the wide lanes": spec.gemm.lanes}[columns]
    want = spec.narrow.intrin if n <= narrow else spec.gemm
    shape, operands, ep = (45, n, 36), OPERANDS[1], EPILOGUES["requant-u8"]
    b = rng.integers(-128, 128, (36, n)).astype(np.int8)
    layout, ex = _build(spec, QGemmProblem(*shape, "uint8", ep), b)
    assert layout.intrin_row == want.name
    asm = INTRIN_ASM[want.name]
    assert _gemm_registers(ex.mod.inspect_source("asm"), asm.mnemonic) == {asm.reg}
    runs = [run_case(spec, np.random.default_rng(3), shape, operands, ep, emulate=emulate)
            for emulate in ((False, True) if spec in NATIVE else (True,))]
    for got in runs[1:]:
        np.testing.assert_array_equal(got, runs[0])


@pytest.mark.parametrize("spec", NARROW, ids=lambda s: s.name)
def test_a_narrow_recipe_must_be_exact_narrower_and_within_the_row_features(spec):
    import dataclasses

    from tvm_lowprec.hwspec import GemmRecipe

    with pytest.raises(ValueError, match="fewer lanes"):
        dataclasses.replace(spec, narrow=GemmRecipe(spec.gemm, spec.tiles))
    features = tuple(f for f in spec.features if f not in spec.narrow.intrin.features[:1])
    with pytest.raises(ValueError, match=f"{spec.narrow.intrin.name} needs"):
        dataclasses.replace(spec, features=features)


@pytest.mark.parametrize("spec", [s for s in TARGETS if s.device == "cpu"], ids=lambda s: s.name)
def test_a_few_rows_take_a_lower_tile_that_pads_less(spec, rng):
    """M = 9 (a 3x3 feature map) with 160 columns: the tile grows tall to keep its accumulators for the
    narrow N and would pad M to whole tiles of that height (8 rows: 16, 7 thrown away); the layout takes
    the height from half the tile's up that pads least, and the result is exact."""
    from tvm_lowprec.kernels.qgemm import ROW_PADDING_LIMIT, tile_layout

    ep = EPILOGUES["requant-u8"]
    problem = QGemmProblem(9, 160, 960, "uint8", ep)
    layout = GemmLayout.choose(problem, spec)
    recipe = spec.recipe_for(None, problem.n)
    gi = recipe.intrin
    grown = tile_layout(gi, gi.operand("uint8"), recipe.tile_for(9), 9, 160, layout.kp)
    assert layout.mp <= grown.mp
    if grown.mp - 9 > ROW_PADDING_LIMIT * grown.mp:
        assert layout.mr >= (grown.mr + 1) // 2 and layout.mp < grown.mp, (grown, layout)
    run_case(spec, rng, (9, 160, 960), OPERANDS[1], ep)


# rows whose tile table lets a tile take more rows where its own pad M too much (Tile.grow_rows)
GROWING = [(t, r) for t in TARGETS if t.device == "cpu" for r in t.recipes() if any(x.grow_rows for x in r.tiles)]


@pytest.mark.parametrize("pair", GROWING, ids=_recipe_id)
def test_a_tile_takes_rows_that_pad_m_less_where_its_own_pad_too_much(pair, rng):
    """ViT's M = 50 on 4-row tiles is 13 tiles of 52 rows (3.8% thrown away): a tile with ``grow_rows``
    takes 5 rows (10 tiles, none thrown away), exact as ever; where its rows pad M by at most
    ROW_PADDING_LIMIT (M = 250: 0.8%) it keeps them."""
    from tvm_lowprec.kernels.qgemm import ROW_PADDING_LIMIT

    spec, recipe = pair
    spec = _only(spec, recipe)
    tile = next(x for x in recipe.tiles if x.grow_rows)
    n = recipe.intrin.lanes * tile.nr
    m = tile.mr * 12 + 2  # 2 rows into a 13th tile
    assert recipe.tile_for(m) is tile and (tile.mr - 2) / (13 * tile.mr) > ROW_PADDING_LIMIT
    layout = GemmLayout.choose(QGemmProblem(m, n, 64, "uint8", Epilogue("requant", "uint8")), spec)
    assert tile.mr < layout.mr <= tile.grow_rows and layout.mp - m < 13 * tile.mr - m, layout
    run_case(spec, rng, (m, n, 64), OPERANDS[1], EPILOGUES["requant-u8"], bound=recipe.intrin.weight_pair_bound)
    few = tile.mr * 62 + 2  # 2 rows into a 63rd tile: little padding
    if recipe.tile_for(few) is tile:
        assert GemmLayout.choose(QGemmProblem(few, n, 64, "uint8", Epilogue()), spec).mr == tile.mr
