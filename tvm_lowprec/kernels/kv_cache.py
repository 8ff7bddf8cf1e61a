"""Kernel: a decoder step's keys or values written into the KV cache in place.

The cache is a model input of the maximum length, ``[batch, kv_heads, length, head]``; the step's rows
``[batch, kv_heads, seq, head]`` go to positions ``start[b] .. start[b] + seq - 1`` of sequence ``b``
(``start``: int64 ``[batch]``, computed by the graph from the attention mask). Called through
``relax.call_tir_inplace`` (the output is the cache itself), so a step copies its own rows only, never
the past. A position outside ``[0, length)`` (a prompt longer than the cache) raises, naming the cache's
length: the call stops with an error and the process goes on.
"""

from __future__ import annotations

import tvm
from tvm.script import tirx as T

OP = "kv_cache_write"


def cache_write_kernel(batch: int, heads: int, length: int, seq, head: int, dtype: str):
    """The PrimFunc ``(cache, rows, start)`` writing ``rows`` into ``cache`` at ``start`` (in place).
    ``seq``: the rows per call, an int or None for a number known at run time (a prompt's tokens)."""
    message = f"KV cache: a position is outside the cache's {length} steps (prompt and new tokens exceed max_length)"
    zero, end = tvm.tirx.const(0, "int64"), tvm.tirx.const(length, "int64")
    seq = tvm.tirx.Var("seq", "int64") if seq is None else seq

    @T.prim_func(private=True, s_tir=True)
    def write(cache: T.Buffer((batch, heads, length, head), dtype), rows: T.Buffer((batch, heads, seq, head), dtype),
              start: T.Buffer((batch,), "int64")):
        T.func_attr({"tir.is_scheduled": True, "lowprec.op": OP, "lowprec.schedule": "default", "op_pattern": 8})
        with T.sblock("root"):  # Relax's analyses of a kernel expect a root block
            for b in range(batch):
                assert start[b] >= zero and start[b] + T.Cast("int64", seq) <= end, message
                for h, s, d in T.grid(heads, seq, head):
                    cache[b, h, start[b] + T.Cast("int64", s), d] = rows[b, h, s, d]

    return write


__all__ = ["OP", "cache_write_kernel"]
