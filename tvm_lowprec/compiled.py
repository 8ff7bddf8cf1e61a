"""The user-facing compiled model: call it with numpy arrays, inspect its kernels and assembly."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import tvm
from tvm import relax

from .errors import InputError, LowPrecError


_POOL_THREADS = None  # what TVM's runtime pool was last configured to by a Compiled
_SAME = object()  # Compiled(runnable=...) default: the executable itself runs


@dataclass(frozen=True)
class KernelInfo:
    """One generated kernel: its name, the operator it implements, its intrinsic, its shape, and
    where its schedule came from: tuning records (``"tuned"``), the default rules (``"default"``), or
    nowhere (``"none"``: no rule accepted it, so its loops run as written, serial and scalar)."""

    name: str
    op: str
    intrinsic: str
    shape: tuple
    schedule: str = "default"
    ops: int | None = None  # integer operations per call (2 per multiply-add), where the op defines them

    def as_row(self) -> dict:
        return {"name": self.name, "op": self.op, "intrinsic": self.intrinsic, "shape": "x".join(map(str, self.shape)),
                "schedule": self.schedule}


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple
    dtype: str
    narrow: str | None = None  # "int4", "uint4", "int2", "uint2": the ONNX type ``dtype`` carries


def _describe(gvar, func) -> KernelInfo:
    attrs = func.attrs if func.attrs is not None else {}
    op = attrs.get("lowprec.op", None)
    intrinsic = attrs.get("lowprec.intrin", None)
    shape = attrs.get("lowprec.shape", None)
    if shape is None:
        out = func.params[-1] if func.params else None  # a 0.27 PrimFunc param carries its buffer's shape
        shape = getattr(out, "shape", ())
    return KernelInfo(
        gvar.name_hint,
        str(op) if op is not None else _op_of(gvar.name_hint),
        str(intrinsic) if intrinsic is not None else "none",
        tuple(int(s) if hasattr(s, "value") or isinstance(s, int) else str(s) for s in shape),
        str(attrs.get("lowprec.schedule", "default")),
        _ops(attrs),
    )


def _ops(attrs) -> int | None:
    """2 x the multiply-adds of one call: a GEMM's M·N·K (times its batch; a 4-bit weight-only GEMM's
    too), a depthwise convolution's output size times its window."""
    op, shape = attrs.get("lowprec.op", None), attrs.get("lowprec.shape", None)
    if op not in ("qgemm", "qgemm16", "qdepthwise", "nbits_gemm") or shape is None:
        return None
    count = 2 * math.prod(int(s) for s in shape)
    return count * max(int(attrs.get("lowprec.batch", 0)), 1) if op == "qgemm" else count


def _op_of(name: str) -> str:
    """A kernel's operator from its name: ``"fused"`` for a chain TVM fused (its name lists the chain),
    else the operator's name without the numbering TVM adds (``reshape3`` -> ``reshape``)."""
    return "fused" if name.startswith("fused_") else name.rstrip("0123456789_")


class Compiled:
    """A compiled model. ``Compiled(*arrays)``, ``Compiled(name=array)`` or ``Compiled({name: array})``
    run it and return a list of numpy arrays (inputs are named by their ONNX names).

    Examples
    --------
    >>> c = tvm_lowprec.compile(tvm_lowprec.from_onnx("model.onnx"), target="native")  # doctest: +SKIP
    >>> outputs = c(x)                                                                  # doctest: +SKIP
    >>> for row in c.kernels(): print(row)                                             # doctest: +SKIP
    """

    def __init__(self, executable, lowered_mod, spec, inputs: Sequence[InputSpec], num_threads: int | None = None,
                 runnable=_SAME, emulation=None, cuda=None, narrow_outputs=()):
        """``runnable``: the executable that runs (default ``executable``; the emulated one; or None
        where this host can run neither); ``emulation``: its :class:`~tvm_lowprec.emulation.EmulationReport`;
        ``cuda``: a GPU row's device code compiled by nvcc (:class:`~tvm_lowprec.cuda.model.CudaBuild`)."""
        self.executable = executable  # the real build: inspect_source shows its code
        self.spec = spec
        self.inputs = tuple(inputs)
        self.num_threads = num_threads
        self.emulation = emulation
        self._lowered = lowered_mod
        self.cuda = cuda
        self.narrow_outputs = tuple(narrow_outputs)  # per output: its 4-/2-bit ONNX type, or None
        self._runnable = executable if runnable is _SAME else runnable
        self._device = tvm.cuda(0) if spec.device == "cuda" and self._runnable is not None else tvm.cpu()
        self._vm = relax.VirtualMachine(self._runnable, self._device) if self._runnable is not None else None

    @property
    def execution(self) -> str:
        """``"native"``, ``"emulated"`` (the target's instructions replaced by their semantics in generic
        code: exact results, meaningless times) or ``"none"`` (this host can run neither)."""
        if self._runnable is None:
            return "none"
        if self.spec.device == "cuda":
            return "cuda"
        return "emulated" if self.emulation is not None else "native"

    def _require(self, timed: bool = False):
        if self._runnable is None and self.spec.device == "cuda":
            from .cuda.run import cuda_device_available

            raise LowPrecError(f"{self.spec.name} needs a CUDA device that TVM's runtime can use, and this host has none "
                               f"({cuda_device_available()[1]}); the build is compile-only here (its PTX and cubin: "
                               "Compiled.cuda)")
        if self._runnable is None:
            from .targets import host_features

            missing = sorted(set(self.spec.code_features) - set(host_features()))
            raise LowPrecError(f"this host lacks {missing} for {self.spec.name}, and the build cannot be emulated here; "
                               "compile for a row this host runs, or run it on a machine that has them")
        if timed and self.execution == "emulated":
            raise LowPrecError(f"{self.spec.name} runs emulated on this host (generic code in place of its "
                               "instructions): its times say nothing about the target; time it on a machine that has them")

    # -- running ---------------------------------------------------------------------------------
    def _set_threads(self):
        global _POOL_THREADS
        if self.num_threads and self.num_threads != _POOL_THREADS:
            # reconfiguring TVM's (process-wide) pool restarts its workers: only when it changes
            tvm.get_global_func("runtime.config_threadpool")(1, int(self.num_threads))
            _POOL_THREADS = self.num_threads

    def _arguments(self, args, kwargs, device=None) -> list:
        if len(args) == 1 and isinstance(args[0], Mapping) and not kwargs:
            kwargs, args = dict(args[0]), ()
        if args and kwargs:
            raise InputError("pass inputs either by position or by name, not both")
        if kwargs:
            unknown = set(kwargs) - {i.name for i in self.inputs}
            if unknown:
                raise InputError(f"unknown input(s) {sorted(unknown)}; the model takes {[i.name for i in self.inputs]}")
            missing = [i.name for i in self.inputs if i.name not in kwargs]
            if missing:
                raise InputError(f"missing input(s) {missing}")
            args = tuple(kwargs[i.name] for i in self.inputs)
        if len(args) != len(self.inputs):
            raise InputError(f"the model takes {len(self.inputs)} input(s) {[i.name for i in self.inputs]}, got {len(args)}")
        return [self._check(spec, np.asarray(a), device) for spec, a in zip(self.inputs, args)]

    def _check(self, spec: InputSpec, value: np.ndarray, device=None):
        if spec.narrow is not None:
            value = _to_carrier(spec, value)
        if str(value.dtype) != spec.dtype:
            raise InputError(f"input {spec.name!r}: expected dtype {spec.dtype}, got {value.dtype}")
        if len(value.shape) != len(spec.shape) or any(
            isinstance(d, int) and d != v for d, v in zip(spec.shape, value.shape)
        ):
            raise InputError(f"input {spec.name!r}: expected shape {list(spec.shape)}, got {list(value.shape)}")
        return tvm.runtime.tensor(np.require(value, requirements="C"), device or self._device)  # keeps 0-d arrays 0-d

    def __call__(self, *args, **kwargs) -> list[np.ndarray]:
        self._require()
        self._set_threads()
        out = _to_numpy(self._vm["main"](*self._arguments(args, kwargs)))
        return [_from_carrier(o, narrow) for o, narrow in zip(out, self.narrow_outputs)] + out[len(self.narrow_outputs):]

    def benchmark(self, *args, number: int = 10, repeat: int = 5, **kwargs) -> float:
        """Median seconds per call, measured by TVM's time evaluator (no Python overhead)."""
        self._require(timed=True)
        self._set_threads()
        tensors = self._arguments(args, kwargs)
        timer = self._vm.time_evaluator("main", self._device, number=number, repeat=repeat)
        return float(np.median(timer(*tensors).results))

    def profile(self, *args, repeat: int = 20, **kwargs) -> list[dict]:
        """Per-kernel time: one row per generated kernel (its :meth:`kernels` fields plus ``ms``, its time
        per model run summed over all its calls (identical layers share one kernel), median over
        ``repeat`` runs, ``calls`` per run, ``gops`` (integer GEMM and depthwise kernels: ``ops`` per
        second; None for the rest) and ``share`` of the summed kernel time), slowest first.

        Times come from a VM instrument around each kernel call; the callback's own overhead (a few
        microseconds a call) is included, so sub-10 us kernels read high.
        """
        import time

        self._require(timed=True)
        self._set_threads()
        tensors = self._arguments(args, kwargs)
        samples: dict[str, list[float]] = {}
        started: dict[str, float] = {}

        def instrument(func, symbol, before_run, ret_value, *call_args):
            if before_run:
                started[symbol] = time.perf_counter()
            else:
                samples.setdefault(symbol, []).append(time.perf_counter() - started.pop(symbol))
            return 0  # VMInstrumentReturnKind.NO_OP

        vm = relax.VirtualMachine(self._runnable, self._device)
        vm.set_instrument(instrument)
        for _ in range(repeat):
            vm["main"](*tensors)
        rows = []
        for info in self.kernels():
            times = samples.get(info.name)
            if times:
                per_run = float(np.median(times)) * len(times) / repeat  # a kernel may run several times
                calls = len(times) // repeat
                gops = info.ops * calls / per_run / 1e9 if info.ops else None
                rows.append({**info.as_row(), "ms": per_run * 1e3, "calls": calls, "gops": gops})
        total = sum(r["ms"] for r in rows) or 1.0
        for r in rows:
            r["share"] = r["ms"] / total
        return sorted(rows, key=lambda r: -r["ms"])

    # -- inspecting ------------------------------------------------------------------------------
    def kernels(self) -> list[KernelInfo]:
        """One row per generated kernel: name, operator, tensor intrinsic (or ``"none"``), shape."""
        rows = [
            _describe(gvar, func)
            for gvar, func in self._lowered.functions.items()
            if isinstance(func, tvm.tirx.PrimFunc)
        ]
        return sorted(rows, key=lambda r: r.name)

    def inspect_source(self, fmt: str = "asm") -> str:
        """Generated code: ``"asm"`` or ``"ll"`` (the CPU side), or for a GPU row ``"cuda"`` (CUDA C),
        ``"ptx"`` (nvcc's PTX for the row's architecture)."""
        if fmt in ("cuda", "ptx"):
            if self.cuda is None:
                raise LowPrecError("no CUDA build: nvcc is not installed (or this is not a GPU row)")
            return self.cuda.source if fmt == "cuda" else self.cuda.ptx
        parts, stack = [], [self.executable.mod]
        while stack:  # the VM module imports the compiled kernels' module
            module = stack.pop()
            try:
                parts.append(module.inspect_source(fmt))
            except Exception:  # noqa: BLE001 - modules without source of this format (the VM's own)
                pass
            stack.extend(module.imports)
        return "\n".join(p for p in parts if p)

    def remote(self, session) -> "RemoteModel":
        """This model on a board reached through TVM RPC (``tvm.rpc.connect(host, port)``, or a
        tracker's ``request(key)``): the library is exported (:meth:`export_library`), uploaded and
        loaded there, and the returned model runs it on the board's CPU
        (:class:`~tvm_lowprec.remote.RemoteModel`)."""
        from .remote import RemoteModel

        return RemoteModel(self, session)

    def export_library(self, path) -> str:
        """Write the compiled model as a shared library that TVM's runtime on the target loads
        (``tvm.runtime.load_module``, or ``session.load_module`` after ``session.upload`` over RPC).
        AArch64 rows are linked with the cross compiler ``aarch64-linux-gnu-gcc`` (Debian package
        ``gcc-aarch64-linux-gnu``); x86 rows with the host's. Returns the path."""
        from . import qemu

        if qemu.is_aarch64(self.spec):
            return qemu.export_aarch64(self.executable, path)
        self.executable.export_library(str(path))
        return str(path)

    def __repr__(self):
        return (f"Compiled(target={self.spec.name}, execution={self.execution}, inputs={[i.name for i in self.inputs]}, "
                f"kernels={len(self.kernels())})")


def _to_carrier(spec: InputSpec, value: np.ndarray) -> np.ndarray:
    """A 4- or 2-bit input (an ``ml_dtypes`` array, or its values in the 8-bit carrier) as the carrier."""
    import ml_dtypes

    from .frontend.narrow_types import CARRIERS, RANGES

    carrier = CARRIERS[spec.narrow]
    if str(value.dtype) not in (spec.narrow, carrier):
        raise InputError(f"input {spec.name!r}: expected dtype {spec.narrow} (or its values as {carrier}), got {value.dtype}")
    wide = np.asarray(value).astype(getattr(ml_dtypes, carrier, carrier))
    if spec.narrow in RANGES:
        lo, hi = RANGES[spec.narrow][1:]
        if wide.size and (wide.min() < lo or wide.max() > hi):
            raise InputError(f"input {spec.name!r}: {spec.narrow} values must lie in [{lo}, {hi}]")
    elif str(value.dtype) != spec.narrow and not np.array_equal(
            wide.astype(getattr(ml_dtypes, spec.narrow)).astype(np.float32), wide.astype(np.float32), equal_nan=True):
        raise InputError(f"input {spec.name!r}: values are not all {spec.narrow} values")
    return wide


def _from_carrier(out: np.ndarray, narrow: str | None) -> np.ndarray:
    if narrow is None:
        return out
    import ml_dtypes

    return out.astype(getattr(ml_dtypes, narrow))


def _to_numpy(out) -> list[np.ndarray]:
    if hasattr(out, "numpy"):
        return [out.numpy()]
    return [x for item in out for x in _to_numpy(item)]
