"""Integer kernels as TensorIR: problem descriptions, PrimFunc builders, compile-time weight packing."""

from .pack_b import build_pack_b
from .qgemm import Epilogue, GemmLayout, QGemmProblem, build_qgemm, pack_weights

__all__ = ["Epilogue", "GemmLayout", "QGemmProblem", "build_pack_b", "build_qgemm", "pack_weights"]
