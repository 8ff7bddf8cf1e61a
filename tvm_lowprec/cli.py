"""``tvm-lowprec``: the command line.

    tvm-lowprec run                    # the shipped demo model: compile, run, kernel table, vs ONNX Runtime
    tvm-lowprec run model.onnx --target x86-avx2 --threads 2
    tvm-lowprec targets                # the registered target rows and whether this host runs them
    tvm-lowprec tune model.onnx --target native --trials 64 --work-dir tuning/
    tvm-lowprec tune model.onnx --target x86-avx512-vnni --rpc-tracker host:9190 --rpc-key vnni
    tvm-lowprec run model.onnx --target arm64-dotprod --rpc board:9090
    tvm-lowprec run model.onnx --database tuning/
    tvm-lowprec run model.onnx --no-cache           # compile again (by default a second run loads the build)
    tvm-lowprec run detector.onnx --shape images=1x3x480x480   # dynamic axes fixed, shapes folded
    tvm-lowprec quantize model.onnx --data samples.npz --out model_qdq.onnx [--config cfg.json] [--target-sqnr 20]
    tvm-lowprec generate llm_dir --prompt-tokens 128 --new-tokens 64   # an int4 decoder (builder or plain): tokens/s
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from .errors import DynamicShapeError, LowPrecError

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


# shortened, in this order, until the table fits (kernel names of fused chains run to 60+ characters,
# the AVX2 rows' intrinsics to 30: "vpmaddwd_ymm_int16_wideb_8x2"), none below NARROWEST
SHRINKABLE = ("name", "intrinsic")
NARROWEST = 12


def _kernel_table(rows: list[dict]) -> str:
    """The per-kernel table within :data:`TABLE_WIDTH` columns: intrinsics without their ``lowprec_``
    prefix, and the :data:`SHRINKABLE` columns shortened to the width the other columns leave."""
    rows = [{**r, "intrinsic": str(r["intrinsic"]).removeprefix("lowprec_")} for r in rows]
    if not rows:
        return _table(rows)
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in rows[0]}
    excess = sum(w + 2 for w in widths.values()) - TABLE_WIDTH
    for column in SHRINKABLE:
        cut = max(0, min(excess, widths.get(column, 0) - NARROWEST))
        widths[column] = widths.get(column, 0) - cut
        excess -= cut
    return _table([{**r, **{c: _shorten(str(r[c]), widths[c]) for c in SHRINKABLE if c in r}} for r in rows])


def _random_inputs(compiled, seed: int) -> dict:
    """:func:`tvm_lowprec.compiled.random_inputs`; a dynamic shape ends the command, naming the fix."""
    from .compiled import random_inputs
    from .errors import InputError

    try:
        return random_inputs(compiled, seed)
    except InputError as err:
        raise SystemExit(f"{err}: fix it with --shape NAME=DxDx...") from None


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


QUANTIZED_OPS = {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "MatMulInteger",
                 "ConvInteger", "DynamicQuantizeLinear", "MatMulNBits", "QGemm", "QLinearAdd"}


def _is_fp32(path: str) -> bool:
    """No quantization operator anywhere in the graph."""
    import onnx

    model = onnx.load(path, load_external_data=False)
    return not any(n.op_type in QUANTIZED_OPS for n in model.graph.node)


def cmd_run(args) -> int:
    import tvm_lowprec

    path = args.model or DEMO_MODEL
    if _is_fp32(path):
        print(f"{path} has no quantization operators: it runs in FP32 here (float kernels). To run it on integer "
              f"kernels, quantize it first:\n  tvm-lowprec quantize {path} --data SAMPLES.npz --out "
              f"{os.path.splitext(path)[0]}_qdq.onnx\n", file=sys.stderr)
    compiled = _compile_cached(path, args)
    print(f"\ntarget: {compiled.spec.name} — {compiled.spec.description}\n")
    inputs = _random_inputs(compiled, args.seed)
    if args.rpc or args.rpc_tracker:
        return _run_on_board(compiled, path, inputs, args)
    if compiled.execution != "native":
        return _run_without_timing(compiled, path, inputs, args)
    from .bench.bandwidth import pool_threads

    profile = compiled.profile(inputs, isolated=args.isolated)
    print(_kernel_table(_profile_rows(profile)))
    print(("each kernel timed alone" if args.isolated else "timed in the model's run") + "; bytes: read + "
          f"written per call;\n% copy: GB/s over a copy of as many bytes on {pool_threads()} thread(s)" + ("; schedules: all default" if _all_default(profile) else ""))
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


def _compile_cached(path: str, args):
    """The model at ``path`` compiled as ``args`` say: from the compile cache where an earlier run stored
    it (keyed by the ONNX file's bytes, ``--shape``, the target row, ``--threads``, ``--database``
    and the versions: :mod:`tvm_lowprec.cache`; no import, no compile), else imported, compiled and
    stored there. ``--no-cache``: neither looked up nor stored."""
    import tvm_lowprec
    from tvm_lowprec import cache

    folder, key = None, None
    if not args.no_cache:
        spec = tvm_lowprec.resolve_target(args.target)
        if cache.cacheable(spec):
            folder = cache.default_dir()
            options = tvm_lowprec._compile_options(args.threads, "float", True, "auto", None)
            key = cache.compile_key(cache.file_digest(path, shape_dict=args.shape), spec, options, args.database)
            t0 = time.perf_counter()
            compiled = cache.lookup(folder, key)
            if compiled is not None:
                print(f"… loaded from cache {compiled.loaded_from} in {time.perf_counter() - t0:.2f} s "
                      "(compiled by an earlier run; --no-cache compiles again)", file=sys.stderr, flush=True)
                return compiled
    t0 = _step(f"importing {path}")
    mod = tvm_lowprec.from_onnx(path, shape_dict=args.shape)
    _done(t0)
    t0 = _step(f"compiling for {args.target}")
    compiled = tvm_lowprec.compile(mod, target=args.target, num_threads=args.threads, database=args.database)
    _done(t0)
    stored = cache.store(folder, key, compiled) if key is not None else None
    if stored is not None:
        print(f"  cached as {stored} (the next run loads it; --no-cache skips the cache)", file=sys.stderr, flush=True)
    return compiled


def _all_default(profile: list[dict]) -> bool:
    return all(r["schedule"] == "default" for r in profile)


def _profile_rows(profile: list[dict]) -> list[dict]:
    """:meth:`Compiled.profile` rows as the run table's cells (the figures as the benchmarks show them);
    the schedule column only where some kernel's is not the default (the width goes to the names)."""
    from .bench.report import profile_figures

    keep = ("name", "op", "intrinsic", "shape") + (() if _all_default(profile) else ("schedule",))
    return [{**{c: r[c] for c in keep}, "ms": f"{r['ms']:.4f}", "calls": r["calls"], **profile_figures(r),
             "share": f"{100 * r['share']:.0f}%"} for r in profile]


_FLAGS = {  # schedule source -> what the flag line says of such kernels
    "none": "no schedule rule accepted (schedule 'none': serial, scalar loops)",
    "generic": "only the generic fallback scheduled (schedule 'generic': parallel and vectorized, no intrinsic)",
}


def _flag_unscheduled(compiled) -> None:
    for source, what in _FLAGS.items():
        names = [k.name for k in compiled.kernels() if k.schedule == source]
        if names:
            print(f"\n!! {len(names)} kernel(s) {what}: " + ", ".join(names))


def _run_without_timing(compiled, path, inputs, args) -> int:
    """A row this host runs emulated (or not at all): the kernel table and the outputs against ONNX
    Runtime, no times (emulated code says nothing about the target's speed)."""
    print(_kernel_table([r.as_row() for r in compiled.kernels()]))
    _flag_unscheduled(compiled)
    if compiled.execution == "none" and compiled.spec.backend.runtime_device == "cuda":
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
                                  num_threads=args.threads, rpc_tracker=args.rpc_tracker, rpc_key=args.rpc_key,
                                  others=not args.gemm_only, top=args.top)
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


class DataError(ValueError):
    """Calibration data that cannot be used (names the file, input or sample)."""


def _input_specs(path: str) -> list[tuple[str, list]]:
    """(name, dims: int or None for a dynamic one) of the graph inputs that are not initializers."""
    import onnx

    model = onnx.load(path, load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    return [(vi.name, [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim])
            for vi in model.graph.input if vi.name not in inits]


def load_samples(data_path: str, inputs: list[tuple[str, list]]) -> list[dict[str, np.ndarray]]:
    """Samples from ``data_path``: a ``.npz`` whose keys are the input names, each an array with the samples
    stacked on a new first axis ``[N, *input shape]``; or a folder of ``.npy`` files, one per input named
    ``<input name>.npy`` stacked the same way, or (a one-input model) one sample per file, in name order."""
    names = [n for n, _ in inputs]
    if os.path.isdir(data_path):
        files = sorted(f for f in os.listdir(data_path) if f.endswith(".npy"))
        if not files:
            raise DataError(f"--data {data_path}: no .npy files in the folder")
        stems = {f[:-4]: f for f in files}
        if set(names) <= set(stems):
            arrays = {n: np.load(os.path.join(data_path, stems[n])) for n in names}
        elif len(names) == 1:
            arrays = {names[0]: np.stack([np.load(os.path.join(data_path, f)) for f in files])}
        else:
            raise DataError(f"--data {data_path}: the model's inputs are {names}; the folder needs one "
                            f"<input name>.npy per input, and has {sorted(stems)}")
    elif data_path.endswith(".npz"):
        with np.load(data_path) as archive:
            arrays = {k: archive[k] for k in archive.files}
        missing = [n for n in names if n not in arrays]
        if missing:
            raise DataError(f"--data {data_path}: no array for input(s) {missing}; the model's inputs are "
                            f"{names}, the file has {sorted(arrays)}")
    else:
        raise DataError(f"--data {data_path}: expected a .npz file or a folder of .npy files")
    counts = {n: len(arrays[n]) for n in names}
    if len(set(counts.values())) != 1:
        raise DataError(f"--data {data_path}: the inputs have different sample counts {counts}")
    samples = []
    for i in range(next(iter(counts.values()))):
        sample = {}
        for name, dims in inputs:
            value = np.asarray(arrays[name][i])
            if len(dims) != value.ndim or any(d is not None and d != v for d, v in zip(dims, value.shape)):
                raise DataError(f"--data {data_path}: sample {i} of input {name!r} has shape {list(value.shape)}; "
                                f"the model takes {['?' if d is None else d for d in dims]} (stack samples on a new "
                                f"first axis)")
            if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
                raise DataError(f"--data {data_path}: sample {i} of input {name!r} has NaN/Inf values")
            sample[name] = value
        samples.append(sample)
    if not samples:
        raise DataError(f"--data {data_path}: no samples")
    return samples


def _sqnr_db(refs, outs) -> float:
    ref = np.concatenate([np.asarray(r, np.float64).ravel() for r in refs])
    err = ref - np.concatenate([np.asarray(o, np.float64).ravel() for o in outs])
    return float("inf") if not err.any() else float(10 * np.log10(np.sum(ref ** 2) / np.sum(err ** 2)))


def _check_ort_loads(path: str) -> None:
    """Say so when ONNX Runtime's default optimizations cannot load the exported file (onnxruntime 1.32's
    MatMulAddFusion fails on some MatMul(DQ, DQ) + Add(DQ bias) graphs), and how to load it anyway."""
    try:
        import onnxruntime as ort
    except ImportError:
        return
    try:
        ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    except Exception as err:  # noqa: BLE001 - ORT raises its own classes
        print(f"\nnote: onnxruntime {ort.__version__} with its default optimizations cannot load {path}: "
              f"{str(err).splitlines()[0][-200:]}\n  it loads with InferenceSession(path, "
              f"disabled_optimizers=['MatMulAddFusion']) or graph_optimization_level=ORT_DISABLE_ALL", file=sys.stderr)


def cmd_quantize(args) -> int:
    import dataclasses
    import logging

    import tvm_lowprec
    from tvm_lowprec.ptq import QuantConfig, accuracy_report
    from tvm_lowprec.ptq.export_onnx import export_qdq
    from tvm_lowprec.ptq.quantize import output_names, quantize_with_plans

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    inputs = _input_specs(args.model)
    samples = load_samples(args.data, inputs)
    shape_dict = dict(args.shape or {})
    for name, dims in inputs:  # dynamic dims fixed to the data's shapes
        if name not in shape_dict and any(d is None for d in dims):
            shape_dict[name] = list(samples[0][name].shape)
    if args.config:
        with open(args.config) as f:
            config = QuantConfig.from_json(f.read())
    else:
        config = QuantConfig.for_target(args.target)
    if args.target_sqnr is not None:
        config = dataclasses.replace(config, target_sqnr=args.target_sqnr)
    t0 = _step(f"importing {args.model}")
    mod = tvm_lowprec.from_onnx(args.model, shape_dict=shape_dict or None)
    _done(t0)
    t0 = _step(f"quantizing on {len(samples)} sample(s)")
    qmod, plans = quantize_with_plans(mod, samples, config, target=args.target, progress=True)
    _done(t0)
    out = args.out or os.path.splitext(args.model)[0] + "_qdq.onnx"
    export_qdq(args.model, plans, out, shape_dict or None)
    stem = os.path.splitext(out)[0]
    report = accuracy_report(mod, qmod, samples, target=args.target, progress=False)
    with open(stem + ".report.md", "w") as f:
        f.write(report.table() + "\n")
    report.plot(stem + ".report.png")
    print(report.table())
    print(f"\nwrote {out} ({len(plans)} quantized layer(s)), {stem}.report.md, {stem}.report.png")
    fp32, ours = _ort_session(args.model, 1), tvm_lowprec.compile(qmod, target=args.target, cache=not args.no_cache)
    _check_ort_loads(out)
    exported = _ort_session(out, 1, optimized=False)
    if fp32 is not None and exported is not None:
        names = output_names(mod)
        refs = [fp32.run(None, s) for s in samples]
        rows = []
        for i, name in enumerate(names):
            ref = [r[i] for r in refs]
            rows.append({"output": name, "tvm-lowprec (dB)": f"{_sqnr_db(ref, [ours(s)[i] for s in samples]):.2f}",
                         "onnxruntime, exported QDQ (dB)":
                             f"{_sqnr_db(ref, [exported.run(None, s)[i] for s in samples]):.2f}"})
        print("\nSQNR against FP32 (onnxruntime) on the data given:")
        print(_table(rows))
    return 0


def parse_shape(text: str) -> tuple[str, list[int]]:
    """``"images=1x3x480x480"`` -> ``("images", [1, 3, 480, 480])``."""
    name, sep, dims = text.rpartition("=")
    values = dims.lower().split("x")
    if not sep or not name or not all(v.isdigit() and int(v) > 0 for v in values):
        raise argparse.ArgumentTypeError(f"bad --shape {text!r}; expected NAME=D1xD2x... with positive integers")
    return name, [int(v) for v in values]


def _add_cache_option(parser) -> None:
    parser.add_argument("--no-cache", action="store_true",
                        help="compile even where the compile cache holds the build, and do not store it "
                             "(cache: $TVM_LOWPREC_CACHE_DIR, else $XDG_CACHE_HOME/tvm-lowprec, else ~/.cache/tvm-lowprec)")


def _add_shape_option(parser) -> None:
    parser.add_argument("--shape", metavar="NAME=1x3x480x480", type=parse_shape, action="append",
                        help="fix an input's shape (repeatable); every shape computation of the model is then "
                             "folded to constants at import")


def cmd_generate(args) -> int:
    """Prefill a prompt of random token ids and decode greedily on :class:`tvm_lowprec.llm.Generator`:
    tokens/s of each, and the 4-bit weights read per decode step as GB/s next to this host's copy
    bandwidth (64 MiB buffers, read and written bytes counted)."""
    import onnx

    from .bench.bandwidth import copy_bandwidth
    from .llm import Generator, _model_file, nbits_weight_bytes

    path = _model_file(args.model)
    if path is None or not path.exists():
        print(f"tvm-lowprec generate: no model at {args.model} (a folder with model.onnx, or the file)", file=sys.stderr)
        return 2
    max_length = args.max_length or args.prompt_tokens + args.new_tokens
    chunk = min(args.chunk, max_length)
    t0 = _step(f"compiling {path} for {args.target} (a prompt piece of up to {chunk} tokens, symbolic, and one token, cache {max_length})")
    gen = Generator(str(path), max_length=max_length, chunk=chunk, target=args.target, num_threads=args.threads)
    _done(t0)
    weights = nbits_weight_bytes(onnx.load(str(path)))
    rng = np.random.default_rng(args.seed)
    prompt = rng.integers(0, min(args.vocab, gen.layout.vocab or args.vocab), args.prompt_tokens).tolist()
    rows = []
    for _ in range(args.rounds):
        gen.reset()
        start = time.perf_counter()
        logits = gen.prefill(prompt)
        prefill_s = time.perf_counter() - start
        tokens, start = [], time.perf_counter()
        for _ in range(args.new_tokens):
            tokens.append(gen.choose(logits, args.top_k, rng=rng))
            logits = gen.step(tokens[-1])
        decode_s = (time.perf_counter() - start) / args.new_tokens
        rows.append((prefill_s, decode_s))
    prefill_s, decode_s = min(r[0] for r in rows), min(r[1] for r in rows)
    copy = copy_bandwidth()
    print(_table([{"compile s": f"{gen.compile_s:.1f}", "prompt": args.prompt_tokens,
                   "prefill tokens/s": f"{args.prompt_tokens / prefill_s:.1f}", "new": args.new_tokens,
                   "decode ms/token": f"{decode_s * 1e3:.2f}", "decode tokens/s": f"{1 / decode_s:.1f}",
                   "4-bit weights MB": f"{weights / 1e6:.1f}", "weights GB/s": f"{weights / decode_s / 1e9:.1f}",
                   "copy GB/s (64 MiB)": f"{copy.ceiling(copy.moved[-1]):.1f}"}]))
    print(f"(best of {args.rounds} rounds; threads: {args.threads or 'all'}; tokens: {tokens[:8]} ...)")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tvm-lowprec", description="Quantized ONNX models on low-precision CPU instructions")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="compile and run a quantized ONNX model (default: the shipped demo)")
    run.add_argument("model", nargs="?", help="ONNX file (default: the demo MLP shipped with the package)")
    run.add_argument("--target", default="native", help="a registered target name or 'native' (default)")
    run.add_argument("--threads", type=int, default=1)
    run.add_argument("--repeat", type=int, default=50, help="timed calls per runtime")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--isolated", action="store_true",
                     help="time each kernel of the profile alone (TVM's time evaluator on its own buffers) "
                          "instead of inside the model's run, whose instrument adds a few us per call")
    run.add_argument("--database", help="tuning records (a `tvm-lowprec tune` work dir) to compile with")
    run.add_argument("--rpc", metavar="HOST:PORT", help="run on the board whose TVM RPC server listens there "
                     "(python -m tvm.exec.rpc_server on the board; for the cross-compiled rows, e.g. arm64-dotprod)")
    run.add_argument("--rpc-tracker", metavar="HOST:PORT", help="run on a board registered with this RPC tracker")
    run.add_argument("--rpc-key", help="the key of the board to run on (with --rpc-tracker; with --rpc where its "
                     "server was started with --key)")
    _add_shape_option(run)
    _add_cache_option(run)
    run.set_defaults(func=cmd_run)
    tune = sub.add_parser("tune", help="tune a model's integer kernels with MetaSchedule; records in --work-dir")
    tune.add_argument("model", help="ONNX file")
    tune.add_argument("--target", default="native", help="a registered target name or 'native' (default)")
    tune.add_argument("--trials", type=int, default=64, help="measured candidates per kernel (default 64)")
    tune.add_argument("--work-dir", default="tuning", help="the JSON database; a second run resumes from it")
    tune.add_argument("--threads", type=int, default=None, help="threads the kernels are tuned for")
    tune.add_argument("--rpc-tracker", metavar="HOST:PORT", help="measure on machines registered with this tracker")
    tune.add_argument("--rpc-key", help="the tracker key of the machines to measure on")
    tune.add_argument("--top", type=int, help="tune only the kernels among the model's N slowest (each timed alone "
                                              "on this host first)")
    tune.add_argument("--gemm-only", action="store_true", help="tune only the integer GEMMs (not the element-wise, "
                                                               "layout, pooling and row kernels around them)")
    _add_shape_option(tune)
    tune.set_defaults(func=cmd_tune)
    quant = sub.add_parser("quantize", help="post-training quantization of an FP32 ONNX model into an ONNX QDQ "
                           "model, with an accuracy report")
    quant.add_argument("model", help="FP32 ONNX file")
    quant.add_argument("--data", required=True, help="calibration samples: a .npz keyed by input name, each "
                       "[N, *input shape], or a folder of .npy files (<input name>.npy, same stacking; or, for a "
                       "one-input model, one sample per file)")
    quant.add_argument("--out", help="the QDQ ONNX file to write (default: MODEL_qdq.onnx); the report goes "
                       "beside it (.report.md, .report.png)")
    quant.add_argument("--config", help="a QuantConfig as JSON (QuantConfig.to_json(); docs/ptq.md)")
    quant.add_argument("--target-sqnr", type=float, help="keep layers in FP32 until every output's SQNR "
                       "against FP32 reaches this (dB)")
    quant.add_argument("--target", default="native", help="the target row quantize calibrates and measures on")
    _add_shape_option(quant)
    _add_cache_option(quant)
    quant.set_defaults(func=cmd_quantize)
    gen = sub.add_parser("generate", help="prefill and decode a language model exported by ORT GenAI's builder "
                         "(int4) or plainly (torch's exporter, optimum: past_key_values.N inputs, present.N "
                         "outputs): tokens/s and weight GB/s per decode step")
    gen.add_argument("model", help="the export's folder (model.onnx, and genai_config.json for the builder's) or its "
                     "model.onnx")
    gen.add_argument("--prompt-tokens", type=int, default=128, help="random prompt length (default 128)")
    gen.add_argument("--new-tokens", type=int, default=64, help="greedy decode steps (default 64)")
    gen.add_argument("--max-length", type=int, help="KV cache length (default prompt + new tokens)")
    gen.add_argument("--chunk", type=int, default=64, help="most prompt tokens per prefill call (default 64)")
    gen.add_argument("--vocab", type=int, default=1000, help="prompt ids are drawn below this and the model's vocabulary (default 1000)")
    gen.add_argument("--top-k", type=int, default=1, help="1: greedy (default); N: sample among the N best")
    gen.add_argument("--rounds", type=int, default=2, help="prefill + decode rounds; the best is reported")
    gen.add_argument("--target", default="native")
    gen.add_argument("--threads", type=int, default=None, help="TVM's thread pool (default: every core)")
    gen.add_argument("--seed", type=int, default=0)
    gen.set_defaults(func=cmd_generate)
    targets = sub.add_parser("targets", help="list the registered targets")
    targets.set_defaults(func=cmd_targets)
    args = parser.parse_args(argv)
    args.shape = dict(getattr(args, "shape", None) or {}) or None
    try:
        return args.func(args)
    except (DynamicShapeError, DataError) as err:
        print(f"tvm-lowprec {args.command}: {err}", file=sys.stderr)
        return 2
    except LowPrecError as err:
        if args.command not in ("quantize", "generate"):
            raise
        print(f"tvm-lowprec {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
