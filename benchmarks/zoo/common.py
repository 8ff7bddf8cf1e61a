"""What every zoo builder shares: the entry type, the cache folder, the torch exporter.

A zoo entry is a :class:`ZooModel`: called as ``entry(cache, size=None, small=False, dynamo=True)`` it
builds the model with random weights, exports it to FP32 ONNX (once; later calls find the file in
``cache``) and returns the file's path. Each source module (``torchvision.py``, ``timm_models.py``,
``transformers_models.py``, ``ultralytics_models.py``, ``keras_models.py``) holds a ``MODELS`` dict of them.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

# Built files: FP32 exports, quantized models, their manifests. Never committed (outside the tree by
# default; ``TVM_LOWPREC_ZOO_CACHE`` or ``--cache`` moves it).
DEFAULT_CACHE = Path(os.environ.get("TVM_LOWPREC_ZOO_CACHE", Path.home() / ".cache" / "tvm-lowprec-zoo"))
MODEL_SEED = 0  # torch.manual_seed before building a model: the random weights of every export


class ZooUnavailable(RuntimeError):
    """The package a builder needs is not installed (the message names it)."""


def require(module: str, package: str | None = None):
    """Import ``module`` or raise :class:`ZooUnavailable` naming the pip package."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ZooUnavailable(f"{package or module} is not installed ({err}); pip install -e '.[zoo]'") from err


@dataclass(frozen=True)
class ZooModel:
    """One zoo model.

    Attributes
    ----------
    name : str
        Registry key.
    source : str
        ``torchvision``, ``timm``, ``transformers``, ``ultralytics`` or ``keras``.
    description : str
        One line for the report.
    size : int
        Default input size: image side (square images) or sequence length / audio frames.
    small_size : int
        The reduced input size (``small=True``, ``--quick``).
    export : callable
        ``export(path, size, dynamo)``: build the model and write its FP32 ONNX file to ``path``.
    kind : str
        ``image``, ``text``, ``audio`` or ``detector`` (what the inputs are).
    tags : tuple of str
        ``cnn``, ``transformer``, ``detector``, ``segmentation``.
    revision : int
        Bumped when the export itself changes (e.g. how its random weights are made), so that cached
        files of the older export are not reused: the cache key ends in ``-r{revision}`` from 1 on.
    """

    name: str
    source: str
    description: str
    size: int
    small_size: int
    export: Callable[[Path, int, bool], None] = field(repr=False)
    kind: str = "image"
    tags: tuple[str, ...] = ()
    revision: int = 0

    def key(self, size: int, dynamo: bool) -> str:
        """The cache key of one export: name, input size, exporter."""
        exporter = "dynamo" if dynamo else "torchscript"
        if self.source == "ultralytics":
            exporter = "ultralytics"  # YOLO.export picks its exporter itself
        elif self.source == "keras":
            exporter = "tf2onnx"  # tf2onnx.convert.from_keras, whatever the torch exporter option
        return f"{self.name}-{size}-{exporter}" + (f"-r{self.revision}" if self.revision else "")

    def resolve_size(self, size: int | None = None, small: bool = False) -> int:
        return size if size is not None else (self.small_size if small else self.size)

    def __call__(self, cache: Path | str = DEFAULT_CACHE, size: int | None = None, small: bool = False,
                 dynamo: bool = True, force: bool = False) -> Path:
        """The FP32 ONNX file (exported now if ``cache`` lacks it, or if ``force``)."""
        size = self.resolve_size(size, small)
        cache = Path(cache)
        cache.mkdir(parents=True, exist_ok=True)
        path = cache / f"{self.key(size, dynamo)}.fp32-export.onnx"
        if force or not path.exists():
            tmp = path.with_suffix(".tmp.onnx")
            self.export(tmp, size, dynamo)
            tmp.replace(path)  # a killed export leaves no half-written file under the cached name
        return path


def torch_export(module, args: tuple, path: Path, input_names: list[str], output_names: list[str],
                 dynamo: bool = True) -> None:
    """``torch.onnx.export`` of ``module`` (eval mode, no grad) into one self-contained file.

    ``dynamo=True`` is the exporter's default (torch.export + onnxscript, the opset it picks);
    ``dynamo=False`` the TorchScript exporter (opset 17). Shapes are static (the example's).
    """
    torch = require("torch")
    module = module.eval()
    kwargs = dict(input_names=input_names, output_names=output_names)
    with torch.no_grad(), _quiet():
        if dynamo:
            require("onnxscript")  # the dynamo exporter needs it
            torch.onnx.export(module, args, str(path), dynamo=True, external_data=False, **kwargs)
        else:
            torch.onnx.export(module, args, str(path), dynamo=False, opset_version=17, **kwargs)


@contextlib.contextmanager
def _quiet():
    """Hold back the exporters' progress prints (they go to stdout, which the harness keeps clean)."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        yield


def batchnorm_statistics(model, example_shape: tuple[int, ...], batches: int = 4, batch: int = 8):
    """``model`` with its batch-norm running statistics measured on random inputs (train mode, a
    cumulative average over ``batches`` of ``batch`` samples of ``example_shape[1:]``), as training would
    have left them; back in eval mode. With the default statistics (mean 0, variance 1) a deep random
    network can make every activation vanish: torchvision's EfficientNet-B0 gives logits of about 1e-14
    for any image, which no quantizer represents (its output scale was 3.7e-16). Seeded by
    :data:`MODEL_SEED`."""
    torch = require("torch")
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average
    generator = torch.Generator().manual_seed(MODEL_SEED + 1)
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(batch, *example_shape[1:], generator=generator))
    return model.eval()


def seeded(fn: Callable):
    """Call ``fn`` under ``torch.manual_seed(MODEL_SEED)`` (random weights, same every build)."""
    torch = require("torch")
    torch.manual_seed(MODEL_SEED)
    return fn()


@contextlib.contextmanager
def scratch_dir():
    """A temporary working directory (exporters that write next to the current directory)."""
    old = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="zoo-") as tmp:
        os.chdir(tmp)
        try:
            yield Path(tmp)
        finally:
            os.chdir(old)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
