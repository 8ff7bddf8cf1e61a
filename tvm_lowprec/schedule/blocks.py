"""Looking up blocks that a PrimFunc may or may not have."""

from __future__ import annotations

from tvm.s_tir.schedule import ScheduleError


def find_block(sch, name: str):
    """The block called ``name``, or None when the function has none (an optional step)."""
    try:
        return sch.get_sblock(name)
    except ScheduleError:
        return None
