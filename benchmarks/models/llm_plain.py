"""The same decoder as ``llm.py`` (a transformers Qwen2 with random weights), exported plainly: torch's
ONNX exporter on a module that reads the Hugging Face folder's weights and writes every operator as
plain ONNX (MatMul, Softmax, the RMS norm as Pow/ReduceMean/Add/Sqrt/Div, the rotary embedding as
Slice/Neg/Concat/Mul, the past keys and values concatenated), then ONNX Runtime's
``MatMulNBitsQuantizer`` (4-bit, symmetric, block 32 or 128, accuracy level 4): the form a torch or
optimum export followed by ORT's weight-only quantizer has.

Inputs ``input_ids`` [batch, sequence_length], ``attention_mask`` [batch, total_sequence_length] and
``past_key_values.N.key/value`` [batch, kv heads, past_sequence_length, head size]; outputs ``logits``
and ``present.N.key/value``, every length symbolic (named as the builder names them). The module
checks itself against transformers' own forward on the folder before it is exported (the same
logits, so the same model as the builder's file).

    python benchmarks/models/llm_plain.py --config tiny --out /tmp/llm --block 32
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from llm import CONFIGS, hf_folder  # noqa: E402

DIMS = ("batch", "sequence_length", "past_sequence_length", "total_sequence_length")


def _module(model):
    """A torch module computing ``model``'s (a transformers Qwen2ForCausalLM) forward with the past
    keys and values as plain tensors."""
    import torch

    cfg = model.config
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head = cfg.hidden_size // heads
    rope = getattr(cfg, "rope_parameters", None) or {}
    theta = float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
    eps = float(cfg.rms_norm_eps)

    def rms(x, weight):
        return weight * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rotate(x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model.model
            self.lm_head = model.lm_head
            self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, head, 2, dtype=torch.float32) / head),
                                 persistent=False)

        def forward(self, input_ids, attention_mask, *past):
            seq = input_ids.shape[1]
            start = past[0].shape[2]
            positions = torch.arange(seq, dtype=torch.float32) + start
            freqs = positions[:, None] * self.inv_freq[None, :]
            cos, sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()
            total = start + seq
            keys = torch.arange(total)[None, :]
            causal = keys <= (torch.arange(seq) + start)[:, None]
            allowed = causal[None, None] & (attention_mask[:, None, None, :] > 0)
            bias = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)
            x = self.model.embed_tokens(input_ids)
            presents = []
            for i, layer in enumerate(self.model.layers):
                attn = layer.self_attn
                h = rms(x, layer.input_layernorm.weight)
                b = h.shape[0]
                q = attn.q_proj(h).view(b, seq, heads, head).transpose(1, 2)
                k = attn.k_proj(h).view(b, seq, kv, head).transpose(1, 2)
                v = attn.v_proj(h).view(b, seq, kv, head).transpose(1, 2)
                q, k = rotate(q, cos, sin), rotate(k, cos, sin)
                k = torch.cat((past[2 * i], k), dim=2)
                v = torch.cat((past[2 * i + 1], v), dim=2)
                presents += [k, v]
                group = heads // kv
                kk = k[:, :, None].expand(b, kv, group, total, head).reshape(b, heads, total, head)
                vv = v[:, :, None].expand(b, kv, group, total, head).reshape(b, heads, total, head)
                scores = torch.matmul(q, kk.transpose(2, 3)) / head ** 0.5 + bias
                out = torch.matmul(torch.softmax(scores, dim=-1), vv)
                x = x + attn.o_proj(out.transpose(1, 2).reshape(b, seq, heads * head))
                h = rms(x, layer.post_attention_layernorm.weight)
                mlp = layer.mlp
                x = x + mlp.down_proj(torch.nn.functional.silu(mlp.gate_proj(h)) * mlp.up_proj(h))
            return (self.lm_head(rms(x, self.model.norm.weight)), *presents)

    return Plain().eval()


def _check_against_transformers(model, plain, layers: int, kv: int, head: int) -> None:
    """The plain module's logits equal transformers' forward on a 6-token prompt (no past)."""
    import torch

    ids = torch.arange(6)[None] % model.config.vocab_size
    with torch.no_grad():
        want = model(input_ids=ids).logits
        past = [torch.zeros(1, kv, 0, head) for _ in range(2 * layers)]
        got = plain(ids, torch.ones(1, 6, dtype=torch.int64), *past)[0]
    if not torch.allclose(got, want, atol=1e-4, rtol=1e-4):
        raise RuntimeError(f"the plain module differs from transformers' forward by {(got - want).abs().max():.3g}")


def build_plain(config: str, out: Path, block: int = 32, seed: int = 0, tied: bool = False) -> Path:
    """``out/<config>-plain-int4-b<block>[-tied]/model.onnx`` (made now if missing): the float export with
    its MatMul weights in 4 bits by ``MatMulNBitsQuantizer`` (the float file is removed once quantized)."""
    import onnx
    import torch
    import transformers
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    suffix = "-tied" if tied else ""
    target = out / f"{config}-plain-int4-b{block}{suffix}"
    model_path = target / "model.onnx"
    if model_path.exists():
        return model_path
    target.mkdir(parents=True, exist_ok=True)
    hf = hf_folder(config, out, seed, tied)
    model = transformers.Qwen2ForCausalLM.from_pretrained(str(hf), torch_dtype=torch.float32).eval()
    cfg = model.config
    layers, kv = cfg.num_hidden_layers, cfg.num_key_value_heads
    head = cfg.hidden_size // cfg.num_attention_heads
    plain = _module(model)
    _check_against_transformers(model, plain, layers, kv, head)

    past_names = [f"past_key_values.{i}.{p}" for i in range(layers) for p in ("key", "value")]
    present_names = [f"present.{i}.{p}" for i in range(layers) for p in ("key", "value")]
    ids = torch.zeros(1, 3, dtype=torch.int64)
    example = (ids, torch.ones(1, 5, dtype=torch.int64), *[torch.randn(1, kv, 2, head) for _ in past_names])
    axes = {"input_ids": {0: DIMS[0], 1: DIMS[1]}, "attention_mask": {0: DIMS[0], 1: DIMS[3]},
            "logits": {0: DIMS[0], 1: DIMS[1]}}
    axes.update({n: {0: DIMS[0], 2: DIMS[2]} for n in past_names})
    axes.update({n: {0: DIMS[0], 2: DIMS[3]} for n in present_names})
    fp32_dir = target / "fp32"  # the float export and its external weights, removed once quantized
    fp32_dir.mkdir(exist_ok=True)
    fp32_path = fp32_dir / "model.onnx"
    with torch.no_grad():
        torch.onnx.export(plain, example, str(fp32_path), input_names=["input_ids", "attention_mask", *past_names],
                          output_names=["logits", *present_names], dynamic_axes=axes, opset_version=17, dynamo=False)
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)  # a line per node
    quantizer = MatMulNBitsQuantizer(onnx.load(str(fp32_path)), bits=4, block_size=block, is_symmetric=True,
                                     accuracy_level=4)
    quantizer.process()
    large = quantizer.model.model.ByteSize() > 1_800_000_000  # protobuf's 2 GB limit
    quantizer.model.save_model_to_file(str(model_path), use_external_data_format=large)
    shutil.rmtree(fp32_dir)
    return model_path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    parser.add_argument("--block", type=int, default=32, choices=[32, 128])
    parser.add_argument("--out", type=Path, default=Path("/tmp/tvm-lowprec-llm"))
    parser.add_argument("--tied", action="store_true", help="output projection tied to the embedding")
    args = parser.parse_args(argv)
    print(build_plain(args.config, args.out, args.block, tied=args.tied))


if __name__ == "__main__":
    main()
