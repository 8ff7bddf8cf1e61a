"""PyTorch's own quantization in (issue: a library for TVM scripts): a model quantized by PT2E
(torchao's prepare_pt2e / convert_pt2e with X86InductorQuantizer), captured by torch.export, compiles
to integer kernels on the row's intrinsic through tvm_lowprec.from_pt2e, and so does the same model
through torch.onnx.export(dynamo=True); both match PyTorch's run of the converted model."""

from __future__ import annotations

import numpy as np
import pytest

import tvm_lowprec

from reference import cosine
from test_tvm_frontends import row_intrinsics

torch = pytest.importorskip("torch", reason="PT2E needs torch: pip install -e '.[pt2e]'")
pytest.importorskip("torchao", reason="PT2E lives in torchao: pip install -e '.[pt2e]'")

SHAPE = (1, 3, 16, 16)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(32 * 8 * 8, 10)

    def forward(self, x):
        y = torch.relu(self.conv1(x))
        y = torch.relu(self.conv2(y))
        return self.fc(y.flatten(1))


@pytest.fixture(scope="module")
def converted():
    """(the PT2E-converted module, its torch.export program, a test input)."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer, get_default_x86_inductor_quantization_config)

    torch.manual_seed(0)
    x = torch.randn(*SHAPE)
    captured = torch.export.export(_Net().eval(), (x,)).module()
    prepared = prepare_pt2e(captured, X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config()))
    for _ in range(8):
        prepared(torch.randn(*SHAPE))
    model = convert_pt2e(prepared)
    return model, torch.export.export(model, (x,)), torch.randn(*SHAPE)


def _check(compiled, model, x):
    spec = compiled.spec
    gemms = [k for k in compiled.kernels() if k.op == "qgemm"]
    assert len(gemms) == 3, [k.name for k in compiled.kernels()]  # two convolutions and the linear layer
    assert {k.intrinsic for k in gemms} <= row_intrinsics(spec) and all(k.intrinsic != "none" for k in gemms)
    want = model(x).detach().numpy()
    got = np.asarray(compiled(x.numpy())[0])
    assert cosine(got, want) >= 0.9999


def test_a_pt2e_model_compiles_to_integer_kernels(converted):
    model, program, x = converted
    ops = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert {"quantized_decomposed.quantize_per_tensor.default",
            "quantized_decomposed.dequantize_per_channel.default"} <= ops  # what PT2E writes
    mod = tvm_lowprec.from_pt2e(program)
    _check(tvm_lowprec.compile(mod, target="native"), model, x)


def test_the_same_model_through_torch_onnx_export(converted, tmp_path):
    model, program, x = converted
    path = tmp_path / "pt2e.onnx"
    torch.onnx.export(program, (x,), str(path), dynamo=True, external_data=False)
    _check(tvm_lowprec.compile(tvm_lowprec.from_onnx(str(path)), target="native"), model, x)


def test_an_unknown_code_dtype_is_a_named_error():
    from tvm_lowprec.frontend.pt2e import _dtype

    class Node:
        target = "quantized_decomposed.quantize_per_tensor.default"
        name = "q0"

    with pytest.raises(tvm_lowprec.UnsupportedOperatorError, match="q0"):
        _dtype(Node(), "torch.complex64")
