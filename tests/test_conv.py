"""Quantized convolutions: QLinearConv (exact against onnx.reference) and quantize_static CNNs (vs ORT).

A convolution with constant weights becomes an NHWC im2col (padding with the activation zero point,
i.e. real zero; none for a 1x1 stride-1 convolution) followed by the integer GEMM kernel; its output
returns to NCHW only where a layer needs NCHW (the graph's output here).
"""

import numpy as np
import pytest

import tvm_lowprec

from models import fp32_cnn, qlinear_conv, quantize_qdq
from reference import assert_within_one_step, ort_session, output_scale

CONVS = {
    "3x3-pad1": dict(x_shape=(1, 4, 9, 9), c_out=8, kernel=(3, 3), pads=(1, 1, 1, 1)),
    "3x3-stride2-asym-pad": dict(x_shape=(2, 3, 10, 11), c_out=5, kernel=(3, 3), strides=(2, 2), pads=(0, 1, 1, 0)),
    "dilated": dict(x_shape=(1, 6, 12, 12), c_out=16, kernel=(3, 3), dilations=(2, 2), pads=(2, 2, 2, 2)),
    "1x1-no-bias-per-tensor": dict(x_shape=(1, 32, 5, 5), c_out=24, kernel=(1, 1), bias=False, per_channel=False),
    "1x1-stride2": dict(x_shape=(1, 16, 9, 9), c_out=8, kernel=(1, 1), strides=(2, 2)),
    "5x1-int8": dict(x_shape=(1, 2, 8, 8), c_out=3, kernel=(5, 1), pads=(2, 0, 2, 0), x_dtype="int8"),
    # taps that read only padding are dropped (patterns.trim_dead_taps): DeepLab's ASPP on a small map
    "atrous-centre-tap-only": dict(x_shape=(1, 16, 6, 6), c_out=16, kernel=(3, 3), dilations=(8, 8), pads=(8, 8, 8, 8)),
    "atrous-partial-5x5": dict(x_shape=(1, 8, 4, 9), c_out=16, kernel=(5, 5), dilations=(3, 3), pads=(6, 6, 6, 6)),
}
# the GEMM depth after the dead taps are dropped: 1 and 3x5 taps of the channels
TRIMMED_DEPTH = {"atrous-centre-tap-only": 16, "atrous-partial-5x5": 3 * 5 * 8}


# depthwise convolutions (one filter per channel) have their own NHWC kernel, vectorized over channels
DEPTHWISE = {
    "depthwise-3x3": dict(x_shape=(1, 16, 10, 10), c_out=16, kernel=(3, 3), pads=(1, 1, 1, 1), group=16),
    "depthwise-5x5-stride2-asym": dict(x_shape=(2, 24, 11, 9), c_out=24, kernel=(5, 5), strides=(2, 2),
                                       pads=(2, 1, 1, 2), group=24),
    "depthwise-dilated-int8": dict(x_shape=(1, 8, 12, 12), c_out=8, kernel=(3, 3), dilations=(2, 2),
                                   pads=(2, 2, 2, 2), group=8, x_dtype="int8", per_channel=False),
    "depthwise-odd-channels": dict(x_shape=(1, 5, 7, 7), c_out=5, kernel=(3, 3), group=5),
    # a channel multiplier (m filters per input channel): the depthwise kernel over the input's channels
    # repeated m times (quant/depthwise_multiplier.py), not m-column GEMMs, one per group
    "depthwise-multiplier-2": dict(x_shape=(1, 8, 9, 9), c_out=16, kernel=(3, 3), pads=(1, 1, 1, 1), group=8),
    "depthwise-multiplier-2-fastvit-7x7-stride2": dict(x_shape=(1, 16, 16, 16), c_out=32, kernel=(7, 7),
                                                       strides=(2, 2), pads=(3, 3, 3, 3), group=16),
    "depthwise-multiplier-3-int8": dict(x_shape=(1, 4, 8, 8), c_out=12, kernel=(3, 3), group=4, x_dtype="int8"),
}
# other grouped convolutions: one batched GEMM kernel, a group per batch, on the row's intrinsic
GROUPED = {
    "grouped-2": dict(x_shape=(1, 6, 7, 7), c_out=4, kernel=(3, 3), strides=(2, 2), group=2),
    "grouped-width8-regnet": dict(x_shape=(1, 48, 9, 9), c_out=48, kernel=(3, 3), pads=(1, 1, 1, 1), group=6),
    "grouped-width16-dilated-int8": dict(x_shape=(2, 32, 10, 10), c_out=32, kernel=(3, 3), dilations=(2, 2),
                                         pads=(2, 2, 2, 2), group=2, x_dtype="int8", per_channel=False),
    "grouped-1x1-shufflenet": dict(x_shape=(1, 24, 6, 6), c_out=36, kernel=(1, 1), group=3),
    "grouped-width64": dict(x_shape=(1, 128, 5, 5), c_out=128, kernel=(3, 3), pads=(1, 1, 1, 1), group=2),
}
KERNEL = {**{n: "qconv2d" for n in CONVS}, **{n: "qdepthwise" for n in DEPTHWISE}, **{n: "qgconv2d" for n in GROUPED}}


@pytest.mark.parametrize("name", list(KERNEL))
def test_qlinear_conv_matches_onnx_reference_exactly(name, rng):
    from onnx.reference import ReferenceEvaluator

    cfg = {**CONVS, **DEPTHWISE, **GROUPED}[name]
    model = qlinear_conv(**cfg)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    kernels = {k.name.split("_")[0] for k in compiled.kernels()}
    assert {"qconv2d", "qdepthwise", "qgconv2d"} & kernels == {KERNEL[name]}
    pointwise = cfg["kernel"] == (1, 1) and cfg.get("strides", (1, 1)) == (1, 1)
    pointwise |= TRIMMED_DEPTH.get(name) == cfg["x_shape"][1]  # one live tap: a 1x1 convolution
    windowed = any("lowprec.window" in compiled._lowered[k.name].attrs for k in compiled.kernels() if k.op == "qgemm")
    # an im2col unless the GEMMs read the padded input in place (a grouped convolution's too, where each
    # group's channels are whole instruction steps; a pointwise grouped one needs its groups gathered)
    assert ("im2col" in kernels) == (not windowed and (name in GROUPED or not pointwise) and name not in DEPTHWISE)
    info = np.iinfo(cfg.get("x_dtype", "uint8"))
    x = rng.integers(info.min, info.max + 1, cfg["x_shape"]).astype(cfg.get("x_dtype", "uint8"))
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = compiled(x)[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(got)) > 10  # not all clamped: the comparison means something


def test_quantize_static_cnn_matches_ort(rng):
    shape = (1, 3, 16, 16)
    qdq = quantize_qdq(fp32_cnn(shape), [rng.standard_normal(shape).astype(np.float32) for _ in range(8)])
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq), target="native")
    names = [k.name for k in compiled.kernels()]
    assert sum(n.startswith("qconv2d") for n in names) == 3 and sum(n.startswith("qdepthwise") for n in names) == 1
    session = ort_session(qdq, optimized=False)
    for _ in range(3):
        x = rng.standard_normal(shape).astype(np.float32)
        assert_within_one_step(compiled(x)[0], session.run(None, {"x": x})[0], output_scale(qdq))


def test_depthwise_fixed_point_requantization_within_one_step(rng):
    from onnx.reference import ReferenceEvaluator

    cfg = DEPTHWISE["depthwise-5x5-stride2-asym"]
    model = qlinear_conv(**cfg)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native", requant_mode="fixed_point")
    x = rng.integers(0, 256, cfg["x_shape"]).astype(np.uint8)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0].astype(np.int32)
    got = compiled(x)[0].astype(np.int32)
    assert np.abs(got - want).max() <= 1 and (got == want).mean() > 0.95


@pytest.mark.host_dependent
@pytest.mark.parametrize("channels", [3, 8])
def test_im2col_padding_is_partitioned_and_exact(channels, rng):
    """The padding copy's rows and columns carry TVM's loop-partition hint (the interior copies without
    the padding's Select), and the im2col is exact against numpy, asymmetric padding and stride 2."""
    from tvm_lowprec.kernels.im2col import build_im2col, pad_argument
    from tvm_lowprec.quant.patterns import ConvGeometry
    from tvm_lowprec.schedule import schedule_func
    from tvm_lowprec.targets import resolve_target
    import tvm

    spec = resolve_target("native")
    g = ConvGeometry(1, channels, (11, 10), (5, 5), (3, 3), (2, 2), (1, 0, 0, 1), (1, 1))
    sch = schedule_func(build_im2col(g, "uint8", "im2col"), spec)
    hinted = [sch.get(loop).annotations.get("pragma_loop_partition_hint") for loop in sch.get_loops(sch.get_sblock("padded"))]
    assert sum(h is not None for h in hinted) == 2, hinted
    inner = sch.get(sch.get_loops(sch.get_sblock("im2col"))[-1])  # a tap row's (kw, c) run: one vector copy
    lanes = spec.gemm.vector_bits // 8
    if channels % lanes and channels not in (lanes // 2, lanes // 4):  # channels that fill no vector alone
        assert int(inner.extent) == 3 * channels and inner.kind == tvm.tirx.ForKind.VECTORIZED, inner
    x = rng.integers(0, 256, (1, 11, 10, channels)).astype(np.uint8)
    out = tvm.runtime.tensor(np.zeros((1, 5, 5, 3, 3, channels), np.uint8))
    pad = tvm.runtime.tensor(pad_argument(7))  # the zero point: a parameter, one kernel for all zero points
    tvm.compile(sch.mod, target=spec.tvm_target(2)).mod["im2col"](tvm.runtime.tensor(x), pad, out)
    padded = np.pad(x, ((0, 0), (1, 0), (0, 1), (0, 0)), constant_values=7)
    want = np.stack([np.stack([padded[:, kh:kh + 9:2, kw:kw + 9:2, :] for kw in range(3)], 3) for kh in range(3)], 3)
    np.testing.assert_array_equal(out.numpy(), want)


@pytest.mark.host_dependent
@pytest.mark.parametrize("c_out", [8, 64])
def test_a_three_channel_stem_gets_a_fourth_channel_instead_of_a_padded_copy_of_a(c_out, rng):
    """3x3 over 3 channels is K = 27, not whole instruction steps: where a fourth channel (the zero
    point, its weights the weights' zero point) makes K whole and the GEMM is one vector of columns
    wide, the im2col writes it and the GEMM reads its A as it is (no A_prepared copy); a wider GEMM
    keeps K = 27 (its multiply-adds, not the copy, bound it); exact against onnx.reference either way."""
    from onnx.reference import ReferenceEvaluator

    model = qlinear_conv(x_shape=(1, 3, 16, 16), c_out=c_out, kernel=(3, 3), pads=(1, 1, 1, 1))
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    (gemm,) = [k for k in compiled.kernels() if k.op == "qgemm"]
    func = compiled._lowered[gemm.name]
    lanes, kstep = (int(v) for v in func.attrs["lowprec.vector"])
    k = int(gemm.name.split("_")[2].split("x")[2])
    want_k = 36 if 27 % kstep and 36 % kstep == 0 and c_out <= lanes else 27
    assert k == want_k, (gemm.name, kstep)
    # the copy is gone where the row's instruction also takes the activations as they are (vpdpbusd's
    # uint8); the vpmaddwd rows (AVX2, AVX-512BW) widen them to int16 in A_prepared whatever K is
    recipes = (*compiled.spec.recipes(), getattr(compiled.spec, "narrow", None))
    (intrin,) = [r.intrin for r in recipes if r is not None and r.intrin.name == str(func.attrs["lowprec.intrin_row"])]
    as_stored = intrin.operand("uint8").storage == "uint8"
    if k == 36:
        assert ("A_prepared" in func.script()) == (not as_stored), (gemm.name, intrin.name)
    x = rng.integers(0, 256, (1, 3, 16, 16)).astype(np.uint8)
    np.testing.assert_array_equal(compiled(x)[0], ReferenceEvaluator(model).run(None, {"x": x})[0])


@pytest.mark.host_dependent
@pytest.mark.parametrize("name", ["3x3-pad1", "3x3-stride2-asym-pad"])
def test_the_gemm_reads_the_im2col_in_place_where_the_row_allows_it(name, rng):
    """Where the row's instruction takes one activation row, its K step divides the channels per tap and
    it stores the activations as they are (kernels.qgemm.ConvWindow), the convolution is a padding copy
    and a GEMM over the padded NHWC input: no im2col kernel, the GEMM's A 4-D; else an im2col. Exact
    against onnx.reference either way (a 3-channel input gets its fourth channel in the padding copy)."""
    from onnx.reference import ReferenceEvaluator

    from tvm_lowprec.kernels.qgemm import GemmLayout, QGemmProblem, Epilogue

    cfg = CONVS[name]
    model = qlinear_conv(**cfg)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    (gemm,) = [k for k in compiled.kernels() if k.op == "qgemm"]
    func = compiled._lowered[gemm.name]
    m, n, k = (int(v) for v in func.attrs["lowprec.shape"])
    flat = GemmLayout.choose(QGemmProblem(m, n, k, "uint8", Epilogue()), compiled.spec)
    channels = k // 9
    expect = flat.rows == 1 and channels % flat.kstep == 0 and flat.a_storage == "uint8"
    names = {kk.name.split("_")[0] for kk in compiled.kernels()}
    assert ("lowprec.window" in func.attrs) == expect and ("im2col" in names) != expect, (gemm.name, names)
    if expect:
        # both convolutions pad (the copy alone, or merged into the input's producer)
        assert len(func.params[0].shape) == 4 and any("pad" in kk.name for kk in compiled.kernels())
    x = rng.integers(0, 256, cfg["x_shape"]).astype(np.uint8)
    np.testing.assert_array_equal(compiled(x)[0], ReferenceEvaluator(model).run(None, {"x": x})[0])


@pytest.mark.host_dependent
def test_the_image_is_quantized_straight_into_the_stems_padded_input(rng):
    """A float NCHW image quantized for a stem that reads its window in place: FuseOps merges the padding
    copy (op_pattern injective) into the quantize-and-transpose, one kernel writes the padded 4-channel
    NHWC input (no ``pad_`` kernel, no [1, H, W, 3] buffer), its border split off (schedule/elementwise:
    the interior a plain layout change). The model's output within one step of ONNX Runtime's QDQ
    graph."""
    from tvm_lowprec.kernels.qgemm import Epilogue, GemmLayout, QGemmProblem

    shape = (1, 3, 24, 40)
    fp32 = fp32_cnn(shape)
    qdq = quantize_qdq(fp32, [rng.standard_normal(shape).astype(np.float32) for _ in range(4)])
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq), target="native")
    stem = compiled._lowered[next(k.name for k in compiled.kernels() if k.op == "qgemm")]
    m, n, k = (int(v) for v in stem.attrs["lowprec.shape"])
    flat = GemmLayout.choose(QGemmProblem(m, n, k, "uint8", Epilogue()), compiled.spec)
    names = [kk.name for kk in compiled.kernels()]
    if "lowprec.window" in stem.attrs:
        writers = [name for name in names if "quantize" in name and "pad" in name]
        assert len(writers) == 1, names
        assert not any(name.startswith("pad_3x") for name in names), names
        (writer,) = [f for g, f in compiled._lowered.functions.items() if g.name_hint == writers[0]]
        assert [int(e) for e in writer.params[-1].shape] == [1, shape[2] + 2, shape[3] + 2, 4]
    else:  # the row reads an im2col (int16 activations, i8mm's two rows): nothing to fuse
        assert not (flat.rows == 1 and flat.a_storage == "uint8" and (k // 9) % flat.kstep == 0), names
    x = rng.standard_normal(shape).astype(np.float32)
    want = ort_session(qdq, optimized=False).run(None, {"x": x})[0]
    assert_within_one_step(compiled(x=x)[0], want, output_scale(qdq))


def _partitioned_script(mod, spec) -> str:
    """``mod``'s main after TVM's lowering up to LoopPartition and the simplification after unrolling."""
    import tvm
    from tvm import s_tir, tirx

    passes = [s_tir.transform.LowerInitBlock(), s_tir.transform.ConvertBlocksToOpaque(),
              s_tir.transform.LowerOpaqueBlock(), tirx.transform.FlattenBuffer(), tirx.transform.NarrowDataType(32),
              s_tir.transform.LoopPartition(), tirx.transform.UnrollLoop(), tirx.transform.StmtSimplify()]
    with spec.tvm_target(1):
        return tvm.ir.transform.Sequential(passes)(mod)["main"].script()


def test_an_int64_padding_copy_still_has_its_border_split_off():
    """FuseTIR needs the padding copy in TVM's int64 shapes; TVM's LoopPartition ignores the hint on an
    int64 loop, which left the border's Select in every element (a 160x160x8 copy: 3.9 -> 52 us).
    The rule narrows the indices first: the lowered interior is a plain copy, no Select."""
    from tvm_lowprec.kernels.im2col import build_im2col
    from tvm_lowprec.quant.patterns import ConvGeometry
    from tvm_lowprec.schedule.qgemm import Im2colRule

    spec = tvm_lowprec.resolve_target("x86-avx2")
    g = ConvGeometry(1, 8, (20, 20), (20, 20), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1))
    func = build_im2col(g, "uint8", "pad", gather=False)
    assert str(func.params[0].shape[0].ty) == "int64"
    sch = Im2colRule().apply(func, spec)
    lowered = _partitioned_script(sch.mod, spec)
    assert "T.Select" not in lowered and "] = x_1[" in lowered, lowered  # border the zero point, interior a copy


@pytest.mark.parametrize("channels", [8, 24, 64])
def test_a_padding_copy_merged_into_an_integer_add_keeps_its_border_apart(channels, rng):
    """FuseOps may merge the padding copy into any injective producer with one reader (an integer
    residual add before a convolution): the element-wise rule splits the border off there too (no
    Select in the lowered interior) and the result is numpy's add, then pad."""
    import tvm
    from tvm import te, tirx

    from tvm_lowprec.schedule.elementwise import ElementwiseRule

    i64 = lambda *v: tuple(tirx.IntImm("int64", n) for n in v)  # noqa: E731
    a = te.placeholder(i64(1, 6, 7, channels), "uint8", "a")
    b = te.placeholder(i64(1, 6, 7, channels), "uint8", "b")
    s = te.compute(a.shape, lambda *i: (a(*i).astype("int32") + b(*i).astype("int32")).astype("uint8"), "add")

    def pad(n, h, w, c):
        inside = tirx.all(h >= 1, h < 7, w >= 1, w < 8)
        return tirx.Select(inside, s[n, tirx.max(tirx.min(h - 1, 5), 0), tirx.max(tirx.min(w - 1, 6), 0), c],
                           tirx.const(7, "uint8"))

    y = te.compute(i64(1, 8, 9, channels), pad, "padded")
    func = te.create_prim_func([a, b, y])
    spec = tvm_lowprec.resolve_target("x86-avx2")
    sch = ElementwiseRule().apply(func, spec)
    lowered = _partitioned_script(sch.mod, spec)
    assert "T.Select" not in lowered, lowered
    lib = tvm.compile(sch.mod, target=spec.tvm_target(1))
    xa, xb = (rng.integers(0, 100, (1, 6, 7, channels)).astype(np.uint8) for _ in range(2))
    out = tvm.runtime.tensor(np.zeros((1, 8, 9, channels), np.uint8))
    lib["main"](tvm.runtime.tensor(xa), tvm.runtime.tensor(xb), out)
    want = np.pad(xa + xb, [(0, 0), (1, 1), (1, 1), (0, 0)], constant_values=7)
    np.testing.assert_array_equal(out.numpy(), want)


def _row_intrinsics(spec) -> dict:
    """Intrinsic name -> the intrinsic row it belongs to, over every recipe of a CPU row (its narrow one too)."""
    recipes = [*spec.recipes(), *([spec.narrow] if spec.narrow is not None else [])]
    return {name: recipe.intrin for recipe in recipes for operand in recipe.intrin.a_operands.values()
            for name in (operand.intrin, operand.intrin_wide_b) if name}


@pytest.mark.parametrize("row", sorted(tvm_lowprec.targets.registered_targets("cpu")))
@pytest.mark.parametrize("name", ["grouped-width8-regnet", "grouped-width64"])
def test_grouped_conv_runs_on_the_rows_intrinsic(row, name):
    """Code generation for every CPU row (no need to run it here): a grouped convolution is one
    batched GEMM on one of the row's recipes, whose instruction the assembly holds."""
    model = qlinear_conv(**GROUPED[name])
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target=row)
    grouped = [k for k in compiled.kernels() if k.name.startswith("qgconv2d")]
    assert len(grouped) == 1 and grouped[0].op == "qgemm"
    intrinsics = _row_intrinsics(compiled.spec)
    assert grouped[0].intrinsic in intrinsics, (grouped[0].intrinsic, sorted(intrinsics))
    mnemonic = intrinsics[grouped[0].intrinsic].name.split("_")[0]
    assert mnemonic in compiled.inspect_source("asm")


@pytest.mark.parametrize("name", sorted(TRIMMED_DEPTH))
def test_dead_taps_leave_the_gemm(name):
    """Exactness is the reference test above; here, the GEMM's depth is the live taps' alone."""
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(qlinear_conv(**CONVS[name])), target="native")
    (gemm,) = [k for k in compiled.kernels() if k.op == "qgemm"]
    assert gemm.shape[2] == TRIMMED_DEPTH[name]


def _conv_chain(channels: int, side: int, layers: int, seed: int = 0):
    """``layers`` 3x3 convolutions (padding 1) of one geometry in a row, no activation between them:
    ORT's calibration gives each input its own zero point."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((channels, channels, 3, 3)) / np.sqrt(9 * channels)).astype(np.float32)
        b = (rng.standard_normal(channels) * 0.3 + 0.2 * (i + 1)).astype(np.float32)  # shifts each output's range
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        x = f"c{i}"
    shape = [1, channels, side, side]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_padding_copies_of_one_geometry_share_one_kernel(rng):
    """The padding value (the input's zero point) is a kernel parameter: three convolutions of one
    geometry whose inputs have three different zero points run one padding kernel three times (YOLO11n:
    31 padding kernels -> 12), each padding with its own zero point: within one step of ORT."""
    from onnx import numpy_helper

    from reference import kernel_calls

    shape = (1, 64, 5, 5)
    qdq = quantize_qdq(_conv_chain(64, 5, 3), [rng.standard_normal(shape).astype(np.float32) for _ in range(4)])
    inits = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    producers = {o: n for n in qdq.graph.node for o in n.output}
    convs = [n for n in qdq.graph.node if n.op_type == "Conv"]
    zero_points = {int(inits[producers[c.input[0]].input[2]]) for c in convs}  # each input's DequantizeLinear
    assert len(zero_points) == 3, zero_points  # the test means something only if they differ
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq), target="native")
    x = rng.standard_normal(shape).astype(np.float32)
    calls = kernel_calls(compiled, x)
    copies = [k.name for k in compiled.kernels() if k.op in ("pad", "im2col")]
    assert len(copies) == 1 and calls[copies[0]] >= 2, (copies, calls)  # the first may fuse into the input's quantize
    assert_within_one_step(compiled(x)[0], ort_session(qdq, optimized=False).run(None, {"x": x})[0], output_scale(qdq))


def test_the_stems_padded_input_keeps_its_border_apart_with_the_zero_point_a_parameter(rng):
    """FuseOps merges the stem's padding copy (its zero point a kernel parameter since padding copies
    share kernels) into the image's quantize-and-transpose: the element-wise rule still recognises the
    padding (``Select(inside, value, pad)``, ``pad`` read from the parameter) and splits the border off,
    as with an immediate zero point (YOLO11n's 3x160x160 stem: 0.11 ms, 3.8% of copy speed, without)."""
    shape = (1, 3, 16, 16)
    qdq = quantize_qdq(fp32_cnn(shape), [rng.standard_normal(shape).astype(np.float32) for _ in range(4)])
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq), target="native")
    # the stem's padded copy: fused into the quantize where its convolution reads the window in place, or the
    # im2col's own padding copy where the row gathers the taps first (the AVX2 row's qconv2d)
    (stem,) = [k.name for k in compiled.kernels() if ("quantize" in k.name and "pad" in k.name)
               or (k.op == "im2col" and k.name.startswith(f"im2col_{shape[1]}x"))]
    script = compiled._lowered[stem].script()
    assert "pad" in script and script.count("pragma_loop_partition_hint") >= 2, script
    x = rng.standard_normal(shape).astype(np.float32)
    assert_within_one_step(compiled(x)[0], ort_session(qdq, optimized=False).run(None, {"x": x})[0], output_scale(qdq))
