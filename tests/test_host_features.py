"""Running "as on another host": the recorded hosts (tvm_lowprec.targets.hosts), the environment variable
TVM_LOWPREC_HOST_FEATURES that names one, and the suite's ``--host-features`` option that sets it.

What a recorded host must give is written here as data: the row ``"native"`` resolves to, the LLVM CPU
it is built for, and which optional recipes that row keeps there. Whatever host is simulated, the real
CPU bounds what runs natively: a row it lacks runs emulated (never a SIGILL)."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

import tvm_lowprec
from tvm_lowprec import targets
from tvm_lowprec.emulation import execution_mode
from tvm_lowprec.targets import HOST_FEATURES_ENV, RECORDED_HOSTS

from models import qlinear_matmul

TESTS = Path(__file__).resolve().parent

# recorded host -> (row "native" resolves to, its mcpu, keeps the bf16 GEMM (AVX512_BF16), keeps the
# VBMI byte lookup (AVX512_VBMI))
EXPECTED = {
    "zen3": ("x86-avx2", "znver3", False, False),
    "zen4": ("x86-avx512-vnni", "znver4", True, True),
    "zen5": ("x86-avx512-vnni", "znver5", True, True),
    "spr": ("x86-avx512-vnni", "sapphirerapids", True, True),  # no AMX row registered: AVX-512 VNNI is its best
    "icelake": ("x86-avx512-vnni", "icelake-server", False, True),
    "skylake-avx512": ("x86-avx512", "skylake-avx512", False, False),
    "alderlake": ("x86-avx-vnni", "alderlake", False, False),
}


def test_every_recorded_host_has_an_expectation():
    assert set(EXPECTED) == set(RECORDED_HOSTS)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_native_resolves_to_the_recorded_hosts_row(monkeypatch, name):
    row, cpu, bf16, vbmi = EXPECTED[name]
    monkeypatch.setenv(HOST_FEATURES_ENV, name)
    host = RECORDED_HOSTS[name]
    assert targets.simulated_host() is host and targets.host_features() == host.features
    assert targets.host_cpu() == cpu
    native = targets.resolve_target("native")
    assert native.row == row and native.name == f"native({row})"
    assert native.llvm["mcpu"] == cpu
    assert (native.bf16 is not None) == bf16
    assert (native.wide_lookup is not None) == vbmi
    assert set(native.code_features) <= host.features


def test_the_recorded_flags_are_linux_spellings_of_the_features_that_matter():
    features = {name: host.features for name, host in RECORDED_HOSTS.items()}
    assert "avx512f" not in features["zen3"] and "avx2" in features["zen3"] and "avxvnni" not in features["zen3"]
    assert {"avx512vnni", "avx512bf16", "avx512vbmi"} <= features["zen4"] and "avxvnni" not in features["zen4"]
    assert {"avx512vnni", "avx512bf16", "avxvnni"} <= features["zen5"]
    assert {"amxtile", "amxint8", "amxbf16", "avx512vnni", "avx512bf16", "avx512fp16", "avxvnni"} <= features["spr"]
    assert "avx512vnni" in features["icelake"] and "avx512bf16" not in features["icelake"]
    assert "avx512bw" in features["skylake-avx512"] and "avx512vnni" not in features["skylake-avx512"]
    assert "avxvnni" in features["alderlake"] and "avx512f" not in features["alderlake"]
    for host in RECORDED_HOSTS.values():
        assert "_" not in "".join(f for f in host.features if f.startswith(("avx", "amx")))  # LLVM names


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_what_runs_natively_is_bounded_by_the_real_cpu(monkeypatch, name):
    """Simulating a host that has more than this CPU (a Sapphire Rapids' AMX and AVX512_FP16 on a Zen 4)
    leaves the rows this CPU lacks emulated; simulating a weaker one (a Zen 3 on a Zen 4) makes the rows
    it lacks emulated although this CPU could run them."""
    monkeypatch.setenv(HOST_FEATURES_ENV, name)
    real = targets.real_host_features()
    assert targets.runnable_features() == RECORDED_HOSTS[name].features & real
    for spec in targets.registered_targets("cpu").values():
        runs = set(spec.code_features) <= RECORDED_HOSTS[name].features and set(spec.code_features) <= real
        assert targets.host_supports(spec) == runs, spec.name
        if spec.name.startswith("x86"):
            assert execution_mode(spec) == ("native" if runs else "emulated"), spec.name


def _isa(feature: str) -> str:
    return feature.lower().replace("-", "").replace("_", "").replace(".", "")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_native_as_on_a_recorded_host_enables_none_of_its_extensions_this_cpu_lacks(monkeypatch, name):
    """The recorded host's mcpu switches on all its extensions; those this CPU lacks are switched off again
    (LLVM emits SSE4a's insertq unasked under znver3: a Zen 3's build faulted on an Intel CPU), except the
    row's own, which make the row emulated here instead."""
    import tvm

    monkeypatch.setenv(HOST_FEATURES_ENV, name)
    native = targets.native_target()
    enabled = {str(f) for f in tvm.target.codegen.llvm_get_cpu_features(native.tvm_target())}
    recorded = {_isa(f) for f in RECORDED_HOSTS[name].features}
    real = {_isa(f) for f in targets.real_host_features()}
    lacking = {f for f in enabled if _isa(f) in recorded and _isa(f) not in real}
    assert lacking <= set(native.code_features), sorted(lacking)
    assert targets.host_supports(native) == (not lacking)


def test_an_unknown_host_is_refused_with_the_recorded_names(monkeypatch):
    monkeypatch.setenv(HOST_FEATURES_ENV, "pentium4")
    with pytest.raises(ValueError, match="pentium4.*zen3.*spr"):
        targets.host_features()


def test_without_the_variable_the_real_cpu_is_the_host(monkeypatch):
    monkeypatch.delenv(HOST_FEATURES_ENV, raising=False)
    assert targets.simulated_host() is None
    assert targets.host_features() == targets.runnable_features() == targets.real_host_features()


@pytest.mark.parametrize("name", ["zen3", "skylake-avx512", "alderlake", "spr"])
def test_a_model_compiled_as_on_a_recorded_host_runs_exactly(monkeypatch, rng, name):
    """``"native"`` builds the recorded host's row; it runs natively where this CPU has its features,
    emulated where not, exact either way."""
    monkeypatch.setenv(HOST_FEATURES_ENV, name)
    model = qlinear_matmul(4, 32, 16)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(model), target="native")
    assert compiled.spec.row == EXPECTED[name][0]
    runs_here = set(compiled.spec.code_features) <= targets.real_host_features()
    assert compiled.execution == ("native" if runs_here else "emulated")
    a = rng.integers(0, 256, (4, 32)).astype(np.uint8)
    want = ReferenceEvaluator(model).run(None, {model.graph.input[0].name: a})[0]
    np.testing.assert_array_equal(compiled(a)[0], want)


@pytest.mark.host_dependent
def test_the_option_reaches_the_library(request):
    """Under ``--host-features NAME`` (this very run, or the subprocess below): the variable is set and
    ``"native"`` is that host's row."""
    name = request.config.getoption("--host-features")
    if name is None:
        pytest.skip("this run simulates no host (see test_the_option_sets_the_variable)")
    assert os.environ[HOST_FEATURES_ENV] == name
    assert targets.native_target().row == EXPECTED[name][0]


def test_the_option_sets_the_variable():
    env = {k: v for k, v in os.environ.items() if k != HOST_FEATURES_ENV}
    for name in ("zen3", "skylake-avx512"):
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--host-features", name,
             f"{TESTS / 'test_host_features.py'}::test_the_option_reaches_the_library"],
            cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr
