"""Hugging Face transformers encoders from their configs (random weights, no hub access).

Each model is made as users make one without weights: a config class with the architecture's sizes,
then ``AutoModel.from_config`` (default attention implementation). The exported graph returns
``last_hidden_state`` only.
"""

from __future__ import annotations

from pathlib import Path

from .common import ZooModel, require, seeded, torch_export


class _Hidden:
    """A torch module returning ``model(**inputs).last_hidden_state`` (made lazily: torch is optional)."""

    @staticmethod
    def wrap(model, names: tuple[str, ...]):
        torch = require("torch")

        class Hidden(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, *args):
                return self.model(**dict(zip(names, args))).last_hidden_state

        return Hidden()


def _text(config_name: str, **config):
    """A text encoder: inputs ``input_ids`` and ``attention_mask`` [1, size] (ids drawn below 20000)."""

    def export(path: Path, size: int, dynamo: bool) -> None:
        torch = require("torch")
        transformers = require("transformers")
        cfg = getattr(transformers, config_name)(**config)
        model = seeded(lambda: transformers.AutoModel.from_config(cfg)).eval()
        ids = torch.randint(1000, 20000, (1, size), dtype=torch.int64)
        mask = torch.ones(1, size, dtype=torch.int64)
        names = ("input_ids", "attention_mask")
        torch_export(_Hidden.wrap(model, names), (ids, mask), path, list(names), ["last_hidden_state"], dynamo)

    return export


def _vit(path: Path, size: int, dynamo: bool) -> None:
    torch = require("torch")
    transformers = require("transformers")
    # ViT-S/16 sizes (DeiT-S): d 384, 6 heads, 12 layers
    cfg = transformers.ViTConfig(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536,
                                 image_size=size, patch_size=16)
    model = seeded(lambda: transformers.AutoModel.from_config(cfg, add_pooling_layer=False)).eval()
    torch_export(_Hidden.wrap(model, ("pixel_values",)), (torch.randn(1, 3, size, size),), path, ["pixel_values"],
                 ["last_hidden_state"], dynamo)


def _whisper_encoder(path: Path, size: int, dynamo: bool) -> None:
    """Whisper-tiny's encoder; ``size`` = mel frames (3000 = 30 s; the encoder requires 2 x its positions)."""
    torch = require("torch")
    transformers = require("transformers")
    cfg = transformers.WhisperConfig(d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536,
                                     decoder_layers=4, decoder_attention_heads=6, decoder_ffn_dim=1536,
                                     num_mel_bins=80, max_source_positions=size // 2)
    model = seeded(lambda: transformers.WhisperModel(cfg)).eval().get_encoder()
    torch_export(_Hidden.wrap(model, ("input_features",)), (torch.randn(1, 80, size),), path, ["input_features"],
                 ["last_hidden_state"], dynamo)


MODELS: dict[str, ZooModel] = {m.name: m for m in (
    ZooModel("bert_4l", "transformers", "BERT, 4 layers at base width (d 768, 12 heads, FF 3072), BertConfig",
             128, 32, _text("BertConfig", num_hidden_layers=4), "text", ("transformer",)),
    ZooModel("bert_tiny", "transformers", "tiny BERT, 2 layers, d 128, 2 heads, FF 512, BertConfig",
             128, 32, _text("BertConfig", num_hidden_layers=2, hidden_size=128, num_attention_heads=2,
                            intermediate_size=512), "text", ("transformer",)),
    ZooModel("distilbert", "transformers", "DistilBERT (6 layers, d 768), DistilBertConfig defaults",
             128, 32, _text("DistilBertConfig"), "text", ("transformer",)),
    ZooModel("vit_s16_hf", "transformers", "ViT-S/16 (d 384, 6 heads, 12 layers), ViTConfig",
             224, 112, _vit, "image", ("transformer",)),
    ZooModel("whisper_tiny_encoder", "transformers", "Whisper-tiny encoder (d 384, 4 layers, 80 mel bins), WhisperConfig",
             3000, 500, _whisper_encoder, "audio", ("transformer",)),
)}
