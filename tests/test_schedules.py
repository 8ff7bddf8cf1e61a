"""Every kernel of a quantized reference model is scheduled by some rule (``schedule != "none"``),
and the rules added for the operators between quantized layers (window reductions: pooling; injective
functions with several outputs: split) keep results exact."""

import re

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import tvm_lowprec

from benchmarks.models.detector import yolo_like
from benchmarks.models.textdet import db_like
from models import fp32_block_net, fp32_cnn, quantize_qdq
from tvm_lowprec.targets import resolve_target
from tvm_lowprec.targets.x86 import X86_TARGETS


def _encoder():
    from benchmarks.models.encoder import EncoderConfig, make_encoder

    return make_encoder(cfg=EncoderConfig(layers=1, d_model=64, heads=4, d_ff=128, seq=16))


def _attention():
    from test_batched import _fp32_attention

    return _fp32_attention()


# the reference models' structures, small: name -> (FP32 model maker, input shape)
REFERENCE = {
    "encoder": (_encoder, (1, 16, 64)),
    "cnn": (lambda: fp32_cnn((1, 3, 16, 16)), (1, 3, 16, 16)),
    "block-net": (lambda: fp32_block_net((1, 8, 16, 16)), (1, 8, 16, 16)),
    "attention": (_attention, (1, 32, 64)),
    "detector": (yolo_like, (1, 3, 64, 64)),
    "text-detector": (db_like, (1, 3, 64, 64)),
}


@pytest.mark.parametrize("name", list(REFERENCE))
def test_no_kernel_of_a_quantized_reference_model_is_left_unscheduled(name, rng):
    make, shape = REFERENCE[name]
    fp32 = make()
    qdq = quantize_qdq(fp32, [rng.standard_normal(shape).astype(np.float32) for _ in range(4)])
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq, shape_dict={qdq.graph.input[0].name: list(shape)}),
                                   target="native")
    kernels = compiled.kernels()
    assert kernels and not [k.name for k in kernels if k.schedule == "none"]


def test_the_shipped_demo_model_has_no_unscheduled_kernel():
    from importlib import resources

    path = resources.files("tvm_lowprec") / "data" / "demo_mlp_qdq.onnx"
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(str(path)), target="native")
    assert all(k.schedule == "default" for k in compiled.kernels())


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_max_pool_is_scheduled_and_exact(layout, rng):
    """A 5x5 stride-1 max pool with padding (SPPF), on uint8: the window rule, results as onnx.reference."""
    shape = (1, 8, 12, 16)
    nodes = [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[5, 5], pads=[2, 2, 2, 2], strides=[1, 1])]
    if layout == "nhwc":  # as the layout pass leaves pools between NHWC convolutions
        nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 3, 1, 2]),
                 helper.make_node("MaxPool", ["xt"], ["p"], kernel_shape=[5, 5], pads=[2, 2, 2, 2]),
                 helper.make_node("Transpose", ["p"], ["y"], perm=[0, 2, 3, 1])]
        shape = (1, 12, 16, 8)
    model = helper.make_model(helper.make_graph(
        nodes, "pool", [helper.make_tensor_value_info("x", TensorProto.UINT8, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)]), opset_imports=[helper.make_opsetid("", 17)])
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    pools = [k for k in compiled.kernels() if "pool" in k.name]
    assert pools and all(k.schedule == "default" for k in pools)
    x = rng.integers(0, 256, shape).astype(np.uint8)
    np.testing.assert_array_equal(compiled(x)[0], ReferenceEvaluator(model).run(None, {"x": x})[0])


def test_split_into_two_outputs_is_scheduled_and_exact(rng):
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Split", ["x", "sizes"], ["a", "b"], axis=1)], "split",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, None), helper.make_tensor_value_info("b", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.array([6, 10], np.int64), "sizes")]), opset_imports=[helper.make_opsetid("", 17)])
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    assert all(k.schedule == "default" for k in compiled.kernels())
    x = rng.standard_normal((1, 16, 8, 8)).astype(np.float32)
    got = compiled(x)
    np.testing.assert_array_equal(got[0], x[:, :6])
    np.testing.assert_array_equal(got[1], x[:, 6:])


@pytest.mark.parametrize("spec", X86_TARGETS, ids=lambda s: s.name)
@pytest.mark.parametrize("channels, vectorized_by", [(3, "llvm"), (32, "tvm")])
def test_a_layout_change_with_few_channels_vectorizes_along_the_rows(channels, vectorized_by, spec, rng):
    """An image's NCHW -> NHWC quantize: with 3 channels innermost the last two axes are left to LLVM's
    loop vectorizer (vectors along W, interleaved stores: the rounding runs on vector registers, with the row's
    rounding instruction); with 32 channels TVM vectorizes the channel axis. Every x86 row's build (its
    rounding instruction from the row); exact either way, run where the host has the row."""
    from tvm import te, tirx

    from tvm_lowprec.schedule.elementwise import ElementwiseRule
    from tvm_lowprec.targets import host_supports

    shape = (1, channels, 24, 32)
    x = te.placeholder(shape, "float32", name="x")
    y = te.compute((1, 24, 32, channels), lambda b, h, w, c: tirx.max(tirx.min(
        tirx.round(x[b, c, h, w] / 0.02) + 128.0, 255.0), 0.0).astype("uint8"), name="q")
    sch = ElementwiseRule().apply(te.create_prim_func([x, y]), spec)
    kinds = [inst.kind.name for inst in sch.trace.insts]
    assert ("Vectorize" in kinds) == (vectorized_by == "tvm")
    lib = tvm.compile(sch.mod, target=spec.tvm_target(1))
    # the row's rounding instruction: its widest one where TVM vectorizes 16 lanes, any where LLVM picks the width
    rounding = spec.vector_round[:1] if vectorized_by == "tvm" else spec.vector_round
    assert re.search(rf"({'|'.join(rounding)})\s+\$\d+, %[xyz]mm", lib.mod.inspect_source("asm"))
    if not host_supports(spec):
        return  # built and checked; this host cannot run the row's code natively
    data = rng.standard_normal(shape).astype(np.float32)
    out = tvm.runtime.tensor(np.zeros((1, 24, 32, channels), np.uint8))
    lib.mod["main"](tvm.runtime.tensor(data), out)
    want = np.clip(np.rint(data / np.float32(0.02)) + 128, 0, 255).astype(np.uint8).transpose(0, 2, 3, 1)
    np.testing.assert_array_equal(out.numpy(), want)


def test_cli_flags_a_kernel_no_rule_scheduled(tmp_path, capsys):
    """A float grouped convolution (two groups: neither one group nor depthwise) has no rule of its own:
    the generic fallback schedules it, and the CLI table says so. (FP32 matmuls and convolutions have
    theirs: tests/test_fp32_kernels.py.)"""
    from onnx import numpy_helper

    from tvm_lowprec.cli import main

    w = np.random.default_rng(0).standard_normal((8, 2, 3, 3)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], group=2, pads=[1] * 4)], "grouped",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(w, "w")])
    path = tmp_path / "grouped_fp32.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert main(["run", str(path), "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    flag = next(line for line in out.splitlines() if line.startswith("!!"))
    assert "schedule 'generic'" in flag and "conv2d" in flag
    assert any(" generic " in line for line in out.splitlines() if line.startswith("conv2d"))


def test_cli_kernel_table_fits_120_columns(tmp_path, capsys, rng):
    """The detector's fused chains have names of 60+ characters: shortened, and their op says "fused"."""
    from tvm_lowprec.cli import TABLE_WIDTH, main

    shape = (1, 3, 64, 64)
    qdq = quantize_qdq(yolo_like(), [rng.standard_normal(shape).astype(np.float32) for _ in range(2)])
    path = tmp_path / "detector.onnx"
    onnx.save(qdq, path)
    assert main(["run", str(path), "--shape", "images=1x3x64x64", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    table = out.split("\n\n")[1].splitlines()
    assert table[0].startswith("name") and len(table) > 20
    assert max(len(line.rstrip()) for line in table) <= TABLE_WIDTH
    fused = [line for line in table[2:] if line.startswith("fused")]
    assert fused and all(line.split()[1] == "fused" for line in fused)
    assert any("…" in line for line in fused)


@pytest.mark.parametrize("spec", X86_TARGETS, ids=lambda s: s.name)
@pytest.mark.parametrize("pieces", [(8, 8, 8), (16, 16, 16, 16), (32, 8, 24)])
def test_a_concatenation_of_whole_vectors_is_vectorized_piece_by_piece(pieces, spec, rng):
    """A requantizing concatenation along channels whose pieces are whole vectors (a C2f block's
    3 x 8, SPPF's 4 x 16), one piece read through a flattened view as our reshape folding leaves it: the
    channel loop is cut at the pieces' boundaries, so no lane selects between pieces and no piece is
    gathered (an ``x % n`` index the cut lets the simplifier drop); exact against numpy."""
    from tvm import te, tirx

    from tvm_lowprec.schedule.elementwise import ElementwiseRule
    from tvm_lowprec.targets import host_supports

    h, w = 6, 10
    ins = [te.placeholder((1, h, w, c), "uint8", name=f"x{i}") for i, c in enumerate(pieces[:-1])]
    flat = te.placeholder((h * w * pieces[-1],), "uint8", name="flat")
    last = te.compute((1, h, w, pieces[-1]), lambda b, i, j, c: flat[(i * w * pieces[-1] + j * pieces[-1] + c)
                                                                    % (h * w * pieces[-1])], name="view")
    scales, zps = [0.03 + 0.01 * i for i in range(len(pieces))], [3 * i for i in range(len(pieces))]
    def dequantize(t, s, z):
        return te.compute(t.shape, lambda b, i, j, c: (t[b, i, j, c].astype("int32") - z).astype("float32") * s)

    deq = [dequantize(t, s, z) for t, s, z in zip([*ins, last], scales, zps)]
    starts = np.cumsum((0, *pieces))

    def pick(b, i, j, c):
        value = deq[-1][b, i, j, c - int(starts[-2])]
        for k in range(len(pieces) - 2, -1, -1):
            value = tirx.if_then_else(c < int(starts[k + 1]), deq[k][b, i, j, c - int(starts[k])], value)
        return value

    cat = te.compute((1, h, w, int(starts[-1])), pick, name="cat")
    out = te.compute(cat.shape, lambda b, i, j, c: tirx.max(tirx.min(tirx.round(cat[b, i, j, c] / 0.05) + 7.0, 255.0),
                                                             0.0).astype("uint8"), name="q")
    sch = ElementwiseRule().apply(te.create_prim_func([*ins, flat, out]), spec)
    assert "LoopPartition" in [inst.kind.name for inst in sch.trace.insts]
    from tvm_lowprec.compiled import _traffic  # the profile's bytes, though the cut's blocks declare no regions

    assert _traffic(sch.mod["main"]) == (h * w * sum(pieces), h * w * sum(pieces))
    lib = tvm.compile(sch.mod, target=spec.tvm_target(1))
    asm = lib.mod.inspect_source("asm")
    assert not re.search(r"\bv?pinsrb\b|\bvpgather", asm)  # every piece loaded as vectors
    if not host_supports(spec):
        return  # built and checked; this host cannot run the row's code natively
    data = [rng.integers(0, 256, (1, h, w, c), dtype=np.uint8) for c in pieces]
    got = tvm.runtime.tensor(np.zeros((1, h, w, int(starts[-1])), np.uint8))
    lib.mod["main"](*[tvm.runtime.tensor(d) for d in data[:-1]], tvm.runtime.tensor(data[-1].ravel()), got)
    floats = [(d.astype(np.int32) - z).astype(np.float32) * np.float32(s) for d, s, z in zip(data, scales, zps)]
    want = np.clip(np.rint(np.concatenate(floats, axis=-1) / np.float32(0.05)) + 7, 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(got.numpy(), want)


def test_a_trailing_reshape_is_written_from_the_producers_nest(rng):
    """A nearest 2x upsample of 6 channels flattened for the next kernel (a text detector's FPN
    pieces): the flatten is folded into the upsample's own nest (reverse_compute_inline), which writes
    the flat positions, instead of a flat loop dividing every position back into (h, w, c); exact."""
    from tvm import te

    from tvm_lowprec.schedule.elementwise import ElementwiseRule

    h, w, c = 15, 15, 6
    x = te.placeholder((1, h, w, c), "uint8", name="x")
    up = te.compute((1, 2 * h, 2 * w, c), lambda b, i, j, k: x[b, i // 2, j // 2, k], name="resize")
    flat = te.compute((4 * h * w * c,), lambda n: up[0, n // (2 * w * c), n // c % (2 * w), n % c], name="T_reshape")
    sch = ElementwiseRule().apply(te.create_prim_func([x, flat]), resolve_target("native"))
    blocks = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    assert blocks == ["resize"], blocks
    lib = tvm.compile(sch.mod, target=resolve_target("native").tvm_target(1))
    data = rng.integers(0, 256, (1, h, w, c), dtype=np.uint8)
    got = tvm.runtime.tensor(np.zeros(4 * h * w * c, np.uint8))
    lib.mod["main"](tvm.runtime.tensor(data), got)
    np.testing.assert_array_equal(got.numpy(), data.repeat(2, axis=1).repeat(2, axis=2).ravel())


@pytest.mark.parametrize("channels, steps", [(48, 16), (32, 32), (24, 48), (40, 40)])
def test_a_per_channel_gate_of_no_power_of_two_width_is_applied_in_vector_steps(channels, steps, rng):
    """A squeeze-excite gate multiply in the integer domain, ``x[p, c] * g[c]`` requantized: with 48
    channels (three vectors of 16, no power of two) the channel axis runs in steps of 16 lanes (as one
    48-lane vector, LLVM rebuilt the hoisted gate lane by lane every pixel); 32 channels stay one
    vector, 40 (no whole vectors of 16) too; 24 without a per-channel operand (a plain shift, read in
    its own flat order) is one flat loop of two pixels a vector. Exact against numpy on the native row."""
    from tvm import te

    from tvm_lowprec.schedule.elementwise import ElementwiseRule
    from tvm_lowprec.targets import resolve_target

    spec = resolve_target("native")
    x = te.placeholder((1, 6, 6, channels), "uint8", name="x")
    g = te.placeholder((channels,), "uint8", name="g")
    if channels == 24:
        y = te.compute(x.shape, lambda b, h, w, c: (x[b, h, w, c].astype("int32") >> 1).astype("uint8"), name="y")
        args = [x, y]
    else:
        y = te.compute(x.shape, lambda b, h, w, c: te.max(te.min(((x[b, h, w, c].astype("int32") - 2) * g[c].astype("int32")
                                                                  * 300 + 4096) >> 13, 255), 0).astype("uint8"), name="y")
        args = [x, g, y]
    sch = ElementwiseRule().apply(te.create_prim_func(args), spec)
    vectorized = [int(sch.get(loop).extent) for loop in sch.get_loops(sch.get_sblock("y")) if sch.get(loop).kind == tvm.tirx.ForKind.VECTORIZED]
    assert vectorized == [steps], vectorized
    lib = tvm.compile(sch.mod, target=spec.tvm_target(1))
    xs, gs = rng.integers(0, 256, (1, 6, 6, channels)).astype(np.uint8), rng.integers(0, 256, channels).astype(np.uint8)
    out = tvm.runtime.tensor(np.zeros(xs.shape, np.uint8))
    lib.mod["main"](*([tvm.runtime.tensor(xs)] + ([tvm.runtime.tensor(gs)] if channels != 24 else []) + [out]))
    if channels == 24:
        want = (xs >> 1).astype(np.uint8)
    else:
        want = np.clip(((xs.astype(np.int64) - 2) * gs * 300 + 4096) >> 13, 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(out.numpy(), want)
