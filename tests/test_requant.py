"""Requantization arithmetic: fixed-point multipliers, and the float mode's tie behaviour."""

import numpy as np
import pytest

from tvm_lowprec.quant.requant import fixed_point_multiplier, requantize_ref


@pytest.mark.parametrize("scale", [1e-6, 3.7e-4, 0.0123, 0.5, 0.99999994, 1.0, 3.5, 1000.0])
def test_fixed_point_multiplier_reconstructs_the_scale(scale):
    m0, shift = fixed_point_multiplier(np.array([scale]))
    assert 2**30 <= int(m0[0]) < 2**31
    assert abs(int(m0[0]) * 2.0 ** -(31 + int(shift[0])) - scale) <= scale * 2**-30


@pytest.mark.parametrize("bad", [0.0, -1.0, np.nan, np.inf])
def test_fixed_point_rejects_bad_scales(bad):
    with pytest.raises(ValueError, match="finite and positive"):
        fixed_point_multiplier(np.array([bad]))


def test_float_mode_rounds_half_to_even():
    acc = np.array([[5, 15, -5, -15, 25]])
    got = requantize_ref(acc, np.float32(0.1), 0, "int8")
    # 0.5 -> 0, 1.5 -> 2, -0.5 -> -0, -1.5 -> -2, 2.5 -> 2 (float64 product of float32(0.1) is a hair above)
    np.testing.assert_array_equal(got, np.rint(acc * np.float64(np.float32(0.1))).astype(np.int8))


def test_fixed_point_is_within_one_step_of_float(rng):
    acc = rng.integers(-(2**22), 2**22, (64, 32))
    mult = (rng.random(32) * 1e-4 + 1e-6).astype(np.float32)
    f = requantize_ref(acc, mult, 3, "int8").astype(int)
    q = requantize_ref(acc, mult, 3, "int8", mode="fixed_point").astype(int)
    assert np.abs(f - q).max() <= 1
    assert (f == q).mean() > 0.999


def test_saturation_is_a_clamp_not_a_wrap():
    got = requantize_ref(np.array([[10**6, -(10**6)]]), np.float32(1.0), 0, "uint8")
    np.testing.assert_array_equal(got, [[255, 0]])


def _requant_kernel(f32: bool, mult: np.ndarray, zero_point: int):
    """``requant_f32`` (``f32``) or the float64 epilogue as a compiled elementwise kernel over int32."""
    import tvm
    from tvm import te

    from tvm_lowprec.kernels.qgemm import Epilogue, requant_f32, requantize
    from tvm_lowprec.targets import resolve_target

    ep = Epilogue("requant", out_dtype="uint8", zero_point=zero_point)
    x = te.placeholder((mult.size * 64,), "int32", name="x")
    m = te.placeholder((mult.size,), "float32", name="m")
    fn = (lambda i: requant_f32(x[i], ep, m[i % mult.size])) if f32 else (lambda i: requantize(x[i], ep, m[i % mult.size]))
    y = te.compute(x.shape, fn, name="y")
    return tvm.compile(tvm.IRModule({"main": te.create_prim_func([x, m, y])}),
                       target=resolve_target("native").tvm_target(1)), ep


def test_float32_requantization_equals_float64_within_its_bounds(rng):
    """The FMA rounding trick against the float64 formula, on random sums, on exact ties (x * mult a
    half-integer) and near ties, where a plain float32 multiply would round the product first."""
    import tvm

    from tvm_lowprec.kernels.qgemm import float32_requant_exact

    mult = np.array([0.5, 0.25, 0.0123, 3.7e-4, 1.5, 0.1], np.float32)
    assert float32_requant_exact(np.full(mult.size, 2**12), 255.0, 0, mult)  # sums below 2**20
    x = rng.integers(-(2**21), 2**21, mult.size * 64).astype(np.int32)
    x[:mult.size] = [1, 3, 0, 0, 1, 5]  # 0.5 -> 0, 0.75, 0, 0, 1.5 -> 2, 0.5 -> 0: ties to even
    x[mult.size:2 * mult.size] = [2**23 - 1, -(2**23) + 1, 16_777_215 // 2, 99, 7, 2**20]
    outs = []
    for f32 in (True, False):
        lib, ep = _requant_kernel(f32, mult, 3)
        y = tvm.runtime.tensor(np.zeros(x.size, np.uint8))
        lib.mod["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(mult), y)
        outs.append(y.numpy())
    np.testing.assert_array_equal(outs[0], outs[1])
    want = np.clip(np.rint(x.astype(np.float64) * np.tile(mult, 64).astype(np.float64)) + 3, 0, 255)
    np.testing.assert_array_equal(outs[0], want.astype(np.uint8))


def test_float32_requantization_is_refused_past_its_bounds():
    from tvm_lowprec.kernels.qgemm import float32_requant_exact

    assert not float32_requant_exact(np.array([2.0**17]), 128.0, 0, np.float32(1e-3))  # a sum of 2**24
    assert not float32_requant_exact(np.array([100.0]), 255.0, 0, np.float32(500.0))  # a product past 2**22
    assert not float32_requant_exact(np.array([100.0]), 255.0, 0, np.float32(np.inf))
