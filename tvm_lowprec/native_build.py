"""Machine code made in a child process: an LLVM abort becomes a Python exception that names the kernel.

LLVM reports some failures by aborting the process (``LLVM ERROR: Do not know how to split the result
of this operator!``, ``LLVM ERROR: Cannot select: ...``): SIGABRT, no exception, a user's Jupyter
kernel or server gone without a word. Those errors come from LLVM's back end (instruction selection),
which TVM does not run in ``tvm.tirx.build``: that makes the LLVM IR and runs LLVM's IR optimizations;
the machine code is made later, when the library's first function is looked up (its JIT) or when it is
written as an object file.

So here the parent builds as ``tvm.compile`` does, up to the LLVM module, and a forked child writes the
module's object file; the parent links it (the C compiler, tens of milliseconds), loads it and runs
that. LLVM's back end never runs in the caller's process, and the work is the same: the code
generation the JIT would do moves to the child. If the child dies (a signal, or an exit without its
object), every kernel is compiled alone, again in children, to name the ones LLVM cannot compile, with
LLVM's own message: :class:`~tvm_lowprec.errors.KernelBuildError`.

What stays in-process: LLVM's IR optimizations in ``tvm.tirx.build`` (no abort known there), and the
code of a GPU row's device (nvcc, a process of its own anyway). Without ``os.fork`` or a C compiler,
or with ``TVM_LOWPREC_BUILD_IN_PROCESS=1``, libraries are built in-process as ``tvm.compile`` does.
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import signal
import tempfile
import time
from typing import Callable

from .errors import KernelBuildError

IN_PROCESS_ENV = "TVM_LOWPREC_BUILD_IN_PROCESS"
TIMEOUT_ENV = "TVM_LOWPREC_BUILD_TIMEOUT"
DEFAULT_TIMEOUT_S = 1800.0  # a child that has not finished by then is killed (a hang is no better than an abort)
MESSAGE_TAIL = 2000  # characters of a child's stderr kept in an error


def isolated() -> bool:
    """Whether LLVM's back end runs in child processes here: ``os.fork`` and a C compiler to link the
    object, and ``TVM_LOWPREC_BUILD_IN_PROCESS`` unset (or ``0``)."""
    if os.environ.get(IN_PROCESS_ENV, "0") not in ("", "0"):
        return False
    if not hasattr(os, "fork"):
        return False
    from tvm.support import cc

    return cc.get_cc() is not None


def _timeout() -> float:
    try:
        return float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S


def run_in_child(work: Callable[[], None], folder: str) -> tuple[bool, str]:
    """Run ``work()`` in a forked child whose standard error goes to a file in ``folder``. Returns
    ``(ok, what)``: ``ok`` when the child returned normally; ``what`` says how it ended otherwise (the
    signal, or the Python exception) with the tail of its standard error, where LLVM writes its message."""
    import sys

    err_path = os.path.join(folder, f"child-{time.monotonic_ns()}.stderr")
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's code
        code = 0
        try:
            faulthandler.disable()  # a dump of the Python stack to the parent's stderr says nothing LLVM's message does not
            fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(fd, 2)
            work()
        except BaseException as err:  # noqa: BLE001 - reported to the parent through the file
            try:
                os.write(2, f"\n{type(err).__name__}: {err}\n".encode(errors="replace"))
            except OSError:
                pass
            code = 3
        os._exit(code)  # no atexit handlers, no flush of buffers inherited from the parent
    deadline = time.monotonic() + _timeout()
    delay = 0.001
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return False, f"killed after {_timeout():.0f} s (${TIMEOUT_ENV})"
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    message = ""
    try:
        with open(err_path, errors="replace") as f:
            message = f.read()[-MESSAGE_TAIL:].strip()
    except OSError:
        pass
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return False, f"{signal.Signals(sig).name}" + (f": {message}" if message else "")
    if os.WEXITSTATUS(status) != 0:
        return False, f"exit status {os.WEXITSTATUS(status)}" + (f": {message}" if message else "")
    return True, message


def tir_pipeline(target) -> str:
    """The TIR pipeline a CPU row's kernels are built with (:mod:`~tvm_lowprec.stack_allocations`: TVM's
    default, small buffers kept on the stack); TVM's default for other targets."""
    if target.kind.name != "llvm":
        return "default"
    from .stack_allocations import register

    return register()


def kernel_library(tir_mod, target):
    """``tvm.tirx.build(tir_mod, target)`` as a library ready to run: the LLVM module's machine code
    made by a child process (:func:`run_in_child`), linked and loaded here. Returns ``(llvm_module,
    runnable_module)``: the first for ``inspect_source`` and ``export_library`` (both run LLVM's back
    end: call them through :func:`text_in_child` / :func:`export_in_child`), the second to call.
    Raises :class:`KernelBuildError` naming the kernels LLVM cannot compile."""
    import tvm

    lib = tvm.tirx.build(tir_mod, target=target, pipeline=tir_pipeline(target))
    if not isolated() or target.kind.name != "llvm":
        return lib, lib
    return lib, _load_object(lib, tir_mod, target)


def _load_object(lib, tir_mod, target):
    import tvm
    from tvm.support import cc

    folder = tempfile.mkdtemp(prefix="tvm-lowprec-build-")
    try:
        obj, so = os.path.join(folder, "kernels.o"), os.path.join(folder, "kernels.so")
        ok, what = run_in_child(lambda: lib.write_to_file(obj), folder)
        if not ok or not os.path.exists(obj):
            raise KernelBuildError(_failure(tir_mod, target, folder, what))
        cc.create_shared(so, [obj])
        return tvm.runtime.load_module(so)  # loaded (mapped): the file may go
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _failure(tir_mod, target, folder: str, what: str) -> str:
    """The error message of a library LLVM could not compile: each kernel built alone in children,
    those that fail named with LLVM's message."""
    import tvm

    funcs = [(gv, f) for gv, f in tir_mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    failed: list[str] = []
    start = 0
    while start < len(funcs):
        progress = os.path.join(folder, "progress")

        def build_each(first=start):
            for i in range(first, len(funcs)):
                with open(progress, "w") as f:
                    f.write(str(i))
                gv, func = funcs[i]
                one = tvm.IRModule({gv: func}, attrs=tir_mod.attrs)
                tvm.tirx.build(one, target=target, pipeline=tir_pipeline(target)).write_to_file(os.path.join(folder, "one.o"))
            with open(progress, "w") as f:
                f.write(str(len(funcs)))

        ok, why = run_in_child(build_each, folder)
        if ok:
            break
        try:
            with open(progress) as f:
                index = int(f.read() or start)
        except (OSError, ValueError):
            index = start
        if index >= len(funcs):
            break
        failed.append(f"{funcs[index][0].name_hint}: {why}")
        start = index + 1
    mcpu = target.attrs.get("mcpu", None)
    target_name = f"{target.kind.name} -mcpu={mcpu}" if mcpu else str(target.kind.name)
    if not failed:
        return (f"LLVM could not compile the kernel library for {target_name} ({what}), though each of its "
                f"{len(funcs)} kernels compiles alone")
    return (f"LLVM cannot compile {len(failed)} of {len(funcs)} kernels for {target_name} "
            f"(the build ran in a child process; yours is unharmed):\n  " + "\n  ".join(failed))


def build_executable(lowered, target):
    """``tvm.compile(lowered, target, relax_pipeline=None)`` for a CPU target whose code runs here,
    with LLVM's back end in a child (:func:`kernel_library`). Returns ``(executable, runnable)``: the
    executable as ``tvm.compile`` makes it (its kernel library not compiled to machine code: for
    :meth:`export_library` and ``inspect_source``, through :func:`export_in_child`/:func:`text_in_child`)
    and the one to run, on the loaded library."""
    import tvm
    from tvm import relax
    from tvm.relax import vm_build

    attrs = dict(lowered.attrs) if lowered.attrs else {}
    if not isolated() or attrs.get("external_mods"):
        executable = tvm.compile(lowered, target=target, relax_pipeline=None, tir_pipeline=tir_pipeline(target))
        return executable, executable
    builder = relax.ExecBuilder()
    tir_mod = vm_build._filter_tir(vm_build._vmcodegen(builder, lowered, "bytecode"))
    if tir_mod is None or not tir_mod.get_global_vars():
        executable = link_vm(lowered, target, None, builder)
        return executable, executable
    lib, loaded = kernel_library(vm_build._auto_attach_system_lib_prefix(tir_mod, target, None), target)
    # a builder is consumed by its link: the runnable one links the same bytecode again
    return link_vm(lowered, target, lib, builder), link_vm(lowered, target, loaded)


def link_vm(lowered, target, kernels, builder=None):
    """The Relax VM executable of ``lowered``'s bytecode (as ``tvm.compile`` emits it) on the kernel
    module ``kernels`` (TVM's LLVM module, a loaded library, an emulated one), its constants linked in.
    ``builder``: one that already holds ``lowered``'s bytecode (else it is emitted here)."""
    from tvm import relax
    from tvm.relax import vm_build

    if builder is None:
        builder = relax.ExecBuilder()
        vm_build._vmcodegen(builder, lowered, "bytecode")
    attrs = dict(lowered.attrs) if lowered.attrs else {}
    params = dict(attrs.get("const_name_to_constant", {}))
    return vm_build.VMExecutable(vm_build._ffi_api.VMLink(builder, target, kernels, [], params))


def text_in_child(make: Callable[[], str], what: str) -> str:
    """``make()`` (which runs LLVM's back end, e.g. ``module.inspect_source("asm")``) in a child when
    :func:`isolated`; :class:`KernelBuildError` naming ``what`` if the child dies."""
    if not isolated():
        return make()
    folder = tempfile.mkdtemp(prefix="tvm-lowprec-text-")
    try:
        out = os.path.join(folder, "text")

        def work():
            text = make()
            with open(out, "w") as f:
                f.write(text)

        ok, why = run_in_child(work, folder)
        if not ok or not os.path.exists(out):
            raise KernelBuildError(f"{what}: LLVM failed in a child process ({why})")
        with open(out) as f:
            return f.read()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def export_in_child(executable, path: str, **kwargs) -> str:
    """``executable.export_library(path, **kwargs)`` (LLVM's back end, the C compiler) in a child when
    :func:`isolated`; :class:`KernelBuildError` if the child dies or writes nothing."""
    if not isolated():
        executable.export_library(path, **kwargs)
        return path
    folder = tempfile.mkdtemp(prefix="tvm-lowprec-export-")
    try:
        ok, why = run_in_child(lambda: executable.export_library(path, **kwargs), folder)
        if not ok or not os.path.exists(path):
            raise KernelBuildError(f"export_library({path}): LLVM failed in a child process ({why})")
        return path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


__all__ = ["build_executable", "export_in_child", "isolated", "kernel_library", "link_vm", "run_in_child", "text_in_child"]
