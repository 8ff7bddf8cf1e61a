"""Integer kernels as TensorIR: problem descriptions, PrimFunc builders, compile-time weight packing."""

from .qgemm import Epilogue, GemmLayout, QGemmProblem, build_qgemm, pack_weights

__all__ = ["Epilogue", "GemmLayout", "QGemmProblem", "build_qgemm", "pack_weights"]
