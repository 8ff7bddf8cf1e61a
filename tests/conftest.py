import numpy as np
import pytest

import tvm_lowprec
from tvm_lowprec.emulation import execution_mode, load_emulated
from tvm_lowprec.targets import host_supports, registered_targets

TARGETS = list(registered_targets().values())
# the rows this host runs natively; every other row runs emulated (tvm_lowprec.emulation)
NATIVE = [t for t in TARGETS if host_supports(t)]


def runnable(spec) -> bool:
    return host_supports(spec)


def skip_unless_runnable(spec):
    if not runnable(spec):
        pytest.skip(f"this host lacks {sorted(set(spec.features) - set(tvm_lowprec.targets.host_features()))} for {spec.name}")


def kernel_module(lib, spec, emulate=False):
    """The module to call a built kernel library through: ``lib`` itself where this host runs the
    row natively (and ``emulate`` is False), else its emulated form, whose replacement counts are
    checked against the real build (and must be positive: the kernel calls the row's intrinsic)."""
    if execution_mode(spec) == "native" and not emulate:
        return lib
    module, report = load_emulated(lib)
    assert report.total > 0, f"{spec.name}: the emulated build replaced no intrinsic call"
    assert dict(report.replaced) == dict(report.found)
    return module


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
