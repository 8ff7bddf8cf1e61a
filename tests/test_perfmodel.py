"""The llvm-mca performance model on every registered row, x86 and AArch64 (code generation and simulation
only: runs on any x86 host with llvm-mca; skipped without it)."""

import re

import pytest

from tvm_lowprec import perfmodel
from tvm_lowprec.intrin import ALL_INTRINSICS
from tvm_lowprec.perfmodel import (
    INTRIN_ASM, SYNTAXES, McaError, ceiling, ceiling_block, extract_kernel_loop, predict, run_mca,
)

from conftest import TARGETS

pytestmark = pytest.mark.skipif(perfmodel.find_llvm_mca() is None,
                                reason="llvm-mca not installed (apt-get install llvm-14)")

# every (row, recipe, llvm-mca CPU) the registry and MCA_CPUS name
CASES = [(t, r.intrin.name, cpu) for t in TARGETS for r in t.recipes() for cpu in perfmodel.mca_cpus(t)]
SHAPE = (64, 256, 256)  # small, but a full table tile and a K loop of 64+ steps


def _id(case):
    return f"{case[0].name}/{case[1]}/{case[2]}"


def _is_back_branch(line: str, isa: str) -> bool:
    return bool(SYNTAXES[isa].branch.match(line))


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_prediction_on_every_row(case):
    spec, recipe, cpu = case
    p = predict(spec, *SHAPE, recipe=recipe, mca_cpu=cpu, iterations=200)
    assert p.intrin == recipe and p.mca_cpu == cpu and p.sched_model != "?"
    # one per accumulator (a matrix instruction's covers `rows` rows), per unrolled step
    assert p.intrinsics_per_iteration >= p.tile[0] // p.rows * p.tile[1]
    mnemonic = INTRIN_ASM[recipe].mnemonic
    assert sum(re.sub(r"^\{\w+\}\s*", "", line).split()[0] == mnemonic for line in p.loop[1:]) == p.intrinsics_per_iteration
    assert _is_back_branch(p.loop[-1], INTRIN_ASM[recipe].isa)  # the block ends at the back branch
    assert 0 < p.fraction <= 1.0 + 1e-9
    assert 0 < p.padding_efficiency <= 1


@pytest.mark.parametrize("intrin", sorted(INTRIN_ASM))
def test_ceiling_block_is_sane(intrin):
    block = ceiling_block(intrin)
    info = INTRIN_ASM[intrin]
    regs = {int(r) for r in re.findall(rf"(?<!\w){info.reg}(\d+)\b", block)}
    assert max(regs) < info.registers  # encodable
    assert block.count(info.mnemonic) >= 8  # enough independent accumulators to hide latency


@pytest.mark.parametrize("case", [c for c in CASES if c[2] == perfmodel.mca_cpus(c[0])[0]], ids=_id)
def test_ceiling_is_sane(case):
    spec, recipe, cpu = case
    top = ceiling(recipe, cpu, 200)
    assert 0.25 <= top <= 4  # x86 and Arm cores issue 0.5-4 vector multiplies per cycle
    # one accumulator's steps alone are no faster: the ceiling block is bound by throughput, not latency
    info = INTRIN_ASM[recipe]
    one_chain = "\n".join(ceiling_block(recipe).splitlines()[: len(info.step)]) + "\n"
    assert 1 / run_mca(one_chain, cpu, 200, info.isa, info.mattr).cycles_per_iteration <= top * 1.02


@pytest.mark.parametrize("spec", TARGETS, ids=lambda t: t.name)
def test_one_by_one_tile_is_predicted_slower(spec):
    good = predict(spec, *SHAPE, iterations=200)
    bad = predict(spec, *SHAPE, tile=(1, 1), iterations=200)
    assert bad.tile[:2] == (spec.gemm.rows, 1)  # a matrix instruction's mr is whole row groups
    assert bad.fraction < good.fraction
    if spec.gemm.name.startswith(("vpdpbusd", "sdot", "usdot", "usmmla")):  # in place: one chain, latency-bound
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
    memory = vnni.memory  # the row's own figures (targets/x86.py)
    assert perfmodel.ROW_MEMORY[vnni.name] is memory
    gemv = predict(vnni, 1, 4096, 4096, iterations=200)
    assert gemv.bytes_moved >= 4096 * 4096
    bound = 2 * 4096 * 4096 / (gemv.bytes_moved / (memory.read_gbs * 1e9)) / (memory.peak_gops * 1e9)
    assert gemv.with_memory(memory) == pytest.approx(bound) and bound < 0.2 < gemv.gemm_fraction
    big = predict(vnni, 1024, 1024, 1024, iterations=200)
    assert big.with_memory(memory) == pytest.approx(big.gemm_fraction)
    with pytest.raises(ValueError, match="positive"):
        perfmodel.Memory(0.0, 10.0)


def test_intrin_asm_covers_every_intrinsic_row():
    """Every intrinsic row the library defines, and every one a registered target uses, carries its assembly."""
    assert all(row.asm is not None for row in ALL_INTRINSICS.values())
    assert set(ALL_INTRINSICS) <= set(INTRIN_ASM)
    assert {r.intrin.name for t in TARGETS for r in t.recipes()} <= set(INTRIN_ASM)
    for name, info in INTRIN_ASM.items():
        assert info.isa in SYNTAXES and info.mnemonic in info.step[0], name


ARM_DOT_ROWS = [t for t in TARGETS if t.name in ("arm64-dotprod", "arm64-i8mm")]


@pytest.mark.parametrize("spec", ARM_DOT_ROWS, ids=lambda t: t.name)
def test_arm_prediction_at_1024_cubed_on_neoverse_v1(spec):
    """The issue's shape and CPU: computed from the AArch64 assembly, and sane. (LLVM 14 gives
    neoverse-v1 its Cortex-A57 model, sched_model "A57"; LLVM 16+ one of its own, "V1".)"""
    p = predict(spec, 1024, 1024, 1024, mca_cpu="neoverse-v1", iterations=200)
    assert p.target == spec.name and p.mca_cpu == "neoverse-v1" and p.sched_model not in ("", "?")
    assert p.intrin == spec.gemm.name and p.intrinsics_per_iteration >= p.tile[0] // p.rows * p.tile[1] > 0
    assert 0 < p.fraction <= 1.05 and 0 < p.gemm_fraction <= 1.05
    assert p.padding_efficiency > 0.99  # 1024 rows in tiles of 2 or 6 (1026: 0.998)
    assert 1 <= p.ceiling_per_cycle <= 4.1  # two (A57, N2) to four (V1) 128-bit dot products per cycle
    assert p.loop[0].endswith(":") and _is_back_branch(p.loop[-1], "aarch64")
    assert not any(line.startswith(("//", ".")) for line in p.loop[1:])  # comments and directives dropped
    assert p.stack_accesses == 0  # the table's tile does not spill


def test_aarch64_loop_extraction_and_syntax():
    """``#`` is an immediate in AArch64 (``//`` a comment), back branches are b.cond/cbnz/tbnz, spills
    are stores to [sp] or [x29]."""
    asm = "\n".join([
        "f:", ".LBB0_1:  // =>This Loop Header: Depth=1", "\tmov w8, #64", ".LBB0_2:  // Parent Loop",
        "\t.p2align 4", "\tldr q1, [x1], #16   // comment", "\tsdot v0.4s, v2.16b, v1.16b",
        "\tsdot v3.4s, v2.16b, v1.16b", "\tstr q4, [sp, #32]", "\tsubs x9, x9, #1", "\tb.ne .LBB0_2",
        "\tcbnz x10, .LBB0_1", ".LBB0_3:", "\tsdot v0.4s, v2.16b, v1.16b", "\ttbnz w11, #0, .LBB0_3", "\tret",
    ])
    loop = extract_kernel_loop(asm, "sdot", isa="aarch64")
    assert loop.label == ".LBB0_2" and loop.intrinsics == 2 and loop.first_line == 4 and loop.isa == "aarch64"
    block = perfmodel.mca_block(loop).splitlines()
    assert block == [".LBB0_2:", "ldr q1, [x1], #16", "sdot v0.4s, v2.16b, v1.16b", "sdot v3.4s, v2.16b, v1.16b",
                     "str q4, [sp, #32]", "subs x9, x9, #1", "b.ne .LBB0_2"]
    assert [bool(SYNTAXES["aarch64"].stack_store.search(line)) for line in block].count(True) == 1
    assert extract_kernel_loop(asm.replace("b.ne .LBB0_2", "cbz x9, .LBB0_4"), "sdot", isa="aarch64").label == ".LBB0_1"
    result = run_mca("\n".join(block[1:]) + "\n", "neoverse-v1", 50, isa="aarch64", mattr=("+dotprod",))
    assert result.instructions == 6 * 50 and result.sched_model not in ("", "?")


def test_aarch64_mattr_is_what_lets_llvm_mca_parse_usdot_on_an_older_cpu():
    """LLVM 14 parses usdot/usmmla (Armv8.6 i8mm) on a CPU model without i8mm only with -mattr=+i8mm."""
    for mnemonic in ("usdot", "usmmla"):
        line = f"{mnemonic} v0.4s, v1.16b, v2.16b\n"
        with pytest.raises(McaError, match="i8mm"):
            run_mca(line, "cortex-a72", 10, isa="aarch64")
        mattr = INTRIN_ASM[f"{mnemonic}_v16"].mattr
        assert run_mca(line, "cortex-a72", 10, isa="aarch64", mattr=mattr).instructions == 10
