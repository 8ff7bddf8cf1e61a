"""Errors that name what is wrong: the operator and node, the input, the value."""


class LowPrecError(Exception):
    """Base class of tvm-lowprec's errors."""


class UnsupportedOperatorError(LowPrecError, NotImplementedError):
    """An ONNX operator outside the supported set (names the operator and every node using it)."""


class InputError(LowPrecError, ValueError):
    """A runtime input with the wrong name, shape or dtype."""


class QuantizationParameterError(LowPrecError, ValueError):
    """A scale or zero point that cannot be used (zero, negative, NaN, wrong shape)."""


class DynamicShapeError(LowPrecError, ValueError):
    """A dimension that stays dynamic where a static one is needed (names the input dimension to fix
    and the first node whose shape depends on it)."""
