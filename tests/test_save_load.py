"""Compile once: ``tvm_lowprec.save``/``load`` give back the whole ``Compiled``, the compile cache
(``compile(cache=...)``, the CLI's default) loads instead of compiling, and damaged or foreign files
are refused with named errors, never a crash. Everything on the demo model, in ``tmp_path``; the
cache folder comes from ``TVM_LOWPREC_CACHE_DIR`` so no test touches ``~/.cache``."""

from __future__ import annotations

import importlib.resources
import json
import os
import shutil
import time
import zipfile

import numpy as np
import pytest
import tvm

import tvm_lowprec
from tvm_lowprec import cache, cli, saved
from tvm_lowprec.targets import host_supports, native_target, registered_targets

DEMO = str(importlib.resources.files("tvm_lowprec") / "data" / "demo_mlp_qdq.onnx")


@pytest.fixture(scope="module")
def demo_mod():
    return tvm_lowprec.from_onnx(DEMO)


@pytest.fixture(scope="module")
def demo(demo_mod):
    return tvm_lowprec.compile(demo_mod, target="native")


@pytest.fixture
def x():
    return np.random.default_rng(0).standard_normal((8, 128)).astype(np.float32)


@pytest.fixture
def cache_env(tmp_path, monkeypatch):
    """The cache folder for this test (through the environment, as a user sets it)."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(cache.ENV_DIR, str(folder))
    return folder


@pytest.fixture
def builds(monkeypatch):
    """Counts the real compiles (``tvm_lowprec._build``, what a cache hit skips)."""
    calls = []
    real = tvm_lowprec._build

    def counting(*args, **kwargs):
        calls.append(args[1].name)
        return real(*args, **kwargs)

    monkeypatch.setattr(tvm_lowprec, "_build", counting)
    return calls


def _entries(folder) -> list:
    return sorted(p.name for p in folder.glob(f"*{cache.SUFFIX}")) if folder.is_dir() else []


# -- save / load ---------------------------------------------------------------------------------
def test_round_trip_gives_the_same_model(demo, x, tmp_path):
    path = tvm_lowprec.save(demo, tmp_path / "demo.tlp")
    loaded = tvm_lowprec.load(path)
    assert loaded.loaded_from == str(path) and demo.loaded_from is None
    (want,) = demo(x)
    for got in (loaded(x), loaded(input=x), loaded({"input": x})):
        np.testing.assert_array_equal(got[0], want)  # bit-identical
        assert got[0].dtype == want.dtype
    out = [np.empty_like(want)]
    assert loaded(x, out=out)[0] is out[0]
    np.testing.assert_array_equal(out[0], want)
    assert loaded.kernels() == demo.kernels()
    assert [r.as_row() for r in loaded.kernels()] == [r.as_row() for r in demo.kernels()]
    assert loaded.inputs == demo.inputs and [i.name for i in loaded.inputs] == ["input"]
    assert loaded.output_names == demo.output_names == ("logits",)
    assert loaded.execution == demo.execution == "native"
    assert loaded.spec.name == demo.spec.name and dict(loaded.spec.llvm) == dict(demo.spec.llvm)
    assert loaded.num_threads == demo.num_threads and loaded.narrow_outputs == demo.narrow_outputs
    asm = loaded.inspect_source("asm")
    assert asm == demo.inspect_source("asm") and demo.spec.gemm.name.split("_")[0] in asm
    assert loaded.inspect_source("ll") == demo.inspect_source("ll")
    rows = loaded.profile(x, repeat=3)
    assert sorted(r["name"] for r in rows) == sorted(k.name for k in demo.kernels())
    assert repr(loaded) == repr(demo)


def test_loaded_model_profiles_isolated_and_exports(demo, x, tmp_path):
    loaded = tvm_lowprec.load(tvm_lowprec.save(demo, tmp_path / "demo.tlp"))
    rows = loaded.profile(x, repeat=2, isolated=True)
    assert {r["timed"] for r in rows} == {"isolated"}
    lib = loaded.export_library(tmp_path / "again.so")  # the library it was loaded from
    vm = tvm.relax.VirtualMachine(tvm.runtime.load_module(lib), tvm.cpu())
    np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), demo(x)[0])
    # a loaded model saves again, to the same content
    again = tvm_lowprec.load(tvm_lowprec.save(loaded, tmp_path / "again.tlp"))
    np.testing.assert_array_equal(again(x)[0], demo(x)[0])
    assert again.kernels() == demo.kernels()


def test_file_from_another_version_is_refused(demo, tmp_path):
    path = tvm_lowprec.save(demo, tmp_path / "demo.tlp")
    for change in ({"tvm_lowprec": "0.0.1"}, {"tvm": "0.26.0"}, {"format_version": 99}):
        other = tmp_path / f"other-{next(iter(change))}.tlp"
        shutil.copy(path, other)
        saved.rewrite_manifest(other, **change)
        with pytest.raises(tvm_lowprec.SavedModelVersionError, match="version"):
            tvm_lowprec.load(other)
    assert issubclass(tvm_lowprec.SavedModelVersionError, tvm_lowprec.SavedModelError)
    assert issubclass(tvm_lowprec.SavedModelError, tvm_lowprec.LowPrecError)


def test_file_for_a_row_this_host_cannot_run_is_refused(demo, tmp_path):
    path = tvm_lowprec.save(demo, tmp_path / "demo.tlp")
    manifest = saved.read_manifest(path)
    lacking = tmp_path / "lacking.tlp"
    shutil.copy(path, lacking)
    saved.rewrite_manifest(lacking, target={**manifest["target"], "features": [*manifest["target"]["features"],
                                                                             "amx-made-up-feature"]})
    with pytest.raises(tvm_lowprec.SavedModelHostError, match="amx-made-up-feature"):
        tvm_lowprec.load(lacking)
    other_host = tmp_path / "other-host.tlp"
    shutil.copy(path, other_host)
    saved.rewrite_manifest(other_host, target={**manifest["target"],
                                               "llvm": {**manifest["target"]["llvm"], "mcpu": "some-other-cpu"}})
    with pytest.raises(tvm_lowprec.SavedModelHostError, match="another host's 'native'"):
        tvm_lowprec.load(other_host)


@pytest.mark.parametrize("row", [s.name for s in registered_targets("cpu").values()
                                 if not host_supports(s) and tvm_lowprec.execution_mode(s) == "emulated"][:1]
                         or [pytest.param("none", marks=pytest.mark.skip(reason="this host runs every x86 row"))])
def test_emulated_build_saves_but_loads_only_where_native(demo_mod, tmp_path, row, x):
    emulated = tvm_lowprec.compile(demo_mod, target=row)
    assert emulated.execution == "emulated"
    path = tvm_lowprec.save(emulated, tmp_path / "emulated.tlp")
    with pytest.raises(tvm_lowprec.SavedModelHostError, match=row):
        tvm_lowprec.load(path)


def test_damaged_files_raise_a_named_error(demo, tmp_path):
    path = tvm_lowprec.save(demo, tmp_path / "demo.tlp")
    garbage = tmp_path / "garbage.tlp"
    garbage.write_bytes(b"not a zip file at all")
    truncated = tmp_path / "truncated.tlp"
    truncated.write_bytes(open(path, "rb").read()[: os.path.getsize(path) // 2])
    flipped = tmp_path / "flipped.tlp"  # a valid archive whose library is not the one saved
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(flipped, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            dst.writestr(name, data[:-1] + bytes([data[-1] ^ 0xFF]) if name == saved.LIBRARY else data)
    for bad in (garbage, truncated, flipped):
        with pytest.raises(tvm_lowprec.SavedModelError):
            tvm_lowprec.load(bad)
    with pytest.raises(FileNotFoundError):
        tvm_lowprec.load(tmp_path / "missing.tlp")


def test_save_refuses_rows_it_cannot_keep(demo_mod, tmp_path):
    arm = tvm_lowprec.compile(demo_mod, target="arm64-dotprod")
    with pytest.raises(tvm_lowprec.LowPrecError, match="export_library"):
        tvm_lowprec.save(arm, tmp_path / "arm.tlp")


def test_the_manifest_is_readable_json(demo, tmp_path):
    path = tvm_lowprec.save(demo, tmp_path / "demo.tlp")
    with zipfile.ZipFile(path) as archive:
        manifest = json.loads(archive.read(saved.MANIFEST))
        assert {saved.LIBRARY, saved.KERNELS, "source.asm", "source.ll"} <= set(archive.namelist())
    assert manifest["tvm_lowprec"] == tvm_lowprec.__version__ and manifest["tvm"] == tvm.__version__
    assert manifest["target"]["name"] == demo.spec.name
    assert [k["name"] for k in manifest["kernels"]] == [k.name for k in demo.kernels()]
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic write left no temporary behind


# -- the compile cache ---------------------------------------------------------------------------
def test_cache_folder_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV_DIR, str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.default_dir() == tmp_path / "mine"
    monkeypatch.delenv(cache.ENV_DIR)
    assert cache.default_dir() == tmp_path / "xdg" / "tvm-lowprec"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.default_dir() == tmp_path / "home" / ".cache" / "tvm-lowprec"
    assert cache.cache_dir(False) is None and cache.cache_dir(tmp_path / "d") == tmp_path / "d"


def test_cache_is_off_by_default(demo_mod, cache_env, builds):
    tvm_lowprec.compile(demo_mod)
    tvm_lowprec.compile(demo_mod)
    assert len(builds) == 2 and _entries(cache_env) == []


def test_cache_hit_does_not_compile(demo_mod, demo, cache_env, builds, x):
    first = tvm_lowprec.compile(demo_mod, cache=True)
    assert len(builds) == 1 and first.loaded_from is None
    assert len(_entries(cache_env)) == 1
    t0 = time.perf_counter()
    second = tvm_lowprec.compile(demo_mod, cache=True)
    hit_seconds = time.perf_counter() - t0
    assert len(builds) == 1, "a cache hit compiled again"
    assert second.loaded_from is not None and second.loaded_from.startswith(str(cache_env))
    np.testing.assert_array_equal(second(x)[0], demo(x)[0])
    assert second.kernels() == first.kernels() and second.inputs == first.inputs
    assert hit_seconds < 1.0
    # an explicit folder is a cache of its own
    other = cache_env.parent / "explicit"
    tvm_lowprec.compile(demo_mod, cache=other)
    tvm_lowprec.compile(demo_mod, cache=str(other))
    assert len(builds) == 2 and len(_entries(other)) == 1


def test_another_option_or_target_misses(demo_mod, cache_env, builds):
    tvm_lowprec.compile(demo_mod, cache=True)
    tvm_lowprec.compile(demo_mod, cache=True, fast_math=False)
    tvm_lowprec.compile(demo_mod, cache=True, requant_mode="fixed_point")
    tvm_lowprec.compile(demo_mod, cache=True, num_threads=1)
    assert len(builds) == 4 and len(_entries(cache_env)) == 4
    others = [s.name for s in registered_targets("cpu").values() if host_supports(s) and s.name != native_target().row]
    if others:
        tvm_lowprec.compile(demo_mod, target=others[-1], cache=True)
        assert builds[-1] == others[-1] and len(builds) == 5 and len(_entries(cache_env)) == 5
    # every one of them hits now
    tvm_lowprec.compile(demo_mod, cache=True, fast_math=False)
    tvm_lowprec.compile(demo_mod, cache=True, num_threads=1)
    assert len(builds) == 4 + bool(others)


def test_another_model_misses(demo_mod, cache_env, builds, tmp_path):
    import onnx
    from onnx import numpy_helper

    model = onnx.load(DEMO)
    init = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))  # a weight: other bytes, same graph
    array = numpy_helper.to_array(init).copy()
    array.flat[0] = array.flat[0] + 1 if array.dtype.kind in "iu" and array.flat[0] < 100 else array.flat[0] - 1
    init.CopyFrom(numpy_helper.from_array(array, init.name))
    onnx.save(model, tmp_path / "changed.onnx")
    tvm_lowprec.compile(demo_mod, cache=True)
    tvm_lowprec.compile(tvm_lowprec.from_onnx(str(tmp_path / "changed.onnx")), cache=True)
    assert len(builds) == 2 and len(_entries(cache_env)) == 2


def test_rows_this_host_does_not_run_natively_are_not_cached(demo_mod, cache_env, builds):
    tvm_lowprec.compile(demo_mod, cache=True, emulate=True)
    tvm_lowprec.compile(demo_mod, target="arm64-dotprod", cache=True)
    assert _entries(cache_env) == [] and len(builds) == 2


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "other-version"])
def test_corrupt_entry_is_compiled_again(demo_mod, demo, cache_env, builds, x, damage):
    tvm_lowprec.compile(demo_mod, cache=True)
    (entry,) = cache_env.glob(f"*{cache.SUFFIX}")
    data = entry.read_bytes()
    if damage == "garbage":
        entry.write_bytes(b"\x7fELF" + os.urandom(256))
    elif damage == "truncated":
        entry.write_bytes(data[: len(data) // 3])
    elif damage == "empty":
        entry.write_bytes(b"")
    else:
        saved.rewrite_manifest(entry, tvm_lowprec="0.0.1")
    with pytest.warns(UserWarning, match="compiling again"):
        again = tvm_lowprec.compile(demo_mod, cache=True)
    assert len(builds) == 2 and again.loaded_from is None
    np.testing.assert_array_equal(again(x)[0], demo(x)[0])
    assert tvm_lowprec.load(entry).kernels() == demo.kernels()  # rewritten, whole
    tvm_lowprec.compile(demo_mod, cache=True)
    assert len(builds) == 2


# -- the CLI -------------------------------------------------------------------------------------
def test_cli_second_run_loads_from_the_cache(tmp_path, cache_env, builds, monkeypatch, capsys):
    model = tmp_path / "model_qdq.onnx"
    shutil.copy(DEMO, model)
    monkeypatch.chdir(tmp_path)
    first_inference = []
    profile = tvm_lowprec.Compiled.profile

    def timed_profile(self, *args, **kwargs):  # the CLI's first inference on a native row
        first_inference.append(time.perf_counter())
        return profile(self, *args, **kwargs)

    monkeypatch.setattr(tvm_lowprec.Compiled, "profile", timed_profile)
    argv = ["run", str(model), "--repeat", "1"]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "compiling" in err and "cached as" in err and "loaded from cache" not in err
    assert len(builds) == 1 and len(_entries(cache_env)) == 1

    first_inference.clear()
    t0 = time.perf_counter()
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert "loaded from cache" in captured.err and "compiling" not in captured.err
    assert len(builds) == 1, "the second run compiled again"
    assert first_inference[0] - t0 < 1.0, f"first inference {first_inference[0] - t0:.2f} s after the start"
    assert "qgemm" in captured.out

    assert cli.main([*argv, "--no-cache"]) == 0
    err = capsys.readouterr().err
    assert "loaded from cache" not in err and "cached as" not in err and len(builds) == 2


def test_cli_key_follows_the_file_and_options(tmp_path, cache_env, builds, monkeypatch, capsys):
    model = tmp_path / "model_qdq.onnx"
    shutil.copy(DEMO, model)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", str(model), "--repeat", "1"]) == 0
    assert cli.main(["run", str(model), "--repeat", "1", "--threads", "2"]) == 0  # another option: compiles
    assert len(builds) == 2
    import onnx

    changed = onnx.load(str(model))  # other bytes, the same graph: compiles
    changed.doc_string = "another file"
    onnx.save(changed, str(model))
    assert cli.main(["run", str(model), "--repeat", "1"]) == 0
    assert len(builds) == 3 and len(_entries(cache_env)) == 3
    capsys.readouterr()
