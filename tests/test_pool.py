"""Max pooling as two 1-D passes (tvm_lowprec.kernels.pool, schedule/pool.SeparablePoolRule): equal
to numpy's window maximum on every CPU row, NHWC and NCHW, codes and floats, strides, dilation and
asymmetric padding; what a model's MaxPool becomes on a CPU row, and what keeps TVM's legalization."""

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import te

import tvm_lowprec
from tvm_lowprec.kernels.pool import OP, separable_max_pool
from tvm_lowprec.schedule import schedule_func
from tvm_lowprec.schedule.pool import SeparablePoolRule

from conftest import TARGETS
from reference import intrinsic_free_module

CPU_ROWS = [spec for spec in TARGETS if spec.device == "cpu"]
# shape, dtype, layout, pool size, strides, padding (top, left, bottom, right), dilation
CASES = {
    "sppf-5x5-16ch": ((1, 40, 40, 16), "uint8", "NHWC", (5, 5), (1, 1), (2, 2, 2, 2), (1, 1)),
    "resnet-3x3-s2-64ch": ((1, 28, 28, 64), "uint8", "NHWC", (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    "int8-asym-dilated-batch": ((2, 13, 11, 8), "int8", "NHWC", (3, 2), (2, 1), (0, 1, 1, 0), (2, 1)),
    "nchw-float32": ((1, 3, 15, 17), "float32", "NCHW", (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
}


def _func(case):
    shape, dtype, layout, *sizes = CASES[case]
    x = te.placeholder(shape, dtype, name="x")
    y = separable_max_pool(x, *sizes, layout)
    return te.create_prim_func([x, y]).with_attrs({"global_symbol": "main", "lowprec.op": OP})


def _reference(x, layout, pool_size, strides, padding, dilation):
    """The window maximum, tap by tap (the padding the dtype's lowest value)."""
    nhwc = x if layout == "NHWC" else x.transpose(0, 2, 3, 1)
    lowest = np.iinfo(x.dtype).min if x.dtype.kind in "iu" else -np.finfo(x.dtype).max
    top, left, bottom, right = padding
    p = np.pad(nhwc, [(0, 0), (top, bottom), (left, right), (0, 0)], constant_values=lowest)
    (kh, kw), (sh, sw), (dh, dw) = pool_size, strides, dilation
    oh = (p.shape[1] - dh * (kh - 1) - 1) // sh + 1
    ow = (p.shape[2] - dw * (kw - 1) - 1) // sw + 1
    out = np.full((p.shape[0], oh, ow, p.shape[3]), lowest, x.dtype)
    for i in range(kh):
        for j in range(kw):
            tap = p[:, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]
            out = np.maximum(out, tap)
    return out if layout == "NHWC" else out.transpose(0, 3, 1, 2)




@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("spec", CPU_ROWS, ids=lambda s: s.name)
def test_the_separable_max_pool_equals_the_window_maximum_on_every_cpu_row(spec, case, rng):
    func = _func(case)
    sch = SeparablePoolRule().apply(func, spec)
    assert sch is not None and schedule_func(func, spec) is not None
    names = sch.mod["main"].script()
    assert "pool_rows" in names and "pool_max" in names  # the two passes
    shape, dtype, layout, *sizes = CASES[case]
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max + 1, shape).astype(dtype)
    else:
        x = (rng.standard_normal(shape) * 4).astype(dtype)
    want = _reference(x, layout, *sizes)
    lib = tvm.compile(sch.mod, target=spec.tvm_target(2)).mod
    args = [tvm.runtime.tensor(x), tvm.runtime.tensor(np.zeros(want.shape, dtype))]
    intrinsic_free_module(lib, spec)["main"](*args)
    np.testing.assert_array_equal(args[1].numpy(), want)


def test_the_rule_declines_other_functions():
    x = te.placeholder((1, 8, 8, 16), "uint8", name="x")
    y = te.compute(x.shape, lambda *i: x(*i) + tvm.tirx.const(1, "uint8"), name="add")
    assert SeparablePoolRule().apply(te.create_prim_func([x, y]), CPU_ROWS[0]) is None
    assert SeparablePoolRule().apply(_func("sppf-5x5-16ch").without_attr("lowprec.op"), CPU_ROWS[0]) is None


def _maxpool_model(ceil_mode: int, size: int = 5):
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[size, size], strides=[2, 2], pads=[2, 2, 2, 2],
                            ceil_mode=ceil_mode)
    graph = helper.make_graph([node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 10, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("ceil_mode,size", [(0, 5), (1, 5), (0, 3)])
def test_a_models_5x5_max_pool_takes_the_two_passes_on_a_cpu_row_except_in_ceil_mode(ceil_mode, size, rng):
    """From SEPARABLE_TAPS (5x5) taps; a 3x3 window stays TVM's one pass (the passes' buffers cost more
    than the taps they save there)."""
    import onnxruntime as ort

    from tvm_lowprec.quant.legalize import SEPARABLE_TAPS

    model = _maxpool_model(ceil_mode, size)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    ops = {k.op for k in compiled.kernels()}
    assert (OP in ops) == (not ceil_mode and size * size >= SEPARABLE_TAPS), ops
    x = rng.standard_normal((1, 4, 10, 10)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(compiled(x)[0], want)


def test_scheduling_leaves_the_function_it_was_given_unchanged():
    """The rules that narrow a function's indices first (int64 -> int32, so LoopPartition takes the
    padding's hint) schedule a deep copy: the pass's result shared the statements it left unchanged
    with the given function, which the schedule then rewrote in place, and the next rule (or a second
    call) saw a scheduled function and declined."""
    func = _func("sppf-5x5-16ch")
    before = func.script()
    for spec in CPU_ROWS[:2]:
        assert SeparablePoolRule().apply(func, spec) is not None
    assert func.script() == before


def test_small_pools_and_padding_copies_run_on_one_thread():
    """A fork of TVM's pool costs about a microsecond on two threads: the passes of SPPF's 40x40x16 pool
    and the padding copy of an 80x80x8 input run serially, a 160x160x16 pool's passes and a 160x160x8
    copy in parallel (schedule/pool.MIN_PARALLEL, schedule/qgemm.COPY_MIN_PARALLEL)."""
    from tvm_lowprec.kernels.im2col import build_im2col
    from tvm_lowprec.quant.patterns import ConvGeometry
    from tvm_lowprec.schedule.qgemm import Im2colRule

    spec = CPU_ROWS[0]
    small = SeparablePoolRule().apply(_func("sppf-5x5-16ch"), spec).mod["main"].script()
    assert "T.parallel" not in small
    x = te.placeholder((1, 160, 160, 16), "uint8", name="x")
    big = te.create_prim_func([x, separable_max_pool(x, (5, 5), (1, 1), (2, 2, 2, 2), (1, 1), "NHWC")])
    assert SeparablePoolRule().apply(big.with_attr("lowprec.op", OP), spec).mod["main"].script().count("T.parallel") == 3
    for side, parallel in ((80, False), (160, True)):
        g = ConvGeometry(1, 8, (side, side), (side, side), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1))
        copy = Im2colRule().apply(build_im2col(g, "uint8", "pad", gather=False), spec).mod["main"].script()
        assert ("T.parallel" in copy) == parallel, side
