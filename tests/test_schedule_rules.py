"""The schedule rules for the detectors' non-GEMM kernels, each on the operator it was written for:
which rule takes the function (the decision), and that the scheduled kernel computes what the
unscheduled one does (the transformation). Also the NaN test a quantize drops when its input is
bounded (:mod:`tvm_lowprec.quant.finite_quantize`)."""

import re

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax

import tvm_lowprec
from tvm_lowprec.kernels.qgemm import _column_groups
from tvm_lowprec.schedule.blocks import root_children
from tvm_lowprec.schedule import DEFAULT_RULES, ElementwiseRule, StridedReductionRule, WindowReductionRule
from tvm_lowprec.targets import resolve_target
from tvm_lowprec.targets.x86 import X86_TARGETS

SPEC = resolve_target("native")


def _fused_primfuncs(build):
    """The PrimFuncs TVM fuses from the Relax function ``build(bb)`` emits (one per kernel)."""
    bb = relax.BlockBuilder()
    build(bb)
    mod = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                                    relax.transform.FuseOps(), relax.transform.FuseTIR()])(bb.get())
    return [f for _, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]


def _function(bb, shape, body, dtype="float32"):
    x = relax.Var("x", relax.TensorType(shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(body(bb, x))
        bb.emit_func_output(out)


def _run(func, inputs):
    """``func`` on numpy ``inputs``: its outputs (the parameters after the inputs)."""
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=SPEC.tvm_target(1))
    outs = [tvm.runtime.tensor(np.zeros([int(d) for d in p.shape], str(p.dtype))) for p in func.params[len(inputs):]]
    lib.mod["main"](*(tvm.runtime.tensor(a) for a in inputs), *outs)
    return [o.numpy() for o in outs]


def _first_rule(func):
    return next((type(r).__name__ for r in DEFAULT_RULES if r.apply(func, SPEC) is not None), None)


def _check_scheduled(func, rule, inputs, exact=True):
    sch = rule.apply(func, SPEC)
    assert sch is not None
    want, got = _run(func, inputs), _run(sch.mod["main"], inputs)
    for w, g in zip(want, got):
        if exact:
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


# -- reductions along an axis that is not the innermost ------------------------------------------
STRIDED = {
    # a YOLO-style DFL head: softmax over the 4 bins of 4 box sides, 64 anchors innermost
    "softmax-axis1": ((1, 4, 4, 64), lambda bb, x: relax.op.nn.softmax(x, axis=1)),
    # squeeze-excite's global average pool of an NHWC tensor (more points than a pooling window)
    "mean-hw-nhwc": ((1, 40, 30, 16), lambda bb, x: relax.op.mean(x, axis=[1, 2], keepdims=True)),
    "sum-axis0": ((300, 40), lambda bb, x: relax.op.sum(x, axis=[0])),
    # wav2vec2's group norm over frames of an NWC tensor: a long column walk, taken in strips of vectors
    "norm-over-frames-nwc": ((1, 400, 256), lambda bb, x: relax.op.divide(
        x, relax.op.sqrt(relax.op.add(relax.op.variance(x, axis=[1], keepdims=True), relax.const(np.float32(1e-5)))))),
}


@pytest.mark.parametrize("name", list(STRIDED))
def test_a_reduction_along_an_outer_axis_is_vectorized_along_the_inner_one(name, rng):
    shape, body = STRIDED[name]
    (func,) = _fused_primfuncs(lambda bb: _function(bb, shape, body))
    assert _first_rule(func) == "StridedReductionRule"
    _check_scheduled(func, StridedReductionRule(), [rng.standard_normal(shape).astype(np.float32)], exact=False)


def test_a_long_reduction_to_one_value_gets_vector_partial_sums(rng):
    """A group norm of one group over a whole 1x1x16384 tensor (mobilevit-v2): dlight's CPU reduction
    rule left it one serial chain of scalar adds; it is declined, and the generic rule rfactors it."""
    shape = (1, 1, 16384)
    (func,) = _fused_primfuncs(lambda bb: _function(bb, shape, lambda bb, x: relax.op.sqrt(
        relax.op.add(relax.op.variance(x, axis=[2], keepdims=True), relax.const(np.float32(1e-5))))))
    assert _first_rule(func) == "GenericRule"
    x = rng.standard_normal(shape).astype(np.float32)
    (got,) = _run(DEFAULT_RULES[-1].apply(func, SPEC).mod["main"], [x])
    np.testing.assert_allclose(got.ravel(), np.sqrt(x.astype(np.float64).var() + 1e-5), rtol=1e-6)


def test_a_long_column_walk_takes_strips_of_vectors():
    shape, body = STRIDED["norm-over-frames-nwc"]
    (func,) = _fused_primfuncs(lambda bb: _function(bb, shape, body))
    sch = StridedReductionRule().apply(func, SPEC)
    outer = sch.get(sch.get_loops(root_children(sch)[1][-1])[0])
    assert outer.kind == tvm.tirx.ForKind.PARALLEL and int(outer.extent) == 256 // 64  # 4 vectors of 16 float32


@pytest.mark.parametrize("axis", [-1])
def test_the_strided_rule_declines_a_row_reduction(axis):
    (func,) = _fused_primfuncs(lambda bb: _function(bb, (8, 64), lambda bb, x: relax.op.nn.softmax(x, axis=axis)))
    assert StridedReductionRule().apply(func, SPEC) is None


def test_a_max_pool_with_a_dequantize_after_it_is_one_window_kernel(rng):
    """SPPF's pools are followed by a dequantize in the same kernel: the window rule takes the pair
    (the dequantize computed per output row), not TVM's fallback."""
    shape = (1, 20, 20, 16)

    def body(bb, x):
        pooled = relax.op.nn.max_pool2d(x, pool_size=(5, 5), padding=(2, 2, 2, 2), layout="NHWC")
        return relax.op.multiply(relax.op.astype(pooled, "float32"), relax.const(0.05, "float32"))

    (func,) = _fused_primfuncs(lambda bb: _function(bb, shape, body, "uint8"))
    assert _first_rule(func) == "WindowReductionRule"
    _check_scheduled(func, WindowReductionRule(), [rng.integers(0, 256, shape).astype(np.uint8)])


@pytest.mark.parametrize("spec", X86_TARGETS, ids=lambda s: s.name)
@pytest.mark.parametrize("pool", ["sppf 5x5 s1, 16 channels", "resnet 3x3 s2, 64 channels"])
def test_max_pools_run_in_the_rows_vector_registers_without_bounds_tests(pool, spec, rng):
    """A pool's taps are full vectors of the row's width (``vpmaxub`` on its registers, from the row's
    data): SPPF's few channels through the fused (column, channel) axis over a padded copy, ResNet's
    64 channels with the padding inlined and its bounds tests split off by LoopPartition; both exact
    against the unscheduled kernel where the host runs the row."""
    from tvm_lowprec.targets import host_supports

    if pool.startswith("sppf"):
        shape, size, stride, pad = (1, 12, 16, 16), 5, 1, 2
    else:
        shape, size, stride, pad = (1, 16, 16, 64), 3, 2, 1

    def body(bb, x):
        return relax.op.nn.max_pool2d(x, pool_size=(size, size), strides=(stride, stride), padding=(pad,) * 4,
                                      layout="NHWC")

    (func,) = _fused_primfuncs(lambda bb: _function(bb, shape, body, "uint8"))
    with spec.tvm_target(1):
        sch = WindowReductionRule().apply(func, spec)
    kinds = [inst.kind.name for inst in sch.trace.insts]
    lanes = spec.gemm.vector_bits // 8
    assert ("ComputeInline" in kinds) == pool.startswith("resnet")  # the padding copied once, or inlined
    assert str(sch.trace).count("pragma_loop_partition_hint") == 2  # rows and columns (of the padding or the window)
    vectorized = sch.mod["main"].script()
    assert f"T.vectorized(T.int64({lanes}))" in vectorized or f"T.vectorized({lanes})" in vectorized
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}), target=spec.tvm_target(1))
    register = {256: "ymm", 512: "zmm"}[spec.gemm.vector_bits]
    assert re.search(rf"vpmaxub\s+[^\n]*%{register}\d+, %{register}\d+", lib.mod.inspect_source("asm"))
    if host_supports(spec):
        x = rng.integers(0, 256, shape).astype(np.uint8)
        out = [tvm.runtime.tensor(np.zeros([int(d) for d in func.params[-1].shape], np.uint8))]
        lib.mod["main"](tvm.runtime.tensor(x), *out)
        np.testing.assert_array_equal(out[0].numpy(), _run(func, [x])[0])


# -- injective chains ----------------------------------------------------------------------------
def _upsample_concat(bb, x):
    """An FPN's four 6-channel maps upsampled and concatenated into 24 channels (offsets 6, 12, 18)."""
    pieces = [relax.op.image.resize2d(relax.op.multiply(x, relax.const(float(i + 1), "float32")), size=(16, 16),
                                      layout="NHWC", method="nearest_neighbor", rounding_method="floor")
              for i in range(4)]
    return relax.op.concat(pieces, axis=-1)


@pytest.mark.parametrize("channels, kept", [(6, 0), (70, 4)])
def test_a_concatenation_of_misaligned_pieces(channels, kept, rng):
    """An FPN's four 6-channel pieces: everything inlined, the channel axis computed in steps of 6,
    one loop each (each step's piece known, its select folded); pieces wider than a vector (70 channels) are
    computed into buffers of their own first. Exact either way."""
    from tvm.s_tir import Schedule

    from tvm_lowprec.schedule.blocks import root_children
    from tvm_lowprec.schedule.elementwise import _pieces_of_misaligned_concats

    shape = (1, 8, 8, channels)
    (func,) = _fused_primfuncs(lambda bb: _function(bb, shape, _upsample_concat))
    sch = Schedule(func)
    assert len(_pieces_of_misaligned_concats(sch, root_children(sch)[1])) == kept
    trace = str(ElementwiseRule().apply(func, SPEC).trace)
    assert ("sch.loop_partition" in trace and "factors=[None, 6]" in trace) == (kept == 0)
    if kept == 0:  # the steps' selects folded before TVM vectorizes: vector stores, not a scalarized loop
        assert "T.Ramp(" in _vectorized_tir(ElementwiseRule().apply(func, SPEC).mod["main"])
    _check_scheduled(func, ElementwiseRule(), [rng.standard_normal(shape).astype(np.float32)])


def test_an_upsample_and_concatenation_keeps_its_column_loop(rng):
    """Four upsampled 16-channel maps into 64 channels (vector-aligned pieces): the rows fused and
    parallel, the column loop kept apart (fused with the rows, every pixel would divide its position
    back into row and column for the resize's indices); exact."""
    shape = (1, 8, 8, 16)
    (func,) = _fused_primfuncs(lambda bb: _function(bb, shape, _upsample_concat))
    sch = ElementwiseRule().apply(func, SPEC)
    (block,) = [b for b in sch.get_child_blocks(sch.get_sblock("root")) if "concat" in sch.get(b).name_hint]
    extents = [int(sch.get(loop).extent) for loop in sch.get_loops(block)]
    assert extents[:2] == [16, 16]  # rows (batch x height), then the 16 columns
    _check_scheduled(func, ElementwiseRule(), [rng.standard_normal(shape).astype(np.float32)])


def test_aligned_concatenation_pieces_are_inlined(rng):
    """16-channel pieces of a 64-channel concatenation (SPPF): each vector reads one piece, nothing kept."""
    from tvm.s_tir import Schedule

    from tvm_lowprec.schedule.blocks import root_children
    from tvm_lowprec.schedule.elementwise import _pieces_of_misaligned_concats

    shape = (1, 8, 8, 16)
    (func,) = _fused_primfuncs(lambda bb: _function(bb, shape, lambda bb, x: relax.op.concat(
        [relax.op.multiply(x, relax.const(float(i), "float32")) for i in range(4)], axis=-1)))
    sch = Schedule(func)
    assert not _pieces_of_misaligned_concats(sch, root_children(sch)[1])
    _check_scheduled(func, ElementwiseRule(), [rng.standard_normal(shape).astype(np.float32)])


def _flat_add_func(channels=8):
    """A GEMM's [600, channels] output reshaped to NHWC and added to an NHWC tensor (a residual add, here
    in integers: float chains are contracted into FMAs by LLVM alike in every schedule, so an unscheduled
    scalar build is no exact reference for them): the reshape moves no element."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((600, channels), "uint8"))
    y = relax.Var("y", relax.TensorType((1, 20, 30, channels), "uint8"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            a = relax.op.astype(relax.op.reshape(x, (1, 20, 30, channels)), "int32")
            total = relax.op.add(relax.op.subtract(a, relax.const(7, "int32")), relax.op.astype(y, "int32"))
            out = bb.emit_output(relax.op.astype(relax.op.clip(total, 0, 255), "uint8"))
        bb.emit_func_output(out)
    mod = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                                    relax.transform.FuseOps(), relax.transform.FuseTIR()])(bb.get())
    (func,) = [f for _, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    return func


def _vectorized_tir(func) -> str:
    """``func``'s TIR right after TVM's VectorizeLoop, as text."""
    from tvm.ir.instrument import pass_instrument

    seen = []

    @pass_instrument
    class _Grab:
        def run_after_pass(self, mod, info):
            if info.name == "tirx.VectorizeLoop":
                seen.append(mod.script())

    with tvm.transform.PassContext(opt_level=3, instruments=[_Grab()]):
        tvm.tirx.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=SPEC.tvm_target(2))
    return seen[-1]


@pytest.mark.parametrize("channels", [8, 24])
def test_an_elementwise_chain_in_flat_order_is_one_flat_vector_loop(channels, rng):
    """8 or 24 channels innermost, reads in the output's own row-major order: one loop of vectors of
    whole pixels, up to 64 elements (not a vector per pixel), every load and store contiguous after
    vectorization (64 lanes over 24-channel pixels left each lane its own div/mod address: byte
    gathers, 12x slower), exact."""
    from tvm_lowprec.schedule.elementwise import _FLAT

    func = _flat_add_func(channels)
    sch = ElementwiseRule().apply(func, SPEC)
    loops = [sch.get(l) for l in sch.get_loops(sch.get_child_blocks(sch.get_sblock("root"))[0])]
    lanes = int(loops[-1].extent)
    assert [int(l.extent) for l in loops] == [600 * channels // lanes, lanes] and lanes % channels == 0 and lanes <= _FLAT
    assert lanes == {8: 48, 24: 48}[channels]  # whole pixels, whole rows of 30 pixels or a divisor of one
    assert loops[-1].kind == tvm.tirx.ForKind.VECTORIZED
    text = _vectorized_tir(sch.mod["main"])
    assert "T.Ramp(" in text and "% T.Broadcast(" not in text and "// T.Broadcast(" not in text, text
    inputs = [rng.integers(0, 256, (600, channels)).astype(np.uint8),
              rng.integers(0, 256, (1, 20, 30, channels)).astype(np.uint8)]
    _check_scheduled(func, ElementwiseRule(), inputs)


@pytest.mark.parametrize("channels", [8, 24])
def test_a_per_channel_broadcast_keeps_the_nest(channels, rng):
    """A read of per-channel parameters is not in the output's flat order: the nest stays, a pixel's
    channels one vector (24: not a loop of three 8-lane vectors)."""
    shape = (1, 20, 30, channels)
    (func,) = _fused_primfuncs(lambda bb: _function(bb, shape, lambda bb, x: relax.op.multiply(
        x, relax.const(np.arange(channels, dtype=np.float32)))))
    sch = ElementwiseRule().apply(func, SPEC)
    loops = [sch.get(l) for l in sch.get_loops(sch.get_child_blocks(sch.get_sblock("root"))[0])]
    assert int(loops[-1].extent) == channels and loops[-1].kind == tvm.tirx.ForKind.VECTORIZED, loops
    _check_scheduled(func, ElementwiseRule(), [rng.standard_normal(shape).astype(np.float32)])


def _cpu_recipes():
    from tvm_lowprec.targets import registered_targets

    for name, spec in sorted(registered_targets("cpu").items()):
        for recipe in spec.recipes():
            for tile in recipe.tiles:
                if tile.nr > 1:
                    yield pytest.param(recipe, tile, id=f"{name}-{recipe.intrin.name}-{tile.mr}x{tile.nr}")


@pytest.mark.parametrize("recipe, tile", list(_cpu_recipes()))
def test_a_narrow_gemm_keeps_the_tiles_accumulators_in_taller_tiles(recipe, tile):
    """N of one vector with K deep: the tile's mr x nr accumulators as (mr * nr) x 1, M allowing; with
    K one instruction step deep, the tile's own mr (no latency to hide)."""
    from tvm_lowprec.kernels.qgemm import _CHAIN_STEPS, tile_layout

    gi = recipe.intrin
    operand = gi.operand("uint8")
    m = 4096
    deep = tile_layout(gi, operand, tile, m, gi.lanes, _CHAIN_STEPS * gi.kstep * 4)
    assert deep.nr == 1 and deep.mr * deep.nr >= tile.mr * tile.nr and deep.mr % gi.rows == 0, deep
    shallow = tile_layout(gi, operand, tile, m, gi.lanes, gi.kstep)
    assert shallow.nr == 1 and shallow.mr == -(-tile.mr // gi.rows) * gi.rows, shallow
    few_rows = tile_layout(gi, operand, tile, 3, gi.lanes, _CHAIN_STEPS * gi.kstep * 4)
    assert few_rows.mr <= -(-3 // gi.rows) * gi.rows


# -- the NaN test of quantize --------------------------------------------------------------------
def _qdq_add_model():
    """x -> Q -> DQ -> + c -> Q -> DQ: the first quantize reads a graph input (NaN possible), the
    second a dequantized value plus a constant (bounded)."""
    init = [helper.make_tensor("s", TensorProto.FLOAT, [], [0.05]), helper.make_tensor("z", TensorProto.UINT8, [], [128]),
            helper.make_tensor("c", TensorProto.FLOAT, [4], [0.5, -1.0, 2.0, 0.0])]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             helper.make_node("Add", ["d", "c"], ["a"]),
             helper.make_node("QuantizeLinear", ["a", "s", "z"], ["q2"]),
             helper.make_node("DequantizeLinear", ["q2", "s", "z"], ["y"])]
    graph = helper.make_graph(nodes, "qdq_add", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_only_the_quantize_of_an_unbounded_input_keeps_its_nan_test():
    from tvm_lowprec.quant.finite_quantize import _Legalizer
    from tvm_lowprec.quant.patterns import mutate_relax_functions

    mod = tvm_lowprec.from_onnx(_qdq_add_model())
    legalizer = _Legalizer(mod)
    mutate_relax_functions(mod, legalizer)
    assert legalizer.without_test == 1  # the second quantize; the first keeps its test
    compiled = tvm_lowprec.compile(mod, target="native")
    x = np.array([[np.nan, 1.0, -2.0, 0.3], [7.0, -7.0, np.inf, 0.0]], np.float32)
    got = compiled(x)[0]
    q = np.where(np.isnan(x), 0, np.clip(np.rint(x / np.float32(0.05)) + 128, 0, 255))  # NaN -> the lowest code
    d = (q - 128) * np.float32(0.05) + np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    want = (np.clip(np.rint(d / np.float32(0.05)) + 128, 0, 255) - 128) * np.float32(0.05)
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=0, atol=1e-6)


# -- copies that change the layout: reads in their simplest form, swept in the read's order ----------
def _head_transpose(x, hw, c=16):
    """A detector head: NHWC codes ``[HW, C]`` read back as NCHW ``[1, C, HW]`` through reshapes and a
    transpose, then dequantized (the chain of reshapes composes into divisions TVM does not fold)."""
    side = int(round(hw ** 0.5))
    y = relax.op.reshape(relax.op.reshape(x, (hw * c,)), (1, side, side, c))
    y = relax.op.reshape(relax.op.permute_dims(y, [0, 3, 1, 2]), (1, c, hw))
    return relax.op.multiply(relax.op.astype(y, "float32"), relax.const(np.float32(0.5)))


def _loads_of(func, name: str) -> list[str]:
    return re.findall(rf"{name}\[[^\]]*\]", func.script())


def test_reshapes_and_a_transpose_read_their_input_at_affine_indices(rng):
    """The composed reshape-transpose-reshape reads ``x[p, c]`` (no division per lane after
    :func:`~tvm_lowprec.schedule.affine_loads.affine_loads`); exact."""
    shape = (400, 16)
    (func,) = _fused_primfuncs(lambda bb: _function(bb, shape, lambda bb, x: _head_transpose(x, 400), "uint8"))
    sch = ElementwiseRule().apply(func, SPEC)
    loads = _loads_of(sch.mod["main"], "x")
    assert loads and not any("//" in load or "%" in load for load in loads), loads
    _check_scheduled(func, ElementwiseRule(), [rng.integers(0, 256, shape, dtype=np.uint8)])


def test_a_concatenation_of_transposed_pieces_is_cut_into_one_loop_per_piece(rng):
    """A head's three scales (400, 100 and 25 anchors) concatenated along the anchors: one loop per
    piece (the 400 in vectors), each reading its piece at affine indices, nothing kept; exact."""
    from tvm.s_tir import Schedule

    from tvm_lowprec.schedule.elementwise import _pieces_of_misaligned_concats

    def build(bb):
        xs = [relax.Var(f"x{i}", relax.TensorType((n, 16), "uint8")) for i, n in enumerate((400, 100, 25))]
        with bb.function("main", xs):
            with bb.dataflow():
                out = bb.emit_output(relax.op.concat([_head_transpose(x, n) for x, n in zip(xs, (400, 100, 25))], axis=2))
            bb.emit_func_output(out)

    (func,) = _fused_primfuncs(build)
    plain = Schedule(func)
    assert not _pieces_of_misaligned_concats(plain, root_children(plain)[1])
    sch = ElementwiseRule().apply(func, SPEC)
    assert str(sch.trace).count("sch.loop_partition") == 1 and "sch.vectorize" in str(sch.trace)
    for name in ("x0", "x1", "x2"):
        loads = _loads_of(sch.mod["main"], name)
        assert loads and not any("//" in load or "%" in load for load in loads), loads
    _check_scheduled(func, ElementwiseRule(), [rng.integers(0, 256, (n, 16), dtype=np.uint8) for n in (400, 100, 25)])


@pytest.mark.parametrize("side, read_order", [(64, True), (8, False)])
def test_a_transpose_back_to_nchw_sweeps_a_large_input_row_by_row(side, read_order, rng):
    """``y[c, h, w] = x[h, w, c]``: the parallel loop runs over (h, c), not (c, h), so each row of
    ``x`` is read while it is in cache, where ``x`` is large (64x64x21 floats: 336 KiB); a small ``x``
    keeps the output's order (its writes contiguous); exact."""
    from tvm_lowprec.schedule.elementwise import _READ_ORDER_BYTES

    shape = (1, side, side, 21)
    assert (side * side * 21 * 4 >= _READ_ORDER_BYTES) == read_order
    (func,) = _fused_primfuncs(lambda bb: _function(bb, shape, lambda bb, x: relax.op.permute_dims(
        relax.op.multiply(x, relax.const(np.float32(2.0))), [0, 3, 1, 2])))
    sch = ElementwiseRule().apply(func, SPEC)
    (block,) = [b for b in sch.get_child_blocks(sch.get_sblock("root"))]
    outer = sch.get(sch.get_loops(block)[0])
    # h (ax2 of the output) before c (ax1), or the output's own order
    assert ("ax2_ax1" in outer.loop_var.name) == read_order, outer.loop_var.name
    _check_scheduled(func, ElementwiseRule(), [rng.standard_normal(shape).astype(np.float32)])


def test_a_channel_repeat_is_unrolled_for_llvms_byte_shuffles(rng):
    """``y[..., c] = x[..., c // 2]`` (a depthwise convolution's channel multiplier, NHWC): steps of
    the channel axis unrolled, not vectorized into a byte gather per lane; exact."""
    shape = (1, 8, 8, 48)
    (func,) = _fused_primfuncs(lambda bb: _function(bb, shape, lambda bb, x: relax.op.repeat(x, 2, axis=3), "uint8"))
    sch = ElementwiseRule().apply(func, SPEC)
    trace = str(sch.trace)
    assert "sch.unroll" in trace and "sch.vectorize" not in trace, trace
    _check_scheduled(func, ElementwiseRule(), [rng.integers(0, 256, shape, dtype=np.uint8)])
