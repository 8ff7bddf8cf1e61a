"""The compile cache: ``tvm_lowprec.compile(mod, cache=True)`` and ``tvm-lowprec run`` keep each
compiled model as a :func:`tvm_lowprec.save` file named by a hash of everything the build depends on,
and load it instead of compiling again.

The key (SHA-256) covers: the model (the Relax IRModule's structural hash, which covers its
constants, and its TVMScript text; and the ONNX file's bytes and import options where the CLI
compiles from a file), the target row (its name, LLVM target and the CPU features its code uses),
every compile option, tuning records (the files of a ``database`` folder, and the records shipped
for the row), and the versions: tvm-lowprec's, a digest of its source files (an edited checkout
never gets a stale build), TVM's and TVM-FFI's.

Where: ``cache=True`` uses ``$TVM_LOWPREC_CACHE_DIR``, else ``$XDG_CACHE_HOME/tvm-lowprec``, else
``~/.cache/tvm-lowprec``; ``cache="some/dir"`` that folder. Only builds this host runs natively are
cached (an emulated, AArch64 or GPU build is compiled each time). Entries are written atomically; an
entry that cannot be read (damaged, from another version) is removed, with a warning, and the model
compiled again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import warnings
from pathlib import Path

SUFFIX = ".tlp"
ENV_DIR = "TVM_LOWPREC_CACHE_DIR"


def default_dir() -> Path:
    """``$TVM_LOWPREC_CACHE_DIR``, else ``$XDG_CACHE_HOME/tvm-lowprec``, else ``~/.cache/tvm-lowprec``."""
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "tvm-lowprec"
    return Path.home() / ".cache" / "tvm-lowprec"


def cache_dir(cache) -> Path | None:
    """The folder ``compile(cache=...)`` names: None for False/None, :func:`default_dir` for True,
    else the path given."""
    if cache is None or cache is False:
        return None
    if cache is True:
        return default_dir()
    if isinstance(cache, (str, os.PathLike)):
        return Path(cache).expanduser()
    raise TypeError(f"cache must be True, False or a folder, not {type(cache).__name__}")


@functools.lru_cache(maxsize=1)
def _package_digest() -> str:
    """SHA-256 over the package's Python sources (names and bytes)."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for file in sorted(root.rglob("*.py")):
        h.update(str(file.relative_to(root)).encode() + b"\0")
        h.update(file.read_bytes())
    return h.hexdigest()


def _tree_digest(path) -> str:
    """SHA-256 over a file's bytes, or every file under a folder (names and bytes)."""
    path = Path(path)
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        h.update(str(file.relative_to(path) if file != path else file.name).encode() + b"\0")
        h.update(file.read_bytes())
    return h.hexdigest()


def module_digest(mod) -> str:
    """A Relax IRModule's identity: its structural hash (constants' bytes included) and its TVMScript."""
    import tvm_ffi

    h = hashlib.sha256(str(tvm_ffi.structural_hash(mod)).encode() + b"\0")
    try:
        h.update(mod.script().encode())
    except Exception:  # noqa: BLE001 - a module the printer rejects: the structural hash alone
        h.update(b"<no script>")
    return h.hexdigest()


def file_digest(path, **import_options) -> str:
    """An ONNX file's identity: its bytes, those of any external-data files its initializers name,
    and the import options (``shape_dict``)."""
    import onnx

    path = Path(path)
    h = hashlib.sha256(path.read_bytes())
    model = onnx.load(str(path), load_external_data=False)
    locations = sorted({entry.value for init in model.graph.initializer for entry in init.external_data
                        if entry.key == "location"})
    for location in locations:
        h.update(location.encode() + b"\0")
        external = path.parent / location
        h.update(external.read_bytes() if external.is_file() else b"<missing>")
    h.update(json.dumps(import_options, sort_keys=True, default=str).encode())
    return "onnx:" + h.hexdigest()


def _database_digest(database, spec) -> str | None:
    """The tuning records' part of the key, or None where ``database`` is an object (a TuningResult,
    a MetaSchedule Database) whose content cannot be hashed: no caching then."""
    from .tune.tuner import SCHEDULE_DIRS

    shipped = [str(root / spec.row) for root in SCHEDULE_DIRS if (root / spec.row).is_dir()] if hasattr(spec, "row") else []
    parts = ["shipped:" + _tree_digest(shipped[0]) if shipped and database is not False else "shipped:none"]
    if database is None or database is False:
        parts.append(f"database:{database}")
    elif isinstance(database, (str, os.PathLike)) and Path(database).exists():
        parts.append("database:" + _tree_digest(database))
    else:
        return None
    return ";".join(parts)


def compile_key(source: str, spec, options: dict, database=None) -> str | None:
    """The cache key of compiling ``source`` (:func:`module_digest` or :func:`file_digest`) for
    ``spec`` with ``options`` (the other compile arguments, JSON-able by ``repr``), or None where the
    build cannot be keyed (a ``database`` object)."""
    import tvm

    from .saved import FORMAT_VERSION, _target_row, versions

    tuning = _database_digest(database, spec)
    if tuning is None:
        return None
    material = {
        "format_version": FORMAT_VERSION,
        **versions(),
        "package": _package_digest(),
        "source": source,
        "target": _target_row(spec),  # what a saved file records of its row, and checks on load
        "options": {k: repr(v) for k, v in sorted(options.items())},
        "tuning": tuning,
        "llvm_cpu": str(tvm.target.codegen.llvm_get_system_cpu()),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def cacheable(spec, emulate="auto") -> bool:
    """Whether a build for ``spec`` is cached: only one this host runs natively (an x86 CPU row whose
    instructions it has), not forced to emulation."""
    from .targets import host_supports

    return emulate is not True and getattr(spec, "device", None) == "cpu" and host_supports(spec)


def entry_path(directory, key: str) -> Path:
    return Path(directory) / f"{key}{SUFFIX}"


def lookup(directory, key: str | None):
    """The model cached under ``key`` in ``directory`` (a :class:`Compiled`, with ``loaded_from``
    set), or None: no entry, or one that cannot be used (then removed, with a warning, unless it is
    only for another host)."""
    from .errors import SavedModelHostError
    from .saved import load

    if directory is None or key is None:
        return None
    path = entry_path(directory, key)
    if not path.is_file():
        return None
    try:
        return load(path)
    except SavedModelHostError:  # valid, for another machine sharing the folder
        return None
    except Exception as err:  # noqa: BLE001 - SavedModelError, OSError: whatever it is, compile again
        warnings.warn(f"tvm-lowprec cache: {err}; removed, compiling again", stacklevel=3)
        try:
            path.unlink()
        except OSError:
            pass
        return None


def store(directory, key: str | None, compiled) -> Path | None:
    """Save ``compiled`` under ``key`` (atomically); None (nothing written) where it is not a native
    CPU build or the folder cannot be written (a warning)."""
    from .saved import save, savable

    if directory is None or key is None or compiled.execution != "native" or savable(compiled) is not None:
        return None
    path = entry_path(directory, key)
    try:
        save(compiled, path)
    except Exception as err:  # noqa: BLE001 - the cache never fails a compile that succeeded
        warnings.warn(f"tvm-lowprec cache: cannot write {path}: {type(err).__name__}: {err}", stacklevel=3)
        return None
    return path
