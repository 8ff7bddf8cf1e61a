"""Make the demo model that ships with the package: a small MLP quantized by ONNX Runtime (QDQ).

    python scripts/make_demo_model.py            # writes tvm_lowprec/data/demo_mlp_qdq.onnx

Fixed seeds: the same file every time (about 60 KB). The FP32 source is not kept.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OUT = os.path.join(os.path.dirname(__file__), "..", "tvm_lowprec", "data", "demo_mlp_qdq.onnx")
BATCH, DIMS = 8, (128, 256, 64)


def fp32_mlp(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "input"
    for i, (k, n) in enumerate(zip(DIMS[:-1], DIMS[1:])):
        inits.append(numpy_helper.from_array((rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32), f"fc{i}.weight"))
        inits.append(numpy_helper.from_array((rng.standard_normal(n) * 0.1).astype(np.float32), f"fc{i}.bias"))
        nodes.append(helper.make_node("Gemm", [prev, f"fc{i}.weight", f"fc{i}.bias"], [f"fc{i}"], transB=1, name=f"fc{i}"))
        prev = f"fc{i}"
        if i < len(DIMS) - 2:
            nodes.append(helper.make_node("Relu", [prev], [f"relu{i}"], name=f"relu{i}"))
            prev = f"relu{i}"
    nodes.append(helper.make_node("Identity", [prev], ["logits"], name="out"))
    graph = helper.make_graph(
        nodes, "demo_mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [BATCH, DIMS[0]])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [BATCH, DIMS[-1]])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what every ONNX Runtime since 1.10 reads (the installed onnx would stamp its own)
    return model


def main():
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args()
    rng = np.random.default_rng(1)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"input": rng.standard_normal((BATCH, DIMS[0])).astype(np.float32)} for _ in range(16)])

        def get_next(self):
            return next(self.it, None)

    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "fp32.onnx")
        onnx.save(fp32_mlp(), src)
        quantize_static(src, args.out, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    print(f"wrote {os.path.normpath(args.out)} ({os.path.getsize(args.out) // 1024} KB)")


if __name__ == "__main__":
    main()
