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
    """The PrimFunc ``(X[n] in_dtype, table[intrin.table_bytes] out_dtype) -> Y[n] out_dtype``: the
    instruction's template (:func:`_template`, parsed once) specialized to ``n``."""
    template = _template(in_dtype, out_dtype, intrin)
    func = template.specialize({template.params[-1]: n})  # IntImm arithmetic folds: constant extents
    attrs = {"lowprec.op": OP, "op_pattern": 8, "lowprec.intrin": f"lowprec_lookup_{intrin.name}",
             "lowprec.lanes": intrin.lanes, "lowprec.folded": folded, "lowprec.shape": [n], "global_symbol": name}
    return func.with_attrs(attrs)


# one template per instruction and dtypes, its length a parameter: a model has hundreds of lookups of
# tens of lengths, and parsing TVMScript costs 20-40 ms a function (YOLO11n: 36 parses, 0.8 s)
_TEMPLATES: dict = {}


def _template(in_dtype: str, out_dtype: str, intrin):
    key = (in_dtype, out_dtype, intrin.name, intrin.lanes, intrin.table_bytes)
    func = _TEMPLATES.get(key)
    if func is None:
        func = _TEMPLATES[key] = _lookup_template(in_dtype, out_dtype, intrin)
    return func


def _lookup_template(in_dtype: str, out_dtype: str, intrin):
    """``vectors = n // lanes`` iterations of the vector lookup, then ``n % lanes`` scalar ones, over a
    length ``n`` given as the last parameter (bound by ``PrimFunc.specialize``)."""
    lanes, table_bytes, slot = intrin.lanes, intrin.table_bytes, intrin.slot

    @T.prim_func(s_tir=True)
    def func(x: T.handle, Tab: T.Buffer((table_bytes,), out_dtype), y: T.handle, n: T.int32):
        T.func_attr({"tir.noalias": True})
        X = T.match_buffer(x, (n,), in_dtype)
        Y = T.match_buffer(y, (n,), out_dtype)
        for o in range(n // lanes):
            with T.sblock("lookup"):
                vo = T.axis.remap("S", [o])
                T.reads(Tab[0:table_bytes], X[vo * lanes:vo * lanes + lanes])
                T.writes(Y[vo * lanes:vo * lanes + lanes])
                Y[T.ramp(vo * lanes, 1, lanes)] = vector_lookup(intrin, X, Tab, in_dtype, out_dtype, vo * lanes)
        for i in range(n % lanes):
            with T.sblock("lookup_tail"):
                vi = T.axis.remap("S", [i])
                T.reads(Tab[0:table_bytes], X[n // lanes * lanes + vi])
                T.writes(Y[n // lanes * lanes + vi])
                Y[n // lanes * lanes + vi] = Tab[slot(code_of(X[n // lanes * lanes + vi], in_dtype))]

    return func


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
