"""Reference models for ``benchmarks/model_bench.py``: built with fixed seeds (or downloaded), then
quantized to QDQ INT8 with ONNX Runtime. See :mod:`models.build`."""
