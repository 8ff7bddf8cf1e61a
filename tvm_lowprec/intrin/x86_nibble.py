"""x86 4-bit weight rows (:mod:`.nibble`): ``vpdpbusd`` where VNNI exists, else ``vpmaddubsw``.

Each declares the semantics of the LLVM intrinsics it calls (the same documented semantics as the
8-bit rows of :mod:`.x86`), so the rows run emulated on hosts without them.
"""

from __future__ import annotations

from ..hwspec import NibbleIntrin
from .nibble import accumulate_twice, pmaddubsw_product, register_nibble
from .x86 import _pmaddubsw_semantics, _pmaddwd_semantics, _vpdpbusd_semantics


def _vnni(name: str, lanes: int, llvm_name: str, features: tuple[str, ...]) -> NibbleIntrin:
    intrin = register_nibble(f"lowprec_{name}_u4", lanes, accumulate_twice(lanes, llvm_name))
    return NibbleIntrin(name, lanes, intrin, lanes * 32, features, {llvm_name: _vpdpbusd_semantics(lanes)})


def _ubsw(name: str, lanes: int, llvm_ubsw: str, llvm_wd: str, features: tuple[str, ...]) -> NibbleIntrin:
    intrin = register_nibble(f"lowprec_{name}_u4", lanes, pmaddubsw_product(lanes, llvm_ubsw, llvm_wd))
    emulation = {llvm_ubsw: _pmaddubsw_semantics(lanes * 2), llvm_wd: _pmaddwd_semantics(lanes)}
    return NibbleIntrin(name, lanes, intrin, lanes * 32, features, emulation)


NIBBLE_VNNI_512 = _vnni("vpdpbusd_zmm", 16, "llvm.x86.avx512.vpdpbusd.512", ("avx512f", "avx512bw", "avx512vnni"))
NIBBLE_VNNI_256 = _vnni("vpdpbusd_ymm", 8, "llvm.x86.avx512.vpdpbusd.256", ("avx2", "avxvnni"))
NIBBLE_UBSW_512 = _ubsw("vpmaddubsw_zmm", 16, "llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512",
                        ("avx512f", "avx512bw"))
NIBBLE_UBSW_256 = _ubsw("vpmaddubsw_ymm", 8, "llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd", ("avx2",))
