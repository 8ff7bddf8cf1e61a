"""Data movement that is a (batched) 2-D transpose of 8-bit codes (tvm_lowprec.schedule.byte_transpose):
found from the function's index expressions whatever reshapes and permutations wrote it, run as
register shuffles on every CPU row, equal to numpy's transpose; anything else is left to the other
rules."""

import numpy as np
import pytest
import tvm
from tvm import te

from tvm_lowprec.schedule import schedule_func
from tvm_lowprec.schedule.byte_transpose import ByteTransposeRule, source_positions, transpose_of

from conftest import TARGETS
from reference import intrinsic_free_module

CPU_ROWS = [spec for spec in TARGETS if spec.device == "cpu"]


def _head_transpose(pixels_h, pixels_w, channels, dtype="uint8"):
    """A detector head's ``reshape([P, C] -> [1, H, W, C]) -> transpose(0, 3, 1, 2)``, as TE writes it."""
    x = te.placeholder((pixels_h * pixels_w, channels), dtype, name="x")
    nhwc = te.compute((1, pixels_h, pixels_w, channels), lambda n, h, w, c: x[h * pixels_w + w, c], name="reshape")
    nchw = te.compute((1, channels, pixels_h, pixels_w), lambda n, c, h, w: nhwc[n, h, w, c], name="transpose")
    return te.create_prim_func([x, nchw]).with_attr("global_symbol", "main"), (pixels_h * pixels_w, channels)


def _heads_transpose(tokens, heads, dim, dtype="int8"):
    """Attention's key transpose, ``[1, T, H, D] -> [1, H, D, T]``: a 2-D transpose of ``[T, H*D]``."""
    x = te.placeholder((1, tokens, heads, dim), dtype, name="x")
    y = te.compute((1, heads, dim, tokens), lambda n, h, d, t: x[n, t, h, d], name="transpose")
    return te.create_prim_func([x, y]).with_attr("global_symbol", "main"), (1, tokens, heads, dim)


CASES = {"head-6400x16": lambda: _head_transpose(80, 80, 16), "head-1600x3": lambda: _head_transpose(40, 40, 3),
         "keys-128x384": lambda: _heads_transpose(128, 12, 32),
         # Whisper's keys at 250 frames: 15 tiles of 16 rows, the last 10 rows a byte at a time
         "keys-250x384": lambda: _heads_transpose(250, 6, 64, "uint8"),
         # ViT-B/16's 7x7 patches back to NCHW: 3 tiles of 16 rows and one row left
         "patches-49x768": lambda: _head_transpose(7, 7, 768)}
EXPECTED = {"head-6400x16": (1, 6400, 16), "head-1600x3": (1, 1600, 3), "keys-128x384": (1, 128, 384),
            "keys-250x384": (1, 250, 384), "patches-49x768": (1, 49, 768)}




@pytest.mark.parametrize("case", list(CASES))
def test_the_permutation_is_read_from_the_index_expressions(case):
    func, _ = CASES[case]()
    assert transpose_of(source_positions(func)) == EXPECTED[case]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("spec", CPU_ROWS, ids=lambda s: s.name)
def test_every_cpu_row_runs_the_transpose_as_shuffles_equal_to_numpy(spec, case, rng):
    func, in_shape = CASES[case]()
    sch = schedule_func(func, spec)
    kernel = sch.mod["main"]
    assert "lowprec.layout" in kernel.attrs and str(kernel.attrs["lowprec.layout"]).startswith("transpose")
    assert "Shuffle" in kernel.script()
    lib = tvm.compile(sch.mod, target=spec.tvm_target(2)).mod
    dtype = str(func.params[0].dtype)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max + 1, in_shape).astype(dtype)
    out_shape = [int(e) for e in func.params[1].shape]
    args = [tvm.runtime.tensor(x), tvm.runtime.tensor(np.zeros(out_shape, dtype))]
    intrinsic_free_module(lib, spec)["main"](*args)
    b, r, s = EXPECTED[case]
    want = x.reshape(b, r, s).transpose(0, 2, 1).reshape(out_shape)
    np.testing.assert_array_equal(args[1].numpy(), want)


def _declined(func):
    return ByteTransposeRule().apply(func.with_attr("global_symbol", "main"), CPU_ROWS[0]) is None


def test_what_is_not_a_2d_transpose_of_codes_is_declined():
    x = te.placeholder((4, 4, 64), "uint8", name="x")
    blocks = te.compute((4, 4, 64), lambda i, j, k: x[j, i, k], name="swap")  # moves 64-byte blocks, not bytes
    assert _declined(te.create_prim_func([x, blocks]))
    flat = te.compute((1024,), lambda i: x[i // 256, i // 64 % 4, i % 64], name="reshape")  # an identity copy
    assert _declined(te.create_prim_func([x, flat]))
    shifted = te.compute((4, 64, 4), lambda i, k, j: x[i, j, k] + tvm.tirx.const(1, "uint8"), name="add")  # arithmetic
    assert _declined(te.create_prim_func([x, shifted]))
    rotated = te.placeholder((32, 16), "uint8", name="rotated")  # a transpose for p < 16, columns rotated after
    mixed = te.compute((16, 32), lambda c, p: rotated[p, (c + p // 16) % 16], name="t")
    assert _declined(te.create_prim_func([rotated, mixed]))
    f = te.placeholder((64, 16), "float32", name="f")  # not 8-bit
    assert _declined(te.create_prim_func([f, te.compute((16, 64), lambda c, p: f[p, c], name="t")]))
    odd = te.placeholder((6, 7), "uint8", name="odd")  # no tile of 16 divides the rows
    assert _declined(te.create_prim_func([odd, te.compute((7, 6), lambda c, p: odd[p, c], name="t")]))
    short = te.placeholder((4, 8000), "uint8", name="short")  # 4 rows: the strided-store direction, left to LLVM
    assert _declined(te.create_prim_func([short, te.compute((8000, 4), lambda p, c: short[c, p], name="t")]))


def test_the_profile_counts_the_bytes_the_transpose_moves():
    """The kernel reads its views of the buffers; the profile still counts both buffers whole."""
    from tvm_lowprec.compiled import _traffic

    func, _ = CASES["head-6400x16"]()
    kernel = schedule_func(func, CPU_ROWS[0]).mod["main"]
    assert _traffic(kernel) == (6400 * 16, 6400 * 16)
