"""Keras models (``keras.applications.<Name>(weights=None)``: random weights, nothing downloaded), converted
to ONNX by tf2onnx the way users convert them: ``tf2onnx.convert.from_keras(model, input_signature=...,
opset=17)``.

The input is what Keras writes: NHWC, float32, named ``image``, batch fixed at 1 (the signature's
``TensorSpec((1, S, S, 3))``; tf2onnx makes the graph NCHW inside, with a Transpose after the input). The
classifier is built with ``classifier_activation=None``: the graph returns logits, as the torch models do.
Weights are seeded with ``keras.utils.set_random_seed(0)``.

**Where TensorFlow runs.** The conversion runs in a process of its own (TensorFlow's thread pools and
memory stay out of the process that times tvm-lowprec): ``python -m zoo.keras_models`` with cwd
``benchmarks/``, under the interpreter named by ``TVM_LOWPREC_TF_PYTHON`` or, unset, this one. The worker
needs only ``tensorflow`` (or ``tensorflow-cpu``), ``keras``, ``tf2onnx`` and ``onnx``, so that variable may
name a virtual environment kept apart from the one that runs the zoo, where TensorFlow does not install
beside it::

    pip install -e ".[zoo-tf]"                       # tensorflow-cpu, tf2onnx (keras comes with TensorFlow)
    # or, apart:
    python -m venv ~/tfvenv && ~/tfvenv/bin/pip install tensorflow-cpu tf2onnx
    TVM_LOWPREC_TF_PYTHON=~/tfvenv/bin/python python benchmarks/zoo.py --models keras_mobilenet_v2

Where neither interpreter has them, the builder raises :class:`~zoo.common.ZooUnavailable` naming the
packages (the zoo's row: ``skipped``). Tested with tensorflow-cpu 2.21.0, keras 3.15.1, tf2onnx 1.17.0,
onnx 1.23.2, numpy 2.4.6, protobuf 7.36.2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from .common import MODEL_SEED, ZooModel, ZooUnavailable

PYTHON_ENV = "TVM_LOWPREC_TF_PYTHON"
PACKAGES = "tensorflow-cpu (or tensorflow), keras, tf2onnx, onnx"
OPSET = 17
_MISSING = 3  # the worker's exit code where an import fails
BENCH_DIR = Path(__file__).resolve().parents[1]


def python() -> str:
    """The interpreter that runs the conversion: ``$TVM_LOWPREC_TF_PYTHON`` or this one."""
    return os.path.expanduser(os.environ.get(PYTHON_ENV) or sys.executable)


def _keras(app: str, **kwargs):
    def export(path: Path, size: int, dynamo: bool) -> None:  # dynamo: a torch option, unused here
        interpreter = python()
        if not os.path.exists(interpreter):
            raise ZooUnavailable(f"{PYTHON_ENV}={interpreter} does not exist; it must name a Python with {PACKAGES}")
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(BENCH_DIR), os.environ.get("PYTHONPATH")])))
        cmd = [interpreter, "-m", "zoo.keras_models", "--app", app, "--size", str(size), "--out", str(path),
               "--kwargs", json.dumps(kwargs)]
        proc = subprocess.run(cmd, cwd=str(BENCH_DIR), env=env, capture_output=True, text=True)
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        if proc.returncode == _MISSING:
            raise ZooUnavailable(f"{tail.splitlines()[-1] if tail else 'import failed'} (interpreter {interpreter}; "
                                 f"it needs {PACKAGES}: pip install -e '.[zoo-tf]', or set {PYTHON_ENV} to a "
                                 f"Python that has them)")
        if proc.returncode != 0:
            raise RuntimeError(f"tf2onnx conversion of keras.applications.{app} failed (exit {proc.returncode}, "
                               f"{interpreter}):\n{tail}")
        if not path.exists():
            raise RuntimeError(f"tf2onnx conversion of keras.applications.{app} wrote no file:\n{tail}")

    return export


def _entry(name, app, description, size=224, small=96, tags=("cnn",), **kwargs):
    return ZooModel(name, "keras", description, size, small, _keras(app, **kwargs), "image", tags)


MODELS: dict[str, ZooModel] = {m.name: m for m in (
    _entry("keras_mobilenet_v2", "MobileNetV2",
           "Keras MobileNetV2 1.0 (ReLU6, depthwise; NHWC, tf2onnx)", alpha=1.0),
    _entry("keras_efficientnet_b0", "EfficientNetB0",
           "Keras EfficientNetB0 (swish, squeeze-excite, in-graph rescale/normalize; NHWC, tf2onnx)"),
)}


# ---------------------------------------------------------------- the worker (TensorFlow's process)

def convert(app: str, size: int, out: Path, kwargs: dict) -> None:
    """Build ``keras.applications.<app>`` with random weights and write tf2onnx's ONNX file to ``out``."""
    import keras
    import tensorflow as tf
    import tf2onnx

    keras.utils.set_random_seed(MODEL_SEED)
    model = getattr(keras.applications, app)(weights=None, input_shape=(size, size, 3),
                                               classifier_activation=None, **kwargs)
    spec = (tf.TensorSpec((1, size, size, 3), tf.float32, name="image"),)
    tf2onnx.convert.from_keras(model, input_signature=spec, opset=OPSET, output_path=str(out))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="convert one keras.applications model with tf2onnx")
    parser.add_argument("--app", required=True)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--kwargs", default="{}")
    args = parser.parse_args(argv)
    for module in ("tensorflow", "keras", "tf2onnx", "onnx"):
        try:
            __import__(module)
        except ImportError as err:
            print(f"{module} is not installed ({err})", file=sys.stderr)
            return _MISSING
    convert(args.app, args.size, args.out, json.loads(args.kwargs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
