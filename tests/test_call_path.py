"""Calling a compiled model: inputs shared with TVM where their memory allows, outputs returned as
views of the memory the VM allocated for that call, ``out=``, and checks that still name the input."""

import gc

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper

import tvm_lowprec
from tvm_lowprec import InputError
from tvm_lowprec.compiled import InputSpec

from models import qlinear_matmul

M, K, N = 4, 64, 32


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def _placed(value: np.ndarray, offset: int) -> np.ndarray:
    """A copy of ``value`` whose data starts ``offset`` bytes past a 64-byte boundary."""
    buffer = np.empty(value.nbytes + 128, np.uint8)
    start = -_address(buffer) % 64 + offset
    copy = np.ndarray(value.shape, value.dtype, buffer, start)
    copy[...] = value
    return copy


@pytest.fixture(scope="module")
def compiled():
    return tvm_lowprec.compile(tvm_lowprec.from_onnx(qlinear_matmul(M, K, N)), target="native")


@pytest.fixture
def a(rng):
    return rng.integers(0, 256, (M, K)).astype(np.uint8)


def _tvm_copy_result(compiled, a) -> np.ndarray:
    """The reference: TVM's own copying path (``tvm.runtime.tensor`` in, ``.numpy()`` out)."""
    return compiled._vm["main"](tvm.runtime.tensor(np.ascontiguousarray(a), tvm.cpu())).numpy()


def test_aligned_input_goes_in_without_a_copy(compiled, a):
    x = _placed(a, 0)
    (tensor,) = compiled._arguments((x,), {})
    assert tensor.data_ptr() == _address(x)  # the tensor is the array's own memory (DLPack)
    np.testing.assert_array_equal(compiled(x)[0], _tvm_copy_result(compiled, a))


@pytest.fixture(scope="module")
def aligned_reader():
    """The same model on the VNNI row (native or emulated, whichever this host runs): its tensorized
    GEMM reads the uint8 input as it is, through the intrinsic's 64-byte aligned match_buffer (the rows
    without VNNI widen the activations first, in a kernel that takes them at any alignment)."""
    return tvm_lowprec.compile(tvm_lowprec.from_onnx(qlinear_matmul(M, K, N)), target="x86-avx512-vnni")


def _input_readers(compiled) -> list:
    return [f for f in compiled._lowered.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]


@pytest.mark.parametrize("offset", [16, 1])
def test_misaligned_input_is_copied_to_aligned_memory(aligned_reader, a, offset):
    # TVM's kernels assume 64-byte aligned arguments (aligned vector moves): an input read by a kernel
    # that keeps that assumption (here the tensorized GEMM, whose intrinsic's match_buffer asks for it)
    # is copied once
    compiled = aligned_reader
    assert not compiled._any_alignment
    assert [int(f.params[0].data_alignment) for f in _input_readers(compiled)] == [64]
    x = _placed(a, offset)
    (tensor,) = compiled._arguments((x,), {})
    assert tensor.data_ptr() != _address(x) and tensor.data_ptr() % 64 == 0
    np.testing.assert_array_equal(compiled(x)[0], _tvm_copy_result(compiled, a))


@pytest.mark.host_dependent
@pytest.mark.parametrize("offset", [16, 1])
def test_a_misaligned_input_is_copied_where_the_native_kernel_keeps_alignment(compiled, a, offset):
    """On this host's row: copied where its GEMM reads the input as it is (VNNI), shared where a kernel
    that takes any alignment reads it (the AVX2 and AVX-512BW rows widen it to int16 first)."""
    (reader,) = _input_readers(compiled)
    keeps = int(reader.params[0].data_alignment) == 64
    assert (0 not in compiled._any_alignment) == keeps
    x = _placed(a, offset)
    (tensor,) = compiled._arguments((x,), {})
    assert (tensor.data_ptr() != _address(x)) == keeps
    np.testing.assert_array_equal(compiled(x)[0], _tvm_copy_result(compiled, a))


@pytest.fixture(scope="module")
def float_input_model():
    """A QDQ MatMul with a float input: its first kernel is the input's quantize, which takes it at any
    alignment (tvm_lowprec.unaligned_inputs)."""
    from models import fp32_linear, quantize_qdq

    rng = np.random.default_rng(3)
    fp32 = fp32_linear((M, K), N)
    qdq = quantize_qdq(fp32, [rng.standard_normal((M, K)).astype(np.float32) for _ in range(4)])
    return tvm_lowprec.compile(tvm_lowprec.from_onnx(qdq), target="native")


@pytest.mark.parametrize("offset", [16, 4])
def test_a_misaligned_float_input_goes_in_without_a_copy(float_input_model, rng, offset):
    compiled = float_input_model
    assert compiled._any_alignment == {0}
    readers = [f for g, f in compiled._lowered.functions.items() if isinstance(f, tvm.tirx.PrimFunc)
               and int(f.params[0].data_alignment) == 4]
    assert readers, "the input's kernel keeps 64-byte alignment"
    x = rng.standard_normal((M, K)).astype(np.float32)
    placed = _placed(x, offset)
    (tensor,) = compiled._arguments((placed,), {})
    assert tensor.data_ptr() == _address(placed)  # numpy's own memory, though not 64-byte aligned
    np.testing.assert_array_equal(compiled(placed)[0], compiled(_placed(x, 0))[0])


def test_an_input_not_aligned_to_its_element_is_still_copied(float_input_model, rng):
    x = _placed(rng.standard_normal((M, K)).astype(np.float32), 2)
    (tensor,) = float_input_model._arguments((x,), {})
    assert tensor.data_ptr() != _address(x) and tensor.data_ptr() % 64 == 0


@pytest.mark.parametrize("layout", ["strided", "fortran", "read-only"])
def test_inputs_that_cannot_be_shared_give_the_right_result(compiled, a, layout):
    if layout == "strided":
        wide = np.zeros((M, 2 * K), np.uint8)
        wide[:, ::2] = a
        x = wide[:, ::2]
    elif layout == "fortran":
        x = np.asfortranarray(a)
    else:
        x = _placed(a, 0)
        x.flags.writeable = False
    (tensor,) = compiled._arguments((x,), {})
    assert tensor.data_ptr() != _address(x)
    np.testing.assert_array_equal(compiled(x)[0], _tvm_copy_result(compiled, a))


def test_outputs_view_the_vm_memory_and_two_calls_are_independent(compiled, a, rng):
    b = rng.integers(0, 256, (M, K)).astype(np.uint8)
    first = compiled(a)[0]
    assert not first.flags.owndata  # a view of the VM's output tensor, not a copy
    kept = first.copy()
    second = compiled(b)[0]
    assert not np.shares_memory(first, second)
    np.testing.assert_array_equal(first, kept)
    np.testing.assert_array_equal(second, _tvm_copy_result(compiled, b))


def test_an_output_outlives_everything_else(compiled, a):
    out = compiled(_placed(a, 0))[0]
    kept = out.copy()
    gc.collect()
    for _ in range(8):  # the VM's pool hands out freed blocks: the live array's must not be one
        compiled(a)
    np.testing.assert_array_equal(out, kept)
    out[...] = 0  # writeable, and owned by the caller alone
    np.testing.assert_array_equal(compiled(a)[0], kept)


def test_out_receives_the_outputs(compiled, a):
    target = np.full((M, N), 7, np.uint8)
    result = compiled(a, out=[target])
    assert result[0] is target
    np.testing.assert_array_equal(target, _tvm_copy_result(compiled, a))


def test_out_of_the_wrong_shape_or_count_names_the_output(compiled, a):
    with pytest.raises(InputError, match=r"out\[0\] \('y'\): expected shape \[4, 32\] dtype uint8, got shape \[4, 31\]"):
        compiled(a, out=[np.empty((M, N - 1), np.uint8)])
    with pytest.raises(InputError, match=r"out\[0\].*dtype uint8, got shape \[4, 32\] dtype int8"):
        compiled(a, out=[np.empty((M, N), np.int8)])
    with pytest.raises(InputError, match="list of 1 array"):
        compiled(a, out=[])


def test_wrong_dtype_and_shape_still_name_the_input(compiled, a):
    with pytest.raises(InputError, match=r"input 'a': expected dtype uint8, got int8"):
        compiled(a.astype(np.int8))
    with pytest.raises(InputError, match=r"input 'a': expected shape \[4, 64\], got \[4, 63\]"):
        compiled(a[:, :-1])
    with pytest.raises(InputError, match=r"input 'a': expected shape \[4, 64\], got \[4, 64, 1\]"):
        compiled(a[..., None])


def test_cached_check_of_symbolic_dims():
    spec = InputSpec("x", ("batch", 8), "float32")
    assert spec.mismatch(np.zeros((3, 8), np.float32)) is None
    assert spec.mismatch(np.zeros((3, 9), np.float32)) == "input 'x': expected shape ['batch', 8], got [3, 9]"
    assert spec.mismatch(np.zeros((8,), np.float32)) == "input 'x': expected shape ['batch', 8], got [8]"
    assert spec.mismatch(np.zeros((3, 8), np.float64)) == "input 'x': expected dtype float32, got float64"
    assert spec == InputSpec("x", ("batch", 8), "float32")  # the cached forms are not fields


def _aliasing_model() -> onnx.ModelProto:
    """Outputs: a computed tensor, a reshape of the input (a view in the VM), the input itself, a
    constant and the computed tensor again."""
    inits = [numpy_helper.from_array(np.array([2, 8], np.int64), "shape"),
             numpy_helper.from_array(np.arange(4, dtype=np.float32), "C")]
    nodes = [helper.make_node("Relu", ["x"], ["relu"]), helper.make_node("Reshape", ["x", "shape"], ["view"]),
             helper.make_node("Identity", ["x"], ["same"]), helper.make_node("Identity", ["C"], ["const"]),
             helper.make_node("Identity", ["relu"], ["again"])]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("relu", "view", "same", "const", "again")]
    graph = helper.make_graph(nodes, "aliasing", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_outputs_that_alias_inputs_constants_or_each_other_are_copied(rng):
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(_aliasing_model()), target="native")
    assert compiled._views == (True, False, False, False, False)  # only the call's own allocation is viewed
    x = _placed(rng.standard_normal((4, 4)).astype(np.float32), 0)
    relu, view, same, const, again = compiled(x)
    for out in (relu, view, same, const, again):
        assert not np.shares_memory(out, x)
    assert not np.shares_memory(relu, again)
    const[...] = -1  # the model's constant must not change
    np.testing.assert_array_equal(compiled(x)[3], np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(relu, np.maximum(x, 0))
    np.testing.assert_array_equal(view, x.reshape(2, 8))


def _scalar_add_model() -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["x", "s"], ["y"])]
    graph = helper.make_graph(nodes, "scalar_add", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
                                                    helper.make_tensor_value_info("s", TensorProto.FLOAT, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("offset", [0, 16])
def test_a_zero_d_input_stays_zero_d(offset):
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(_scalar_add_model()), target="native")
    x, s = np.arange(3, dtype=np.float32), _placed(np.array(2.5, np.float32), offset)
    tensors = compiled._arguments((x, s), {})
    assert tensors[1].shape == ()
    np.testing.assert_array_equal(compiled(x, s)[0], x + 2.5)
