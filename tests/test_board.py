"""The emulated arm64 board (tvm_lowprec.board): TVM's RPC server under qemu-aarch64, used as a user
uses a remote board.

- A Relax model cross-compiled for AArch64 and exported with ``aarch64-linux-gnu-gcc`` runs on the
  board through ``upload``/``load_module``/the Relax VM and equals numpy, connected directly and
  through a tracker (``connect_tracker(...).request(key)``).
- A board that cannot start fails within its timeout with an error naming the problem and quoting the
  server's output, and leaves no process behind.

The board's filesystem is prepared once (tvm_lowprec.board.prepare_sysroot, cached under
``~/.cache/tvm-lowprec``); the tests skip, with the reason, only where it cannot be prepared here.
Starting a board costs about 30 s (TVM is imported twice under qemu).
"""

import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import tvm
from tvm.script import ir as I
from tvm.script import relax as R

from tvm_lowprec.board import (
    CROSS_CC,
    EM_AARCH64,
    QEMU,
    BoardError,
    EmulatedBoard,
    SysrootError,
    cross_compile,
    prepare_sysroot,
    run_remote,
)

from conftest import board_session

M, K, N = 8, 64, 32


@I.ir_module
class Int8MatmulRelu:
    @R.function
    def main(x: R.Tensor((M, K), "int8"), w: R.Tensor((K, N), "int8")):
        with R.dataflow():
            acc = R.matmul(x, w, out_dtype="int32")
            out = R.nn.relu(acc)
            R.output(acc, out)
        return (out, acc)


def _reference(x, w):
    acc = x.astype(np.int32) @ w.astype(np.int32)
    return [np.maximum(acc, 0), acc]


@pytest.fixture(scope="module")
def sysroot():
    if shutil.which(QEMU) is None:  # a board needs qemu even where a cached filesystem is at hand
        pytest.skip(f"{QEMU} not found: install the Debian package qemu-user")
    try:
        return prepare_sysroot()
    except SysrootError as error:
        pytest.skip(f"the arm64 board cannot be prepared here: {error}")


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    if shutil.which(CROSS_CC) is None:
        pytest.skip(f"{CROSS_CC} not found (Debian packages gcc-aarch64-linux-gnu, libc6-dev-arm64-cross)")
    return cross_compile(Int8MatmulRelu, tmp_path_factory.mktemp("arm64") / "int8_matmul_relu.so")


def _instructions(library, mnemonic):
    objdump = shutil.which("aarch64-linux-gnu-objdump")
    if objdump is None:
        pytest.skip("aarch64-linux-gnu-objdump not found (Debian package binutils-aarch64-linux-gnu)")
    listing = subprocess.run([objdump, "-d", str(library)], capture_output=True, text=True, check=True).stdout
    return sum(1 for line in listing.splitlines() if f"\t{mnemonic}\t" in line)


@pytest.fixture(scope="module")
def board(sysroot):
    with EmulatedBoard(sysroot=sysroot) as board:
        yield board


@pytest.fixture
def inputs():
    rng = np.random.default_rng(7)
    return [rng.integers(-128, 128, (M, K), dtype=np.int8), rng.integers(-128, 128, (K, N), dtype=np.int8)]


def test_library_is_aarch64_with_sdot(library):
    """The model the board runs is AArch64 code that uses the dot-product extension (LLVM forms
    ``sdot`` from the int8 matmul's reduction with ``+dotprod``)."""
    header = library.read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == EM_AARCH64
    assert _instructions(library, "sdot") > 0


def test_relax_model_runs_on_the_board(board, library, inputs):
    outputs = run_remote(board.connect(), library, inputs)
    for got, want in zip(outputs, _reference(*inputs), strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_relax_model_runs_through_a_tracker(arm_board, library, inputs):
    """The test run's shared board (conftest.arm_board) is registered with a tracker under its key."""
    address, key = arm_board
    assert tvm.rpc.connect_tracker(*address).summary()["queue_info"][key]["free"] == 1
    outputs = run_remote(board_session(arm_board), library, inputs)
    for got, want in zip(outputs, _reference(*inputs), strict=True):
        np.testing.assert_array_equal(got, want)


def test_board_cpu_without_dotprod_traps(sysroot, library, inputs):
    """The board executes the library's instructions: on a CPU model without dotprod (Cortex-A72) its
    ``sdot`` dies with SIGILL, the session ends and the error says so."""
    with EmulatedBoard(cpu="cortex-a72", sysroot=sysroot) as board:
        with pytest.raises(BoardError, match="the remote session ended while running 'main'"):
            run_remote(board.connect(), library, inputs)
        deadline = time.monotonic() + 10
        while "Illegal instruction" not in board.output_tail() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "Illegal instruction" in board.output_tail()


@pytest.mark.skipif(shutil.which(QEMU) is None, reason=f"{QEMU} not found: install the Debian package qemu-user")
def test_bogus_interpreter_is_refused(tmp_path):
    """Checked before qemu starts: qemu-aarch64 itself loses its message when its output is a file."""
    missing = tmp_path / "no-such-python3.11"
    with pytest.raises(BoardError, match=f"interpreter {missing} cannot be read: No such file"):
        EmulatedBoard(sysroot=tmp_path, python=missing, timeout=60).start()
    host_elf = os.path.realpath(sys.executable)
    with pytest.raises(BoardError, match=f"interpreter {host_elf} is not an AArch64 executable"):
        EmulatedBoard(sysroot=tmp_path, python=host_elf, timeout=60).start()


def test_board_that_exits_says_why(sysroot):
    board = EmulatedBoard(cpu="no-such-cpu", sysroot=sysroot, timeout=60)
    start = time.monotonic()
    with pytest.raises(BoardError, match=r"exited with status 1 before it was ready(.|\n)*"
                                         r"unable to find CPU model 'no-such-cpu'"):  # qemu's words, quoted
        board.start()
    assert time.monotonic() - start < 10
    assert not board.running


def test_board_not_ready_in_time_is_stopped(sysroot):
    board = EmulatedBoard(sysroot=sysroot, timeout=1).launch()
    pid = board.pid
    with pytest.raises(BoardError, match=r"was not ready within 1 s(.|\n)*tvm.exec.rpc_server"):
        board.wait_ready()
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # the whole process group is gone
