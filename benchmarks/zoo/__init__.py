"""A model zoo built the way users build models: torchvision, timm, transformers, Ultralytics and Keras models
with random weights, exported to ONNX (Keras: by tf2onnx), quantized by ONNX Runtime, run by tvm-lowprec
(``benchmarks/zoo.py``).

``REGISTRY`` maps every name to its :class:`~zoo.common.ZooModel` (``REGISTRY[name](cache)`` -> FP32 ONNX
path); :func:`zoo.build.build` adds ORT's pre-processing and quantization; :mod:`zoo.runner` runs one
model end to end, in its own process. Import with ``benchmarks/`` on ``sys.path``.
"""

from __future__ import annotations

from . import keras_models, timm_models, torchvision, transformers_models, ultralytics_models
from .common import DEFAULT_CACHE, ZooModel, ZooUnavailable

SOURCES = {"torchvision": torchvision.MODELS, "timm": timm_models.MODELS,
           "transformers": transformers_models.MODELS, "ultralytics": ultralytics_models.MODELS,
           "keras": keras_models.MODELS}
REGISTRY: dict[str, ZooModel] = {name: m for models in SOURCES.values() for name, m in models.items()}

# --quick: small models at their reduced input sizes (one per source, a segmenter, a tiny encoder)
QUICK = ("squeezenet1_1", "mobilenet_v3_large", "lraspp_mobilenet_v3_large", "ghostnet_100", "bert_tiny", "yolov8n")
# the default run: every model but the test-sized tiny BERT
DEFAULT = tuple(name for name in REGISTRY if name != "bert_tiny")

__all__ = ["DEFAULT", "DEFAULT_CACHE", "QUICK", "REGISTRY", "SOURCES", "ZooModel", "ZooUnavailable"]
