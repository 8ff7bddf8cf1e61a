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


class SavedModelError(LowPrecError):
    """A saved model (:func:`tvm_lowprec.save`, or a compile-cache entry) that cannot be read: not a
    tvm-lowprec file, truncated or corrupt (names the file and what is wrong)."""


class SavedModelVersionError(SavedModelError):
    """A saved model written by another version of tvm-lowprec or of TVM, or in another file format
    version: its library is not guaranteed to load with this runtime (names both versions)."""


class SavedModelHostError(SavedModelError):
    """A saved model whose target row this host cannot run natively (it lacks the row's instructions,
    or the row is not a CPU row of this architecture): names the row and what is missing."""


class KernelBuildError(LowPrecError, RuntimeError):
    """A kernel that LLVM cannot compile to machine code for the target (LLVM reports it by aborting;
    the build runs in a child process, :mod:`tvm_lowprec.native_build`): names every such kernel with
    LLVM's message."""
