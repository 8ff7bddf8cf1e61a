import os

import numpy as np
import pytest

import tvm_lowprec
from tvm_lowprec.emulation import execution_mode, load_emulated
from tvm_lowprec.qemu import QemuModule, unavailable_reason
from tvm_lowprec.targets import host_supports, registered_targets

TARGETS = list(registered_targets("cpu").values())  # GPU rows: tests/test_cuda_*.py
# the rows this host runs natively; every other row runs emulated (tvm_lowprec.emulation). Refilled in
# pytest_configure, once --host-features has named the host (test modules import it after that)
NATIVE = [t for t in TARGETS if host_supports(t)]


def pytest_addoption(parser):
    from tvm_lowprec.targets import HOST_FEATURES_ENV, RECORDED_HOSTS

    parser.addoption(
        "--host-features", metavar="NAME", default=None, choices=sorted(RECORDED_HOSTS),
        help=f"run as on a recorded host ({', '.join(RECORDED_HOSTS)}): sets {HOST_FEATURES_ENV}, which "
             "tvm_lowprec.targets.host_features reads (the real CPU still bounds what runs natively)")


def pytest_configure(config):
    from tvm_lowprec.targets import HOST_FEATURES_ENV, simulated_host

    config.addinivalue_line(
        "markers", "host_dependent: what the test checks depends on the host CPU's features (the rows it runs "
        "natively, the row 'native' resolves to); .ci/run runs these again with --host-features zen3")
    name = config.getoption("--host-features")
    if name:  # the workers of pytest-xdist get the option too, and inherit the variable
        os.environ[HOST_FEATURES_ENV] = name
    simulated_host()  # an unknown name in the environment variable fails here, once
    NATIVE[:] = [t for t in TARGETS if host_supports(t)]
    # the CLI caches compiled models by default: the tests' entries go to a folder of this run's, never
    # to the user's ~/.cache (tests that check the cache point the variable at their own tmp_path)
    if "TVM_LOWPREC_CACHE_DIR" not in os.environ:
        import tempfile

        os.environ["TVM_LOWPREC_CACHE_DIR"] = tempfile.mkdtemp(prefix="tvm-lowprec-test-cache-")


def pytest_report_header(config):
    from tvm_lowprec.targets import native_target, simulated_host

    host = simulated_host()
    where = f"as on recorded host {host.name} ({host.about})" if host else "on this host"
    return f"tvm-lowprec: {where}; native = {native_target().name}; natively run rows: {[t.name for t in NATIVE]}"


def runnable(spec) -> bool:
    return host_supports(spec)


def skip_unless_runnable(spec):
    if not runnable(spec):
        pytest.skip(f"this host lacks {sorted(set(spec.features) - set(tvm_lowprec.targets.host_features()))} for {spec.name}")


def kernel_module(lib, spec, emulate=False):
    """The module to call a built kernel library through: ``lib`` itself where this host runs the
    row natively (and ``emulate`` is False), else its emulated form, whose replacement counts are
    checked against the real build (and must be positive: the kernel calls the row's intrinsic)."""
    mode = execution_mode(spec)
    if mode == "native" and not emulate:
        return lib
    if mode == "qemu":  # AArch64: the real instructions under qemu-aarch64, on the row's CPU model
        return QemuModule(lib, cpu=spec.qemu_cpu)
    if mode == "compile-only":
        pytest.skip(f"{spec.name} cannot run here: {unavailable_reason()}")
    module, report = load_emulated(lib)
    assert report.total > 0, f"{spec.name}: the emulated build replaced no intrinsic call"
    assert dict(report.replaced) == dict(report.found)
    return module


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(scope="session")
def arm_board():
    """One emulated arm64 board for the whole test run (tvm_lowprec.board): TVM's RPC server under
    qemu-aarch64 (``-cpu max``: every Arm row's instructions), registered with a local RPC tracker on
    the loopback interface. Yields ``(tracker address, key)``; a session is
    ``tvm.rpc.connect_tracker(*address).request(key)``. Skips, with the reason, only where the
    board's filesystem cannot be prepared here."""
    from tvm_lowprec.board import EmulatedBoard, LocalTracker, SysrootError, prepare_sysroot

    reason = unavailable_reason()
    if reason:
        pytest.skip(f"no emulated arm64 board here: {reason}")
    try:
        sysroot = prepare_sysroot()
    except SysrootError as error:
        pytest.skip(f"the arm64 board cannot be prepared here: {error}")
    key = "lowprec-arm64"
    with LocalTracker() as tracker, EmulatedBoard(key=key, tracker=tracker.address, sysroot=sysroot):
        yield tracker.address, key


def board_session(arm_board):
    """A new RPC session on the emulated board (one per model: a session holds its uploads)."""
    import tvm

    address, key = arm_board
    return tvm.rpc.connect_tracker(*address).request(key, session_timeout=300)
