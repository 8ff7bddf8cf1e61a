"""float32 <-> float8 (e4m3fn, e5m2) conversions as TensorIR expressions on the bytes, exact.

TVM 0.27's own casts (``astype("float8_e4m3fn")`` on LLVM CPU targets) are wrong outside the normal
range, measured: 500 -> -0, -1e9 -> -0.234, NaN -> 1.5, 0.0013 -> 0.0078 (the format's nearest value
is 0.00195). ONNX's QuantizeLinear and DequantizeLinear with float8 types need the formats' own
rules, so the conversion is written here on the integer bits:

- **encode** (float32 -> the float8 byte): round to nearest, ties to even, as ``ml_dtypes`` and ONNX's
  reference do; with ``saturate`` (ONNX's default) values beyond the largest finite value, infinities
  included, become that value; without it they become infinity (e5m2) or NaN (e4m3fn, which has no
  infinity). NaN stays NaN. Results below the smallest normal become subnormals, rounded the same way.
- **decode** (the byte -> float32): exact (every float8 value is a float32).

A format is data (:class:`Float8Format`); the functions take the byte as ``uint8`` and build TE/TIR
expressions, so a kernel reinterprets its ``float8_*`` buffer as ``uint8`` and back.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx


@dataclass(frozen=True)
class Float8Format:
    """``ebits`` exponent bits, ``mbits`` mantissa bits, exponent ``bias``; ``has_inf``: IEEE-style
    infinities and NaNs in the top exponent (e5m2), else only the all-ones code is NaN (e4m3fn)."""

    name: str
    ebits: int
    mbits: int
    bias: int
    has_inf: bool

    @property
    def max_code(self) -> int:
        """The byte of the largest finite value (sign bit clear)."""
        if self.has_inf:
            return ((1 << self.ebits) - 2) << self.mbits | ((1 << self.mbits) - 1)
        return (1 << (self.ebits + self.mbits)) - 2  # all ones but the last mantissa bit

    @property
    def max_value(self) -> float:
        e = (self.max_code >> self.mbits) - self.bias
        m = self.max_code & ((1 << self.mbits) - 1)
        return (1 + m / (1 << self.mbits)) * 2.0**e

    @property
    def nan_code(self) -> int:
        return (1 << (self.ebits + self.mbits)) - 1 if not self.has_inf else ((1 << self.ebits) - 1) << self.mbits | 2

    @property
    def inf_code(self) -> int | None:
        return ((1 << self.ebits) - 1) << self.mbits if self.has_inf else None


E4M3FN = Float8Format("float8_e4m3fn", 4, 3, 7, has_inf=False)
E5M2 = Float8Format("float8_e5m2", 5, 2, 15, has_inf=True)
FORMATS = {f.name: f for f in (E4M3FN, E5M2)}


def _u32(value: int):
    return tirx.const(value, "uint32")


def encode(x, fmt: Float8Format, saturate: bool = True):
    """The float8 byte (``uint8``) of the float32 expression ``x``."""
    bits = tirx.reinterpret("uint32", x)
    sign = (bits >> _u32(24)) & _u32(0x80)
    mag = bits & _u32(0x7FFFFFFF)
    shift = 23 - fmt.mbits
    # normal float8 results: round the float32 mantissa to mbits, ties to even, then re-bias
    rounded = (mag + _u32((1 << (shift - 1)) - 1) + ((mag >> _u32(shift)) & _u32(1))) >> _u32(shift)
    normal = rounded - _u32((127 - fmt.bias) << fmt.mbits)
    # below the smallest normal (2**(1 - bias)): a multiple of the subnormal step, rounded half to even
    step_scale = tirx.const(2.0 ** (fmt.bias - 1 + fmt.mbits), "float32")
    subnormal = tirx.round(tirx.reinterpret("float32", mag) * step_scale).astype("uint32")
    smallest_normal_bits = _u32((127 + 1 - fmt.bias) << 23)
    code = tirx.if_then_else(mag < smallest_normal_bits, subnormal, normal)
    overflow = tirx.const(fmt.max_code, "uint32")
    if saturate:
        beyond = _u32(fmt.max_code)
    else:
        beyond = _u32(fmt.inf_code if fmt.has_inf else fmt.nan_code)
    # |x| rounds past the largest finite value (infinity included)
    code = tirx.if_then_else(code > overflow, beyond, code)
    code = tirx.if_then_else(mag > _u32(0x7F800000), _u32(fmt.nan_code), code)
    return (sign | code).astype("uint8")


def decode(byte, fmt: Float8Format):
    """The float32 value of the float8 byte expression ``byte`` (``uint8``)."""
    b = byte.astype("uint32")
    sign = (b & _u32(0x80)) << _u32(24)
    exp = (b >> _u32(fmt.mbits)) & _u32((1 << fmt.ebits) - 1)
    man = b & _u32((1 << fmt.mbits) - 1)
    normal = tirx.reinterpret("float32", sign | ((exp + _u32(127 - fmt.bias)) << _u32(23)) | (man << _u32(23 - fmt.mbits)))
    magnitude = man.astype("float32") * tirx.const(2.0 ** (1 - fmt.bias - fmt.mbits), "float32")
    subnormal = tirx.if_then_else(sign > _u32(0), -magnitude, magnitude)
    value = tirx.if_then_else(exp == _u32(0), subnormal, normal)
    top = _u32((1 << fmt.ebits) - 1)
    nan = tirx.const(float("nan"), "float32")
    if fmt.has_inf:
        inf = tirx.reinterpret("float32", sign | _u32(0x7F800000))
        special = tirx.if_then_else(man == _u32(0), inf, nan)
        return tirx.if_then_else(exp == top, special, value)
    return tirx.if_then_else(tirx.all(exp == top, man == _u32((1 << fmt.mbits) - 1)), nan, value)
