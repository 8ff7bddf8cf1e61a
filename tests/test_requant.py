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
