"""Float functions of one 8-bit tensor become 256-entry tables (:mod:`tvm_lowprec.quant.lookup_tables`).

Each model takes an 8-bit tensor holding every value of its dtype, dequantizes it, applies a float
chain written the way exporters write it, and quantizes the result; the compiled model must equal
``onnx.reference`` on all 256 inputs and contain one table lookup kernel instead of the float
operators, on the row's lookup instruction (``vpermi2b``, ``vpshufb``, ``tbl``: the row's data).
The lookup kernel itself (:mod:`tvm_lowprec.kernels.lookup`) is checked on every row's instruction,
natively, emulated or under qemu-aarch64, against numpy on every input value.
"""

import re

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import tvm_lowprec
from tvm_lowprec.emulation import execution_mode, load_emulated
from tvm_lowprec.kernels.lookup import build_lookup
from tvm_lowprec.qemu import is_aarch64
from tvm_lowprec.schedule import schedule_func
from tvm_lowprec.targets import resolve_target

from conftest import TARGETS, kernel_module

ONNX_DTYPE = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8}


def _qdq(name, value_in, value_out, scale, zp_name):
    return [helper.make_node("QuantizeLinear", [value_in, scale, zp_name], [f"{name}_q"]),
            helper.make_node("DequantizeLinear", [f"{name}_q", scale, zp_name], [value_out])]


# name -> nodes from "d" (the dequantized input) to "f" (the float result); constants in CONSTS
CHAINS = {
    "sigmoid": [helper.make_node("Sigmoid", ["d"], ["f"])],
    "tanh": [helper.make_node("Tanh", ["d"], ["f"])],
    # SiLU as quantize_static leaves it: the sigmoid quantized on its own, then x * sigmoid(x)
    "silu": [helper.make_node("Sigmoid", ["d"], ["s"]), *_qdq("sig", "s", "sd", "s_mid", "z_mid"),
             helper.make_node("Mul", ["d", "sd"], ["f"])],
    # GELU as BERT exporters write it: x * 0.5 * (1 + erf(x / sqrt(2)))
    "gelu-erf": [helper.make_node("Div", ["d", "sqrt2"], ["a"]), helper.make_node("Erf", ["a"], ["e"]),
                 helper.make_node("Add", ["e", "one"], ["p"]), helper.make_node("Mul", ["d", "p"], ["m"]),
                 helper.make_node("Mul", ["m", "half"], ["f"])],
}
# hard-swish as paddle2onnx writes it, x * clip(x + 3, 0, 6) / 6, and ORT's quantize_static puts a
# Q/DQ pair after every op (its scales below are what calibration would give: each op's range)
CHAINS["hardswish-decomposed"] = [
    helper.make_node("Add", ["d", "three"], ["a"]), *_qdq("add", "a", "ad", "s_add", "z_mid"),
    helper.make_node("Clip", ["ad", "zero", "six"], ["c"]), *_qdq("clip", "c", "cd", "s_clip", "z_mid"),
    helper.make_node("Mul", ["d", "cd"], ["m"]), *_qdq("mul", "m", "md", "s_mul", "z_mid"),
    helper.make_node("Div", ["md", "six"], ["f"]),
]
CONSTS = {"sqrt2": np.float32(np.sqrt(2)), "one": np.float32(1), "half": np.float32(0.5),
          "s_mid": np.float32(1 / 255), "z_mid": np.uint8(0), "three": np.float32(3), "zero": np.float32(0),
          "six": np.float32(6), "s_add": np.float32(8.2 / 255), "s_clip": np.float32(6 / 255), "s_mul": np.float32(31 / 255)}
# operators each chain folds into its table: the Relax ops between the 8-bit input and the output,
# its dequantize and quantize included (hard-swish: DQ, Add, Q, DQ, Clip, Q, DQ, Mul, Q, DQ, Div, Q)
FOLDED = {"sigmoid": 3, "tanh": 3, "silu": 6, "gelu-erf": 7, "hardswish-decomposed": 12}
NATIVE = resolve_target("native")
X86 = [s for s in TARGETS if not is_aarch64(s)]
LOOKUPS = {l.name: (l, spec) for spec in TARGETS for l in (spec.lookup, spec.wide_lookup) if l is not None}


def _model(chain_nodes, dtype, in_scale=0.04, out_scale=0.02, in_axis_scale=None):
    zp_in = np.array(0 if dtype == "int8" else 128, dtype)
    zp_out = np.array(-20 if dtype == "int8" else 100, dtype)
    scale = np.float32(in_scale) if in_axis_scale is None else np.asarray(in_axis_scale, np.float32)
    zp = zp_in if in_axis_scale is None else np.full(scale.shape, zp_in, dtype)
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in CONSTS.items()]
    inits += [numpy_helper.from_array(scale, "s_in"), numpy_helper.from_array(zp, "z_in"),
              numpy_helper.from_array(np.float32(out_scale), "s_out"), numpy_helper.from_array(zp_out, "z_out")]
    nodes = [helper.make_node("DequantizeLinear", ["x", "s_in", "z_in"], ["d"], axis=0), *chain_nodes,
             helper.make_node("QuantizeLinear", ["f", "s_out", "z_out"], ["y"])]
    shape = [256 // 16, 16] if in_axis_scale is None else [len(in_axis_scale), 256 // len(in_axis_scale)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", ONNX_DTYPE[dtype], shape)],
                              [helper.make_tensor_value_info("y", ONNX_DTYPE[dtype], shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _all_values(dtype, shape):
    info = np.iinfo(dtype)
    return np.arange(info.min, info.max + 1).astype(dtype).reshape(shape)


def _lookups(compiled):
    return [k for k in compiled.kernels() if k.op == "lookup"]


def _float_ops(compiled):
    names = " ".join(k.name for k in compiled.kernels())
    return [op for op in ("sigmoid", "tanh", "erf", "divide", "clip", "take") if op in names]


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("name", list(CHAINS))
def test_chain_is_one_lookup_and_exact_on_every_input(name, dtype):
    model = _model(CHAINS[name], dtype)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    (lookup,) = _lookups(compiled)
    assert lookup.intrinsic == f"lowprec_lookup_{NATIVE.lookup_intrin.name}" and lookup.folded == FOLDED[name]
    assert not _float_ops(compiled), _float_ops(compiled)
    x = _all_values(dtype, (16, 16))
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    got = compiled(x)[0]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(got)) > 20  # a real function of the input, not a clamped constant


@pytest.mark.parametrize("spec", TARGETS, ids=lambda s: s.name)
def test_every_row_folds_the_decomposed_hardswish_into_its_lookup_instruction(spec):
    """Built for every row: its own lookup instruction in the assembly (the row's data); run natively,
    emulated (x86) or, for the AArch64 rows, checked at the kernel level below."""
    model = _model(CHAINS["hardswish-decomposed"], "uint8")
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target=spec)
    (lookup,) = _lookups(compiled)
    assert lookup.intrinsic == f"lowprec_lookup_{spec.lookup_intrin.name}"
    assert re.search(spec.lookup_intrin.asm, compiled.inspect_source("asm"))
    if is_aarch64(spec):
        return
    x = _all_values("uint8", (16, 16))
    np.testing.assert_array_equal(compiled(x)[0], ReferenceEvaluator(model).run(None, {"x": x})[0])


@pytest.mark.parametrize("n", [64 * 5, 1000, 37])
@pytest.mark.parametrize("in_dtype, out_dtype", [("uint8", "uint8"), ("int8", "uint8"), ("uint8", "int8"), ("int8", "int8")])
@pytest.mark.parametrize("name", list(LOOKUPS))
def test_lookup_kernel_is_exact_on_every_row(name, in_dtype, out_dtype, n, rng):
    """The kernel alone (vector body and scalar tail): every input value, each table dtype."""
    intrin, spec = LOOKUPS[name]
    func = build_lookup(n, in_dtype, out_dtype, intrin, folded=1)
    lib = tvm.compile(schedule_func(func, spec).mod, target=spec.tvm_target(2)).mod
    if n >= intrin.lanes:
        assert re.search(intrin.asm, lib.inspect_source("asm"))
    info_in, info_out = np.iinfo(in_dtype), np.iinfo(out_dtype)
    x = np.resize(rng.permutation(np.arange(info_in.min, info_in.max + 1)), n).astype(in_dtype)
    table = rng.integers(info_out.min, info_out.max + 1, 256).astype(out_dtype)
    # x86: the emulated semantics always (what an AVX2 host runs), and the instruction itself where here
    runs = [True] if is_aarch64(spec) else [True, False] if execution_mode(spec) == "native" else [False]
    for native in runs:
        if n < intrin.lanes and not is_aarch64(spec):  # the scalar tail alone: no target intrinsic to replace
            module = lib if native else load_emulated(lib)[0]
        else:
            module = kernel_module(lib, spec, emulate=not native)
        args = [tvm.runtime.tensor(a) for a in (x, intrin.pack(table), np.zeros(n, out_dtype))]
        module["main"](*args)
        np.testing.assert_array_equal(args[-1].numpy(), table[x.view(np.uint8)], err_msg="native" if native else "emulated")


@pytest.mark.parametrize("chain, ops", [("requant", 2), ("relu", 3)])
def test_cheap_chains_follow_the_rows_cost(chain, ops):
    """A lone requantization (2 ops) or a clamp (3): a lookup where the row's instruction costs less
    than the arithmetic (its ``min_ops``), vector arithmetic elsewhere; exact either way."""
    nodes = [helper.make_node("Relu", ["d"], ["f"])] if chain == "relu" else [helper.make_node("Identity", ["d"], ["f"])]
    model = _model(nodes, "uint8")
    for spec in X86:
        compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target=spec)
        assert bool(_lookups(compiled)) == (ops >= spec.lookup_intrin.min_ops), spec.name
        x = _all_values("uint8", (16, 16))
        np.testing.assert_array_equal(compiled(x)[0], ReferenceEvaluator(model).run(None, {"x": x})[0])


def test_per_channel_parameters_keep_the_float_chain():
    """With a per-channel input scale the function depends on the position: no single table."""
    model = _model(CHAINS["sigmoid"], "uint8", in_axis_scale=[0.01, 0.02, 0.04, 0.08])
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    assert not _lookups(compiled)
    x = _all_values("uint8", (4, 64))
    got, want = compiled(x)[0], ReferenceEvaluator(model).run(None, {"x": x})[0]
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1


def test_function_of_two_tensors_is_not_a_table(rng):
    """x * sigmoid(y) with two different inputs: the chain has two 8-bit leaves."""
    model = _model(CHAINS["sigmoid"], "uint8")
    graph = model.graph
    graph.input.append(helper.make_tensor_value_info("x2", TensorProto.UINT8, [16, 16]))
    graph.node.insert(1, helper.make_node("DequantizeLinear", ["x2", "s_in", "z_in"], ["d2"]))
    graph.node[-1].input[0] = "g"
    graph.node.insert(len(graph.node) - 1, helper.make_node("Mul", ["f", "d2"], ["g"]))
    onnx.checker.check_model(model)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    x, x2 = _all_values("uint8", (16, 16)), rng.integers(0, 256, (16, 16)).astype(np.uint8)
    got, want = compiled(x, x2)[0], ReferenceEvaluator(model).run(None, {"x": x, "x2": x2})[0]
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
    # the inner Q(sigmoid(DQ(x))) has no quantize of its own here, so no table either
    assert not _lookups(compiled)


def test_a_chain_after_a_requantizing_concatenation_runs_on_each_piece(rng):
    """A YOLO head's class scores: two 8-bit tensors with their own scales concatenated (requantized
    into one scale), then ``Sigmoid`` with its Q/DQ pair, then a float output. The requantization and
    the chain after the concatenation move onto its pieces (:mod:`tvm_lowprec.quant.through_concat`),
    so each piece's requantize-sigmoid-quantize is one table of its own codes: a lookup per piece
    (5 operators folded), no float sigmoid left, and the concatenation copies codes (and dequantizes
    them for the float output); exact against onnx.reference. (Before, the pieces' requantization
    stayed in the concatenation's kernel and the chain started at the concatenated codes.)"""
    consts = {"s1": np.float32(0.04), "s2": np.float32(0.06), "sc": np.float32(0.05), "so": np.float32(1 / 255),
              "z1": np.uint8(120), "z2": np.uint8(130), "zc": np.uint8(128), "zo": np.uint8(0)}
    nodes = [helper.make_node("DequantizeLinear", ["a", "s1", "z1"], ["da"]),
             helper.make_node("DequantizeLinear", ["b", "s2", "z2"], ["db"]),
             helper.make_node("Concat", ["da", "db"], ["c"], axis=1), *_qdq("cat", "c", "cd", "sc", "zc"),
             helper.make_node("Sigmoid", ["cd"], ["p"]), *_qdq("sig", "p", "y", "so", "zo")]
    graph = helper.make_graph(nodes, "scores", [helper.make_tensor_value_info(n, TensorProto.UINT8, [1, c, 64])
                                                for n, c in (("a", 3), ("b", 5))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 10
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    lookups = _lookups(compiled)
    assert sorted(k.shape for k in lookups) == [(3 * 64,), (5 * 64,)], compiled.kernels()
    assert all(k.folded == 5 for k in lookups) and "sigmoid" not in _float_ops(compiled), compiled.kernels()
    a, b = (rng.integers(0, 256, (1, c, 64)).astype(np.uint8) for c in (3, 5))
    want = ReferenceEvaluator(model).run(None, {"a": a, "b": b})[0]
    np.testing.assert_array_equal(compiled(a, b)[0], want)


def test_a_cpu_without_vbmi_keeps_the_rows_own_lookup():
    """The VNNI row's vpermi2b needs AVX-512 VBMI, which Cascade Lake lacks: a spec derived for such a
    CPU drops it (as it drops bf16) and runs its tables on the row's vpshufb zmm."""
    vnni = resolve_target("x86-avx512-vnni")
    assert vnni.lookup_intrin.name == "vpermi2b_zmm" and "avx512vbmi" in vnni.code_features
    cascade_lake = vnni.for_cpu(set(vnni.features))  # AVX-512 VNNI, no VBMI, no BF16
    assert cascade_lake.wide_lookup is None and cascade_lake.lookup_intrin.name == "vpshufb_zmm"
    assert "avx512vbmi" not in cascade_lake.code_features
