"""A BERT-base-sized Transformer encoder (post-LayerNorm, GELU via Erf) as an FP32 ONNX graph.

Input ``x``: float32 [batch, seq, d_model] (the embeddings are left out); output ``y``, same shape.
Weights are drawn with a fixed seed at scale 1/sqrt(fan_in), so activations stay near unit variance
and the attention softmax is neither uniform nor one-hot.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from .graph import GraphBuilder, float_input


@dataclass(frozen=True)
class EncoderConfig:
    layers: int = 2
    d_model: int = 768
    heads: int = 12
    d_ff: int = 3072
    seq: int = 128
    batch: int = 1

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


def _linear(g: GraphBuilder, rng: np.random.Generator, x: str, d_in: int, d_out: int, prefix: str) -> str:
    """``x @ W + b`` as MatMul + Add (the QDQ quantizer's usual pattern)."""
    w = g.const(f"{prefix}_w", rng.standard_normal((d_in, d_out)) / np.sqrt(d_in))
    b = g.const(f"{prefix}_b", 0.02 * rng.standard_normal(d_out))
    return g.op("Add", [g.op("MatMul", [x, w], f"{prefix}_mm"), b], f"{prefix}_out")


def _layer_norm(g: GraphBuilder, rng: np.random.Generator, x: str, d: int, prefix: str, output: str | None) -> str:
    gamma = g.const(f"{prefix}_gamma", 1.0 + 0.05 * rng.standard_normal(d))
    beta = g.const(f"{prefix}_beta", 0.02 * rng.standard_normal(d))
    return g.op("LayerNormalization", [x, gamma, beta], prefix, output=output, axis=-1, epsilon=1e-12)


def _gelu(g: GraphBuilder, x: str) -> str:
    """0.5 * x * (1 + erf(x / sqrt(2)))."""
    erf = g.op("Erf", [g.op("Div", [x, g.const("sqrt2", np.float32(np.sqrt(2.0)))])])
    one_plus = g.op("Add", [erf, g.const("one", np.float32(1.0))])
    return g.op("Mul", [g.op("Mul", [x, one_plus]), g.const("half", np.float32(0.5))], "gelu")


def _split_heads(g: GraphBuilder, x: str, cfg: EncoderConfig, perm: list[int]) -> str:
    shape = g.const("heads_shape", np.array([cfg.batch, cfg.seq, cfg.heads, cfg.head_dim], dtype=np.int64))
    return g.op("Transpose", [g.op("Reshape", [x, shape])], perm=perm)


def _attention(g: GraphBuilder, rng: np.random.Generator, x: str, cfg: EncoderConfig, prefix: str) -> str:
    d = cfg.d_model
    q = _split_heads(g, _linear(g, rng, x, d, d, f"{prefix}_q"), cfg, [0, 2, 1, 3])   # [b, h, s, dh]
    k = _split_heads(g, _linear(g, rng, x, d, d, f"{prefix}_k"), cfg, [0, 2, 3, 1])   # [b, h, dh, s]
    v = _split_heads(g, _linear(g, rng, x, d, d, f"{prefix}_v"), cfg, [0, 2, 1, 3])   # [b, h, s, dh]
    scores = g.op("Mul", [g.op("MatMul", [q, k], f"{prefix}_qk"), g.const("scale", np.float32(cfg.head_dim ** -0.5))])
    probs = g.op("Softmax", [scores], f"{prefix}_softmax", axis=-1)
    context = g.op("Transpose", [g.op("MatMul", [probs, v], f"{prefix}_pv")], perm=[0, 2, 1, 3])
    merged_shape = g.const("merged_shape", np.array([cfg.batch, cfg.seq, d], dtype=np.int64))
    merged = g.op("Reshape", [context, merged_shape])
    return _linear(g, rng, merged, d, d, f"{prefix}_o")


def _encoder_layer(g: GraphBuilder, rng: np.random.Generator, x: str, cfg: EncoderConfig, index: int,
                   output: str | None = None) -> str:
    prefix = f"l{index}"
    attended = g.op("Add", [x, _attention(g, rng, x, cfg, f"{prefix}_attn")], f"{prefix}_res1")
    x = _layer_norm(g, rng, attended, cfg.d_model, f"{prefix}_ln1", None)
    hidden = _gelu(g, _linear(g, rng, x, cfg.d_model, cfg.d_ff, f"{prefix}_ff1"))
    ff = _linear(g, rng, hidden, cfg.d_ff, cfg.d_model, f"{prefix}_ff2")
    return _layer_norm(g, rng, g.op("Add", [x, ff], f"{prefix}_res2"), cfg.d_model, f"{prefix}_ln2", output)


def make_encoder(seed: int = 0, cfg: EncoderConfig = EncoderConfig()) -> onnx.ModelProto:
    """The encoder with weights drawn from ``seed``; input ``x`` [batch, seq, d_model], output ``y``."""
    rng = np.random.default_rng(seed)
    g = GraphBuilder("encoder")
    x = "x"
    for index in range(cfg.layers):
        x = _encoder_layer(g, rng, x, cfg, index, output="y" if index == cfg.layers - 1 else None)
    shape = [cfg.batch, cfg.seq, cfg.d_model]
    return g.model([float_input("x", shape)], [float_input("y", shape)])
