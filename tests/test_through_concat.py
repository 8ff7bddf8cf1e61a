"""``quant/through_concat.py``: an element-wise operator after a concatenation moves onto its pieces only
where that is the same computation (the concatenation read by it alone, scalar operands, data pieces)."""

import numpy as np
import tvm
from tvm import relax

from tvm_lowprec.quant.through_concat import through_concat_module


def _module(extra_reader: bool = False, per_channel: bool = False, constant_piece: bool = False):
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((1, 3, 8), "float32"))
    b = relax.Var("b", relax.TensorType((1, 5, 8), "float32"))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            second = relax.const(np.ones((1, 5, 8), np.float32)) if constant_piece else b
            cat = bb.emit(relax.op.concat([a, second], axis=1))
            scale = relax.const(np.linspace(1, 2, 8).astype(np.float32)) if per_channel else relax.const(np.float32(0.5))
            y = bb.emit(relax.op.sigmoid(bb.emit(relax.op.multiply(cat, scale))))
            out = bb.emit_output(relax.Tuple([y, cat]) if extra_reader else y)
        bb.emit_func_output(out)
    return bb.get()


def _ops_before_concat(mod) -> list[str]:
    """The operators bound before the last concatenation of ``main``."""
    names = [b.value.op.name for block in mod["main"].body.blocks for b in block.bindings
             if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]
    return names[:len(names) - names[::-1].index("relax.concat") - 1]


def _run(mod, a, b):
    exe = tvm.compile(relax.transform.LegalizeOps()(mod), target=tvm.target.Target({"kind": "llvm"}))
    vm = relax.VirtualMachine(exe, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b)).numpy()


def test_a_chain_after_a_concatenation_moves_onto_each_piece_with_the_same_result(rng):
    mod = _module()
    moved = through_concat_module(mod)
    assert _ops_before_concat(moved).count("relax.sigmoid") == 2 and _ops_before_concat(moved).count("relax.multiply") == 2
    a, b = rng.standard_normal((1, 3, 8)).astype(np.float32), rng.standard_normal((1, 5, 8)).astype(np.float32)
    np.testing.assert_array_equal(_run(moved, a, b), _run(mod, a, b))


def test_it_stays_where_the_concatenation_has_another_reader_a_per_channel_operand_or_a_constant_piece():
    for kwargs in ({"extra_reader": True}, {"per_channel": True}, {"constant_piece": True}):
        moved = through_concat_module(_module(**kwargs))
        assert "relax.sigmoid" not in _ops_before_concat(moved), kwargs
