"""Metadata recorded with every benchmark run: date, versions, CPU model and vector features."""

from __future__ import annotations

import datetime
import os
import platform
from importlib import metadata
from pathlib import Path

HOST_FLAGS = ("avx2", "avx512f", "avx512vnni", "avx_vnni")

# module name -> distribution names it may be installed under
_DISTRIBUTIONS = {
    "numpy": ("numpy",),
    "tvm": ("apache-tvm", "tvm"),
    "onnx": ("onnx",),
    "onnxruntime": ("onnxruntime",),
    "torch": ("torch",),
    "threadpoolctl": ("threadpoolctl",),
    "matplotlib": ("matplotlib",),
}


def package_version(module: str) -> str | None:
    """Installed version of ``module`` without importing it, or ``None`` when absent."""
    for dist in _DISTRIBUTIONS.get(module, (module,)):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def cpu_info(path: str = "/proc/cpuinfo") -> dict:
    """CPU model and the presence of :data:`HOST_FLAGS`, read from the first processor entry.

    Returns
    -------
    dict
        ``{"model": str, "flags": {flag: bool}, "logical_cpus": int}``; model ``"unknown"``
        where ``path`` cannot be read (non-Linux hosts).
    """
    fields: dict[str, str] = {}
    try:
        text = Path(path).read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    from ..targets import cpuinfo_features, llvm_feature_name

    flags = cpuinfo_features(fields.get("flags", ""))
    return {
        "model": fields.get("model name", "unknown"),
        "flags": {flag: llvm_feature_name(flag) in flags for flag in HOST_FLAGS},
        "logical_cpus": os.cpu_count(),
    }


def llvm_host_cpu() -> str | None:
    """The CPU name LLVM detects for this host (what ``target="native"`` resolves to), if TVM imports."""
    try:
        from tvm.target import codegen

        return str(codegen.llvm_get_system_cpu())
    except (ImportError, AttributeError) as err:
        return f"unknown ({type(err).__name__}: {err})"


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages (other processes competing for the cores), if known."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def collect_metadata(**run_info) -> dict:
    """Everything recorded about the host and software, merged with ``run_info`` (benchmark spec).

    Returns
    -------
    dict
        JSON-serialisable.
    """
    numpy_threads = "threadpoolctl" if package_version("threadpoolctl") else "default (threadpoolctl not installed)"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": {"cpu": cpu_info(), "machine": platform.machine(), "python": platform.python_version()},
        "versions": {module: package_version(module) for module in _DISTRIBUTIONS},
        "target": {"requested": "native", "llvm_host_cpu": llvm_host_cpu()},
        "numpy_threads": numpy_threads,
        "loadavg_end": load_average(),
        **run_info,
    }


def host_line(meta: dict) -> str:
    """One line naming when and where a run of :func:`collect_metadata`'s ``meta`` ran: date, CPU model,
    logical CPUs, the :data:`HOST_FLAGS` it has, LLVM's name for the CPU (and ``meta["git"]`` if any)."""
    cpu = meta["host"]["cpu"]
    flags = ", ".join(flag for flag, present in cpu["flags"].items() if present) or "none of " + ", ".join(cpu["flags"])
    git = f"; tvm-lowprec @ {meta['git']}" if meta.get("git") else ""
    return (f"{meta['date']} · **{cpu['model']}** ({cpu['logical_cpus']} logical CPUs; {flags}; LLVM: "
            f"`{meta['target']['llvm_host_cpu']}`){git}")
