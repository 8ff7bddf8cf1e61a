"""Schedule rule for the depthwise kernel on the row's four-byte dot product, lane by lane: the kernel
written anew as vector code (:func:`~tvm_lowprec.kernels.depthwise_dot.build_depthwise_dot`), four
taps of a channel in each int32 lane. It needs no schedule.

Declines what that kernel does not take (weights past int8, an instruction without a lane-wise form or
that reads widened activations, fewer channels than a vector's lanes) and every other function: the
one-tap kernel's rule (:class:`~tvm_lowprec.schedule.depthwise.DepthwiseRule`) schedules those.
"""

from __future__ import annotations

from tvm.s_tir import Schedule

from ..kernels.depthwise_dot import build_depthwise_dot


class DepthwiseDotRule:
    def apply(self, func, spec):
        attrs = func.attrs if func.attrs is not None else {}
        if attrs.get("lowprec.op", None) != "qdepthwise":  # a CPU rule: the CPU backend's rows only ask it
            return None
        a_dtype = str(func.params[0].ty.dtype)
        for recipe in spec.recipes():
            gi = recipe.intrin
            if a_dtype in getattr(gi, "a_operands", {}):
                kernel = build_depthwise_dot(func, gi, gi.operand(a_dtype))
                if kernel is not None:
                    return Schedule(kernel)
        return None
