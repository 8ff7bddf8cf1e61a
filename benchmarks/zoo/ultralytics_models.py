"""Ultralytics YOLO detectors from their yaml files (random weights), exported by ``model.export``.

``YOLO("yolov8n.yaml").export(format="onnx", imgsz=...)`` is what a user runs (offline it works: the
yaml ships in the package). ``simplify=False``: with the default, Ultralytics installs ``onnxslim`` at
run time when it is missing. The export is Ultralytics' own (TorchScript exporter, static shapes).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .common import ZooModel, require, scratch_dir


def _yolo(yaml: str):
    def export(path: Path, size: int, dynamo: bool) -> None:
        os.environ.setdefault("YOLO_OFFLINE", "1")
        os.environ.setdefault("YOLO_VERBOSE", "False")
        require("torch")
        ultralytics = require("ultralytics")
        with scratch_dir() as tmp:
            import torch

            torch.manual_seed(0)
            model = ultralytics.YOLO(yaml)
            written = model.export(format="onnx", imgsz=size, simplify=False)
            shutil.move(str(Path(tmp) / written), str(path))

    return export


MODELS: dict[str, ZooModel] = {m.name: m for m in (
    ZooModel("yolov8n", "ultralytics", "YOLOv8n (C2f, SPPF, DFL head), 80 classes, yolov8n.yaml", 320, 160,
             _yolo("yolov8n.yaml"), "image", ("detector",)),
    ZooModel("yolo11n", "ultralytics", "YOLO11n (C3k2, C2PSA attention), 80 classes, yolo11n.yaml", 320, 160,
             _yolo("yolo11n.yaml"), "image", ("detector",)),
)}
