"""tvm-lowprec's passes as ``tvm.transform`` passes: ``tvm.compile(..., relax_pipeline=tvm_lowprec.pipeline(row))``
gives the executable ``tvm_lowprec.compile`` gives (bit-identical outputs), and a pipeline of a user's
own, their pass between ours, compiles to the same integer kernels."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

import tvm_lowprec
from tvm_lowprec import transform

from models import fp32_block_net, fp32_cnn, quantize_qdq


def _vm_outputs(executable, *args):
    vm = relax.VirtualMachine(executable, tvm.cpu())
    out = vm["main"](*(tvm.runtime.tensor(a) for a in args))
    outs = list(out) if isinstance(out, (tvm.ir.Array, list, tuple)) else [out]
    return [o.numpy() for o in outs]


def _compiled_outputs(compiled, *args):
    out = compiled(*args)
    return [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]


@pytest.fixture(scope="module")
def qdq_cnn():
    rng = np.random.default_rng(0)
    shape = (1, 3, 16, 16)
    samples = [rng.standard_normal(shape).astype("float32") for _ in range(4)]
    return quantize_qdq(fp32_cnn(shape), samples), rng.standard_normal(shape).astype("float32")


@pytest.mark.parametrize("builder,shape", [(fp32_cnn, (1, 3, 16, 16)), (fp32_block_net, (1, 8, 16, 16))],
                         ids=["cnn", "blocks"])  # blocks: SiLU tables, residual add, pools, concat, resize, Gemm
def test_tvm_compile_with_our_pipeline_equals_compile(builder, shape):
    rng = np.random.default_rng(1)
    model = quantize_qdq(builder(shape), [rng.standard_normal(shape).astype("float32") for _ in range(4)])
    x = rng.standard_normal(shape).astype("float32")
    row = "native"
    mod = tvm_lowprec.from_onnx(model)
    ours = tvm_lowprec.compile(mod, target=row)
    executable = tvm.compile(mod, target=tvm_lowprec.tvm_target(row), relax_pipeline=tvm_lowprec.pipeline(row),
                             tir_pipeline=tvm_lowprec.transform.tir_pipeline(row))
    for got, want in zip(_vm_outputs(executable, x), _compiled_outputs(ours, x)):
        np.testing.assert_array_equal(got, want)


def test_a_users_pass_between_ours(qdq_cnn):
    """QDQToInteger, then the user's pass (here it counts the integer kernels it sees), then the rest."""
    model, x = qdq_cnn
    row = tvm_lowprec.resolve_target("native")
    seen = []

    @tvm.transform.module_pass(opt_level=0, name="user.CountKernels")
    def count(mod, _ctx):
        seen.append(sum(1 for f in mod.functions.values()
                        if isinstance(f, tvm.tirx.PrimFunc) and f.attrs.get("lowprec.op", None) == "qgemm"))
        return mod

    seq = tvm.transform.Sequential([transform.PrepareModule(), transform.QDQToInteger(row), count,
                                    *transform.after_qdq_to_integer(row), transform.Lower()])
    executable = tvm.compile(tvm_lowprec.from_onnx(model), target=tvm_lowprec.tvm_target(row), relax_pipeline=seq)
    assert seen and seen[0] >= 2  # the two convolutions, as integer GEMMs, before scheduling
    want = _compiled_outputs(tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target=row), x)
    np.testing.assert_array_equal(_vm_outputs(executable, x)[0], want[0])


def test_every_step_is_a_named_pass():
    steps = transform.passes("x86-avx2")
    assert all(isinstance(p, tvm.transform.Pass) for p in steps)
    names = [p.info.name for p in steps]
    assert names[0] == "lowprec.PrepareModule" and names[-1] == "lowprec.Lower"
    assert "lowprec.QDQToInteger" in names and "lowprec.ScheduleFuncs" in names
    assert callable(tvm_lowprec.pipeline) and hasattr(tvm_lowprec.pipeline, "high_level")  # module and pass factory


def test_our_rules_as_a_dlight_rule_list_schedule_as_compile_does(qdq_cnn):
    """``tvm.s_tir.dlight.ApplyDefaultSchedule(*tvm_lowprec.schedule.rules(row))`` schedules every kernel
    of a QDQ CNN exactly as ``ScheduleKernels`` does (structurally equal PrimFuncs), GEMMs included."""
    from tvm.s_tir import dlight

    model, _x = qdq_cnn
    row = "x86-avx512-vnni"  # scheduling only: any host
    before = [transform.PrepareModule(), transform.QDQToInteger(row), *transform.after_qdq_to_integer(row)[:-1]]
    with tvm_lowprec.tvm_target(row):
        fused = tvm.transform.Sequential(before)(tvm_lowprec.from_onnx(model))
        ours = transform.ScheduleKernels(row)(fused)
        theirs = dlight.ApplyDefaultSchedule(*tvm_lowprec.schedule.rules(row))(fused)
    kernels = [gv for gv, f in ours.functions.items()
               if isinstance(f, tvm.tirx.PrimFunc) and f.attrs.get("lowprec.schedule", None) not in ("view", "none")]
    assert any(ours[gv].attrs.get("lowprec.op", None) == "qgemm" for gv in kernels)
    for gv in kernels:
        assert tvm_ffi.structural_equal(theirs[gv], ours[gv]), gv.name_hint
    with pytest.raises(NotImplementedError, match="tvm_lowprec.tune"):
        tvm_lowprec.schedule.rules(row)[0].apply(fused[kernels[0]], None, True)
