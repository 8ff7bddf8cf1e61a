"""Where compile time goes: ``tvm_lowprec.compile``'s phases timed one by one on one model.

    python benchmarks/compile_phases.py model.onnx [--target native] [--shape name=1x3x224x224]

Import, each Relax pass of phase 1 (:func:`tvm_lowprec.pipeline.fused_module`, in its order), TVM's
legalize/fold/fuse passes, scheduling, then the lowering, ``tvm.compile`` of the scheduled module
(TIR passes and LLVM IR), and the first load of the VM, where LLVM makes the machine code of every
kernel, as a table of seconds and shares. The phases run in the order ``compile`` runs them,
inside the row's target scope; the sum is close to ``compile``'s own time (tuning-record lookups and
the ``Compiled`` wrapper aside).
"""

from __future__ import annotations

import argparse
import time

import tvm
from tvm import relax

import tvm_lowprec
from tvm_lowprec import pipeline as P
from tvm_lowprec.targets import resolve_target


def _phases(spec):
    """(name, module -> module) in compile's order: phase 1's rewrites as the pipeline lists them, then
    legalization, folding, fusion and scheduling."""
    return [
        *P.rewrites(spec),
        ("legalize", tvm.transform.Sequential([relax.transform.DeadCodeElimination(),
                                               relax.transform.LegalizeOps(customize_legalize_map=P.LEGALIZE),
                                               relax.transform.AnnotateTIROpPattern()])),
        ("fold_constants", P.fold_constants_module),
        ("fuse", lambda m: _fuse(m)),
        ("schedule", P.schedule_module(spec)),
    ]


def _fuse(mod):
    with P._fusion_depth(P.MAX_FUSED_OPS):
        return tvm.transform.Sequential([relax.transform.FuseOps(), relax.transform.FuseTIR(),
                                         relax.transform.DeadCodeElimination()])(mod)


def profile(path: str, target: str = "native", shape_dict: dict | None = None) -> list[tuple[str, float]]:
    rows = []
    start = time.perf_counter()
    mod = tvm_lowprec.from_onnx(path, shape_dict)
    rows.append(("import", time.perf_counter() - start))
    spec = resolve_target(target)
    with spec.tvm_target(2):
        for name, phase in _phases(spec):
            start = time.perf_counter()
            mod = phase(mod)
            rows.append((name, time.perf_counter() - start))
        target_now = tvm.target.Target.current()
        start = time.perf_counter()
        lowered = P.lowering_passes(target_now)(mod)
        rows.append(("lower (VM passes)", time.perf_counter() - start))
        start = time.perf_counter()
        executable = tvm.compile(lowered, target=target_now, relax_pipeline=None)
        rows.append(("TIR passes + LLVM IR", time.perf_counter() - start))
        start = time.perf_counter()
        relax.VirtualMachine(executable, tvm.cpu())  # LLVM makes the machine code here, at first use
        rows.append(("LLVM machine code (VM load)", time.perf_counter() - start))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--target", default="native")
    parser.add_argument("--shape", action="append", default=[], help="name=1x3x224x224 (repeatable)")
    args = parser.parse_args(argv)
    shapes = {k: [int(d) for d in v.split("x")] for k, v in (s.split("=", 1) for s in args.shape)} or None
    rows = profile(args.model, args.target, shapes)
    total = sum(s for _, s in rows)
    print(f"| phase | s | share |\n|---|---:|---:|")
    for name, seconds in rows:
        print(f"| {name} | {seconds:.2f} | {100 * seconds / total:.0f}% |")
    print(f"| total | {total:.2f} | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
