import numpy as np
import pytest

import tvm_lowprec
from tvm_lowprec.targets import host_supports, registered_targets

TARGETS = list(registered_targets().values())


def runnable(spec) -> bool:
    return host_supports(spec)


def skip_unless_runnable(spec):
    if not runnable(spec):
        pytest.skip(f"this host lacks {sorted(set(spec.features) - set(tvm_lowprec.targets.host_features()))} for {spec.name}")


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
