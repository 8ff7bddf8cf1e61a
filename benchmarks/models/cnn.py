"""A ResNet-18-style CNN at 224x224 as an FP32 ONNX graph (batch-norm folded away: convs with biases).

Input ``image``: float32 [1, 3, 224, 224]; output ``logits``: float32 [1, 1000]. Conv weights are
He-initialised with a fixed seed; the last conv of each residual branch is scaled down
(``RESIDUAL_SCALE``) so the residual stream does not grow block after block without batch norm.
"""

from __future__ import annotations

import numpy as np
import onnx

from .graph import GraphBuilder, float_input

STAGES = ((64, 1), (128, 2), (256, 2), (512, 2))  # (channels, stride of the first block)
BLOCKS_PER_STAGE = 2
RESIDUAL_SCALE = 0.4
IMAGE = (1, 3, 224, 224)
CLASSES = 1000


def _conv(g: GraphBuilder, rng: np.random.Generator, x: str, c_in: int, c_out: int, kernel: int, stride: int,
          scale: float = 1.0) -> str:
    fan_in = c_in * kernel * kernel
    w = g.const("conv_w", scale * np.sqrt(2.0 / fan_in) * rng.standard_normal((c_out, c_in, kernel, kernel)))
    b = g.const("conv_b", 0.01 * rng.standard_normal(c_out))
    pad = kernel // 2
    return g.op("Conv", [x, w, b], "conv", kernel_shape=[kernel, kernel], strides=[stride, stride],
                pads=[pad, pad, pad, pad])


def _basic_block(g: GraphBuilder, rng: np.random.Generator, x: str, c_in: int, c_out: int, stride: int) -> str:
    branch = g.op("Relu", [_conv(g, rng, x, c_in, c_out, 3, stride)])
    branch = _conv(g, rng, branch, c_out, c_out, 3, 1, scale=RESIDUAL_SCALE)
    shortcut = x if stride == 1 and c_in == c_out else _conv(g, rng, x, c_in, c_out, 1, stride)
    return g.op("Relu", [g.op("Add", [branch, shortcut], "residual")])


def _stem(g: GraphBuilder, rng: np.random.Generator, x: str) -> str:
    x = g.op("Relu", [_conv(g, rng, x, IMAGE[1], 64, 7, 2)])
    return g.op("MaxPool", [x], "maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])


def _head(g: GraphBuilder, rng: np.random.Generator, x: str, channels: int) -> str:
    pooled = g.op("Flatten", [g.op("GlobalAveragePool", [x], "gap")], axis=1)
    w = g.const("fc_w", rng.standard_normal((CLASSES, channels)) / np.sqrt(channels))
    b = g.const("fc_b", 0.01 * rng.standard_normal(CLASSES))
    return g.op("Gemm", [pooled, w, b], output="logits", transB=1)


def make_cnn(seed: int = 0) -> onnx.ModelProto:
    """The CNN with weights drawn from ``seed``; input ``image`` [1, 3, 224, 224], output ``logits``."""
    rng = np.random.default_rng(seed)
    g = GraphBuilder("resnet18_style")
    x, c_in = _stem(g, rng, "image"), 64
    for channels, stride in STAGES:
        for block in range(BLOCKS_PER_STAGE):
            x = _basic_block(g, rng, x, c_in, channels, stride if block == 0 else 1)
            c_in = channels
    logits = _head(g, rng, x, c_in)
    return g.model([float_input("image", list(IMAGE))], [float_input(logits, [IMAGE[0], CLASSES])])
