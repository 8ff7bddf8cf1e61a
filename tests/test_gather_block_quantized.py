"""ONNX Runtime's ``com.microsoft.GatherBlockQuantized`` (a 4-bit language model's token embedding):
rewritten into standard operators before import, exact against ORT running the same node and against
a numpy model of ORT's definition, with and without zero points; unsupported forms name the node."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_lowprec
from tvm_lowprec.errors import UnsupportedOperatorError

ROWS, COLUMNS, BLOCK = 50, 96, 32


def _model(rng, bits=4, zero_points=True, scale_dtype=np.float32, index_shape=(2, 3), **attrs):
    per_byte = 8 // bits
    data = rng.integers(0, 256, (ROWS, COLUMNS // per_byte)).astype(np.uint8)
    scales = (rng.random((ROWS, COLUMNS // BLOCK)) * 0.05 + 0.01).astype(scale_dtype)
    inits = [numpy_helper.from_array(data, "data"), numpy_helper.from_array(scales, "scales")]
    inputs = ["data", "ids", "scales"]
    if zero_points:
        blocks = COLUMNS // BLOCK
        zp = rng.integers(0, 256, (ROWS, -(-blocks // per_byte))).astype(np.uint8)
        inits.append(numpy_helper.from_array(zp, "zp"))
        inputs.append("zp")
    node = helper.make_node("GatherBlockQuantized", inputs, ["embedded"], domain="com.microsoft", bits=bits,
                            block_size=BLOCK, **attrs)
    out_type = helper.np_dtype_to_tensor_dtype(np.dtype(scale_dtype))
    graph = helper.make_graph([node], "embedding", [helper.make_tensor_value_info("ids", TensorProto.INT64, list(index_shape))],
                              [helper.make_tensor_value_info("embedded", out_type, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model, data, scales, (zp if zero_points else None)


def _numpy(data, scales, zp, ids, bits):
    """ORT's definition: low nibble first; absent zero points are 2**(bits - 1)."""
    q = np.stack([data & 15, data >> 4], axis=-1).reshape(ROWS, COLUMNS) if bits == 4 else data
    blocks = COLUMNS // BLOCK
    if zp is None:
        z = np.full((ROWS, blocks), 1 << (bits - 1))
    else:
        z = np.stack([zp & 15, zp >> 4], axis=-1).reshape(ROWS, -1)[:, :blocks] if bits == 4 else zp
    centered = q.astype(np.float32) - np.repeat(z, BLOCK, axis=1).astype(np.float32)
    return (centered.astype(scales.dtype) * np.repeat(scales, BLOCK, axis=1))[ids]


@pytest.mark.parametrize("bits, zero_points, scale_dtype", [(4, True, np.float32), (4, False, np.float32),
                                                            (8, True, np.float32), (8, False, np.float32),
                                                            (4, True, np.float16)])
def test_embedding_matches_ort_and_the_definition(bits, zero_points, scale_dtype, rng):
    model, data, scales, zp = _model(rng, bits, zero_points, scale_dtype)
    ids = rng.integers(0, ROWS, (2, 3)).astype(np.int64)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0]
    np.testing.assert_array_equal(want, _numpy(data, scales, zp, ids, bits))  # the definition, as ORT runs it
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    got = compiled(ids)[0]
    assert got.shape == (2, 3, COLUMNS) and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("attrs", [{"gather_axis": 1}, {"quantize_axis": 0}])
def test_other_axes_are_named(attrs, rng):
    model, *_ = _model(rng, **attrs)
    with pytest.raises(UnsupportedOperatorError, match="GatherBlockQuantized"):
        tvm_lowprec.from_onnx(model)
