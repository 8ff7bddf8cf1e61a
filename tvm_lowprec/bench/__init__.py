"""Benchmark harness: tvm-lowprec's integer GEMM against ONNX Runtime, PyTorch and NumPy.

Declare a :class:`Benchmark` (shapes x providers x thread counts) and call :func:`run_benchmark`;
see ``benchmarks/matmul_grid.py`` for the command-line front end.
"""

from .grid import Benchmark, gops, run_benchmark
from .registry import PROVIDERS, BaseProvider, Prepared, get_provider, register
from .timing import (DEFAULT_TIMING, QUICK_TIMING, Measurement, Timing, compiled_loop, measure, measure_interleaved,
                     time_callable, wall_loop)

__all__ = [
    "Benchmark", "BaseProvider", "DEFAULT_TIMING", "compiled_loop", "Measurement", "PROVIDERS", "Prepared", "QUICK_TIMING",
    "Timing", "get_provider", "gops", "measure", "measure_interleaved", "register", "run_benchmark", "time_callable",
    "wall_loop",
]
