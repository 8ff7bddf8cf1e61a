#!/usr/bin/env python
"""Predict every candidate register tile of the VNNI and Arm rows with llvm-mca (``tvm_lowprec.perfmodel``).

For each row, each shape and each tile ``mr x nr`` that :class:`~tvm_lowprec.hwspec.Tile` accepts
(at most 28 accumulators), with each K block choice, the GEMM is built as the library builds it and
its inner loop simulated on the row's llvm-mca CPUs (:data:`ROW_CPUS`: the x86 rows on their default
model, the AArch64 rows on ``neoverse-v1`` and ``neoverse-n2``). Writes ``tiles.md`` (a summary of the
Arm rows, then the best tiles per row, CPU and shape with the row's current table tile) and
``tiles.csv`` (every candidate).

The model ignores memory (every load hits L1): K blocks, which exist for the cache, look the same to it
unless they change the loop's code, and GEMV is predicted far above what it measures. LLVM 14 has no
Neoverse model: ``neoverse-v1`` and ``neoverse-n2`` both run on its Cortex-A57 model.

Examples
--------
python benchmarks/predict_tiles.py                      # VNNI rows at 5 shapes, Arm rows at 3 on 2 CPUs (~15 min)
python benchmarks/predict_tiles.py --rows x86-avx-vnni --shapes 16x3072x768 --out /tmp/tiles
python benchmarks/predict_tiles.py --rows arm64-i8mm --cpus neoverse-v1,ampere1 --out /tmp/tiles
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import time
from pathlib import Path

try:
    import tvm_lowprec  # noqa: F401
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tvm_lowprec.bench.report import write_csv  # noqa: E402
from tvm_lowprec.perfmodel import (  # noqa: E402
    INTRIN_ASM, build_asm, default_mca_cpu, find_llvm_mca, layout_for, mca_version, predict, sched_model_note,
)
from tvm_lowprec.hwspec import Tile  # noqa: E402
from tvm_lowprec.targets import registered_targets  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tvm_lowprec.bench.cli_args import parse_shapes  # noqa: E402

ARM_ROWS = ("arm64-i8mm", "arm64-dotprod", "arm64-neon")
ROWS = ("x86-avx512-vnni", "x86-avx-vnni", *ARM_ROWS)
SHAPES = ((1024, 1024, 1024), (16, 3072, 768), (1, 4096, 4096), (128, 768, 3072), (256, 256, 256))
# Rows predicted on other CPU models than their default, or at fewer shapes than SHAPES. LLVM 14 gives
# neoverse-v1 and neoverse-n2 the same (Cortex-A57) model: both are run, so a later LLVM's own models
# show up here unchanged.
ROW_CPUS = {name: ("neoverse-v1", "neoverse-n2") for name in ARM_ROWS}
ROW_SHAPES = {name: SHAPES[:3] for name in ARM_ROWS}
# Newer llvm-mca binaries the Arm rows are predicted with as well, where installed: LLVM 16 and later
# have Neoverse V1/N2 models of their own (Debian 12: `apt-get install llvm-19`).
ARM_EXTRA_MCA = ("llvm-mca-19",)
KBLOCKS = (0, 512)
MAX_MR, MAX_NR = 8, 8
MAX_NR_FEW_ROWS = 16  # one or two rows (GEMV, tiny M) may take wider panels
FIELDS = ("row", "llvm_mca", "mca_cpu", "sched_model", "M", "N", "K", "mr", "nr", "kblock", "cycles_per_iteration",
          "intrinsics_per_iteration", "ceiling_per_cycle", "kernel_pct", "padding_efficiency", "predicted_pct",
          "stack_accesses", "table_tile")


def candidate_tiles(kblocks=KBLOCKS) -> list[Tile]:
    """Every ``mr x nr`` (up to 8 x 8; up to 16 columns groups for one or two rows) the Tile check
    accepts, with each K block."""
    tiles = []
    for mr in range(1, MAX_MR + 1):
        for nr in range(1, (MAX_NR_FEW_ROWS if mr <= 2 else MAX_NR) + 1):
            for kblock in kblocks:
                try:
                    tiles.append(Tile(1, mr=mr, nr=nr, kblock=kblock))
                except ValueError:  # too many accumulators
                    pass
    return tiles


def _effective(spec, tile: Tile, shape) -> tuple[int, int, int]:
    """The tile as GemmLayout.choose builds it at this shape (mr clipped, nr fitted to N, K block
    dropped when it does not divide K); candidates that build the same kernel are predicted once."""
    layout = layout_for(spec, *shape, tile=tile)
    return layout.mr, layout.nr, layout.kblock


@contextlib.contextmanager
def _llvm_mca(binary: str):
    """Run the perfmodel with ``binary`` (it reads ``LLVM_MCA`` on every call)."""
    before = os.environ.get("LLVM_MCA")
    if binary:  # None: none installed, let the perfmodel say so
        os.environ["LLVM_MCA"] = binary
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("LLVM_MCA", None)
        else:
            os.environ["LLVM_MCA"] = before


def predict_row(name: str, shapes, log, cpus=None, binaries=None) -> list[dict]:
    """Every candidate tile of row ``name`` at ``shapes`` on each of ``cpus`` (default: the row's
    :data:`ROW_CPUS`, else its default llvm-mca CPU) with each llvm-mca of ``binaries`` (default: the
    one :func:`find_llvm_mca` finds); each candidate kernel is built once."""
    spec = registered_targets()[name]
    cpus = tuple(cpus or ROW_CPUS.get(name) or (default_mca_cpu(spec),))
    binaries = tuple(binaries or (find_llvm_mca(),))
    rows = []
    for shape in shapes:
        lanes = spec.gemm.lanes
        table = layout_for(spec, *shape)
        table = (table.mr, table.nr, table.kblock)
        seen = set()
        for tile in candidate_tiles():
            if min(tile.nr, -(-shape[1] // lanes)) != tile.nr:
                continue
            eff = _effective(spec, tile, shape)
            if eff in seen:
                continue
            try:  # a matrix instruction's mr is rounded up to its row count: 1x16 builds as 2x16
                Tile(1, *eff)
            except ValueError:
                continue
            seen.add(eff)
            built = build_asm(spec, *shape, tile=eff)
            for binary in binaries:
                with _llvm_mca(binary):
                    for cpu in cpus:
                        p = predict(spec, *shape, tile=eff, mca_cpu=cpu, built=built)
                        rows.append(_row_dict(name, mca_version(binary), p, table))
        log(f"{name} {'x'.join(map(str, shape))}: {len(seen)} tiles on {', '.join(cpus)} "
            f"(llvm-mca {', '.join(mca_version(b) for b in binaries)})")
    return rows


def _row_dict(name: str, version: str, p, table) -> dict:
    """One CSV row of :data:`FIELDS` for prediction ``p`` (``table``: the row's own tile at this shape)."""
    return {
        "row": name, "llvm_mca": version, "mca_cpu": p.mca_cpu, "sched_model": p.sched_model,
        "M": p.shape[0], "N": p.shape[1], "K": p.shape[2], "mr": p.tile[0], "nr": p.tile[1], "kblock": p.tile[2],
        "cycles_per_iteration": round(p.cycles_per_iteration, 3),
        "intrinsics_per_iteration": p.intrinsics_per_iteration,
        "ceiling_per_cycle": round(p.ceiling_per_cycle, 4), "kernel_pct": round(100 * p.fraction, 1),
        "padding_efficiency": round(p.padding_efficiency, 4), "predicted_pct": round(100 * p.gemm_fraction, 1),
        "stack_accesses": p.stack_accesses, "table_tile": p.tile == table,
    }


def _tile_text(r: dict) -> str:
    return f"{r['mr']}x{r['nr']}" + (f"/k{r['kblock']}" if r["kblock"] else "")


def _rank(cands: list[dict]) -> list[dict]:
    """Best first: loops without spills, then predicted %, then fewer accumulators, the smaller K block."""
    return sorted(cands, key=lambda r: (r["stack_accesses"] > 0, -r["predicted_pct"], r["mr"] * r["nr"], r["kblock"]))


def _shape_text(shape) -> str:
    return "x".join(map(str, shape))


def _model_text(r: dict) -> str:
    note = sched_model_note(r["mca_cpu"], r["sched_model"])
    return f"model {r['sched_model']}" + (f": {note}" if note else "")


def _mnemonic(row: str) -> str:
    return INTRIN_ASM[registered_targets()[row].gemm.name].mnemonic


def _key(r: dict) -> tuple:
    return r["row"], r["llvm_mca"], r["mca_cpu"]


def render_arm_summary(rows: list[dict]) -> list[str]:
    """One line per Arm row, llvm-mca, CPU and shape: the table's tile and the best candidate."""
    arm = [r for r in rows if r["row"] in ARM_ROWS]
    if not arm:
        return []
    lines = ["## AArch64 rows: summary", "",
             "% of the dot-product peak = % of the llvm-mca model's own ceiling for the row's instruction "
             "(`sdot`, `usmmla`, `smull`+`sadalp`: a block of independent accumulators on the same model). "
             "**LLVM 14 has no Neoverse model**: its `neoverse-v1` and `neoverse-n2` are both its Cortex-A57 "
             "model (3-wide dispatch, two 128-bit SIMD pipes, loads and broadcasts of 2-4 micro-ops), on "
             "which every A broadcast and B load competes with the dot products for dispatch. LLVM 19 "
             "(`llvm-mca-19`, where installed) has models of their own: V1 with four SIMD pipes "
             "(4 `sdot` per cycle), N2 with two.", "",
             "| row | llvm-mca | CPU (model) | shape | table tile | predicted % | best tile | predicted % |",
             "|---|---|---|---|---|---:|---|---:|"]
    for key in dict.fromkeys((*_key(r), (r["M"], r["N"], r["K"])) for r in arm):
        cands = [r for r in arm if (*_key(r), (r["M"], r["N"], r["K"])) == key]
        ranked = _rank(cands)
        table = next((r for r in ranked if r["table_tile"]), None)
        best = ranked[0]
        lines.append(f"| {key[0]} | {key[1]} | `{key[2]}` ({best['sched_model']}) | {_shape_text(key[3])} | "
                     f"{_tile_text(table) if table else '?'} | {table['predicted_pct'] if table else '?'} | "
                     f"{_tile_text(best)} | {best['predicted_pct']} |")
    return lines + [""]


def render(rows: list[dict], top: int) -> str:
    lines = ["# Predicted register tiles for the VNNI and AArch64 rows (llvm-mca)", "",
             "Generated by `python benchmarks/predict_tiles.py`. Predicted % = micro-kernel % of the llvm-mca "
             "ceiling (same CPU model) x padding efficiency M·N·K/(Mp·Np·Kp). The model ignores memory: "
             "every load hits L1, so K blocks (a cache measure) change nothing unless the loop's code changes, "
             "and the epilogue and C traffic are not counted. Tiles whose loop spills (`spills` > 0: "
             "stores to the stack in the loop) rank last: llvm-mca does not follow a spilled accumulator's "
             "store-to-load chain, so it predicts them optimistic. Ties are broken by fewer accumulators, then "
             "the smaller K block. `*` marks the tile the row's current table picks for that M. Candidates "
             "that build the same kernel (nr fitted to N, mr rounded to a matrix instruction's rows) are "
             "listed once, as built.", ""]
    lines += render_arm_summary(rows)
    for name, version, cpu in dict.fromkeys(_key(r) for r in rows):
        of_row = [r for r in rows if _key(r) == (name, version, cpu)]
        mnemonic = _mnemonic(name)
        lines += [f"## {name} on llvm-mca {version} `{cpu}` ({_model_text(of_row[0])}, "
                  f"ceiling {of_row[0]['ceiling_per_cycle']} {mnemonic} per cycle)", ""]
        for shape in dict.fromkeys((r["M"], r["N"], r["K"]) for r in of_row):
            cands = [r for r in of_row if (r["M"], r["N"], r["K"]) == shape]
            ranked = _rank(cands)
            shown = ranked[:top] + [r for r in ranked[top:] if r["table_tile"]]
            lines += [f"### {_shape_text(shape)} ({len(cands)} candidates)", "",
                      f"| rank | tile | cycles/iter | {mnemonic}/iter | kernel % | padding | predicted % | spills |",
                      "|---:|---|---:|---:|---:|---:|---:|---:|"]
            for r in shown:
                mark = "*" if r["table_tile"] else ""
                lines.append(f"| {ranked.index(r) + 1} | {_tile_text(r)}{mark} | {r['cycles_per_iteration']} | "
                             f"{r['intrinsics_per_iteration']} | {r['kernel_pct']} | {r['padding_efficiency']} | "
                             f"{r['predicted_pct']} | {r['stack_accesses']} |")
            lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated target rows")
    parser.add_argument("--shapes", type=parse_shapes, default=None,
                        help="MxNxK,... (default: 5 shapes, 3 for the Arm rows)")
    parser.add_argument("--cpus", default="", help="comma-separated llvm-mca CPUs for every row "
                        "(default: neoverse-v1,neoverse-n2 for the Arm rows, the default model for the others)")
    parser.add_argument("--arm-mca", default=",".join(ARM_EXTRA_MCA),
                        help="comma-separated llvm-mca binaries the Arm rows are also predicted with, where "
                        "installed (default: %(default)s; '' for none)")
    parser.add_argument("--top", type=int, default=10, help="tiles shown per shape in tiles.md")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/predicted"))
    args = parser.parse_args(argv)
    start = time.time()
    rows = []
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    extra = []
    for binary in filter(None, args.arm_mca.split(",")):
        if shutil.which(binary) is None:
            log(f"{binary} not installed: the Arm rows are predicted with {find_llvm_mca()} only")
        elif mca_version(binary) != mca_version():
            extra.append(binary)
    for name in filter(None, args.rows.split(",")):
        shapes = args.shapes or ROW_SHAPES.get(name, SHAPES)
        binaries = (find_llvm_mca(), *extra) if name in ARM_ROWS else None
        rows += predict_row(name, shapes, log, cpus=tuple(filter(None, args.cpus.split(","))), binaries=binaries)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, args.out / "tiles.csv", FIELDS)
    (args.out / "tiles.md").write_text(render(rows, args.top))
    print(f"{len(rows)} predictions in {time.time() - start:.0f} s -> {args.out}/tiles.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
