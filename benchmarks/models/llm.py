"""Decoder language models with random weights, exported by ONNX Runtime GenAI's model builder.

A transformers config (Qwen2 here: RMS norms, rotary embeddings, grouped-query attention, SwiGLU),
random weights from ``from_config`` saved with ``save_pretrained``, then ``python -m
onnxruntime_genai.models.builder -i <folder> -p int4 -e cpu``: MatMulNBits (4-bit, block 32),
GroupQueryAttention with the rotary caches, (Skip)SimplifiedLayerNormalization, inputs ``input_ids``,
``attention_mask``, ``past_key_values.N.key/value``. Nothing is downloaded (the builder reads the local
folder; ``-m`` only names the architecture). Needs ``pip install -e ".[llm]"``.

    python benchmarks/models/llm.py --config tiny --out /tmp/llm
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

# hidden, intermediate, layers, heads, kv heads, vocabulary
CONFIGS = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512),
    # Qwen2.5-0.5B's shape (about 309 MB of int4 weights and scales per token)
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936),
}
ARCHITECTURE = "Qwen/Qwen2.5-0.5B"  # the builder's architecture name: no download with -i


def hf_folder(config: str, out: Path, seed: int = 0, tied: bool = False) -> Path:
    """``out/<config>-hf[-tied]``: the transformers model with random weights (``seed``), made now if
    missing; both exports (the builder's here, the plain one in ``llm_plain.py``) read it."""
    import torch
    import transformers

    hf = out / f"{config}-hf{'-tied' if tied else ''}"
    if not (hf / "config.json").exists():
        cfg = transformers.Qwen2Config(**CONFIGS[config], max_position_embeddings=4096, tie_word_embeddings=tied)
        torch.manual_seed(seed)
        transformers.Qwen2ForCausalLM(cfg).eval().save_pretrained(str(hf))
    return hf


def build(config: str, out: Path, precision: str = "int4", seed: int = 0, tied: bool = False) -> Path:
    """``out/<config>-<precision>[-tied]/model.onnx`` (made now if missing); the Hugging Face folder beside
    it. ``tied``: the output projection shares the token embedding (Qwen2.5-0.5B's own configuration),
    which the builder then writes as a 4-bit ``GatherBlockQuantized`` embedding."""
    suffix = "-tied" if tied else ""
    target = out / f"{config}-{precision}{suffix}"
    model_path = target / "model.onnx"
    if model_path.exists():
        return model_path
    hf = hf_folder(config, out, seed, tied)
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", ARCHITECTURE, "-i", str(hf),
                    "-o", str(target), "-p", precision, "-e", "cpu", "-c", str(out / "cache")],
                   check=True, stdout=subprocess.DEVNULL)
    return model_path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    parser.add_argument("--precision", default="int4", choices=["int4", "fp32"])
    parser.add_argument("--out", type=Path, default=Path("/tmp/tvm-lowprec-llm"))
    parser.add_argument("--tied", action="store_true", help="output projection tied to the embedding")
    args = parser.parse_args(argv)
    print(build(args.config, args.out, args.precision, tied=args.tied))


if __name__ == "__main__":
    main()
