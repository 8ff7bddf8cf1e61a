"""Parsing TVMScript without ``inspect.stack()``'s cost.

Every ``@T.prim_func`` calls :func:`inspect.stack`, which looks up each frame's source file; a frame
whose file is not on disk (``<frozen importlib._bootstrap>``, i.e. every frame of an import) makes
:func:`inspect.getmodule` scan all of ``sys.modules``. While a module of intrinsics is imported this
costs seconds per hundred prim_funcs: ``import tvm.s_tir.tensor_intrin`` took about 60 s on our
2-core hosts, and MetaSchedule imports it in the tuning process and again in every builder worker,
whose pool it restarts for every batch (60 s per batch of candidates, whatever the batch size).

:func:`cheap_frame_inspection` makes ``inspect.stack`` return the same frames, with the source line
from :mod:`linecache` (what TVMScript's parser reads: ``frame`` and ``code_context``) and no module
lookup. This module imports nothing heavy, so MetaSchedule's worker processes run its functions as
their initializers cheaply (the tuner pickles them by value): :func:`import_tensor_intrinsics` in the
builder, :func:`use_threads` in the runner.
"""

from __future__ import annotations

import contextlib
import inspect
import linecache
import sys


def _stack(context: int = 1):
    frames, frame = [], sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        line = linecache.getline(code.co_filename, frame.f_lineno, frame.f_globals) if context > 0 else ""
        frames.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name,
                                        [line] if line else None, 0 if line else None))
        frame = frame.f_back
    return frames


@contextlib.contextmanager
def cheap_frame_inspection():
    """``inspect.stack`` without per-frame module lookups, for the duration of the block."""
    original = inspect.stack
    inspect.stack = _stack
    try:
        yield
    finally:
        inspect.stack = original


def import_tensor_intrinsics() -> None:
    """Import TVM's own tensor intrinsics (``tvm.s_tir.tensor_intrin``) the cheap way; MetaSchedule's
    ``TuneContext`` and builder workers import it, and then find it already loaded."""
    with cheap_frame_inspection():
        import tvm.s_tir.tensor_intrin  # noqa: F401


def use_threads(count: int) -> None:
    """A MetaSchedule runner worker's initializer: TVM's thread pool there gets ``count`` threads (it
    reads ``TVM_NUM_THREADS`` when first used), so candidates are measured at the thread count they
    are tuned for."""
    import os

    os.environ["TVM_NUM_THREADS"] = str(count)



def export_shared_library(compiler: str, mod) -> str:
    """A MetaSchedule builder's export for another CPU: ``mod`` linked into a shared library by the
    cross ``compiler`` here (MetaSchedule's default exports a tar that the board links itself, which
    needs a compiler on the board; an emulated board has none)."""
    import os
    import tempfile

    from tvm.support import cc

    path = os.path.join(tempfile.mkdtemp(), "tvm_tmp_mod.so")
    mod.export_library(path, fcompile=cc.cross_compiler(compiler))
    return path
