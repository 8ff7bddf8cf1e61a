"""``tvm-lowprec``: the command line.

    tvm-lowprec run                    # the shipped demo model: compile, run, kernel table, vs ONNX Runtime
    tvm-lowprec run model.onnx --target x86-avx2 --threads 2
    tvm-lowprec targets                # the registered target rows and whether this host runs them
    tvm-lowprec tune model.onnx --target native --trials 64 --work-dir tuning/
    tvm-lowprec tune model.onnx --target x86-avx512-vnni --rpc-tracker host:9190 --rpc-key vnni
    tvm-lowprec run model.onnx --target arm64-dotprod --rpc board:9090
    tvm-lowprec run model.onnx --database tuning/
    tvm-lowprec run detector.onnx --shape images=1x3x480x480   # dynamic axes fixed, shapes folded
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from .errors import DynamicShapeError

DEMO_MODEL = os.path.join(os.path.dirname(__file__), "data", "demo_mlp_qdq.onnx")


def _step(message: str):
    print(f"… {message}", file=sys.stderr, flush=True)
    return time.perf_counter()


def _done(t0: float):
    print(f"  done in {time.perf_counter() - t0:.2f} s", file=sys.stderr, flush=True)


def _table(rows: list[dict]) -> str:
    if not rows:
        return "(none)"
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols), "  ".join("-" * widths[c] for c in cols)]
    lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(lines)


TABLE_WIDTH = 120  # the kernel tables fit a terminal of this many columns


def _shorten(text: str, width: int) -> str:
    """``text`` cut in the middle to ``width`` characters (its start and its numbered end both matter)."""
    if len(text) <= width:
        return text
    tail = (width - 1) // 3
    return text[: width - 1 - tail] + "…" + text[len(text) - tail:]


def _kernel_table(rows: list[dict]) -> str:
    """The per-kernel table within :data:`TABLE_WIDTH` columns: intrinsics without their ``lowprec_``
    prefix, and kernel names (long for fused chains) shortened to the width the other columns leave."""
    rows = [{**r, "intrinsic": str(r["intrinsic"]).removeprefix("lowprec_")} for r in rows]
    if not rows:
        return _table(rows)
    others = [c for c in rows[0] if c != "name"]
    used = sum(max(len(c), *(len(str(r[c])) for r in rows)) + 2 for c in others)
    width = max(16, TABLE_WIDTH - used)
    return _table([{**r, "name": _shorten(str(r["name"]), width)} for r in rows])


def _random_inputs(compiled, seed: int) -> dict:
    """Normal floats; 8-bit inputs over their whole range; wider integer inputs are token-id-like
    (small non-negative values), and any input named like a mask is all ones."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for spec in compiled.inputs:
        if any(not isinstance(d, int) for d in spec.shape):
            raise SystemExit(
                f"input {spec.name!r} has a dynamic shape {spec.shape}: fix it with --shape {spec.name}=DxDx..."
            )
        if spec.dtype.startswith("float"):
            inputs[spec.name] = rng.standard_normal(spec.shape).astype(spec.dtype)
        elif "mask" in spec.name.lower():
            inputs[spec.name] = np.ones(spec.shape, spec.dtype)
        elif np.dtype(spec.dtype).itemsize == 1:
            info = np.iinfo(spec.dtype)
            inputs[spec.name] = rng.integers(info.min, info.max + 1, spec.shape).astype(spec.dtype)
        else:
            inputs[spec.name] = rng.integers(0, 1000, spec.shape).astype(spec.dtype)
    return inputs


def _ort_session(path: str, threads: int, optimized: bool = True):
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    if not optimized:  # the graph as written: float QDQ semantics, no fused integer kernels
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    except Exception as err:  # noqa: BLE001 - ORT raises its own classes (an IR version it does not read, ...)
        print(f"\nonnxruntime {ort.__version__} cannot load {path}, no comparison: {str(err).splitlines()[0][-300:]}",
              file=sys.stderr)
        return None


def _max_diffs(outputs, reference) -> str:
    return ", ".join(f"{float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))):.4g}" for a, b in zip(outputs, reference))


def _median_seconds(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def cmd_run(args) -> int:
    import tvm_lowprec

    path = args.model or DEMO_MODEL
    t0 = _step(f"importing {path}")
    mod = tvm_lowprec.from_onnx(path, shape_dict=args.shape)
    _done(t0)
    t0 = _step(f"compiling for {args.target}")
    compiled = tvm_lowprec.compile(mod, target=args.target, num_threads=args.threads, database=args.database)
    _done(t0)
    print(f"\ntarget: {compiled.spec.name} — {compiled.spec.description}\n")
    inputs = _random_inputs(compiled, args.seed)
    if args.rpc or args.rpc_tracker:
        return _run_on_board(compiled, path, inputs, args)
    if compiled.execution != "native":
        return _run_without_timing(compiled, path, inputs, args)
    rows = [{**r, "ms": f"{r['ms']:.4f}", "gops": "" if r["gops"] is None else f"{r['gops']:.1f}",
             "share": f"{100 * r['share']:.0f}%"} for r in compiled.profile(inputs)]
    print(_kernel_table(rows))
    _flag_unscheduled(compiled)
    outputs = compiled(inputs)
    t_tvm = compiled.benchmark(inputs, number=max(1, args.repeat // 5), repeat=5)
    rows = [{"runtime": "tvm-lowprec", "ms": f"{t_tvm * 1e3:.3f}", "tvm-lowprec speed-up": "1.00"}]
    session = _ort_session(path, args.threads)
    if session is not None:
        print(f"\nmax |tvm-lowprec - onnxruntime| per output: {_max_diffs(outputs, session.run(None, inputs))}")
        _print_vs_graph_as_written(outputs, path, inputs, args.threads)
        t_ort = _median_seconds(lambda: session.run(None, inputs), args.repeat)
        rows.append({"runtime": "onnxruntime", "ms": f"{t_ort * 1e3:.3f}", "tvm-lowprec speed-up": f"{t_ort / t_tvm:.2f}"})
    print(f"\nlatency, {args.threads} thread(s), median of {args.repeat} calls:")
    print(_table(rows))
    return 0


def _flag_unscheduled(compiled) -> None:
    unscheduled = [k.name for k in compiled.kernels() if k.schedule == "none"]
    if unscheduled:
        print(f"\n!! {len(unscheduled)} kernel(s) no schedule rule accepted (schedule 'none': serial, scalar loops): "
              + ", ".join(unscheduled))


def _run_without_timing(compiled, path, inputs, args) -> int:
    """A row this host runs emulated (or not at all): the kernel table and the outputs against ONNX
    Runtime, no times (emulated code says nothing about the target's speed)."""
    print(_kernel_table([r.as_row() for r in compiled.kernels()]))
    _flag_unscheduled(compiled)
    if compiled.execution == "none" and compiled.spec.device == "cuda":
        build = compiled.cuda
        if build is None:
            print(f"\n{compiled.spec.name}: no CUDA device here and no nvcc: CUDA source only (inspect_source('cuda') "
                  "needs nvcc for PTX)")
        else:
            mma = ", ".join(f"{name} x{count}" for name, count in build.mma.items())
            print(f"\n{compiled.spec.name}: no CUDA device here; nvcc built {len(build.kernel_names)} kernels for "
                  f"{build.arch}: {len(build.cubin) // 1024} KiB of cubin; PTX mma: {mma or 'none'}")
        return 0
    if compiled.execution == "none":
        print(f"\n{compiled.spec.name} cannot run in this process, natively or emulated: compiled only "
              "(Compiled.export_library writes the library a board of that kind loads)")
        return 0
    report = compiled.emulation
    print(f"\nthis host lacks {compiled.spec.name}'s instructions: ran emulated ({report.total} intrinsic calls "
          f"replaced by their semantics, retargeted to {report.host_cpu}); no timing")
    _print_vs_graph_as_written(compiled(inputs), path, inputs, args.threads)
    return 0


def _host_port(text: str, option: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"tvm-lowprec run: {option} must be HOST:PORT, not {text!r}")
    return host, int(port)


def _board_session(args):
    """The RPC session ``--rpc HOST:PORT`` (a board's ``tvm.exec.rpc_server``) or ``--rpc-tracker
    HOST:PORT --rpc-key KEY`` (a board registered with a tracker) names."""
    import tvm

    if args.rpc_tracker:
        if not args.rpc_key:
            raise SystemExit("tvm-lowprec run: --rpc-tracker needs --rpc-key")
        return tvm.rpc.connect_tracker(*_host_port(args.rpc_tracker, "--rpc-tracker")).request(args.rpc_key)
    return tvm.rpc.connect(*_host_port(args.rpc, "--rpc"), key=args.rpc_key or "")  # a server started with --key


def _run_on_board(compiled, path, inputs, args) -> int:
    """The model on a board over TVM RPC (the way a cross-compiled row runs): the kernel table, the
    board's outputs against ONNX Runtime here, and the board's own time per call."""
    print(_kernel_table([r.as_row() for r in compiled.kernels()]))
    _flag_unscheduled(compiled)
    where = args.rpc or f"{args.rpc_key}@{args.rpc_tracker}"
    with compiled.remote(_board_session(args)) as remote:
        outputs = remote(inputs)
        seconds = remote.benchmark(inputs, number=max(1, args.repeat // 5), repeat=5)
    print(f"\nran on the board at {where}: {seconds * 1e3:.3f} ms per call, by the board's own timer "
          "(meaningless where the board is emulated)")
    _print_vs_graph_as_written(outputs, path, inputs, args.threads)
    return 0


def _print_vs_graph_as_written(outputs, path, inputs, threads) -> None:
    session = _ort_session(path, threads, optimized=False)
    if session is not None:
        print(f"max |tvm-lowprec - onnxruntime, graph as written (no fusion)|: {_max_diffs(outputs, session.run(None, inputs))}")


def cmd_tune(args) -> int:
    import logging

    import tvm_lowprec
    from tvm_lowprec.tune import TuningError

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    t0 = _step(f"importing {args.model}")
    mod = tvm_lowprec.from_onnx(args.model, shape_dict=args.shape)
    _done(t0)
    try:
        result = tvm_lowprec.tune(mod, args.target, trials=args.trials, work_dir=args.work_dir,
                                  num_threads=args.threads, rpc_tracker=args.rpc_tracker, rpc_key=args.rpc_key)
    except TuningError as err:
        print(f"tvm-lowprec tune: {err}", file=sys.stderr)
        return 2
    print(result.table())
    print(f"\nrecords: {result.work_dir}/ — use them with tvm_lowprec.compile(mod, {args.target!r}, "
          f"database={str(result.work_dir)!r}) or tvm-lowprec run {args.model} --target {args.target} "
          f"--database {result.work_dir}")
    return 0


def cmd_targets(_args) -> int:
    from tvm_lowprec.emulation import execution_mode
    from tvm_lowprec.targets import native_target, registered_targets

    rows = [
        {"name": s.name, "instruction": s.instruction, "here": execution_mode(s), "about": s.description}
        for s in registered_targets().values()
    ]
    print(_table(rows))
    print("\nhere: native = runs on this CPU; emulated = runs with the instructions replaced by their semantics in "
          "generic code (exact results, not timed); qemu = AArch64 kernels run under qemu-aarch64 (exact, not "
          "timed); compile-only = code generation only; cuda = a GPU row with a CUDA device here (else compile-only: nvcc makes its PTX and cubin)")
    print(f"native = {native_target().name}")
    return 0


def parse_shape(text: str) -> tuple[str, list[int]]:
    """``"images=1x3x480x480"`` -> ``("images", [1, 3, 480, 480])``."""
    name, sep, dims = text.rpartition("=")
    values = dims.lower().split("x")
    if not sep or not name or not all(v.isdigit() and int(v) > 0 for v in values):
        raise argparse.ArgumentTypeError(f"bad --shape {text!r}; expected NAME=D1xD2x... with positive integers")
    return name, [int(v) for v in values]


def _add_shape_option(parser) -> None:
    parser.add_argument("--shape", metavar="NAME=1x3x480x480", type=parse_shape, action="append",
                        help="fix an input's shape (repeatable); every shape computation of the model is then "
                             "folded to constants at import")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tvm-lowprec", description="Quantized ONNX models on low-precision CPU instructions")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="compile and run a quantized ONNX model (default: the shipped demo)")
    run.add_argument("model", nargs="?", help="ONNX file (default: the demo MLP shipped with the package)")
    run.add_argument("--target", default="native", help="a registered target name or 'native' (default)")
    run.add_argument("--threads", type=int, default=1)
    run.add_argument("--repeat", type=int, default=50, help="timed calls per runtime")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--database", help="tuning records (a `tvm-lowprec tune` work dir) to compile with")
    run.add_argument("--rpc", metavar="HOST:PORT", help="run on the board whose TVM RPC server listens there "
                     "(python -m tvm.exec.rpc_server on the board; for the cross-compiled rows, e.g. arm64-dotprod)")
    run.add_argument("--rpc-tracker", metavar="HOST:PORT", help="run on a board registered with this RPC tracker")
    run.add_argument("--rpc-key", help="the key of the board to run on (with --rpc-tracker; with --rpc where its "
                     "server was started with --key)")
    _add_shape_option(run)
    run.set_defaults(func=cmd_run)
    tune = sub.add_parser("tune", help="tune a model's integer kernels with MetaSchedule; records in --work-dir")
    tune.add_argument("model", help="ONNX file")
    tune.add_argument("--target", default="native", help="a registered target name or 'native' (default)")
    tune.add_argument("--trials", type=int, default=64, help="measured candidates per kernel (default 64)")
    tune.add_argument("--work-dir", default="tuning", help="the JSON database; a second run resumes from it")
    tune.add_argument("--threads", type=int, default=None, help="threads the kernels are tuned for")
    tune.add_argument("--rpc-tracker", metavar="HOST:PORT", help="measure on machines registered with this tracker")
    tune.add_argument("--rpc-key", help="the tracker key of the machines to measure on")
    _add_shape_option(tune)
    tune.set_defaults(func=cmd_tune)
    targets = sub.add_parser("targets", help="list the registered targets")
    targets.set_defaults(func=cmd_targets)
    args = parser.parse_args(argv)
    args.shape = dict(getattr(args, "shape", None) or {}) or None
    try:
        return args.func(args)
    except DynamicShapeError as err:
        print(f"tvm-lowprec {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
