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
    infinities and NaNs in the top exponent (e5m2), else only the all-ones code is NaN (e4m3fn), or,
    with ``has_nan`` False, no code is special (float4 e2m1: its all-ones code is 6.0). ``bits``:
    the width (8, or 4 for float4, whose code sits in the byte's low half, sign at bit 3)."""

    name: str
    ebits: int
    mbits: int
    bias: int
    has_inf: bool
    has_nan: bool = True
    bits: int = 8

    @property
    def sign_bit(self) -> int:
        return 1 << (self.bits - 1)

    @property
    def max_code(self) -> int:
        """The byte of the largest finite value (sign bit clear)."""
        if self.has_inf:
            return ((1 << self.ebits) - 2) << self.mbits | ((1 << self.mbits) - 1)
        if not self.has_nan:
            return (1 << (self.ebits + self.mbits)) - 1  # every code is a number
        return (1 << (self.ebits + self.mbits)) - 2  # all ones but the last mantissa bit

    @property
    def max_value(self) -> float:
        e = (self.max_code >> self.mbits) - self.bias
        m = self.max_code & ((1 << self.mbits) - 1)
        return (1 + m / (1 << self.mbits)) * 2.0**e

    @property
    def nan_code(self) -> int | None:
        if not self.has_nan:
            return None
        return (1 << (self.ebits + self.mbits)) - 1 if not self.has_inf else ((1 << self.ebits) - 1) << self.mbits | 2

    @property
    def inf_code(self) -> int | None:
        return ((1 << self.ebits) - 1) << self.mbits if self.has_inf else None


E4M3FN = Float8Format("float8_e4m3fn", 4, 3, 7, has_inf=False)
E5M2 = Float8Format("float8_e5m2", 5, 2, 15, has_inf=True)
FORMATS = {f.name: f for f in (E4M3FN, E5M2)}
# float4 (ONNX FLOAT4E2M1, OCP MX): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; no infinity, no NaN
E2M1 = Float8Format("float4_e2m1fn", 2, 1, 1, has_inf=False, has_nan=False, bits=4)


def _u32(value: int):
    return tirx.const(value, "uint32")


def encode(x, fmt: Float8Format, saturate: bool = True):
    """The float8 byte (``uint8``) of the float32 expression ``x`` (for float4, the code in its low
    four bits). A format without NaN maps NaN as ``ml_dtypes`` does: to zero of the opposite sign."""
    bits = tirx.reinterpret("uint32", x)
    sign = (bits >> _u32(32 - fmt.bits)) & _u32(fmt.sign_bit)
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
    if saturate or not fmt.has_nan:  # nothing to overflow into: a format without NaN saturates
        beyond = _u32(fmt.max_code)
    else:
        beyond = _u32(fmt.inf_code if fmt.has_inf else fmt.nan_code)
    # |x| rounds past the largest finite value (infinity included)
    code = tirx.if_then_else(code > overflow, beyond, code)
    is_nan = mag > _u32(0x7F800000)
    if fmt.has_nan:
        return tirx.if_then_else(is_nan, _u32(fmt.nan_code) | sign, sign | code).astype("uint8")
    return tirx.if_then_else(is_nan, sign ^ _u32(fmt.sign_bit), sign | code).astype("uint8")


def decode(byte, fmt: Float8Format):
    """The float32 value of the float8 byte expression ``byte`` (``uint8``)."""
    b = byte.astype("uint32")
    sign = (b & _u32(fmt.sign_bit)) << _u32(32 - fmt.bits)
    exp = (b >> _u32(fmt.mbits)) & _u32((1 << fmt.ebits) - 1)
    man = b & _u32((1 << fmt.mbits) - 1)
    normal = tirx.reinterpret("float32", sign | ((exp + _u32(127 - fmt.bias)) << _u32(23)) | (man << _u32(23 - fmt.mbits)))
    magnitude = man.astype("float32") * tirx.const(2.0 ** (1 - fmt.bias - fmt.mbits), "float32")
    subnormal = tirx.if_then_else(sign > _u32(0), -magnitude, magnitude)
    value = tirx.if_then_else(exp == _u32(0), subnormal, normal)
    top = _u32((1 << fmt.ebits) - 1)
    nan = tirx.const(float("nan"), "float32")
    if not fmt.has_nan:
        return value
    if fmt.has_inf:
        inf = tirx.reinterpret("float32", sign | _u32(0x7F800000))
        special = tirx.if_then_else(man == _u32(0), inf, nan)
        return tirx.if_then_else(exp == top, special, value)
    return tirx.if_then_else(tirx.all(exp == top, man == _u32((1 << fmt.mbits) - 1)), nan, value)
