"""Compile once: :func:`save` writes a :class:`~tvm_lowprec.compiled.Compiled` to one file, :func:`load`
gives it back, whole.

The file is a zip archive:

``manifest.json``
    the format and the versions that wrote it (tvm-lowprec, TVM, TVM-FFI), the target row (its name,
    LLVM target and the CPU features its code uses), the input specs, output names, the kernel
    table, thread count and what the call path needs (which outputs may be numpy views, which inputs
    the kernels take at any alignment), and the SHA-256 of the library;
``model.so``
    the Relax VM executable exported as a shared library (``VMExecutable.export_library``);
``kernels.json``
    the kernels' PrimFuncs (``tvm.ir.save_json``): :meth:`Compiled.kernels` and
    ``profile(isolated=True)`` read them as after a compile;
``source.asm``, ``source.ll``
    the generated assembly and LLVM IR, which a loaded shared library cannot give back
    (:meth:`Compiled.inspect_source`).

:func:`load` checks the versions (:class:`~tvm_lowprec.errors.SavedModelVersionError`) and that this
host runs the row natively (:class:`~tvm_lowprec.errors.SavedModelHostError`) *before* it loads any
code, then loads the library with ``tvm.runtime.load_module`` from a private temporary file and builds
the Relax VM on it. A file that is not such an archive, or whose members are damaged:
:class:`~tvm_lowprec.errors.SavedModelError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import weakref
import zipfile

from .native_build import export_in_child
from .errors import LowPrecError, SavedModelError, SavedModelHostError, SavedModelVersionError

FORMAT = "tvm-lowprec-saved-model"
FORMAT_VERSION = 1
MANIFEST, LIBRARY, KERNELS = "manifest.json", "model.so", "kernels.json"
SOURCE_FORMATS = ("asm", "ll")


def versions() -> dict:
    """The versions a saved file must match to load: this package's, TVM's and TVM-FFI's."""
    import tvm
    import tvm_ffi

    from . import __version__

    return {"tvm_lowprec": __version__, "tvm": str(tvm.__version__), "tvm_ffi": str(getattr(tvm_ffi, "__version__", ""))}


def savable(compiled) -> str | None:
    """Why ``compiled`` cannot be saved, or None: only x86 CPU rows (an AArch64 row's library needs a
    board; a GPU row's device code runs where TVM sees a GPU): :meth:`Compiled.export_library` for those."""
    from . import qemu

    if not compiled.spec.backend.savable:
        return f"{compiled.spec.name} is a {compiled.spec.backend.name} row"
    if qemu.is_aarch64(compiled.spec):
        return f"{compiled.spec.name} is an AArch64 row, cross-compiled"
    return None


def _target_row(spec) -> dict:
    return {"name": spec.name, "llvm": _jsonable(dict(spec.llvm)), "features": sorted(spec.code_features)}


def _jsonable(value):
    """A target's LLVM dict as JSON (TVM's containers and strings as Python's)."""
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or (hasattr(value, "__iter__") and not isinstance(value, (str, bytes))):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bool, int, float)) or value is None:
        return value
    return str(value)


@contextlib.contextmanager
def quiet_native_log():
    """Silence TVM's C++ log on file descriptor 2 (``export_library`` and ``load_module`` of a VM
    executable print a "Scope Saving:"/"Scope Loaded:" warning per function); errors still raise."""
    import sys

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def save(compiled, path) -> str:
    """Write ``compiled`` (from :func:`tvm_lowprec.compile`) to ``path`` as one file that
    :func:`load` turns back into the same model: outputs, input specs, :meth:`~Compiled.kernels`,
    :meth:`~Compiled.profile`, :attr:`~Compiled.execution`, :attr:`~Compiled.spec` and
    :meth:`~Compiled.inspect_source` (``"asm"``, ``"ll"``). The write is atomic (a temporary file
    in the same folder, then renamed). Returns the path."""
    import tvm

    from .compiled import _output_views

    why = savable(compiled)
    if why is not None:
        raise LowPrecError(f"save: {why}; write its library with Compiled.export_library instead")
    path = os.fspath(path)
    lowered = compiled._lowered
    prims = None
    if lowered is not None:
        prims = tvm.IRModule({g: f for g, f in lowered.functions.items() if isinstance(f, tvm.tirx.PrimFunc)})
    views = compiled._views if compiled._views or lowered is None else _output_views(lowered)
    folder = tempfile.mkdtemp(prefix="tvm-lowprec-save-")
    try:
        library = os.path.join(folder, LIBRARY)
        with quiet_native_log():
            if compiled._library is not None:
                shutil.copyfile(compiled._library, library)
            else:
                export_in_child(compiled.executable, library)
        with open(library, "rb") as f:
            so = f.read()
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            **versions(),
            "target": _target_row(compiled.spec),
            "num_threads": compiled.num_threads,
            "inputs": [{"name": i.name, "shape": list(i.shape), "dtype": i.dtype, "narrow": i.narrow}
                       for i in compiled.inputs],
            "narrow_outputs": list(compiled.narrow_outputs),
            "output_names": list(compiled.output_names) if compiled.output_names is not None else None,
            "output_views": list(views),
            "any_alignment": sorted(compiled._any_alignment),
            "kernels": [{**dataclasses.asdict(k), "shape": list(k.shape)} for k in compiled.kernels()],
            "library_sha256": hashlib.sha256(so).hexdigest(),
            "sources": list(SOURCE_FORMATS),
        }
        members = {MANIFEST: json.dumps(manifest, indent=1).encode(), LIBRARY: so}
        if prims is not None:
            members[KERNELS] = tvm.ir.save_json(prims).encode()
        for fmt in SOURCE_FORMATS:
            members[f"source.{fmt}"] = compiled.inspect_source(fmt).encode()
        _write_atomic(path, members)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return path


def _write_atomic(path: str, members: dict[str, bytes]) -> None:
    """A zip of ``members`` at ``path``: written beside it under a temporary name, then renamed over it
    (a reader never sees a half-written file)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as to any new file
    try:
        with os.fdopen(fd, "wb") as f:
            with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
                for name, data in members.items():
                    archive.writestr(name, data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_manifest(path) -> dict:
    """The manifest of a saved file, its format and versions checked (:class:`SavedModelError`,
    :class:`SavedModelVersionError`)."""
    path = os.fspath(path)
    try:
        with zipfile.ZipFile(path) as archive:
            manifest = json.loads(archive.read(MANIFEST))
    except FileNotFoundError:
        raise
    except (zipfile.BadZipFile, KeyError, ValueError, OSError, EOFError) as err:
        raise SavedModelError(f"{path}: not a readable tvm-lowprec saved model ({type(err).__name__}: {err})") from None
    _check_versions(path, manifest)
    return manifest


def _check_versions(path: str, manifest) -> None:
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise SavedModelError(f"{path}: not a tvm-lowprec saved model (no {FORMAT!r} manifest)")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise SavedModelVersionError(f"{path}: file format version {manifest.get('format_version')!r}; this tvm-lowprec "
                                     f"reads version {FORMAT_VERSION}: compile the model again")
    here = versions()
    differ = [f"{k} {manifest.get(k)!r} (here {v!r})" for k, v in here.items() if manifest.get(k) != v]
    if differ:
        raise SavedModelVersionError(f"{path}: saved with another version: " + ", ".join(differ)
                                     + "; its library may not load with this runtime: compile the model again")


def _spec_of(path: str, row: dict):
    """The target row a file was saved for, as this host resolves it; :class:`SavedModelHostError`
    where this host cannot run it natively."""
    from .targets import host_features, host_supports, native_target, registered_targets, resolve_target

    name, llvm = row.get("name"), row.get("llvm")
    features = set(row.get("features") or ())
    missing = sorted(features - set(host_features()))
    if missing:
        raise SavedModelHostError(f"{path}: compiled for {name}, whose code uses {missing}, which this host lacks; "
                                  "load it on a machine that has them, or compile the model for a row this host runs")
    registered = registered_targets("cpu")
    try:
        if name in registered:
            spec = registered[name]
        elif str(name).startswith("native("):
            spec = native_target()
            if spec.name != name or _jsonable(dict(spec.llvm)) != llvm:
                raise SavedModelHostError(
                    f"{path}: compiled for {name} with LLVM target {llvm}, another host's 'native'; this host's is "
                    f"{spec.name} with {_jsonable(dict(spec.llvm))}: compile for a registered row (e.g. "
                    f"{str(name)[7:-1]!r}) to move a model between machines")
        else:  # a user target dict: its row again, from the same LLVM target
            spec = resolve_target(dict(llvm))
            if spec.name != name:
                raise SavedModelHostError(f"{path}: compiled for {name}; its LLVM target resolves to {spec.name} here")
    except SavedModelHostError:
        raise
    except (ValueError, TypeError, RuntimeError) as err:
        raise SavedModelHostError(f"{path}: compiled for {name}, which this host cannot resolve: {err}") from None
    if not host_supports(spec):
        raise SavedModelHostError(f"{path}: this host does not run {spec.name} natively")
    return spec


def load(path):
    """The :class:`~tvm_lowprec.compiled.Compiled` that :func:`save` wrote to ``path``, ready to run
    (``execution == "native"``). Raises :class:`SavedModelVersionError` for a file from another
    version of tvm-lowprec or TVM, :class:`SavedModelHostError` where this host cannot run the file's
    target row natively, :class:`SavedModelError` for a file that is not a saved model or is damaged;
    no code from the file is loaded before those checks pass."""
    import tvm

    from .compiled import Compiled, InputSpec, KernelInfo

    path = os.fspath(path)
    try:
        with zipfile.ZipFile(path) as archive:
            manifest = json.loads(archive.read(MANIFEST))
            _check_versions(path, manifest)
            spec = _spec_of(path, manifest["target"])
            so = archive.read(LIBRARY)
            kernels_json = archive.read(KERNELS).decode() if KERNELS in archive.namelist() else None
            sources = {fmt: archive.read(f"source.{fmt}").decode() for fmt in manifest.get("sources", ())
                       if f"source.{fmt}" in archive.namelist()}
        if hashlib.sha256(so).hexdigest() != manifest["library_sha256"]:
            raise SavedModelError(f"{path}: the library's checksum does not match the manifest's (a damaged file)")
        inputs = [InputSpec(i["name"], tuple(i["shape"]), i["dtype"], i.get("narrow")) for i in manifest["inputs"]]
        table = [KernelInfo(**{**k, "shape": tuple(k["shape"])}) for k in manifest["kernels"]]
        outputs = manifest["output_views"], manifest["output_names"], manifest["narrow_outputs"]
        any_alignment, num_threads = manifest["any_alignment"], manifest["num_threads"]
    except (SavedModelError, FileNotFoundError):
        raise
    except (zipfile.BadZipFile, KeyError, ValueError, TypeError, OSError, EOFError, UnicodeDecodeError) as err:
        raise SavedModelError(f"{path}: not a readable tvm-lowprec saved model ({type(err).__name__}: {err})") from None
    lowered = None
    if kernels_json is not None:
        try:
            lowered = tvm.ir.load_json(kernels_json)
        except Exception:  # noqa: BLE001 - the stored kernel table stands in (no isolated profile)
            lowered = None
    folder = tempfile.mkdtemp(prefix="tvm-lowprec-load-")
    library = os.path.join(folder, LIBRARY)
    with open(library, "wb") as f:
        f.write(so)
    try:
        with quiet_native_log():
            module = tvm.runtime.load_module(library)
        executable = tvm.runtime.Executable(module)
        compiled = Compiled(executable, lowered, spec, inputs, num_threads=num_threads, narrow_outputs=outputs[2],
                            any_alignment=any_alignment, output_views=outputs[0], output_names=outputs[1],
                            kernel_table=table, sources=sources, library=library)
    except Exception as err:  # noqa: BLE001 - TVM's loader raises its own classes
        shutil.rmtree(folder, ignore_errors=True)
        raise SavedModelError(f"{path}: its library does not load ({type(err).__name__}: {err})") from None
    weakref.finalize(compiled, shutil.rmtree, folder, True)
    compiled.loaded_from = path
    return compiled


def rewrite_manifest(path, **changes) -> None:
    """``path``'s manifest with ``changes`` applied, the other members kept (for tests and tools that
    need a file from "another version")."""
    path = os.fspath(path)
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    manifest = json.loads(members[MANIFEST])
    manifest.update(changes)
    members[MANIFEST] = json.dumps(manifest, indent=1).encode()
    _write_atomic(path, members)


__all__ = ["FORMAT_VERSION", "load", "read_manifest", "save", "savable"]
