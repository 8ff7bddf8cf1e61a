#!/usr/bin/env python
"""The depthwise kernel on its own: the five largest depthwise convolutions of the 480x480 text
detector (benchmarks/models/textdet.py), built with ``build_depthwise`` + ``DepthwiseRule`` for
``target="native"``, checked exactly against a numpy int64 convolution and requantization, and timed
with ``time_evaluator``.

``--rules`` times this tree's two depthwise kernels against each other instead: the one-tap kernel
(``DepthwiseRule``) and the four-taps-a-lane one (``DepthwiseDotRule``, where it applies: stride 1,
output width 12 and up, weights within int8), interleaved. ``--keras`` takes Keras MobileNetV2@96's
depthwise layers instead of the text detector's.

``--old DIR`` also builds another version of the kernel (``DIR/old_kernel.py`` and ``DIR/old_rule.py``,
e.g. the files of an earlier commit with their relative imports made absolute) and times both in the
same process, interleaved, so that both see the same machine load; the line then ends with the ratio.

    TVM_NUM_THREADS=1 python benchmarks/depthwise_bench.py [--old DIR | --rules] [--keras] [--threads N] [--shapes 0,2]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from types import SimpleNamespace

import numpy as np
import tvm

from tvm_lowprec.kernels import depthwise as kernel
from tvm_lowprec.kernels.qgemm import Epilogue
from tvm_lowprec.quant.patterns import ConvGeometry
from tvm_lowprec.quant.requant import requantize_ref
from tvm_lowprec.schedule.depthwise import DepthwiseRule
from tvm_lowprec.schedule.depthwise_dot import DepthwiseDotRule
from tvm_lowprec.targets import resolve_target

# (channels, input height = width, stride): qdepthwise_u8_{C}x{H}x{W}_k3x3_s{S}, pad 1
SHAPES = [(16, 240, 1), (48, 120, 2), (32, 120, 1), (24, 240, 2), (48, 60, 2)]
# Keras MobileNetV2 at 96x96 (benchmarks/zoo: keras_mobilenet_v2)
KERAS_SHAPES = [(144, 24, 1), (32, 48, 1), (192, 12, 1), (384, 6, 1), (576, 6, 1), (960, 3, 1), (96, 48, 2),
                (144, 24, 2)]


def geometry(c, h, s, k=3, pad=1, batch=1):
    out = (h + 2 * pad - k) // s + 1
    return ConvGeometry(batch, c, (h, h), (out, out), (k, k), (s, s), (pad, pad, pad, pad), (1, 1), groups=c)


def reference(x, w_taps, zw, zx, bias, mult, ep, g):
    (kh, kw), (sh, sw), (oh, ow) = g.kernel, g.strides, g.out_hw
    top, left, bottom, right = g.padding
    xp = np.pad(x.astype(np.int64), ((0, 0), (top, bottom), (left, right), (0, 0)), constant_values=zx)
    w = w_taps.astype(np.int64).reshape(kh, kw, -1)
    acc = np.zeros((x.shape[0], oh, ow, x.shape[3]), np.int64)
    for i in range(kh):
        for j in range(kw):
            acc += (xp[:, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw, :] - zx) * (w[i, j] - zw)
    return requantize_ref(acc + bias, mult, ep.zero_point, ep.out_dtype, ep.qmin, ep.qmax, ep.mode)


def load_version(path):
    mods = {}
    for name in ("old_kernel", "old_rule"):
        spec = importlib.util.spec_from_file_location(name, f"{path}/{name}.py")
        mods[name] = importlib.util.module_from_spec(spec)
        sys.modules[name] = mods[name]
        spec.loader.exec_module(mods[name])
    return SimpleNamespace(kernel=mods["old_kernel"], rule=mods["old_rule"].DepthwiseRule())


def build(version, g, ep, zx, spec, threads, params):
    problem = version.kernel.DepthwiseProblem(g, "uint8", ep)
    import inspect

    names = list(inspect.signature(version.kernel.build_depthwise).parameters)
    if "pad_value" not in names:  # the zero points are parameters (depthwise_params' arrays)
        func = version.kernel.build_depthwise(problem, "dw", params)
    elif "params" in names:
        func = version.kernel.build_depthwise(problem, zx, "dw", params)
    else:  # a builder without the params argument
        func = version.kernel.build_depthwise(problem, zx, "dw")
    sch = version.rule.apply(func, spec)
    assert sch is not None, "the rule declined"
    return tvm.compile(sch.mod, target=spec.tvm_target(threads))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default=None, help="folder with old_kernel.py and old_rule.py")
    ap.add_argument("--threads", type=int, default=1, help="num-cores of the target (set TVM_NUM_THREADS too)")
    ap.add_argument("--repeat", type=int, default=15, help="interleaved rounds of 20 calls each")
    ap.add_argument("--mode", default="float", choices=["float", "fixed_point"])
    ap.add_argument("--shapes", default=None, help="indices into SHAPES, comma separated")
    ap.add_argument("--rules", action="store_true", help="the one-tap kernel against the four-tap one")
    ap.add_argument("--keras", action="store_true", help="Keras MobileNetV2@96's layers")
    ap.add_argument("--asm", default=None, help="write the new kernel's assembly for the first shape here")
    a = ap.parse_args()
    spec = resolve_target("native")
    rng = np.random.default_rng(0)
    versions = {"new": SimpleNamespace(kernel=kernel, rule=DepthwiseRule())}
    if a.old:
        versions = {"old": load_version(a.old), **versions}
    if a.rules:
        versions = {"old": versions["new"], "new": SimpleNamespace(kernel=kernel, rule=DepthwiseDotRule())}
    table = KERAS_SHAPES if a.keras else SHAPES
    shapes = table if a.shapes is None else [table[int(i)] for i in a.shapes.split(",")]
    for c, h, s in shapes:
        g = geometry(c, h, s)
        zx, zw = 7, 128 if a.rules else 131  # the four-tap kernel takes w - zw within int8
        ep = Epilogue("requant", "uint8", zero_point=3, qmin=3, mode=a.mode)
        x = rng.integers(0, 256, (1, h, h, c)).astype(np.uint8)
        w_taps = rng.integers(0, 256, (9, c)).astype(np.uint8)
        bias = rng.integers(-5000, 5000, c).astype(np.int32)
        mult = (rng.uniform(0.5, 2.0, c) / 300).astype(np.float32)
        want = reference(x, w_taps, zw, zx, bias, mult, ep, g)
        assert len(np.unique(want)) > 20  # not all clamped: the check means something
        out_shape = (1, *g.out_hw, c)
        runs = {}
        for name, version in versions.items():
            params = version.kernel.depthwise_params(w_taps, zw, zx, bias, mult, ep)
            try:
                lib = build(version, g, ep, zx, spec, a.threads, params)
            except AssertionError:
                print(f"  {name}: the rule declined {c}x{h}x{h} s{s}")
                continue
            args = [tvm.runtime.tensor(np.ascontiguousarray(v)) for v in [x, *params]]
            out = tvm.runtime.tensor(np.zeros(out_shape, "uint8"))
            lib["dw"](*args, out)
            np.testing.assert_array_equal(out.numpy(), want, err_msg=f"{name} differs from the reference")
            runs[name] = (lib.mod.time_evaluator("dw", tvm.cpu(), number=20, repeat=1), [*args, out])
            if name == "new" and a.asm and (c, h, s) == shapes[0]:
                with open(a.asm, "w") as f:
                    f.write(lib.mod.inspect_source("asm"))
        times = {name: [] for name in runs}
        for _ in range(a.repeat):  # interleaved
            for name, (timer, args) in runs.items():
                times[name].append(timer(*args).mean * 1e3)
        macs = g.rows * c * 9
        line = f"qdepthwise_u8_{c}x{h}x{h}_k3x3_s{s}:"
        for name, ts in times.items():
            ms = float(np.median(ts))
            line += f"  {name} {ms:.4f} ms ({2 * macs / ms / 1e6:.1f} GOPS)"
        if "old" in times and "new" in times:
            line += f"  old/new {np.median(times['old']) / np.median(times['new']):.2f}x"
        print(line, flush=True)


if __name__ == "__main__":
    main()
