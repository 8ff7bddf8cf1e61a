"""Looking up blocks that a PrimFunc may or may not have."""

from __future__ import annotations

from tvm.s_tir.schedule import ScheduleError


def find_block(sch, name: str):
    """The block called ``name``, or None when the function has none (an optional step)."""
    try:
        return sch.get_sblock(name)
    except ScheduleError:
        return None


def root_children(sch) -> tuple[object, list]:
    """(the root block or None, the blocks directly under it): te-made functions have a root block,
    TVMScript ones may not (then no blocks)."""
    root = find_block(sch, "root")
    return root, (list(sch.get_child_blocks(root)) if root is not None else [])
