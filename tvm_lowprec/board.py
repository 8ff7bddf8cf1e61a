"""An emulated arm64 board: TVM's own RPC server running under ``qemu-aarch64``, used as a remote board is.

Why: a user deploys an AArch64 model by cross-compiling it on a workstation, exporting it with a cross
compiler, uploading it to the board's RPC server and running it there through the Relax VM. Nothing
on an x86 host exercises that path; this module makes it testable without Arm hardware. The board is
a real arm64 userland (Debian's arm64 ``python3.11`` and the aarch64 ``apache-tvm`` wheel) run by
qemu-user, which executes AArch64 code, the dot-product instructions included, exactly.

The pieces:

1. :func:`prepare_sysroot` builds the board's filesystem once and caches it outside the git tree
   (``~/.cache/tvm-lowprec/arm64-board``, or ``$LOWPREC_ARM64_SYSROOT``): Debian arm64 packages
   unpacked with ``dpkg -x`` (the interpreter and the libraries it and TVM load), and aarch64 wheels
   installed with ``pip install --target <sysroot>/site --platform ...``. A ``.done`` stamp recording
   the recipe makes later calls instant; a changed recipe rebuilds it.
2. :class:`EmulatedBoard` starts ``python3.11 -m tvm.exec.rpc_server`` under qemu on the loopback
   interface, directly reachable or registered with a tracker, and kills its process group on close.
   :class:`LocalTracker` starts ``python -m tvm.exec.rpc_tracker`` on the host.
3. :func:`cross_compile` and :func:`run_remote`: the user's side (build, export with
   ``aarch64-linux-gnu-gcc``, upload, load, run through the VM, download the outputs).

Why the sysroot carries a shell script, ``usr/bin/python3.11-qemu``: TVM's RPC server runs its
listening loop in a worker it starts with ``sys.executable -m tvm.exec.popen_worker``. Under qemu-user
``sys.executable`` is the arm64 ELF, which the host kernel refuses ("Exec format error") unless
binfmt_misc is registered for AArch64, which containers rarely have. The board therefore starts
Python with ``argv[0]`` set to the script (qemu's ``-0``), so ``sys.executable`` names it and each
Python the board starts re-enters qemu (with the board's ``QEMU_CPU``).

Costs measured on a 2-core x86-64 host (Debian 12, qemu 7.2), with other work running: ``import tvm``
takes 12-15 s under qemu, so a board accepts connections 17-30 s after it starts (the server, then its
worker, import TVM); a session, upload and run of a small model then take well under a second. The
first :func:`prepare_sysroot` (11 MB of .deb files, about 110 MB of wheels, 430 MB unpacked) took
30-47 s, ``apt-get update`` and an empty pip cache included; 12-15 s of it is the check that TVM
imports on the board.

TVM's server runs each session in a forked process; when that process dies (SIGILL on an instruction
the board's CPU model lacks), the client gets an error and the server stops accepting connections:
start a new board.

Host requirements: Debian's ``qemu-user``, ``dpkg`` and ``apt-get`` (with root, or the arm64
architecture already added: ``dpkg --add-architecture arm64 && apt-get update``), ``pip``, and for
:func:`cross_compile` ``gcc-aarch64-linux-gnu``; :class:`LocalTracker` needs ``tornado``. Where a piece
is missing the error names it (:class:`SysrootError` for the one-time preparation).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import LowPrecError
from .qemu import CROSS_CC, QEMU  # noqa: F401  (the same tools as the kernel harness; CROSS_CC re-exported)

SYSROOT_ENV = "LOWPREC_ARM64_SYSROOT"
LOOPBACK = "127.0.0.1"
EM_AARCH64 = 183  # the ELF header's e_machine of AArch64 code


# Debian 12 (bookworm) arm64 packages of the board: the interpreter and its standard library, and
# every library their ELF files need (python3.11: libz, libexpat; lib-dynload: libffi for ctypes,
# libssl/libcrypto for hashlib, libbz2, liblzma, libcrypt, libuuid; TVM: libstdc++, libgcc_s).
DEBS = (
    "python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib",
    "libc6", "libgcc-s1", "libstdc++6", "zlib1g", "libexpat1", "libffi8", "libssl3",
    "libbz2-1.0", "liblzma5", "libcrypt1", "libuuid1",
)
# The board's TVM must be the host's (pinned together as in setup.py); cloudpickle and psutil are
# what TVM's RPC server imports at run time without declaring them.
WHEELS = ("apache-tvm==0.27.0.post1", "apache-tvm-ffi==0.1.14.post1", "numpy", "cloudpickle", "psutil")
WHEEL_PLATFORMS = ("manylinux_2_28_aarch64", "manylinux2014_aarch64")  # the TVM wheel is manylinux_2_28
PYTHON = "usr/bin/python3.11"
PYTHON_WRAPPER = "usr/bin/python3.11-qemu"
SITE = "site"
STAMP = ".done"
# Re-enters qemu for a process the board's Python starts with sys.executable (see the module docstring).
_WRAPPER_SCRIPT = """#!/bin/sh
# Written by tvm_lowprec.board: runs the board's arm64 Python under qemu-aarch64. The board starts its
# Python with argv[0] set to this script, so the processes TVM's RPC server starts come back here.
root="$(cd "$(dirname "$0")/../.." && pwd)"
exec "${LOWPREC_QEMU:-qemu-aarch64}" -L "$root" -0 "$0" "$root/usr/bin/python3.11" "$@"
"""
# What the preparation checks the board's Python can import (what tvm.exec.rpc_server needs).
_IMPORT_CHECK = "import cloudpickle, psutil, numpy, tvm, tvm.rpc, tvm.exec.popen_worker; print(tvm.__version__)"


class BoardError(LowPrecError):
    """The emulated board (or its tracker) did not start, or a remote run failed."""


class SysrootError(BoardError):
    """The board's filesystem cannot be prepared here (names the missing tool, package or permission)."""


# ---------------------------------------------------------------------------------------------------
# Sysroot


def default_sysroot() -> Path:
    """``$LOWPREC_ARM64_SYSROOT``, else ``~/.cache/tvm-lowprec/arm64-board``."""
    override = os.environ.get(SYSROOT_ENV)
    return Path(override).expanduser() if override else Path.home() / ".cache" / "tvm-lowprec" / "arm64-board"


def _recipe() -> dict:
    """What a sysroot is built from; a stamp recording another recipe means rebuild."""
    return {"debs": list(DEBS), "wheels": list(WHEELS), "platforms": list(WHEEL_PLATFORMS),
            "wrapper": hashlib.sha256(_WRAPPER_SCRIPT.encode()).hexdigest()[:16]}


def sysroot_ready(path: Path) -> bool:
    """Whether ``path`` holds a finished sysroot built from the current recipe."""
    try:
        stamp = json.loads((Path(path) / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("recipe") == _recipe()


def prepare_sysroot(path: str | os.PathLike | None = None) -> Path:
    """The board's filesystem at ``path`` (default :func:`default_sysroot`), built if it is not there.

    Idempotent: a finished sysroot (its ``.done`` stamp records the recipe) is returned at once. Builds
    into a sibling folder and renames it, under a lock, so concurrent callers and interrupted builds
    never leave a half sysroot behind. Raises :class:`SysrootError` naming what is missing.
    """
    path = Path(path).expanduser().resolve() if path is not None else default_sysroot()
    if sysroot_ready(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with _lock(path.with_name(path.name + ".lock")):
        if sysroot_ready(path):  # another process built it while we waited
            return path
        _require_tools()
        for stale in path.parent.glob(f"{path.name}.partial-*"):  # left by an interrupted build
            shutil.rmtree(stale, ignore_errors=True)
        staging = path.with_name(f"{path.name}.partial-{os.getpid()}")
        try:
            version = _build(staging)
            shutil.rmtree(path, ignore_errors=True)
            staging.rename(path)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        (path / STAMP).write_text(json.dumps({"recipe": _recipe(), "tvm": version}, indent=1))
    return path


@contextlib.contextmanager
def _lock(lock_path: Path):
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _require_tools() -> None:
    needed = {QEMU: "the Debian package qemu-user", "dpkg": "dpkg (a Debian host)",
              "apt-get": "apt (a Debian host)"}
    missing = [f"{tool} ({what})" for tool, what in needed.items() if shutil.which(tool) is None]
    if missing:
        raise SysrootError(f"cannot prepare the arm64 board: missing {', '.join(missing)}")


def _build(root: Path) -> str:
    """Build a sysroot in the empty folder ``root``; returns the board's TVM version."""
    root.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="lowprec-debs-") as debs:
        for deb in _download_debs(Path(debs)):
            _run(["dpkg", "-x", str(deb), str(root)], f"unpacking {deb.name}")
    _install_wheels(root / SITE)
    wrapper = root / PYTHON_WRAPPER
    wrapper.write_text(_WRAPPER_SCRIPT)
    wrapper.chmod(0o755)
    return _check_imports(root)


def _download_debs(dest: Path) -> list[Path]:
    """``apt-get download`` the arm64 packages into ``dest``, adding the arm64 architecture to dpkg and
    updating apt's lists first where they lack it."""
    if "arm64" not in _run(["dpkg", "--print-foreign-architectures"], "listing dpkg's architectures").stdout.split():
        _as_root("dpkg --add-architecture arm64")
        _run(["dpkg", "--add-architecture", "arm64"], "adding the arm64 architecture to dpkg")
        _apt_update()
    command = ["apt-get", "download", *(f"{name}:arm64" for name in DEBS)]
    result = subprocess.run(command, cwd=dest, capture_output=True, text=True)
    if result.returncode != 0 and os.geteuid() == 0:  # lists without arm64, or out of date: update once
        _apt_update()
        result = subprocess.run(command, cwd=dest, capture_output=True, text=True)
    if result.returncode != 0:
        raise SysrootError(f"apt-get download of the arm64 packages failed (the board needs Debian 12 "
                           f"'bookworm' arm64 packages: {' '.join(DEBS)}):\n{_tail(result.stderr)}")
    debs = sorted(dest.glob("*.deb"))
    if len(debs) != len(DEBS):
        raise SysrootError(f"apt-get download gave {len(debs)} .deb files for {len(DEBS)} packages: "
                           f"{[d.name for d in debs]}")
    return debs


def _apt_update() -> None:
    _as_root("apt-get update (to fetch the arm64 package lists)")
    _run(["apt-get", "update"], "apt-get update", timeout=600)


def _as_root(action: str) -> None:
    if os.geteuid() != 0:
        raise SysrootError(f"preparing the arm64 board needs root for '{action}': run once as root "
                           "'dpkg --add-architecture arm64 && apt-get update'")


def _install_wheels(site: Path) -> None:
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
               "--no-warn-script-location", "--target", str(site), "--only-binary=:all:",
               "--python-version", "3.11", "--implementation", "cp"]
    for platform in WHEEL_PLATFORMS:
        command += ["--platform", platform]
    _run(command + list(WHEELS), "pip install of the aarch64 wheels", timeout=1200)


def _check_imports(root: Path) -> str:
    """Run the board's Python once: it must import what the RPC server needs. Returns TVM's version.

    Raises :class:`BoardError`, not :class:`SysrootError`: everything was installed, so a failure here
    is a wrong recipe (a library missing from :data:`DEBS`, a wheel from :data:`WHEELS`), not this host.
    """
    env = _board_env(root, cpu="max")
    command = [QEMU, "-cpu", "max", "-L", str(root), str(root / PYTHON), "-c", _IMPORT_CHECK]
    return _run(command, "importing TVM on the arm64 board", env=env, timeout=600, error=BoardError).stdout.strip()


def _run(command: Sequence[str], what: str, timeout: float = 300, error: type = SysrootError,
         **kwargs) -> subprocess.CompletedProcess:
    """Run a preparation step; raise ``error`` naming the step, the command and the end of its output."""
    try:
        result = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout, **kwargs)
    except FileNotFoundError as missing:
        raise error(f"{what}: {missing.filename} not found") from missing
    except subprocess.TimeoutExpired as expired:
        raise error(f"{what} took longer than {timeout:g} s: {' '.join(command)}") from expired
    if result.returncode != 0:
        raise error(f"{what} failed (exit status {result.returncode}): {' '.join(command)}\n"
                    f"{_tail(result.stderr or result.stdout)}")
    return result


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _board_env(root: Path, cpu: str) -> dict:
    """The environment of the board's processes: only the board's wheels on the path, and what the
    Python wrapper needs to start children under the same qemu CPU."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(PYTHONPATH=str(root / SITE), PYTHONNOUSERSITE="1", QEMU_CPU=cpu,
               LOWPREC_QEMU=shutil.which(QEMU) or QEMU)
    return env


# ---------------------------------------------------------------------------------------------------
# Processes: the board and the tracker


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nothing listens on now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


class _Service:
    """A background process in its own process group, its output in a log file, stopped as a group."""

    name = "service"

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.command: list[str] = []
        self._proc: subprocess.Popen | None = None
        self._logdir: str | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The process id (also its process group's id) while started, else None."""
        return self._proc.pid if self._proc is not None else None

    def _launch(self, command: list[str], env: dict | None = None) -> None:
        if self._proc is not None:
            raise BoardError(f"the {self.name} is already started")
        self.command = command
        self._logdir = tempfile.mkdtemp(prefix="lowprec-board-")
        with open(self.log_path, "wb") as log:
            try:
                self._proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                              env=env, cwd=self._logdir, start_new_session=True,
                                              preexec_fn=_no_core_dumps)
            except OSError as error:
                self._cleanup()
                raise BoardError(f"cannot start the {self.name} ({command[0]}): {error}") from error

    @property
    def log_path(self) -> Path:
        return Path(self._logdir or ".") / "output.log"

    def output_tail(self, lines: int = 25) -> str:
        try:
            return _tail(self.log_path.read_text(errors="replace"), lines)
        except OSError:
            return ""

    def _wait(self, ready) -> None:
        """Poll ``ready()`` until it holds; stop the process and raise if it exits or the timeout passes."""
        deadline = time.monotonic() + self.timeout
        while True:
            if self._proc.poll() is not None:
                self._fail(f"exited with status {self._proc.returncode} before it was ready")
            if ready():
                return
            if time.monotonic() > deadline:
                self._fail(f"was not ready within {self.timeout:g} s")
            time.sleep(0.25)

    def _fail(self, why: str):
        tail = self.output_tail()
        self.close()
        raise BoardError(f"the {self.name} {why}.\ncommand: {' '.join(self.command)}\n"
                         f"its output ends with:\n{tail or '(nothing)'}")

    def close(self) -> None:
        """Stop the process group (SIGTERM, then SIGKILL after 5 s) and remove the log."""
        proc, self._proc = self._proc, None
        if proc is not None:
            _stop_group(proc)
        self._cleanup()

    def _cleanup(self) -> None:
        if self._logdir:
            shutil.rmtree(self._logdir, ignore_errors=True)
            self._logdir = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()


def _no_core_dumps() -> None:
    """In the child before exec: qemu-user writes a core file (``qemu_*.core``, guest memory, hundreds
    of MB) into the working directory on a fatal guest signal where the limit allows it."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _stop_group(proc: subprocess.Popen) -> None:
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(grace)
            # children of the group outlive the leader for a moment: make sure they got the signal too
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            return
        except subprocess.TimeoutExpired:
            continue


class LocalTracker(_Service):
    """A TVM RPC tracker on this host (``python -m tvm.exec.rpc_tracker``), loopback only.

    ``with LocalTracker() as tracker:`` then ``EmulatedBoard(tracker=tracker.address)`` and
    ``tvm.rpc.connect_tracker(*tracker.address).request(key)``. Needs ``tornado`` on the host.
    """

    name = "RPC tracker"

    def __init__(self, host: str = LOOPBACK, port: int | None = None, timeout: float = 60.0):
        super().__init__(timeout)
        self.host, self.port = host, port

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def start(self) -> "LocalTracker":
        import importlib.util

        if importlib.util.find_spec("tornado") is None:
            raise BoardError(f"TVM's RPC tracker needs tornado on the host: pip install tornado (for {sys.executable})")
        self.port = self.port or free_port(self.host)
        self._launch([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", self.host, "--port", str(self.port),
                      "--port-end", str(self.port + 1)])
        self._wait(lambda: _accepts(self.host, self.port))
        return self

    def summary(self) -> dict:
        """The tracker's ``summary()``: ``queue_info`` (key -> free/pending) and ``server_info``."""
        import tvm.rpc

        return tvm.rpc.connect_tracker(self.host, self.port).summary()


def _check_interpreter(python: Path) -> None:
    """Refuse an interpreter qemu-aarch64 cannot run, before starting it: qemu reports a missing file
    on buffered stdout and leaves with ``_exit``, so the message is lost when stdout is not a terminal."""
    try:
        with open(python, "rb") as handle:
            header = handle.read(20)
    except OSError as error:
        raise BoardError(f"the board's interpreter {python} cannot be read: {error.strerror}") from error
    if header[:4] != b"\x7fELF" or int.from_bytes(header[18:20], "little") != EM_AARCH64:
        raise BoardError(f"the board's interpreter {python} is not an AArch64 executable")


class EmulatedBoard(_Service):
    """An arm64 "board": TVM's RPC server in Debian's arm64 Python under ``qemu-aarch64 -cpu <cpu>``.

    ``with EmulatedBoard() as board: remote = board.connect()``. The server listens on a free loopback
    port. With ``tracker=(host, port)`` it registers with that tracker under ``key`` (reach it with
    ``tvm.rpc.connect_tracker(host, port).request(key)``, or :meth:`connect`); without, a client
    connects directly with the same ``key`` (what :meth:`connect` does).

    Parameters
    ----------
    cpu : str
        The qemu CPU model (``qemu-aarch64 -cpu help``): ``max`` has every extension qemu implements; an
        older model (e.g. ``cortex-a72``, no dotprod) makes code using a newer instruction die with SIGILL.
    key : str
        The server's device key.
    tracker : (str, int), optional
        A tracker to register with instead of serving direct connections.
    timeout : float
        Seconds to wait for the server to accept connections (importing TVM under qemu takes tens).
    sysroot : path, optional
        A prepared board filesystem; default :func:`prepare_sysroot` (built on first use).
    python : path, optional
        The arm64 interpreter to start, default the sysroot's ``usr/bin/python3.11`` (the processes the
        server starts use the sysroot's wrapper).
    """

    name = "emulated arm64 board"

    def __init__(self, cpu: str = "max", key: str = "arm64-emu", tracker: tuple[str, int] | None = None,
                 timeout: float = 180.0, *, sysroot: str | os.PathLike | None = None,
                 python: str | os.PathLike | None = None):
        super().__init__(timeout)
        self.cpu, self.key = cpu, key
        self.tracker = (tracker[0], int(tracker[1])) if tracker else None
        self._sysroot = Path(sysroot) if sysroot is not None else None
        self._python = Path(python) if python is not None else None
        self.host, self.port = LOOPBACK, None

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def launch(self) -> "EmulatedBoard":
        """Start the server process and return at once (:meth:`wait_ready` waits for it): boards
        launched together start in parallel."""
        root = self._sysroot if self._sysroot is not None else prepare_sysroot()
        qemu = shutil.which(QEMU)
        if qemu is None:
            raise BoardError(f"{QEMU} not found: install the Debian package qemu-user")
        python = self._python or root / PYTHON
        _check_interpreter(python)
        self.port = free_port(self.host)
        command = [qemu, "-cpu", self.cpu, "-L", str(root), "-0", str(root / PYTHON_WRAPPER), str(python),
                   "-m", "tvm.exec.rpc_server", "--host", self.host, "--port", str(self.port),
                   "--port-end", str(self.port + 1), "--key", self.key]
        if self.tracker:
            command += ["--tracker", f"{self.tracker[0]}:{self.tracker[1]}"]
        self._launch(command, env=_board_env(root, self.cpu))
        return self

    def wait_ready(self) -> "EmulatedBoard":
        """Wait until the server accepts connections (registered with the tracker, if any); raise
        :class:`BoardError` with the server's output if it exits or the timeout passes first."""
        if self._proc is None:
            raise BoardError("the board is not started: call launch() or start() first")
        if self.tracker is None:
            self._wait(lambda: _accepts(self.host, self.port))
        else:
            self._wait(self._registered)
        return self

    def start(self) -> "EmulatedBoard":
        """:meth:`launch` and :meth:`wait_ready`."""
        return self.launch().wait_ready()

    def _registered(self) -> bool:
        import tvm.rpc

        if not _accepts(*self.tracker):
            return False
        summary = tvm.rpc.connect_tracker(*self.tracker).summary()
        ours = any(info.get("key") == f"server:{self.key}" and list(info.get("addr", []))[1:] == [self.port]
                   for info in summary.get("server_info", []))
        return ours and summary.get("queue_info", {}).get(self.key, {}).get("free", 0) > 0

    def connect(self, session_timeout: float = 0):
        """A ``tvm.rpc`` session on the board (through the tracker where it registered with one)."""
        import tvm.rpc

        if not self.running:
            raise BoardError("the board is not running")
        if self.tracker:
            return tvm.rpc.connect_tracker(*self.tracker).request(self.key, session_timeout=session_timeout)
        return tvm.rpc.connect(self.host, self.port, key=self.key, session_timeout=session_timeout)


# ---------------------------------------------------------------------------------------------------
# The user's side


def arm64_target():
    """The LLVM target of the row :data:`tvm_lowprec.targets.arm.BOARD_ROW` names (Neon and the dot-product
    extension; the board's ``-cpu max`` has both), as a ``tvm.target.Target``."""
    from .targets import registered_targets
    from .targets.arm import BOARD_ROW

    return registered_targets()[BOARD_ROW].tvm_target()


def cross_compile(mod, path: str | os.PathLike, target=None) -> Path:
    """Build the Relax module ``mod`` for ``target`` (default :func:`arm64_target`) and export it as an
    AArch64 shared library at ``path`` with ``aarch64-linux-gnu-gcc``, ready for :func:`run_remote`."""
    import tvm

    from .qemu import export_aarch64

    return Path(export_aarch64(tvm.compile(mod, target if target is not None else arm64_target()), path))


def run_remote(session, lib_path: str | os.PathLike, inputs: Sequence[np.ndarray],
               func: str = "main") -> list[np.ndarray]:
    """Run ``func`` of the exported Relax library ``lib_path`` on an RPC ``session``: upload, load,
    a VM on the remote CPU, the inputs copied there, the outputs copied back (a tuple output flattened
    in order; :func:`tvm_lowprec.remote.invoke`)."""
    import tvm

    from .remote import invoke, load_remote

    vm, device = load_remote(session, lib_path)
    return invoke(vm, [tvm.runtime.tensor(np.ascontiguousarray(x), device) for x in inputs], func)


if __name__ == "__main__":  # python -m tvm_lowprec.board: prepare the sysroot ahead of the tests
    print(prepare_sysroot())
