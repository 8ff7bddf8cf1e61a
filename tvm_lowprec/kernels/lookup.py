"""The table lookup kernel: ``Y[i] = table[X[i]]`` over a flattened 8-bit tensor, the table (256
entries, packed in the layout of the row's lookup instruction) a constant.

Two blocks: ``lookup``, one iteration per ``lanes`` elements, each the row's vector lookup
(:class:`~tvm_lowprec.hwspec.LookupIntrin`, :func:`~tvm_lowprec.intrin.lookup.vector_lookup`), which
the schedule (:mod:`tvm_lowprec.schedule.lookup`) runs in parallel; and ``lookup_tail`` over the last
``n % lanes`` elements, scalar. Decisions on the function: the instruction (``lowprec.intrin``), the
number of element-wise operators the table stands for (``lowprec.folded``).
"""

from __future__ import annotations

import math

from tvm import tirx
from tvm.script import tirx as T

from ..intrin.lookup import code_of, vector_lookup

OP = "lookup"


def build_lookup(n: int, in_dtype: str, out_dtype: str, intrin, folded: int, name: str = "lookup"):
    """The PrimFunc ``(X[n] in_dtype, table[intrin.table_bytes] out_dtype) -> Y[n] out_dtype``."""
    key = (n, in_dtype, out_dtype, intrin.name, intrin.lanes, intrin.table_bytes, folded)
    func = _PARSED.get(key)
    if func is None:
        if len(_PARSED) >= 512:
            _PARSED.clear()
        func = _PARSED[key] = _lookup_func(n, in_dtype, out_dtype, intrin, folded)
    return func.with_attr("global_symbol", name)


# kernels parsed once per shape and instruction: a model has hundreds of lookups of a few lengths, and
# parsing the TVMScript was most of their cost (YOLO11n: 185 parses, 3.5 s)
_PARSED: dict = {}


def _lookup_func(n: int, in_dtype: str, out_dtype: str, intrin, folded: int):
    lanes, table_bytes, slot = intrin.lanes, intrin.table_bytes, intrin.slot
    vectors = n // lanes
    main = vectors * lanes

    @T.prim_func(s_tir=True)
    def func(X: T.Buffer((n,), in_dtype), Tab: T.Buffer((table_bytes,), out_dtype), Y: T.Buffer((n,), out_dtype)):
        T.func_attr({"tir.noalias": True})
        for o in range(vectors):
            with T.sblock("lookup"):
                vo = T.axis.remap("S", [o])
                T.reads(Tab[0:table_bytes], X[vo * lanes:vo * lanes + lanes])
                T.writes(Y[vo * lanes:vo * lanes + lanes])
                Y[T.ramp(vo * lanes, 1, lanes)] = vector_lookup(intrin, X, Tab, in_dtype, out_dtype, vo * lanes)
        for i in range(n - main):
            with T.sblock("lookup_tail"):
                vi = T.axis.remap("S", [i])
                T.reads(Tab[0:table_bytes], X[main + vi])
                T.writes(Y[main + vi])
                Y[main + vi] = Tab[slot(code_of(X[main + vi], in_dtype))]

    attrs = {"lowprec.op": OP, "op_pattern": 8, "lowprec.intrin": f"lowprec_lookup_{intrin.name}",
             "lowprec.lanes": lanes, "lowprec.folded": folded, "lowprec.shape": [n]}
    return func.with_attrs(attrs)


def lookup_in_place(out, table, intrin, start, stop, name: str = "looked_up"):
    """Statements replacing ``out``'s elements ``start .. stop`` (flat positions: int or TIR
    expressions) by their table entries, in place: a view of ``out`` as one axis, the row's vector
    lookup over whole ``intrin.lanes`` from ``start`` (serial), the rest of the range scalar. What a
    GEMM whose output a lookup reads (:mod:`tvm_lowprec.quant.lookup_epilogue`) runs on each task's
    rows while they are in cache; ``out`` and the table share the 8-bit dtype."""
    dtype, lanes = str(out.dtype), intrin.lanes
    flat = tirx.decl_buffer((math.prod(int(e) for e in out.shape),), dtype, name, data=out.data)
    index = "int32" if isinstance(start, int) else str(start.ty)
    start = tirx.const(start, index) if isinstance(start, int) else start
    stop = tirx.const(stop, index) if isinstance(stop, int) else stop
    vectors = (stop - start) // lanes
    v, t = tirx.Var("v", index), tirx.Var("t", index)
    at = start + v * lanes
    body = tirx.BufferStore(flat, vector_lookup(intrin, flat, table, dtype, dtype, at), [tirx.Ramp(at, 1, lanes)])
    tail = start + vectors * lanes + t
    scalar = tirx.BufferStore(flat, tirx.BufferLoad(table, [intrin.slot(code_of(tirx.BufferLoad(flat, [tail]), dtype))]),
                              [tail])
    return tirx.SeqStmt([
        tirx.DeclBuffer(flat, data=out.data),
        tirx.For(v, tirx.const(0, index), vectors, tirx.ForKind.SERIAL, body),
        tirx.For(t, tirx.const(0, index), stop - start - vectors * lanes, tirx.ForKind.SERIAL, scalar),
    ])
