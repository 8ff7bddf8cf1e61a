"""Intel AMX's tile instructions as generic LLVM IR, for emulated execution (issue 27).

AMX keeps its operands in eight tile registers (``tmm0``-``tmm7``, each up to 16 rows of 64 bytes) whose
shapes a 64-byte configuration sets (``ldtilecfg``: palette 1, then per tile its bytes per row
``colsb`` at bytes 16 + 2t and its rows at byte 48 + t). TVM reaches the instructions through LLVM's
intrinsics with immediate tile numbers (``@llvm.x86.ldtilecfg(ptr)``, ``tilezero(i8)``,
``tileloadd64(i8, ptr, i64 stride)``, ``tilestored64(i8, ptr, i64)``, ``tdpbusd(i8 c, i8 a, i8 b)`` and
its ``bssd``/``bsud``/``buud`` signedness variants, ``tilerelease()``), which a TIR kernel calls with
``T.call_llvm_intrin`` (checked: LLVM emits ``ldtilecfg``, ``tileloadd``, ``tdpbusd``, ``tilestored``).

Emulated, the tile registers and the configuration are a block of memory per calling function (the
state, :attr:`AmxSemantics.state`: 8 tiles of 1024 bytes, then 8 row counts and 8 column byte counts),
which :func:`tvm_lowprec.emulation.emulated_ir` allocates at the entry of each function that uses them
and passes to every replaced call: tiles are per thread on the hardware too (a parallel task configures
its own). Each function follows Intel's pseudo-code (SDM, "TDPBUSD"): for ``m < rows(c)``, ``n <
colsb(c) / 4``: ``c[m][n] += sum_{k < colsb(a) / 4} sum_{i < 4} a.byte[m][4k + i] * b.byte[k][4n + i]``,
int32 wrapping, each byte zero- or sign-extended as the variant says; loads and stores move ``colsb``
bytes of ``rows`` rows at the given stride and a load zeroes the rest of the tile.
"""

from __future__ import annotations

from dataclasses import dataclass

TILES, TILE_BYTES, ROW_BYTES = 8, 1024, 64
ROWS_AT, COLSB_AT = TILES * TILE_BYTES, TILES * TILE_BYTES + TILES  # state offsets of the shape tables
STATE_TYPE = f"[{TILES * TILE_BYTES + TILES * 3 + 8} x i8]"  # tiles, rows (i8), colsb (i16), padding


class _Ir:
    """A tiny LLVM IR writer: SSA names, counted loops over allocas (LLVM's mem2reg tidies them)."""

    def __init__(self):
        self.lines: list[str] = []
        self.allocas: list[str] = []
        self.n = 0

    def tmp(self) -> str:
        self.n += 1
        return f"%t{self.n}"

    def emit(self, text: str) -> str:
        name = self.tmp()
        self.lines.append(f"{name} = {text}")
        return name

    def at(self, base: str, offset: str) -> str:
        return self.emit(f"getelementptr i8, ptr {base}, i64 {offset}")

    def loop(self, bound: str, body) -> None:
        """``for (i = 0; i < bound; i++) body(i)`` (i64)."""
        self.n += 1
        label = f"l{self.n}"
        self.allocas.append(f"%{label}.i = alloca i64")
        self.lines += [f"store i64 0, ptr %{label}.i", f"br label %{label}.head", f"{label}.head:"]
        i = self.emit(f"load i64, ptr %{label}.i")
        more = self.emit(f"icmp ult i64 {i}, {bound}")
        self.lines += [f"br i1 {more}, label %{label}.body, label %{label}.end", f"{label}.body:"]
        body(i)
        step = self.emit(f"add i64 {i}, 1")
        self.lines += [f"store i64 {step}, ptr %{label}.i", f"br label %{label}.head", f"{label}.end:"]

    def shape(self, state: str, tile: str) -> tuple[str, str, str]:
        """``(tile address, rows, colsb)`` of tile number ``tile`` (an i8 value), as i64."""
        t = self.emit(f"zext i8 {tile} to i64")
        offset = self.emit(f"mul i64 {t}, {TILE_BYTES}")
        address = self.at(state, offset)
        rows = self.emit(f"load i8, ptr {self.at(self.at(state, str(ROWS_AT)), t)}")
        colsb_at = self.emit(f"mul i64 {t}, 2")
        colsb = self.emit(f"load i16, ptr {self.at(self.at(state, str(COLSB_AT)), colsb_at)}, align 1")
        return address, self.emit(f"zext i8 {rows} to i64"), self.emit(f"zext i16 {colsb} to i64")

    def define(self, name: str, params: str) -> str:
        return "\n".join([f"define internal void @{name}({params}) {{", "entry:"]
                         + [f"  {a}" for a in self.allocas] + [f"  {line}" if not line.endswith(":") else line
                                                               for line in self.lines] + ["  ret void", "}", ""])


@dataclass(frozen=True)
class AmxSemantics:
    """One AMX intrinsic (``op``: ``ldtilecfg``, ``tilezero``, ``tileloadd64``, ``tilestored64``,
    ``tilerelease``, or a dot product ``tdpbusd``/``tdpbssd``/``tdpbsud``/``tdpbuud``) over the
    emulated tile state, which every replaced call gets as its first argument (module docstring).
    ``a_ext``/``b_ext``: how a dot product widens each operand's bytes (a wrong one is the control that
    the tests must see fail)."""

    op: str
    a_ext: str = "zext"
    b_ext: str = "sext"
    state = STATE_TYPE  # class constant: what emulated_ir allocates per calling function

    def llvm_ir(self, name: str) -> str:
        ir = _Ir()
        if self.op == "ldtilecfg":
            def copy(t):
                colsb = ir.emit(f"load i16, ptr {ir.at(ir.at('%cfg', '16'), ir.emit(f'mul i64 {t}, 2'))}, align 1")
                rows = ir.emit(f"load i8, ptr {ir.at(ir.at('%cfg', '48'), t)}")
                ir.lines.append(f"store i16 {colsb}, ptr {ir.at(ir.at('%st', str(COLSB_AT)), ir.emit(f'mul i64 {t}, 2'))}, align 1")
                ir.lines.append(f"store i8 {rows}, ptr {ir.at(ir.at('%st', str(ROWS_AT)), t)}")
            ir.loop(str(TILES), copy)
            return ir.define(name, "ptr %st, ptr %cfg")
        if self.op == "tilerelease":
            ir.loop(str(TILES * 3), lambda i: ir.lines.append(f"store i8 0, ptr {ir.at(ir.at('%st', str(ROWS_AT)), i)}"))
            return ir.define(name, "ptr %st")
        if self.op == "tilezero":
            address, _, _ = ir.shape("%st", "%t")
            ir.loop(str(TILE_BYTES), lambda i: ir.lines.append(f"store i8 0, ptr {ir.at(address, i)}"))
            return ir.define(name, "ptr %st, i8 %t")
        if self.op in ("tileloadd64", "tilestored64"):
            address, rows, colsb = ir.shape("%st", "%t")
            load = self.op == "tileloadd64"
            if load:
                ir.loop(str(TILE_BYTES), lambda i: ir.lines.append(f"store i8 0, ptr {ir.at(address, i)}"))

            def row(r):
                memory = ir.at("%base", ir.emit(f"mul i64 {r}, %stride"))
                tile_row = ir.at(address, ir.emit(f"mul i64 {r}, {ROW_BYTES}"))

                def byte(c):
                    src, dst = (ir.at(memory, c), ir.at(tile_row, c)) if load else (ir.at(tile_row, c), ir.at(memory, c))
                    ir.lines.append(f"store i8 {ir.emit(f'load i8, ptr {src}')}, ptr {dst}")
                ir.loop(colsb, byte)
            ir.loop(rows, row)
            return ir.define(name, "ptr %st, i8 %t, ptr %base, i64 %stride")
        if self.op.startswith("tdpb"):
            c_at, m_rows, c_colsb = ir.shape("%st", "%c")
            a_at, _, a_colsb = ir.shape("%st", "%a")
            b_at, _, _ = ir.shape("%st", "%b")
            n_cols = ir.emit(f"lshr i64 {c_colsb}, 2")
            k_steps = ir.emit(f"lshr i64 {a_colsb}, 2")

            def offset(row_index, column, scale=4, plus=0):  # row * 64 + column * scale + plus, as i64
                row_bytes = ir.emit(f"mul i64 {row_index}, {ROW_BYTES}")
                col_bytes = ir.emit(f"add i64 {ir.emit(f'mul i64 {column}, {scale}')}, {plus}")
                return ir.emit(f"add i64 {row_bytes}, {col_bytes}")

            def byte(base, at, ext):
                value = ir.emit(f"load i8, ptr {ir.at(base, at)}")
                return ir.emit(f"{ext} i8 {value} to i32")

            def row(m):
                def col(n):
                    acc_at = ir.at(c_at, offset(m, n))
                    ir.allocas.append(f"%acc{ir.n} = alloca i32")
                    acc = f"%acc{ir.n}"
                    ir.lines.append(f"store i32 {ir.emit(f'load i32, ptr {acc_at}, align 4')}, ptr {acc}")

                    def step(k):
                        for i in range(4):
                            av = byte(a_at, offset(m, k, 4, i), self.a_ext)
                            bv = byte(b_at, offset(k, n, 4, i), self.b_ext)
                            product = ir.emit(f"mul i32 {av}, {bv}")
                            total = ir.emit(f"add i32 {ir.emit(f'load i32, ptr {acc}')}, {product}")
                            ir.lines.append(f"store i32 {total}, ptr {acc}")
                    ir.loop(k_steps, step)
                    ir.lines.append(f"store i32 {ir.emit(f'load i32, ptr {acc}')}, ptr {acc_at}, align 4")
                ir.loop(n_cols, col)
            ir.loop(m_rows, row)
            return ir.define(name, "ptr %st, i8 %c, i8 %a, i8 %b")
        raise ValueError(f"no AMX semantics for {self.op!r}")


_DOTS = {"tdpbusd": ("zext", "sext"), "tdpbssd": ("sext", "sext"), "tdpbsud": ("sext", "zext"),
         "tdpbuud": ("zext", "zext")}
# LLVM intrinsic -> its semantics: what an AMX row's intrinsic rows declare as their ``emulation``
AMX_SEMANTICS = {
    **{f"llvm.x86.{op}": AmxSemantics(op) for op in ("ldtilecfg", "tilezero", "tileloadd64", "tilestored64",
                                                     "tilerelease")},
    **{f"llvm.x86.{op}": AmxSemantics(op, a, b) for op, (a, b) in _DOTS.items()},
}


def tile_config(shapes: dict[int, tuple[int, int]]) -> bytes:
    """The 64-byte ``ldtilecfg`` operand: palette 1, and per tile number its ``(rows, bytes per row)``."""
    cfg = bytearray(64)
    cfg[0] = 1
    for tile, (rows, colsb) in shapes.items():
        if not (0 <= tile < TILES and 0 < rows <= 16 and 0 < colsb <= ROW_BYTES):
            raise ValueError(f"tile {tile}: {rows} rows of {colsb} bytes is not an AMX tile shape")
        cfg[16 + 2 * tile:18 + 2 * tile] = colsb.to_bytes(2, "little")
        cfg[48 + tile] = rows
    return bytes(cfg)


__all__ = ["AMX_SEMANTICS", "AmxSemantics", "STATE_TYPE", "tile_config"]
