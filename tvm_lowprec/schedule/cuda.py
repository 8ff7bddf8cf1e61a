"""GPU schedule rules: the quantized GEMM on tensor-core ``mma.sync``, everything else through TVM's
dlight GPU rules (row reductions, general reductions, and the fallback that binds spatial loops).

A qgemm PrimFunc (:func:`tvm_lowprec.kernels.build_qgemm` with a GPU row's ``"nk"`` layout) has up
to four stages, each a kernel of its own once lowered:

1. ``A_prepared`` (only where M or K is not a multiple of the block tile): the activations padded
   with zeros, one thread per element;
2. ``rowsum`` (only where the weight zero point is not zero): one thread per activation row;
3. ``gemm``: :func:`tvm_lowprec.cuda.gemm.tensorize_gemm` (shared-memory staging, ``ldmatrix``,
   ``m16n8k32`` mma, int32 accumulators in registers), the mma form from ``lowprec.intrin``;
4. ``epilogue``, fused into the GEMM kernel: each thread block stores its int32 accumulator tile to
   shared memory, then its threads apply the bias and zero-point corrections, the requantization
   and the fused activation to the tile and write the outputs (the accumulators never go to global
   memory). With a ``rowsum`` stage (a weight zero point that is not zero: attention's run-time
   operands) the epilogue is a kernel of its own that reads the accumulators from global memory.
"""

from __future__ import annotations

from tvm.s_tir import Schedule

from .blocks import find_block, root_children

THREADS = 256  # per block for the elementwise stages: 8 warps, full occupancy at any register use


def _is_qgemm(func) -> bool:
    return func.attrs is not None and func.attrs.get("lowprec.op", None) == "qgemm"


def bind_elementwise(sch: Schedule, block, threads: int = THREADS) -> None:
    """One thread per point of the block's spatial loops; reduction loops stay serial in the thread."""
    loops = sch.get_loops(block)
    if any(sch.get(loop).thread_binding is not None for loop in loops):
        return
    kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
    spatial = [loop for loop, kind in zip(loops, kinds) if kind == 0]
    reduce = [loop for loop, kind in zip(loops, kinds) if kind != 0]
    if not spatial:
        spatial = [sch.add_unit_loop(block)]
    sch.reorder(*spatial, *reduce)
    bx, tx = sch.split(sch.fuse(*spatial), factors=[None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    if reduce:
        sch.decompose_reduction(block, reduce[0])


class CudaQGemmRule:
    """Declines anything that is not a qgemm built for a GPU row (B stored ``[N, K]``)."""

    def apply(self, func, spec):
        if not _is_qgemm(func) or len(func.attrs.get("lowprec.block", [])) != 5:
            return None
        from ..cuda.gemm import intrin_group
        from ..cuda.mma import GemmTiles

        tiles = GemmTiles(*(int(x) for x in func.attrs["lowprec.block"]))
        group = intrin_group(str(func.attrs["lowprec.intrin"]))
        sch = Schedule(func)
        from ..cuda.gemm import tensorize_gemm

        # a row-sum stage (a weight zero point that is not zero) is a second producer of the epilogue,
        # which TVM cannot then move into the GEMM's block loop: that epilogue stays a kernel of its own
        fused = find_block(sch, "rowsum") is None
        tensorize_gemm(sch, sch.get_sblock("gemm"), tiles, group, epilogue=sch.get_sblock("epilogue") if fused else None)
        # A_prepared (zero padding) stays a kernel of its own: inlined into the 16-byte global -> shared
        # copy, TVM 0.27's CUDA codegen writes the padded vector as make_uint4 of 16 bytes (nvcc: "too
        # many arguments")
        for name in ("A_prepared", "rowsum") if fused else ("A_prepared", "rowsum", "epilogue"):
            block = find_block(sch, name)
            if block is not None:
                bind_elementwise(sch, block)
        return sch


class CudaPackBRule:
    """Run-time weight packing (attention's K and V) into the ``[N, K]`` layout: every stage one
    thread per output element (the column sums reduce along K inside the thread)."""

    def apply(self, func, spec):
        if func.attrs is None or func.attrs.get("lowprec.op", None) != "pack_b":
            return None
        sch = Schedule(func)
        _, blocks = root_children(sch)
        for block in blocks:
            bind_elementwise(sch, block)
        return sch
