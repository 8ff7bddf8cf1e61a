"""The llvm-mca performance model on every registered row (code generation and simulation only: runs on
any x86 host with llvm-mca; skipped without it)."""

import re

import pytest

from tvm_lowprec import perfmodel
from tvm_lowprec.perfmodel import INTRIN_ASM, McaError, ceiling, ceiling_block, extract_kernel_loop, predict, run_mca

from conftest import TARGETS

pytestmark = pytest.mark.skipif(perfmodel.find_llvm_mca() is None,
                                reason="llvm-mca not installed (apt-get install llvm-14)")

# every (row, recipe, llvm-mca CPU) the registry and MCA_CPUS name
CASES = [(t, r.intrin.name, cpu) for t in TARGETS for r in t.recipes() for cpu in perfmodel.mca_cpus(t)]
SHAPE = (64, 256, 256)  # small, but a full table tile and a K loop of 64+ steps


def _id(case):
    return f"{case[0].name}/{case[1]}/{case[2]}"


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_prediction_on_every_row(case):
    spec, recipe, cpu = case
    p = predict(spec, *SHAPE, recipe=recipe, mca_cpu=cpu, iterations=200)
    assert p.intrin == recipe and p.mca_cpu == cpu and p.sched_model != "?"
    assert p.intrinsics_per_iteration >= p.tile[0] * p.tile[1]  # one per accumulator, per unrolled step
    mnemonic = INTRIN_ASM[recipe].mnemonic
    assert sum(re.sub(r"^\{\w+\}\s*", "", line).split()[0] == mnemonic for line in p.loop[1:]) == p.intrinsics_per_iteration
    assert p.loop[-1].split()[0].startswith("j")  # the block ends at the back branch
    assert 0 < p.fraction <= 1.0 + 1e-9
    assert 0 < p.padding_efficiency <= 1


@pytest.mark.parametrize("intrin", sorted(INTRIN_ASM))
def test_ceiling_block_is_sane(intrin):
    block = ceiling_block(intrin)
    info = INTRIN_ASM[intrin]
    regs = {int(r) for r in re.findall(rf"%{info.reg}(\d+)", block)}
    assert max(regs) < info.registers  # encodable
    assert block.count(info.mnemonic) >= 8  # enough independent accumulators to hide latency


@pytest.mark.parametrize("case", [c for c in CASES if c[2] == perfmodel.mca_cpus(c[0])[0]], ids=_id)
def test_ceiling_is_sane(case):
    spec, recipe, cpu = case
    top = ceiling(recipe, cpu, 200)
    assert 0.25 <= top <= 4  # x86 cores issue 0.5-2 vector multiplies per cycle
    # one accumulator's steps alone are no faster: the ceiling block is bound by throughput, not latency
    one_chain = "\n".join(ceiling_block(recipe).splitlines()[: len(INTRIN_ASM[recipe].step)]) + "\n"
    assert 1 / run_mca(one_chain, cpu, 200).cycles_per_iteration <= top * 1.02


@pytest.mark.parametrize("spec", TARGETS, ids=lambda t: t.name)
def test_one_by_one_tile_is_predicted_slower(spec):
    good = predict(spec, *SHAPE, iterations=200)
    bad = predict(spec, *SHAPE, tile=(1, 1), iterations=200)
    assert bad.tile[:2] == (1, 1)
    assert bad.fraction < good.fraction
    if spec.gemm.name.startswith("vpdpbusd"):  # accumulates in place: one chain, latency-bound
        assert bad.fraction < 0.5 * good.fraction


def test_loop_extraction_picks_innermost_loop_with_most_intrinsics():
    asm = "\n".join([
        "f:", ".LBB0_1:", "  vpaddd %ymm0, %ymm1, %ymm1", ".LBB0_2:", "\t.p2align 4",
        "  vpmaddwd %ymm2, %ymm3, %ymm4  # comment", "  vpmaddwd %ymm2, %ymm3, %ymm5", "  jne .LBB0_2",
        "  jmp .LBB0_1", ".LBB0_3:", "  vpmaddwd %ymm2, %ymm3, %ymm4", "  jb .LBB0_3", "  ret",
    ])
    loop = extract_kernel_loop(asm, "vpmaddwd")
    assert loop.label == ".LBB0_2" and loop.intrinsics == 2 and loop.first_line == 4
    assert perfmodel.mca_block(loop).splitlines() == [
        ".LBB0_2:", "vpmaddwd %ymm2, %ymm3, %ymm4", "vpmaddwd %ymm2, %ymm3, %ymm5", "jne .LBB0_2"]
    with pytest.raises(McaError, match="no loop"):
        extract_kernel_loop(asm, "vpdpbusd")


def test_mca_rejection_names_the_line():
    with pytest.raises(McaError, match=r"line 2 `bogus %ymm1`"):
        run_mca("vpaddd %ymm1, %ymm2, %ymm2\nbogus %ymm1\n", "znver3", 10)
    with pytest.raises(McaError, match="vpdpbusd"):  # Zen 3's model has no VNNI
        run_mca("vpdpbusd %zmm1, %zmm2, %zmm3\n", "znver3", 10)


def test_roofline_bounds_a_gemv_by_its_weight_stream_and_leaves_a_large_gemm_alone():
    """1x4096x4096 moves 16 MiB of weights for 33.6 M ops: at 98 GB/s and 1070 GOPS it cannot pass
    2*4096*4096 / (16.8 MB / 98 GB/s) = 196 GOPS (18% of peak) however good its loop; 1024^3 moves
    about 3 MiB for 2.1 G ops and stays compute-bound."""
    vnni = next(t for t in TARGETS if t.name == "x86-avx512-vnni")
    memory = perfmodel.ROW_MEMORY[vnni.name]
    gemv = predict(vnni, 1, 4096, 4096, iterations=200)
    assert gemv.bytes_moved >= 4096 * 4096
    bound = 2 * 4096 * 4096 / (gemv.bytes_moved / (memory.read_gbs * 1e9)) / (memory.peak_gops * 1e9)
    assert gemv.with_memory(memory) == pytest.approx(bound) and bound < 0.2 < gemv.gemm_fraction
    big = predict(vnni, 1024, 1024, 1024, iterations=200)
    assert big.with_memory(memory) == pytest.approx(big.gemm_fraction)
    with pytest.raises(ValueError, match="positive"):
        perfmodel.Memory(0.0, 10.0)
