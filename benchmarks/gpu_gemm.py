"""Tensor-core GEMMs on a GPU: exactness and throughput of our kernels against torch's.

- INT8 (TVM-scheduled, :mod:`tvm_lowprec.cuda.gemm`) against ``torch._int_mm``;
- FP8 e4m3 (TVM-scheduled, :mod:`tvm_lowprec.cuda.fp8`) against ``torch._scaled_mm`` at the same
  shapes and output dtype (float32), checked against a float64 model within its error bound;
- INT4 (generated CUDA C, :mod:`tvm_lowprec.cuda.int4`): exact, TOPS only, since torch has no
  INT4 x INT4 GEMM to compare with.

    python benchmarks/gpu_gemm.py --out DIR     # on the GPU machine: DIR/results.json, DIR/report.md
    python benchmarks/gpu_gemm.py --selftest    # anywhere: builds every kernel, prints the plan

Every case is wrapped so that one failure never stops the rest; results are rewritten after each
case, so a run cut short still leaves what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SHAPES = [(256, 256, 256), (512, 768, 3072), (4096, 4096, 4096)]  # (M, N, K)
A_DTYPES = ["uint8", "int8"]
FP8_SHAPES = [(512, 768, 3072), (4096, 4096, 4096)]
FP8_DTYPE = "float8_e4m3fn"
INT4_SHAPES = SHAPES
INT4_A_DTYPES = ["int4", "uint4"]
KINDS = ("int8", "fp8", "int4")
T0 = time.time()


def log(*args):
    print(f"[{time.time() - T0:6.1f}s]", *args, flush=True)


def tops(m, n, k, ms):
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12 if ms and ms > 0 else None


def time_cuda(fn, warmup, reps, event_cls, sync):
    """Median milliseconds of ``fn()`` between CUDA events (one event pair per call)."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(reps):
        start, end = event_cls(), event_cls()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(_elapsed(start, end))
    return statistics.median(times)


def _elapsed(start, end):
    if hasattr(start, "elapsed_time"):  # torch.cuda.Event
        return start.elapsed_time(end)
    import cupy

    return cupy.cuda.get_elapsed_time(start, end)


def operands(rng, m, n, k, a_dtype):
    ia, ib = np.iinfo(a_dtype), np.iinfo(np.int8)
    a = rng.integers(ia.min, ia.max, size=(m, k), endpoint=True).astype(a_dtype)
    b = rng.integers(ib.min, ib.max, size=(n, k), endpoint=True).astype(np.int8)
    a[0, :], a[-1, :], b[0, :], b[-1, :] = ia.min, ia.max, ib.min, ib.max
    return a, b


def exact_check(a_dev, b_dev, c_dev, a_host, b_host):
    """Exact comparison. Small shapes: numpy int64. All shapes: float64 on the GPU, which is exact
    here (|A*B| <= 2^15, K <= 2^12: every partial sum < 2^53)."""
    import cupy

    ref = a_dev.astype(cupy.float64) @ b_dev.astype(cupy.float64).T
    ok = bool(cupy.array_equal(c_dev.astype(cupy.float64), ref))
    mism = int(cupy.count_nonzero(c_dev.astype(cupy.float64) != ref))
    if a_host.shape[0] * b_host.shape[0] * a_host.shape[1] <= 2**27:
        ref64 = a_host.astype(np.int64) @ b_host.astype(np.int64).T
        ok_np = bool(np.array_equal(cupy.asnumpy(c_dev).astype(np.int64), ref64))
        return ok and ok_np, {"numpy_int64": ok_np, "gpu_float64": ok, "mismatches": mism}
    return ok, {"gpu_float64": ok, "mismatches": mism}


def run_ours(case, args, arch):
    import cupy

    from tvm_lowprec.cuda.gemm import build_gemm
    from tvm_lowprec.cuda.nvcc import find_tool
    from tvm_lowprec.cuda.run import GemmKernel

    m, n, k, a_dtype = case["m"], case["n"], case["k"], case["a_dtype"]
    t = time.time()
    # the cubin only (PTX is checked by the tests); without nvcc, CuPy compiles the source
    g = build_gemm(m, n, k, a_dtype=a_dtype, arch=arch, compile="cubin" if find_tool("nvcc") else False)
    case.update(build_s=round(time.time() - t, 2), tiles=vars(g.tiles), grid=g.grid, block=g.block)
    kernel = GemmKernel(g)
    case["loaded_from"] = kernel.loaded_from
    a, b = operands(np.random.default_rng(m + n + k), m, n, k, a_dtype)
    a_dev, b_dev = cupy.asarray(a), cupy.asarray(b)
    c_dev = cupy.full((m, n), -7, dtype=np.int32)  # poison: untouched outputs cannot pass
    kernel(a_dev, b_dev, c_dev)
    cupy.cuda.Device().synchronize()
    case["exact"], case["exact_detail"] = exact_check(a_dev, b_dev, c_dev, a, b)
    log(f"  {a_dtype} {m}x{n}x{k}: exact={case['exact']} {case['exact_detail']}")
    ms = time_cuda(lambda: kernel(a_dev, b_dev, c_dev), args.warmup, args.reps, cupy.cuda.Event,
                   cupy.cuda.Device().synchronize)
    case.update(ours_ms=ms, ours_tops=tops(m, n, k, ms))
    log(f"  ours {ms:.4f} ms = {case['ours_tops']:.1f} TOPS")


def run_torch_int_mm(case, args):
    import torch

    m, n, k = case["m"], case["n"], case["k"]
    if m <= 16 or m % 8 or n % 8 or k % 8:
        case["torch_note"] = "torch._int_mm needs M > 16 and multiples of 8"
        return
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, device="cuda")
    b = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda").t()  # [K, N], column-major
    try:
        torch._int_mm(a, b)
    except RuntimeError:  # an older torch may want a row-major mat2
        b = b.contiguous()
        torch._int_mm(a, b)
    ms = time_cuda(lambda: torch._int_mm(a, b), args.warmup, args.reps,
                   lambda: torch.cuda.Event(enable_timing=True), torch.cuda.synchronize)
    case.update(torch_ms=ms, torch_tops=tops(m, n, k, ms), torch_op="torch._int_mm s8 x s8 -> s32")
    log(f"  torch._int_mm {ms:.4f} ms = {case['torch_tops']:.1f} TOPS")


def _nvcc_compile():
    from tvm_lowprec.cuda.nvcc import find_tool

    # the cubin only (PTX is checked by the tests); without nvcc, CuPy compiles the source
    return "cubin" if find_tool("nvcc") else False


def run_fp8(case, args, arch):
    """Ours and torch._scaled_mm on the same e4m3 operands, both writing float32 C."""
    import cupy
    import torch

    from tvm_lowprec.cuda.fp8 import build_fp8_gemm
    from tvm_lowprec.cuda.mma import sm_number
    from tvm_lowprec.cuda.run import GemmKernel

    m, n, k = case["m"], case["n"], case["k"]
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = (torch.randn(m, k, device="cuda", generator=gen) * 2).to(torch.float8_e4m3fn)
    bt = (torch.randn(n, k, device="cuda", generator=gen) * 2).to(torch.float8_e4m3fn)  # [N, K] row-major
    b = bt.t()  # [K, N] column-major, as _scaled_mm wants
    one = torch.tensor(1.0, device="cuda")
    timing = (args.warmup, args.reps, lambda: torch.cuda.Event(enable_timing=True), torch.cuda.synchronize)

    out_dtype = torch.float32
    try:
        torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=out_dtype)
    except RuntimeError:  # a torch without float32 output: bf16
        out_dtype = torch.bfloat16
    fn = lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=out_dtype)
    fn()
    ms = time_cuda(fn, *timing)
    case.update(fp8_ms=ms, fp8_tops=tops(m, n, k, ms), torch_out=str(out_dtype))
    log(f"  torch._scaled_mm e4m3 {m}x{n}x{k} -> {out_dtype}: {ms:.4f} ms = {case['fp8_tops']:.1f} TOPS")

    if sm_number(arch) < 89:
        case["ours_note"] = f"{arch} has no FP8 mma.sync"
        return
    t = time.time()
    g = build_fp8_gemm(m, n, k, FP8_DTYPE, arch, compile=_nvcc_compile())
    case.update(build_s=round(time.time() - t, 2), tiles=vars(g.tiles), grid=g.grid, block=g.block)
    kernel = GemmKernel(g)
    case["loaded_from"] = kernel.loaded_from
    a_dev, b_dev = cupy.asarray(a.view(torch.uint8)), cupy.asarray(bt.view(torch.uint8))
    c_dev = cupy.full((m, n), float("nan"), dtype=cupy.float32)  # poison
    kernel(a_dev, b_dev, c_dev)
    cupy.cuda.Device().synchronize()
    # float64 model: exact products, the sum as exact as float64; bound as in tvm_lowprec.cuda.fp8
    a64, b64 = a.to(torch.float32).double(), bt.to(torch.float32).double()
    ref = a64 @ b64.T
    bound = (a64.abs() @ b64.abs().T) * (k * 2.0**-24 + (k // 32) * 2.0**-13)
    err = (torch.as_tensor(c_dev, device="cuda").double() - ref).abs()
    within = bool(torch.all(err <= bound).item()) and bool(torch.isfinite(err).all().item())
    case.update(within_bound=within, max_err_over_bound=float((err / bound.clamp_min(1e-30)).max().item()))
    log(f"  ours fp8: within bound={within} (max err/bound {case['max_err_over_bound']:.3g})")
    ms = time_cuda(lambda: kernel(a_dev, b_dev, c_dev), args.warmup, args.reps, cupy.cuda.Event,
                   cupy.cuda.Device().synchronize)
    case.update(ours_ms=ms, ours_tops=tops(m, n, k, ms))
    log(f"  ours fp8 {ms:.4f} ms = {case['ours_tops']:.1f} TOPS ({case['ours_tops'] / case['fp8_tops']:.2f}x torch)")


def run_int4(case, args, arch):
    """Ours only (torch has no INT4 x INT4 GEMM): exact against float64 on the GPU (|a*b| <= 120,
    K <= 2^12: every partial sum < 2^53) and numpy int64 for small shapes."""
    import cupy

    from tvm_lowprec.cuda.int4 import build_int4_gemm, pack_int4
    from tvm_lowprec.cuda.run import GemmKernel

    m, n, k, a_dtype = case["m"], case["n"], case["k"], case["a_dtype"]
    t = time.time()
    g = build_int4_gemm(m, n, k, a_dtype, arch, compile=_nvcc_compile())
    case.update(build_s=round(time.time() - t, 2), tiles=vars(g.tiles), grid=g.grid, block=g.block)
    kernel = GemmKernel(g)
    case["loaded_from"] = kernel.loaded_from
    rng = np.random.default_rng(m + n + k)
    lo, hi = (-8, 7) if a_dtype == "int4" else (0, 15)
    a = rng.integers(lo, hi, size=(m, k), endpoint=True, dtype=np.int8 if lo < 0 else np.uint8)
    b = rng.integers(-8, 7, size=(n, k), endpoint=True, dtype=np.int8)
    a[0, :], a[-1, :], b[0, :], b[-1, :] = lo, hi, -8, 7
    a_dev, b_dev = cupy.asarray(pack_int4(a, a_dtype)), cupy.asarray(pack_int4(b, "int4"))
    c_dev = cupy.full((m, n), -7, dtype=np.int32)
    kernel(a_dev, b_dev, c_dev)
    cupy.cuda.Device().synchronize()
    ref = cupy.asarray(a).astype(cupy.float64) @ cupy.asarray(b).astype(cupy.float64).T
    ok = bool(cupy.array_equal(c_dev.astype(cupy.float64), ref))
    detail = {"gpu_float64": ok, "mismatches": int(cupy.count_nonzero(c_dev.astype(cupy.float64) != ref))}
    if m * n * k <= 2**27:
        ok_np = bool(np.array_equal(cupy.asnumpy(c_dev).astype(np.int64), a.astype(np.int64) @ b.astype(np.int64).T))
        detail["numpy_int64"] = ok_np
        ok = ok and ok_np
    case["exact"], case["exact_detail"] = ok, detail
    log(f"  {a_dtype} {m}x{n}x{k}: exact={ok} {detail}")
    ms = time_cuda(lambda: kernel(a_dev, b_dev, c_dev), args.warmup, args.reps, cupy.cuda.Event,
                   cupy.cuda.Device().synchronize)
    case.update(ours_ms=ms, ours_tops=tops(m, n, k, ms))
    log(f"  ours int4 {ms:.4f} ms = {case['ours_tops']:.1f} TOPS")


def environment():
    env = {"python": platform.python_version(), "numpy": np.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    for mod in ("tvm", "cupy", "torch"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception as err:  # noqa: BLE001
            env[mod] = f"unavailable ({type(err).__name__})"
    try:
        from tvm_lowprec.cuda.run import cuda_device_available

        env["device"] = cuda_device_available()[1]
    except Exception as err:  # noqa: BLE001
        env["device"] = f"unknown ({err})"
    return env


def _fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def _note(c, *keys):
    for key in keys:
        if c.get(key):
            return str(c[key]).splitlines()[0][:120]
    return ""


def write_outputs(out, env, cases, fp8, int4=()):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"environment": env, "cases": cases, "fp8_peer": fp8, "int4": list(int4)}, f, indent=1,
                  default=str)
    lines = ["# Tensor-core GEMMs: our mma kernels vs torch", ""]
    lines += [f"- {k}: {v}" for k, v in env.items()]
    lines += ["", "C[M,N] = A[M,K] x B[N,K]^T. TOPS = 2MNK / median time (CUDA events).", "",
              "## INT8: TVM-generated mma kernel vs torch._int_mm", "",
              "| shape MxNxK | A x B | ours TOPS | torch._int_mm TOPS | ours/torch | exact | note |",
              "|---|---|---|---|---|---|---|"]
    for c in cases:
        ratio = c["ours_tops"] / c["torch_tops"] if c.get("ours_tops") and c.get("torch_tops") else None
        exact = {True: "yes", False: "**NO**"}.get(c.get("exact"), "not run")
        note = c.get("error", c.get("torch_note", "")).splitlines()[0][:120] if c.get("error") or c.get("torch_note") else ""
        lines.append(f"| {c['m']}x{c['n']}x{c['k']} | {c['a_dtype']} x int8 | {_fmt(c.get('ours_tops'))} | "
                     f"{_fmt(c.get('torch_tops'))} | {_fmt(ratio, '.2f')} | {exact} | {note} |")
    if fp8:
        lines += ["", "## FP8 e4m3 x e4m3 -> float32: ours (TVM-scheduled mma.sync m16n8k32) vs torch._scaled_mm", "",
                  ("Same operands, float32 C (torch's out dtype in `torch out`). `within bound`: |C - float64 model| "
                   "<= sum|a*b| * (K 2^-24 + K/32 2^-13) everywhere. On sm_90 mma.sync FP8 has no native SASS: ptxas "
                   "converts to f16 and runs HMMA (FP8 is native there only in wgmma, which torch uses)."), "",
                  "| shape MxNxK | ours TOPS | torch._scaled_mm TOPS | ours/torch | within bound | torch out | note |",
                  "|---|---|---|---|---|---|---|"]
        for c in fp8:
            ratio = c["ours_tops"] / c["fp8_tops"] if c.get("ours_tops") and c.get("fp8_tops") else None
            ok = {True: "yes", False: "**NO**"}.get(c.get("within_bound"), "not run")
            lines.append(f"| {c['m']}x{c['n']}x{c['k']} | {_fmt(c.get('ours_tops'))} | {_fmt(c.get('fp8_tops'))} | "
                         f"{_fmt(ratio, '.2f')} | {ok} | {c.get('torch_out', '-')} | {_note(c, 'error', 'ours_note')} |")
    if int4:
        lines += ["", "## INT4: generated mma.sync m16n8k64 kernel (no torch peer: torch has no INT4 x INT4 GEMM)", "",
                  ("A int4/uint4 x B int4 -> int32, packed two per byte. On sm_90 the 4-bit mma has no native SASS: "
                   "ptxas emulates it with 8-bit IMMA (Hopper has no 4-bit tensor cores); sm_80, sm_86 and "
                   "sm_89 run it natively (IMMA.16864)."), "",
                  "| shape MxNxK | A x B | ours TOPS | exact | note |", "|---|---|---|---|---|"]
        for c in int4:
            exact = {True: "yes", False: "**NO**"}.get(c.get("exact"), "not run")
            lines.append(f"| {c['m']}x{c['n']}x{c['k']} | {c['a_dtype']} x int4 | {_fmt(c.get('ours_tops'))} | {exact} | "
                         f"{_note(c, 'error')} |")
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def selftest(out=None):
    """No GPU: build every kernel for sm_90, print what the GPU run would do, write an empty report
    (to ``out``, else a temporary folder) to check the writer."""
    from tvm_lowprec.cuda.gemm import build_gemm
    from tvm_lowprec.cuda.nvcc import ptx_mma_instructions

    failures = 0
    for (m, n, k) in SHAPES:
        for a_dtype in A_DTYPES:
            try:
                g = build_gemm(m, n, k, a_dtype=a_dtype, arch="sm_90")
                log(f"would run {a_dtype} {m}x{n}x{k}: {g.kernel_name}{tuple(p.name for p in g.params)} "
                    f"grid={g.grid} block={g.block} tiles={g.tiles} cubin={len(g.cubin)} B "
                    f"ptx={ptx_mma_instructions(g.ptx)}")
            except Exception:  # noqa: BLE001
                failures += 1
                log(f"FAILED {a_dtype} {m}x{n}x{k}:\n{traceback.format_exc()}")
    log("then torch._int_mm at each shape")
    from tvm_lowprec.cuda.fp8 import build_fp8_gemm
    from tvm_lowprec.cuda.int4 import build_int4_gemm

    for (m, n, k) in FP8_SHAPES:
        try:
            g = build_fp8_gemm(m, n, k, FP8_DTYPE, arch="sm_90")
            log(f"would run {FP8_DTYPE} {m}x{n}x{k}: {g.kernel_name}{tuple(p.name for p in g.params)} "
                f"grid={g.grid} block={g.block} tiles={g.tiles} cubin={len(g.cubin)} B "
                f"ptx={ptx_mma_instructions(g.ptx)}, then torch._scaled_mm at the same shape")
        except Exception:  # noqa: BLE001
            failures += 1
            log(f"FAILED fp8 {m}x{n}x{k}:\n{traceback.format_exc()}")
    for (m, n, k) in INT4_SHAPES:
        for a_dtype in INT4_A_DTYPES:
            try:
                g = build_int4_gemm(m, n, k, a_dtype, arch="sm_90")
                log(f"would run {a_dtype} {m}x{n}x{k}: {g.kernel_name}{tuple(p.name for p in g.params)} "
                    f"grid={g.grid} block={g.block} tiles={g.tiles.block_m}x{g.tiles.block_n}x{g.tiles.block_k} "
                    f"cubin={len(g.cubin)} B ptx={ptx_mma_instructions(g.ptx)} (no torch peer)")
            except Exception:  # noqa: BLE001
                failures += 1
                log(f"FAILED {a_dtype} {m}x{n}x{k}:\n{traceback.format_exc()}")
    log(f"environment: {environment()}")
    import tempfile

    out = out or tempfile.mkdtemp(prefix="gpu_gemm_selftest_")
    write_outputs(out, environment(), [{"m": 1, "n": 1, "k": 1, "a_dtype": "int8", "error": "selftest"}],
                  [{"m": 1, "n": 1, "k": 1, "error": "selftest"}], [{"m": 1, "n": 1, "k": 1, "a_dtype": "int4",
                                                                     "error": "selftest"}])
    log(f"report writer checked: {out}/report.md")
    return failures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="output folder (default gpu_gemm_out)")
    parser.add_argument("--selftest", action="store_true")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--max-seconds", type=float, default=55.0, help="skip remaining work after this")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"which GEMMs, of {','.join(KINDS)}")
    args = parser.parse_args(argv)
    if args.selftest:
        return 1 if selftest(args.out) else 0
    args.out = args.out or "gpu_gemm_out"

    env = environment()
    log(f"environment: {env}")
    from tvm_lowprec.cuda.run import device_arch

    try:
        arch = device_arch()
    except Exception as err:  # noqa: BLE001
        arch = "sm_90"
        log(f"cannot read the device arch ({err}); assuming {arch}")
    kinds = set(args.kinds.split(","))
    if kinds - set(KINDS):
        parser.error(f"unknown kinds {sorted(kinds - set(KINDS))}; choose from {KINDS}")
    cases, fp8, int4 = [], [], []
    for (m, n, k) in SHAPES if "int8" in kinds else ():
        for a_dtype in A_DTYPES:
            case = {"m": m, "n": n, "k": k, "a_dtype": a_dtype}
            cases.append(case)
            if time.time() - T0 > args.max_seconds:
                case["error"] = "skipped: time budget spent"
                continue
            log(f"case {a_dtype} {m}x{n}x{k}")
            for step in (lambda case=case: run_ours(case, args, arch), lambda case=case: run_torch_int_mm(case, args)):
                try:
                    step()
                except Exception as err:  # noqa: BLE001
                    case.setdefault("error", f"{type(err).__name__}: {err}")
                    case.setdefault("tracebacks", []).append(traceback.format_exc())
                    log(f"  FAILED: {type(err).__name__}: {err}")
            write_outputs(args.out, env, cases, fp8, int4)
    def guarded(case, label, run):
        """One case; a failure (or the time budget spent) is recorded in it, never raised."""
        try:
            if time.time() - T0 > args.max_seconds:
                raise RuntimeError("skipped: time budget spent")
            log(f"case {label}")
            run(case, args, arch)
        except Exception as err:  # noqa: BLE001
            case["error"] = f"{type(err).__name__}: {err}"
            case.setdefault("tracebacks", []).append(traceback.format_exc())
            log(f"  {label} FAILED: {case['error']}")
        write_outputs(args.out, env, cases, fp8, int4)

    for (m, n, k) in FP8_SHAPES if "fp8" in kinds else ():
        fp8.append({"m": m, "n": n, "k": k, "dtype": FP8_DTYPE})
        guarded(fp8[-1], f"fp8 {m}x{n}x{k}", run_fp8)
    for (m, n, k) in INT4_SHAPES if "int4" in kinds else ():
        for a_dtype in INT4_A_DTYPES:
            int4.append({"m": m, "n": n, "k": k, "a_dtype": a_dtype})
            guarded(int4[-1], f"{a_dtype} {m}x{n}x{k}", run_int4)
    log(f"wrote {args.out}/results.json and report.md")
    bad = [c for c in cases + int4 if c.get("exact") is False] + [c for c in fp8 if c.get("within_bound") is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
