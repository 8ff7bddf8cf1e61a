"""The operands of every ``vpdpbusd`` call in the VNNI rows' LLVM IR: the accumulator, then the 4
activation bytes broadcast to every lane (sign-flipped by xor 0x80808080 for int8 activations), then
one contiguous load of packed weights. The rows also *run* on every host (natively, or emulated:
tests/test_emulation.py); this pins down how the instruction is fed, which an emulated run with the
instruction's own semantics cannot distinguish from an equivalent feeding.
"""

import re

import pytest

import tvm_lowprec

from conftest import TARGETS
from models import qlinear_matmul

VNNI = [t for t in TARGETS if t.gemm.name.startswith("vpdpbusd")]


def _definitions(ll: str) -> dict:
    defs = {}
    for line in ll.splitlines():
        m = re.match(r"\s*(%[\w.]+) = (.*)", line)
        if m:
            defs[m.group(1)] = m.group(2)
    return defs


def _chain(defs, value, depth=6):
    """The definitions reached by following first operands from ``value``."""
    out = []
    for _ in range(depth):
        text = defs.get(value)
        if text is None:
            break
        out.append(text)
        operands = re.findall(r"(%[\w.]+)", text)
        if not operands:
            break
        value = operands[0]
    return out


@pytest.mark.parametrize("spec", VNNI, ids=lambda s: s.name)
@pytest.mark.parametrize("a_dtype", ["uint8", "int8"])
def test_vpdpbusd_operands(spec, a_dtype):
    c = tvm_lowprec.compile(tvm_lowprec.from_onnx(qlinear_matmul(8, 64, 32, a_dtype=a_dtype)), target=spec)
    ll = c.inspect_source("ll")
    defs = _definitions(ll)
    nbytes = spec.gemm.lanes * 4
    calls = [line for line in ll.splitlines() if "@llvm.x86.avx512.vpdpbusd" in line and " call " in line]
    assert calls
    for call in calls:
        args = re.findall(r"<\d+ x i\d+> (%[\w.]+)", call.split("vpdpbusd.")[1])
        assert len(args) == 3
        activation, weights = _chain(defs, args[1]), _chain(defs, args[2])
        assert any(t.startswith("shufflevector") or t.startswith("insertelement") for t in activation)
        assert any(t.startswith("load i32") for t in activation), "4 activation bytes, broadcast"
        assert any("xor" in t and "-2139062144" in t for t in activation) == (a_dtype == "int8")
        assert weights[0].startswith(f"load <{nbytes} x i8>"), "one contiguous load of packed weights"
        assert any("%B_packed" in t for t in weights)
