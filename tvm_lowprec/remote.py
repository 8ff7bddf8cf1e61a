"""A compiled model running on a board reached through TVM's RPC: the way a cross-compiled row
(the AArch64 ones) runs, on a real board or on the emulated one (:mod:`tvm_lowprec.board`).

The library is exported here with the row's linker (``aarch64-linux-gnu-gcc`` for AArch64), uploaded
to the board's RPC server, loaded there, and driven by a Relax VM whose calls travel over the
session; inputs are copied to the board's CPU and outputs back. The VM is called through its
stateful interface (``set_input``, ``invoke_stateful``, ``get_outputs``): called plainly over RPC, a
function returning a tuple gives back a remote object, not its tensors. Times from
:meth:`RemoteModel.benchmark` are the board's own (TVM's time evaluator runs there): meaningful on
real hardware, not under emulation.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

import numpy as np
from tvm import relax


def load_remote(session, lib_path: str | os.PathLike):
    """Upload the exported Relax library ``lib_path`` and load it on the board: ``(vm, device)``."""
    lib_path = Path(lib_path)
    session.upload(str(lib_path))
    device = session.cpu()
    return relax.VirtualMachine(session.load_module(lib_path.name), device), device


def invoke(vm, tensors, func: str = "main") -> list[np.ndarray]:
    """Run ``func`` on the board with ``tensors`` (already on its device); its outputs as numpy arrays,
    a tuple flattened in order. A board whose server died mid-call (SIGILL on an instruction its CPU
    lacks, say) raises :class:`~tvm_lowprec.board.BoardError`."""
    vm.set_input(func, *tensors)
    try:
        vm.invoke_stateful(func)
    except RuntimeError as error:
        if "kShutdown" not in str(error):
            raise
        from .board import BoardError

        raise BoardError(f"the remote session ended while running {func!r}: the server's process died (e.g. "
                         "SIGILL on an instruction the board's CPU lacks; the server's output, "
                         "EmulatedBoard.output_tail(), says which signal)") from error
    return _flatten(vm.get_outputs(func))


def _flatten(value) -> list[np.ndarray]:
    import tvm
    import tvm_ffi

    if isinstance(value, tvm.runtime.Tensor):
        return [value.numpy()]
    if isinstance(value, (list, tuple, tvm_ffi.Array)):
        return [array for item in value for array in _flatten(item)]
    from .board import BoardError

    raise BoardError(f"the remote function returned {type(value).__name__}, not tensors")


class RemoteModel:
    """``Compiled.remote(session)``: call it as the compiled model itself (by position, by ONNX input
    name or with one dict); it returns numpy arrays. A board's RPC server serves one session at a
    time, and the session lasts while anything refers to it: :meth:`close` it (or use the model as a
    context manager) before another client needs the board."""

    def __init__(self, compiled, session):
        self.compiled = compiled
        self.session = session
        name = f"lowprec_{compiled.spec.row}_{uuid.uuid4().hex[:8]}.so"
        with tempfile.TemporaryDirectory(prefix="lowprec-remote-") as tmp:
            self._vm, self.device = load_remote(session, compiled.export_library(Path(tmp) / name))

    def __call__(self, *args, **kwargs) -> list[np.ndarray]:
        return invoke(self._vm, self.compiled._arguments(args, kwargs, self.device))

    def close(self) -> None:
        """Drop every reference this model holds on the session (the VM and the loaded library hold
        it too), so the session ends and the board is free for the next one."""
        import gc

        self._vm = self.device = self.session = None
        gc.collect()  # remote handles in reference cycles would keep the session open until collected

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def benchmark(self, *args, number: int = 10, repeat: int = 5, **kwargs) -> float:
        """Median seconds per call on the board (its own timer: no RPC round trip counted)."""
        self._vm.set_input("main", *self.compiled._arguments(args, kwargs, self.device))
        timer = self._vm.time_evaluator("invoke_stateful", self.device, number=number, repeat=repeat)
        return float(np.median(timer("main").results))
