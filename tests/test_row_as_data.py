"""A target row is data from end to end (issue 27): a new row of an existing kind is one registry entry in
``tvm_lowprec/targets/`` plus, for a new instruction, one intrinsic row from ``tvm_lowprec/intrin/``; no
other module names a row or an intrinsic (the checklist: docs/targets.md). Both are checked here from the
registry: no code outside those two packages keys anything by a registered row's or intrinsic row's
name, and a throwaway row with a throwaway intrinsic row, registered and nothing else, is compiled, run
exactly, listed, predicted for and executed as its features allow."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest

import tvm_lowprec
from tvm_lowprec import perfmodel, targets
from tvm_lowprec.emulation import execution_mode
from tvm_lowprec.intrin import ALL_INTRINSICS

PACKAGE = Path(tvm_lowprec.__file__).parent
ROW_PACKAGES = ("targets", "intrin")  # where rows and intrinsic rows are defined, and nowhere else


def _names() -> set[str]:
    """Every registered row's name and every intrinsic row any of them (or the intrin package) defines."""
    names = set(targets.registered_targets()) | set(ALL_INTRINSICS)
    for spec in targets.registered_targets("cpu").values():
        for recipe in (*spec.recipes(), spec.narrow, spec.int16, spec.nibble, spec.bf16, spec.fma):
            if recipe is not None:
                names.add(recipe.intrin.name)
        names |= {row.name for row in (spec.lookup, spec.wide_lookup, spec.register_permute) if row is not None}
    return names


def _code_strings(path: Path):
    """``(line, text)`` of every string constant of a module that is not a docstring."""
    tree = ast.parse(path.read_text())
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def test_no_module_outside_targets_and_intrin_names_a_row_or_an_intrinsic():
    names = _names()
    assert {"x86-avx2", "vpmaddwd_ymm", "sdot_v16"} <= names  # the scan looks for real names
    found = [f"{path.relative_to(PACKAGE)}:{line}: {text!r}" for path in sorted(PACKAGE.rglob("*.py"))
             if path.relative_to(PACKAGE).parts[0] not in ROW_PACKAGES
             for line, text in _code_strings(path) if text in names]
    assert not found, "put what these key by row or intrinsic name on the row itself:\n" + "\n".join(found)


@pytest.fixture(scope="module")
def probe_row():
    """A row of the AVX2 kind with an intrinsic row of its own (vpmaddwd ymm under a new name), registered
    and nothing else; unregistered afterwards."""
    from tvm_lowprec.intrin.x86 import _pmaddwd_row

    base = targets.registered_targets()["x86-avx2"]
    intrin = _pmaddwd_row("vpmaddwd_ymm_probe", 8, "llvm.x86.avx2.pmadd.wd", ("avx2",))
    spec = dataclasses.replace(base, name="x86-probe", aliases=("probe-row",), gemm=intrin, bounded=(),
                               description="a throwaway row: vpmaddwd ymm under a new intrinsic row",
                               mca_cpus=("haswell",), grid_prediction=True)
    targets.register_target(spec)
    yield spec
    targets.unregister_target("x86-probe")


def test_a_throwaway_row_is_one_registry_entry(probe_row, capsys):
    from tvm_lowprec.bench.grid import predicted_rows
    from tvm_lowprec.bench.problems import make_problem, qlinearmatmul_model
    from tvm_lowprec.bench.providers import exact_reference
    from tvm_lowprec.cli import main

    assert tvm_lowprec.resolve_target("probe-row") is probe_row
    # the performance model reads the row and its intrinsic row
    assert perfmodel.MCA_CPUS["x86-probe"] == ("haswell",) and perfmodel.mca_cpus(probe_row) == ("haswell",)
    assert perfmodel.INTRIN_ASM["vpmaddwd_ymm_probe"].mnemonic == "vpmaddwd"
    assert "x86-probe" in predicted_rows()
    # it runs where its features are (native), else emulated by its intrinsic's semantics
    assert execution_mode(probe_row) == ("native" if targets.host_supports(probe_row) else "emulated")
    # full-range weights: the exact vpmaddwd recipe, the probe's own intrinsic, checked exactly
    problem = make_problem(37, 40, 72, np.random.default_rng(0), full_range=True)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(qlinearmatmul_model(problem)), target="x86-probe")
    assert any("vpmaddwd_ymm_probe" in str(k.intrinsic) for k in compiled.kernels())
    np.testing.assert_array_equal(compiled(problem.a)[0], exact_reference(problem))
    assert compiled.execution == execution_mode(probe_row)
    assert main(["targets"]) == 0
    assert "x86-probe" in capsys.readouterr().out


def test_a_row_is_gone_once_unregistered():
    base = targets.registered_targets()["x86-avx2"]
    spec = targets.register_target(dataclasses.replace(base, name="x86-gone", aliases=("gone-row",)))
    assert tvm_lowprec.resolve_target("gone-row") is spec
    targets.unregister_target("x86-gone")
    assert "x86-gone" not in targets.registered_targets() and "x86-avx2" in targets.registered_targets()
    with pytest.raises(Exception, match="gone-row"):
        tvm_lowprec.resolve_target("gone-row")
    with pytest.raises(KeyError):
        targets.unregister_target("x86-no-such-row")


def _device_tests(path: Path):
    """``(line, source)`` of each comparison of a ``.device`` attribute with a string in a module."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "device" for s in sides) and any(
                    isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides):
                yield node.lineno, ast.unparse(node)


def test_what_differs_by_device_is_asked_of_its_backend():
    """No module tests a row's ``device`` against a device's name: the schedule rules, the lowering, the
    GEMM layout, the build, the executor and the services are the row's backend's
    (:mod:`tvm_lowprec.backends`); only the registry filters rows by device."""
    from tvm_lowprec.backends import BACKENDS

    allowed = {Path("targets") / "__init__.py"}  # registered_targets(device), host_supports (CPU features)
    found = [f"{path.relative_to(PACKAGE)}:{line}: {text}" for path in sorted(PACKAGE.rglob("*.py"))
             if path.relative_to(PACKAGE) not in allowed for line, text in _device_tests(path)]
    assert not found, "ask spec.backend instead:\n" + "\n".join(found)
    for spec in targets.registered_targets().values():  # every row's backend resolves what it names
        backend = spec.backend
        assert backend is BACKENDS[spec.device] and backend.schedule_rules()
        assert callable(backend.lowering_pipeline().finalize_passes)
