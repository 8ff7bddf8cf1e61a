"""A small helper for writing ONNX graphs with ``onnx.helper``: unique names, weights as initializers."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17  # LayerNormalization is in the default domain from opset 17


class GraphBuilder:
    """Collects nodes and initializers; every ``op`` call returns the name of its (first) output."""

    def __init__(self, name: str):
        self.name = name
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._counts: dict[str, int] = {}

    def fresh(self, prefix: str) -> str:
        count = self._counts.get(prefix, 0)
        self._counts[prefix] = count + 1
        return f"{prefix}_{count}"

    def const(self, prefix: str, value) -> str:
        """Add ``value`` (numpy array or scalar) as an initializer; float64 is stored as float32."""
        array = np.asarray(value)
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        name = self.fresh(prefix)
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def op(self, op_type: str, inputs: list[str], prefix: str | None = None, *, output: str | None = None,
           **attrs) -> str:
        """Append a node; its output is ``output`` (a graph output's name) or a fresh name from ``prefix``."""
        out = output or self.fresh(prefix or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"{out}_node", **attrs))
        return out

    def model(self, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, inputs, outputs, self.initializers)
        opsets = [helper.make_opsetid("", OPSET)]
        model = helper.make_model(graph, opset_imports=opsets, producer_name="tvm-lowprec-bench")
        model.ir_version = 8  # readable by every ONNX Runtime this benchmark supports
        onnx.checker.check_model(model)
        return model


def float_input(name: str, shape: list[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
