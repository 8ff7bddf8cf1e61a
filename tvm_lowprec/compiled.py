"""The user-facing compiled model: call it with numpy arrays, inspect its kernels and assembly."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from .errors import InputError, LowPrecError
from .kernel_cost import buffer_bytes, call_ops, param_buffers
from .native_build import export_in_child, kernel_library, text_in_child


_POOL_THREADS = None  # what TVM's runtime pool was last configured to by a Compiled
_SAME = object()  # Compiled(runnable=...) default: the executable itself runs


@dataclass(frozen=True)
class KernelInfo:
    """One generated kernel: its name, the operator it implements, its intrinsic, its shape, and
    where its schedule came from: tuning records (``"tuned"``), the default rules (``"default"``), the
    last-resort generic rule (``"generic"``: parallel and vectorized loops, no intrinsic;
    :mod:`tvm_lowprec.schedule.generic`), or nowhere (``"none"``: even the generic rule failed, so its
    loops run as written, serial and scalar)."""

    name: str
    op: str
    intrinsic: str
    shape: tuple
    schedule: str = "default"
    ops: int | None = None  # operations per call (2 per multiply-add), where the op defines them (GEMMs)
    reads: int | None = None  # bytes of the parameter buffers one call reads (None: a symbolic shape)
    writes: int | None = None  # bytes of the parameter buffers one call writes
    folded: int | None = None  # a lookup kernel: the element-wise operators its table stands for

    @property
    def bytes(self) -> int | None:
        """Bytes one call moves: ``reads + writes``, or None where a shape is symbolic."""
        return None if self.reads is None or self.writes is None else self.reads + self.writes

    def as_row(self) -> dict:
        return {"name": self.name, "op": self.op, "intrinsic": self.intrinsic, "shape": "x".join(map(str, self.shape)),
                "schedule": self.schedule}


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple
    dtype: str
    narrow: str | None = None  # "int4", "uint4", "int2", "uint2": the ONNX type ``dtype`` carries

    def __post_init__(self):
        # What a call compares against, made once: the dtype as a numpy dtype (None where numpy and
        # ml_dtypes do not spell it as ``dtype``: then the strings are compared), the shape with None
        # for a symbolic dimension, and whether the shape is all fixed (then one tuple comparison).
        object.__setattr__(self, "_dtype", _numpy_dtype(self.dtype))
        object.__setattr__(self, "_dims", tuple(d if isinstance(d, int) else None for d in self.shape))
        object.__setattr__(self, "_fixed", all(isinstance(d, int) for d in self.shape))

    def mismatch(self, value: np.ndarray) -> str | None:
        """Why ``value`` (already in the carrier type, for a narrow input) cannot be this input, or None."""
        expected = self._dtype
        if (value.dtype != expected) if expected is not None else (str(value.dtype) != self.dtype):
            return f"input {self.name!r}: expected dtype {self.dtype}, got {value.dtype}"
        shape = value.shape
        if shape != self._dims and (self._fixed or len(shape) != len(self._dims) or any(
                d is not None and d != v for d, v in zip(self._dims, shape))):
            return f"input {self.name!r}: expected shape {list(self.shape)}, got {list(shape)}"
        return None


def _numpy_dtype(name: str) -> np.dtype | None:
    """``name`` as a numpy dtype whose ``str`` is ``name`` again (ml_dtypes' for bfloat16, float8...),
    or None."""
    try:
        dtype = np.dtype(name)
    except TypeError:
        try:
            import ml_dtypes
        except ImportError:
            return None
        dtype = np.dtype(getattr(ml_dtypes, name)) if hasattr(ml_dtypes, name) else None
    return dtype if dtype is not None and str(dtype) == name else None


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
        call_ops(attrs),
        *_traffic(func),
        folded=int(attrs["lowprec.folded"]) if "lowprec.folded" in attrs else None,
    )


def _traffic(func) -> tuple[int | None, int | None]:
    """Bytes of the parameter buffers one call reads and writes, each buffer whole (shape x dtype
    size), which the root block's access regions sort into read and written (a buffer accessed
    opaquely, e.g. through a pointer, counts as both, as in TVM's own analysis; without a root block:
    the last buffer written, the others read). A lookup counts its whole table though it gathers some
    rows. (None, None) where a buffer's shape is symbolic."""
    from tvm.s_tir.analysis import get_sblock_access_region

    buffers = param_buffers(func)
    sizes = [buffer_bytes(b) for b in buffers]
    if any(size is None for size in sizes):
        return None, None
    if isinstance(func.body, tvm.s_tir.SBlockRealize):
        reads, writes, opaque = get_sblock_access_region(func.body.block, {b: b for b in buffers})
        if not (reads or writes or opaque):  # blocks that declare no regions (a loop_partition's)
            reads, writes = _leaf_regions(func)
        read = {id(b) for b in buffers if any(r.source.same_as(b) for r in [*reads, *opaque])}
        written = {id(b) for b in buffers if any(r.source.same_as(b) for r in [*writes, *opaque])}
    else:
        read, written = {id(b) for b in buffers[:-1]}, {id(b) for b in buffers[-1:]}
    return (sum(n for b, n in zip(buffers, sizes) if id(b) in read),
            sum(n for b, n in zip(buffers, sizes) if id(b) in written))


def _leaf_regions(func) -> tuple[list, list]:
    """The read and written regions every block of ``func`` declares (the blocks walked by hand: a
    loop_partition's output defines its block variables once per piece, which ``Schedule`` refuses)."""
    reads, writes, stack = [], [], [func.body]
    while stack:
        node = stack.pop()
        if isinstance(node, tvm.s_tir.SBlock):
            reads.extend(node.reads)
            writes.extend(node.writes)
        stack.extend(getattr(node, "seq", ()))
        stack.extend(c for c in (getattr(node, n, None) for n in ("block", "body", "then_case", "else_case"))
                     if isinstance(c, (tvm.tirx.Stmt, tvm.s_tir.SBlock)))
    return reads, writes


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
                 runnable=_SAME, emulation=None, cuda=None, narrow_outputs=(), any_alignment=frozenset(), *,
                 output_views=None, output_names=None, kernel_table=None, sources=None, library=None):
        """``runnable``: the executable that runs (default ``executable``; the emulated one; or None
        where this host can run neither); ``emulation``: its :class:`~tvm_lowprec.emulation.EmulationReport`;
        ``cuda``: a GPU row's device code compiled by nvcc (:class:`~tvm_lowprec.cuda.model.CudaBuild`);
        ``any_alignment``: positions of the inputs whose kernels take them at any alignment
        (:func:`~tvm_lowprec.unaligned_inputs.unaligned_inputs`), passed without a copy however numpy
        aligned them.

        A model loaded from a file (:func:`tvm_lowprec.load`) has no Relax ``main``: ``lowered_mod``
        holds its kernels' PrimFuncs only (or is None), and what :func:`tvm_lowprec.save` stored
        stands in for the rest: ``output_views`` (:func:`_output_views`), ``output_names``,
        ``kernel_table`` (:meth:`kernels`, where ``lowered_mod`` is None), ``sources`` (format ->
        :meth:`inspect_source` text; the loaded library has none) and ``library`` (the shared
        library's path, which :meth:`export_library` copies)."""
        self.executable = executable  # the real build: inspect_source shows its code
        self.spec = spec
        self.inputs = tuple(inputs)
        self.num_threads = num_threads
        self.emulation = emulation
        self._lowered = lowered_mod
        self.cuda = cuda
        self.narrow_outputs = tuple(narrow_outputs)  # per output: its 4-/2-bit ONNX type, or None
        self._runnable = executable if runnable is _SAME else runnable
        self._device = spec.backend.device() if self._runnable is not None else tvm.cpu()
        self._vm = relax.VirtualMachine(self._runnable, self._device) if self._runnable is not None else None
        # the call path: main looked up once; inputs and outputs shared with numpy where on this CPU
        self._main = self._vm["main"] if self._vm is not None else None
        self._host = self._device.dlpack_device_type() == tvm_ffi.DLDeviceType.kDLCPU
        if output_views is not None:
            self._views = tuple(output_views) if self._host else ()
        else:
            self._views = _output_views(lowered_mod) if self._host and lowered_mod is not None else ()
        self._any_alignment = frozenset(any_alignment)
        self.output_names = tuple(output_names) if output_names is not None else _output_names(lowered_mod)
        self._kernel_table = tuple(kernel_table) if kernel_table is not None else None
        self._sources = dict(sources or {})
        self._library = library
        self.loaded_from: str | None = None  # the file :func:`tvm_lowprec.load` read this model from

    @property
    def execution(self) -> str:
        """``"native"``, ``"emulated"`` (the target's instructions replaced by their semantics in generic
        code: exact results, meaningless times) or ``"none"`` (this host can run neither)."""
        if self._runnable is None:
            return "none"
        return "emulated" if self.emulation is not None else self.spec.backend.runs_as

    def _require(self, timed: bool = False):
        if self._runnable is None:
            raise LowPrecError(self.spec.backend.cannot_run(self.spec))
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
        if len(args) == 1 and not kwargs and type(args[0]) is not np.ndarray and isinstance(args[0], Mapping):
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
        return [self._check(spec, np.asarray(a), device, i in self._any_alignment)
                for i, (spec, a) in enumerate(zip(self.inputs, args))]

    def _check(self, spec: InputSpec, value: np.ndarray, device=None, any_alignment: bool = False):
        """``value`` checked against ``spec`` (cached dtype and shape: no strings built unless it fails)
        as a tensor on ``device`` (default: the model's); on this host's CPU without a copy where
        :func:`_host_tensor` can."""
        if spec.narrow is not None:
            value = _to_carrier(spec, value)
        problem = spec.mismatch(value)
        if problem is not None:
            raise InputError(problem)
        if device is None and self._host:
            return _host_tensor(value, any_alignment)
        return tvm.runtime.tensor(np.require(value, requirements="C"), device or self._device)  # keeps 0-d arrays 0-d

    def __call__(self, *args, out=None, **kwargs) -> list[np.ndarray]:
        """Run the model: the outputs as a list of numpy arrays.

        On the CPU, inputs go in without a copy where their memory allows (C-contiguous, writeable, a
        dtype DLPack carries, and 64-byte aligned unless the kernels reading the input take it at any
        alignment, :mod:`~tvm_lowprec.unaligned_inputs`; :func:`_host_tensor`), else with one copy; the outputs
        come back as numpy arrays over the memory the VM allocated for them in this call (it stays alive
        while an array refers to it; the next call gets new memory). ``out=[arrays]`` (one per output,
        of its shape and dtype) receives the outputs instead, by one copy each, and is returned: the
        Relax VM allocates a model's outputs inside ``main`` (``R.vm.alloc_storage`` +
        ``R.vm.alloc_tensor``) and has no entry point that takes the destinations. An input named
        ``out`` is passed by position or in a dict.
        """
        self._require()
        self._set_threads()
        if out is not None and not isinstance(out, (list, tuple)) and any(i.name == "out" for i in self.inputs):
            kwargs, out = {**kwargs, "out": out}, None  # the model's own input "out", by name
        result = _to_numpy(self._main(*self._arguments(args, kwargs)), self._views)
        if self.narrow_outputs:
            result = ([_from_carrier(o, narrow) for o, narrow in zip(result, self.narrow_outputs)]
                      + result[len(self.narrow_outputs):])
        return result if out is None else _copy_into(result, out, self.output_names)

    def benchmark(self, *args, number: int = 10, repeat: int = 5, **kwargs) -> float:
        """Median seconds per call, measured by TVM's time evaluator (no Python overhead)."""
        self._require(timed=True)
        self._set_threads()
        tensors = self._arguments(args, kwargs)
        timer = self._vm.time_evaluator("main", self._device, number=number, repeat=repeat)
        return float(np.median(timer(*tensors).results))

    def profile(self, *args, repeat: int = 20, isolated: bool = False, **kwargs) -> list[dict]:
        """Per-kernel time: one row per generated kernel (its :meth:`kernels` fields plus ``ms``, its time
        per model run summed over all its calls (identical layers share one kernel), median over
        ``repeat`` runs, ``calls`` per run, ``gops`` (GEMMs, integer and float, and integer depthwise
        kernels: ``ops`` per second; None for the rest), ``bytes`` one call reads and writes (:attr:`KernelInfo.bytes`: its
        parameter buffers whole; None for a symbolic shape), ``gbs`` (``bytes x calls`` per second),
        ``pct_copy`` (the kernels without ``gops``: ``gbs`` as a percentage of this host's copy
        bandwidth at the same bytes and thread count, :func:`~tvm_lowprec.bench.bandwidth.copy_bandwidth`,
        measured on the first profile of a process; None on a GPU) and ``share`` of the summed kernel
        time), slowest first.

        Times come from a VM instrument around each kernel call; the callback's own overhead (a few
        microseconds a call) is included, so sub-10 us kernels read high (and their GB/s low).
        ``isolated=True`` times each kernel alone instead (:func:`_isolated_seconds`: all kernels built
        in one library, each run by TVM's time evaluator on its own buffers, filled with random codes
        and floats, zeros for 32- and 64-bit integers such as indices and biases) and multiplies by its
        calls per run from ``repeat`` instrumented runs: no callback overhead, but every kernel finds
        its operands in cache as often as its own loop brings them there, not as the model leaves them.
        Its rows say ``timed: "isolated"``; a kernel with a symbolic shape keeps its in-model time
        (``timed: "in model"``).
        """
        import time

        from .bench.bandwidth import copy_bandwidth, pct_of_copy

        self._require(timed=True)
        if isolated and not self.spec.backend.isolated_profile:
            raise LowPrecError(f"profile(isolated=True) times CPU kernels; a {self.spec.backend.name} row's kernels are "
                               "timed in the model")
        if isolated and self._lowered is None:
            raise LowPrecError("profile(isolated=True) needs the kernels' IR, which this loaded model lacks")
        self._set_threads()
        ceiling = copy_bandwidth() if self.spec.backend.copy_bandwidth else None  # before the VM's workers spin
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
        alone = _isolated_seconds(self._lowered, self.spec.tvm_target(self.num_threads or 2), self._device,
                                  [name for name in samples]) if isolated else {}
        rows = []
        for info in self.kernels():
            times = samples.get(info.name)
            if times:
                calls = len(times) // repeat
                if info.name in alone:
                    per_run = alone[info.name] * calls
                else:
                    per_run = float(np.median(times)) * len(times) / repeat  # a kernel may run several times
                gops = info.ops * calls / per_run / 1e9 if info.ops else None
                gbs = info.bytes * calls / per_run / 1e9 if info.bytes is not None else None
                pct = pct_of_copy(info.bytes, gbs, ceiling) if gops is None else None
                rows.append({**info.as_row(), "ms": per_run * 1e3, "calls": calls, "gops": gops,
                             "bytes": info.bytes, "gbs": gbs, "pct_copy": pct,
                             "timed": "isolated" if info.name in alone else "in model"})
        total = sum(r["ms"] for r in rows) or 1.0
        for r in rows:
            r["share"] = r["ms"] / total
        return sorted(rows, key=lambda r: -r["ms"])

    # -- inspecting ------------------------------------------------------------------------------
    def kernels(self) -> list[KernelInfo]:
        """One row per generated kernel: name, operator, tensor intrinsic (or ``"none"``), shape."""
        if self._lowered is None and self._kernel_table is not None:
            return list(self._kernel_table)
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
        if fmt in self._sources:  # a loaded model: the text stored when it was saved
            return self._sources[fmt]
        def collect() -> str:
            parts, stack = [], [self.executable.mod]
            while stack:  # the VM module imports the compiled kernels' module
                module = stack.pop()
                try:
                    parts.append(module.inspect_source(fmt))
                except Exception:  # noqa: BLE001 - modules without source of this format (the VM's own)
                    pass
                stack.extend(module.imports)
            return "\n".join(p for p in parts if p)

        if fmt == "ll":  # LLVM IR as built: LLVM's back end does not run
            return collect()
        return text_in_child(collect, f"inspect_source({fmt!r})")  # assembly: LLVM's back end, in a child

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

        if self._library is not None:  # a loaded model: the library it was loaded from
            import shutil

            shutil.copyfile(self._library, path)
            return str(path)
        if qemu.is_aarch64(self.spec):
            return qemu.export_aarch64(self.executable, path)
        return export_in_child(self.executable, str(path))

    def __repr__(self):
        return (f"Compiled(target={self.spec.name}, execution={self.execution}, inputs={[i.name for i in self.inputs]}, "
                f"kernels={len(self.kernels())})")


def random_inputs(compiled: Compiled, seed: int = 0) -> dict:
    """Inputs for a run of ``compiled`` (a timing, a smoke test): normal floats; 8-bit inputs over their
    whole range; wider integer inputs token-id-like (0..999), and any input named like a mask all
    ones. :class:`InputError` for an input with a dynamic dimension."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for spec in compiled.inputs:
        if any(not isinstance(d, int) for d in spec.shape):
            raise InputError(f"input {spec.name!r} has a dynamic shape {list(spec.shape)}")
        if spec.dtype.startswith("float"):
            inputs[spec.name] = rng.standard_normal(spec.shape).astype(spec.dtype)
        elif "mask" in spec.name.lower():
            inputs[spec.name] = np.ones(spec.shape, spec.dtype)
        elif np.dtype(spec.dtype).itemsize == 1:
            info = np.iinfo(spec.dtype)
            inputs[spec.name] = rng.integers(info.min, info.max + 1, spec.shape).astype(spec.dtype)
        else:
            inputs[spec.name] = rng.integers(0, 1000, spec.shape).astype(spec.dtype)
    return inputs


def _isolated_seconds(lowered, target, device, names, min_repeat_ms: int = 20, repeat: int = 5) -> dict[str, float]:
    """Seconds per call of each kernel ``names`` of ``lowered`` run alone: the kernels with fixed
    shapes built into one library for ``target`` and each timed by TVM's time evaluator (median of
    ``repeat`` runs of at least ``min_repeat_ms``) on buffers of its parameters' shapes: random 8-bit
    codes and normal floats, zeros for wider integers (indices stay in range, biases neutral)."""
    funcs = {}
    for gvar, func in lowered.functions.items():
        if gvar.name_hint in names and isinstance(func, tvm.tirx.PrimFunc):
            if all(buffer_bytes(p) is not None for p in func.params if hasattr(p, "shape")):
                funcs[gvar.name_hint] = func.with_attr("global_symbol", gvar.name_hint)
    if not funcs:
        return {}
    _, lib = kernel_library(tvm.IRModule(funcs), target)  # LLVM's back end in a child process
    rng = np.random.default_rng(0)
    seconds = {}
    for name, func in funcs.items():
        args = [tvm.runtime.tensor(_random_fill(rng, p), device) for p in func.params]
        timer = lib.time_evaluator(name, device, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms)
        seconds[name] = float(np.median(timer(*args).results))
    return seconds


def _random_fill(rng, buffer) -> np.ndarray:
    shape, dtype = tuple(int(d) for d in buffer.shape), str(buffer.dtype)
    kind = np.dtype(bool) if dtype == "bool" else _numpy_dtype(dtype)
    if kind is None:
        raise LowPrecError(f"profile(isolated=True): no numpy type for a {dtype} buffer of {list(shape)}")
    if kind.kind == "f":
        return rng.standard_normal(shape).astype(kind)
    if kind.kind in "iu" and kind.itemsize == 1:
        info = np.iinfo(kind)
        return rng.integers(info.min, info.max + 1, size=shape, dtype=kind)
    return np.zeros(shape, dtype=kind)


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


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose data is 64-byte aligned (what :func:`_host_tensor` passes
    to the kernels without a copy)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    buffer = np.empty(nbytes + 63, np.uint8)
    offset = -buffer.ctypes.data & 63
    return np.ndarray(tuple(shape), dtype, buffer, offset)


def _host_tensor(value: np.ndarray, any_alignment: bool = False):
    """``value`` as a CPU tensor: its own memory through DLPack where TVM's kernels can take it (C-
    contiguous, data 64-byte aligned, writeable: numpy refuses to export a read-only array by the
    DLPack version tvm_ffi asks for), else a 64-byte aligned copy (one memcpy), or TVM's own copy for
    the dtypes numpy cannot export (ml_dtypes' bfloat16, float8, int4). A 0-d array stays 0-d; an empty
    one (a past of length 0) is a new empty tensor.

    64 bytes because the generated code assumes it: TVM marks every argument buffer
    ``storage_alignment`` 64, LLVM then emits aligned vector moves (``vmovaps``/``vmovdqa64``), and a
    vectorized kernel handed numpy's usual 16-byte aligned data dies with SIGSEGV (seen here with
    TVM 0.27; ``tvm.runtime.from_dlpack`` requires 64 for the same reason). ``any_alignment``: the
    model's kernels take this input at any alignment (:mod:`~tvm_lowprec.unaligned_inputs`): no copy
    for alignment."""
    if value.size == 0:  # numpy's strides of an empty array are not the compact ones TVM checks (an empty past)
        return tvm.runtime.empty(value.shape, str(value.dtype), tvm.cpu())
    try:
        if value.flags.c_contiguous and value.flags.writeable:
            tensor = tvm_ffi.from_dlpack(value)
            if not tensor.data_ptr() & 63 or any_alignment and not tensor.data_ptr() % max(value.itemsize, 1):
                return tensor
        copy = aligned_empty(value.shape, value.dtype)
        np.copyto(copy, value)
        return tvm_ffi.from_dlpack(copy)
    except (BufferError, TypeError):  # a dtype numpy's DLPack export lacks
        return tvm.runtime.tensor(np.require(value, requirements="C"), tvm.cpu())


# dtypes whose tensors numpy's DLPack import takes (not ml_dtypes' bfloat16, float8, int4)
_VIEWABLE = frozenset(["bool", "float16", "float32", "float64"] + [f"{s}int{b}" for s in ("", "u") for b in (8, 16, 32, 64)])
_ALLOC_TENSOR = ("relax.vm.alloc_tensor", "relax.builtin.alloc_tensor")


def _output_views(mod) -> tuple[bool, ...]:
    """Per output of the lowered ``main``, flattened as :func:`_to_numpy` does: whether the caller may
    get a numpy view of it. Only a tensor allocated in each call is one: ``R.vm.alloc_tensor`` on storage
    that ``R.vm.alloc_storage`` made in the same call (or ``R.builtin.alloc_tensor``), returned once, of a
    dtype in ``_VIEWABLE``. Everything else is copied: an input, its ``vm.builtin.reshape`` view, a
    constant, a second return of one tensor, storage from elsewhere (a cached allocation)."""
    if "main" not in [g.name_hint for g in mod.get_global_vars()]:
        return ()
    main = mod["main"]
    bound = {b.var: b.value for block in main.body.blocks for b in block.bindings}

    def resolve(expr):
        while isinstance(expr, relax.Var) and isinstance(bound.get(expr), (relax.Var, relax.Tuple)):
            expr = bound[expr]
        return expr

    def is_call(expr, names):
        return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name in names

    seen = set()

    def fresh(var) -> bool:
        value = bound.get(var) if isinstance(var, relax.Var) else None
        if not is_call(value, _ALLOC_TENSOR) or var in seen:
            return False
        seen.add(var)
        storage = bound.get(value.args[0]) if value.op.name == "relax.vm.alloc_tensor" else None
        own = value.op.name == "relax.builtin.alloc_tensor" or is_call(storage, ("relax.vm.alloc_storage",))
        return own and str(getattr(var.ty, "dtype", "")) in _VIEWABLE

    def leaves(expr) -> list[bool]:
        expr = resolve(expr)
        if isinstance(expr, relax.Tuple):
            return [v for field in expr.fields for v in leaves(field)]
        return [fresh(expr)]

    return tuple(leaves(main.body.body))


def _flatten(out) -> list:
    if hasattr(out, "numpy"):
        return [out]
    return [x for item in out for x in _flatten(item)]


def _to_numpy(out, views=()) -> list[np.ndarray]:
    """The VM's result (a tensor, or nested tuples of them) as numpy arrays: output ``i`` a view of its
    tensor's memory where ``views[i]`` (:func:`_output_views`; the array keeps the tensor alive), a copy
    elsewhere."""
    if hasattr(out, "numpy"):  # one output, the common case
        return [np.from_dlpack(out) if views == (True,) else out.numpy()]
    tensors = _flatten(out)
    if len(views) != len(tensors):
        views = (False,) * len(tensors)
    return [np.from_dlpack(t) if view else t.numpy() for t, view in zip(tensors, views)]


def _output_names(mod) -> tuple[str, ...] | None:
    """The ONNX output names the frontend recorded on ``main`` (``lowprec.output_names``), or None."""
    if mod is None or "main" not in [g.name_hint for g in mod.get_global_vars()]:
        return None
    attrs = mod["main"].attrs
    names = attrs.get("lowprec.output_names", None) if attrs is not None else None
    return tuple(str(n) for n in names) if names is not None else None


def _copy_into(result: list[np.ndarray], out, names) -> list[np.ndarray]:
    """``Compiled(..., out=out)``: each output copied into the caller's array, which must have its
    shape and dtype; returns ``out`` as a list."""
    if not isinstance(out, (list, tuple)) or len(out) != len(result):
        raise InputError(f"out= takes a list of {len(result)} array(s), one per output, got {type(out).__name__}"
                         + (f" of {len(out)}" if isinstance(out, (list, tuple)) else ""))
    for i, (target, value) in enumerate(zip(out, result)):
        if not isinstance(target, np.ndarray) or target.shape != value.shape or target.dtype != value.dtype:
            name = f" ({str(names[i])!r})" if names is not None and i < len(names) else ""
            got = (f"shape {list(target.shape)} dtype {target.dtype}" if isinstance(target, np.ndarray)
                   else type(target).__name__)
            raise InputError(f"out[{i}]{name}: expected shape {list(value.shape)} dtype {value.dtype}, got {got}")
        np.copyto(target, value)
    return list(out)
