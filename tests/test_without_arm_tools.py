"""The suite on a host without the Arm packages (qemu-user, gcc-aarch64-linux-gnu): the README says the
AArch64 tests then skip and name the packages to install. CI's host has the packages (``.ci/run``
installs them), so this file hides them: it runs pytest in a subprocess whose ``PATH`` holds every
program of ours except ``qemu-*`` and ``aarch64-linux-gnu-*``, first collecting the README's whole test
command, then running the tests that touch the Arm rows, which must pass or skip, none fail.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tvm_lowprec.qemu import CROSS_CC, QEMU

HIDDEN = ("qemu-", "aarch64-linux-gnu-")
ROOT = Path(__file__).resolve().parent.parent
ARM_TESTS = ["tests/test_arm.py", "tests/test_board.py", "tests/test_arm_models.py",
             "tests/test_emulation.py::test_every_row_runs_here", "tests/test_emulation.py::test_cli_runs_the_demo_model_on_every_row"]


def _path_without_arm_tools(tmp_path) -> str:
    """A directory of links to every program on ``PATH`` but the Arm tools (first one of a name wins)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            target = bin_dir / entry.name
            if entry.name.startswith(HIDDEN) or target.exists() or target.is_symlink():
                continue
            target.symlink_to(entry.path)
    return str(bin_dir)


def _pytest(args, path, tmp_path):
    env = {**os.environ, "PATH": path, "PYTEST_ADDOPTS": ""}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def test_the_arm_tests_skip_naming_the_packages_when_the_tools_are_missing(tmp_path):
    path = _path_without_arm_tools(tmp_path)
    probe = subprocess.run([sys.executable, "-c", f"import shutil; print(shutil.which({QEMU!r}), shutil.which({CROSS_CC!r}))"],
                           env={**os.environ, "PATH": path}, capture_output=True, text=True, check=True)
    assert probe.stdout.split() == ["None", "None"]  # the tools are hidden for the children

    collected = _pytest(["--collect-only", "tests"], path, tmp_path)
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    assert "error" not in collected.stdout.splitlines()[-1]

    run = _pytest(["-rs", *ARM_TESTS], path, tmp_path)
    summary = run.stdout.strip().splitlines()[-1]
    assert run.returncode == 0 and "failed" not in summary, run.stdout[-5000:] + run.stderr[-2000:]
    skips = [line for line in run.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skips and all("qemu" in line or "aarch64" in line for line in skips), skips
    assert any("qemu-user" in line for line in skips) and any("gcc-aarch64-linux-gnu" in line for line in skips)
    assert "passed" in summary  # what needs no Arm tool (cross-compiled assembly, the row table) still runs
