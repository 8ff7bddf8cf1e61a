"""One zoo model end to end, in-process (:func:`run_model`) or in a process of its own (:func:`run_isolated`).

Stages, recorded as they start (a process that dies leaves the stage it died in): ``build`` (export,
``quant_pre_process``, ``quantize_static``; cached), ``reference`` (ONNX Runtime on the QDQ graph as
written, ``ORT_DISABLE_ALL``, and its sensitivity: ``model_bench.reference_outputs``), ``import``
(``tvm_lowprec.from_onnx``), ``compile`` (``tvm_lowprec.compile(..., target="native")``), ``check``
(``model_bench.check_row``: cosine and max difference against the QDQ graph, in output steps), ``time``
(tvm-lowprec vs ORT INT8 vs ORT FP32 per thread count, interleaved and quiesced:
``tvm_lowprec.bench.timing.measure_interleaved``) and ``profile`` (``Compiled.profile``, the slowest
kernels). A Python exception in a stage is recorded (``error``, ``stage``) and the ORT timings still run
where they can; a crash, abort or timeout is recorded by :func:`run_isolated` from outside.

``python -m zoo.runner --name NAME --config JSON --result PATH`` (cwd ``benchmarks/``) is the child.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parents[1]
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

from tvm_lowprec.bench.report import json_safe  # noqa: E402

from .common import DEFAULT_CACHE, ZooUnavailable, log  # noqa: E402

STAGES = ("build", "reference", "import", "compile", "check", "time", "profile", "done")


@dataclass
class RunConfig:
    """What :func:`run_model` does with a model (JSON-serialisable: it crosses the process boundary).

    ``timing``: ``"default"``, ``"quick"`` (``tvm_lowprec.bench.timing``'s timings) or None (no timing,
    no profile: the tests). ``size`` overrides the input size; ``small`` picks the model's reduced size.
    """

    cache: str = str(DEFAULT_CACHE)
    small: bool = False
    size: int | None = None
    dynamo: bool = True
    fmt: str = "QDQ"
    s8s8: bool = False
    reduce_range: bool = False
    calibration: int = 4
    threads: list[int] = field(default_factory=lambda: [1, 2])
    timing: str | None = "default"
    profile: bool = True
    top: int = 3
    # "ort": tvm-lowprec compiles ORT's quantized file; "tvm_lowprec": it quantizes the FP32 file itself
    # (tvm_lowprec.quantize on the same calibration inputs) and is checked against ORT's FP32 run
    quantizer: str = "ort"


# tvm_lowprec.quantize's acceptance in the zoo: cosine against ORT's FP32 output at least this
PTQ_COSINE_OK = 0.99


# The zoo's acceptance (the issue that built it): cosine against ORT's QDQ graph as written at least
# this, or no further from it than the graph itself moves under a 1e-6 perturbation of the input (its
# measured sensitivity, in quantization steps), or at least as close to it as ONNX Runtime's own optimized
# INT8 run of the same file (``ort_spread``: its fused kernels round differently from the graph as written;
# EfficientNetV2-S's SiLU chains carry those differences to cosine 0.989). model_bench's stricter
# COSINE_OK gate is kept as well.
ZOO_COSINE_OK = 0.999


def zoo_status(strict: str, res: dict) -> str:
    """``"ok"`` where model_bench's gate passes, or the zoo's: cosine >= :data:`ZOO_COSINE_OK`, or at most
    the graph's own sensitivity in steps, or a cosine at least ORT INT8's own (``ort_spread``: ORT with
    its default optimizations against the same graph as written); else ``"mismatch"``. The reason
    goes into ``res["ok_by"]``."""
    cos = res.get("cosine") or 0.0
    steps, sensitivity, spread = res.get("steps"), res.get("sensitivity_steps"), res.get("ort_spread")
    reasons = (("gate", strict == "ok"), ("cosine", cos >= ZOO_COSINE_OK),
               ("sensitivity", steps is not None and sensitivity is not None and steps <= sensitivity + 1e-6),
               ("ort_spread", spread is not None and cos >= spread))
    res["ok_by"] = next((name for name, ok in reasons if ok), None)
    return "ok" if res["ok_by"] else "mismatch"

def _timing(name: str):
    from tvm_lowprec.bench.timing import DEFAULT_TIMING, QUICK_TIMING

    return {"default": DEFAULT_TIMING, "quick": QUICK_TIMING}[name]


class _Recorder:
    """The result dict, written to ``path`` at every stage (what survives a crash)."""

    def __init__(self, result: dict, path: Path | None):
        self.result, self.path = result, path
        self.flush()

    def stage(self, name: str) -> None:
        self.result["stage"] = name
        log(f"[{self.result['model']}] {name}")
        self.flush()

    def flush(self) -> None:
        if self.path is not None:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(json_safe(self.result), indent=1))
            tmp.replace(self.path)


def _fail(rec: _Recorder, err: BaseException) -> None:
    from model_bench import error_text

    rec.result.update(status="error", error=f"{rec.result['stage']}: {error_text(err)}", failed_stage=rec.result["stage"],
                      traceback=traceback.format_exc(limit=12))
    log(f"[{rec.result['model']}] {rec.result['error']}")
    rec.flush()


def run_model(name: str, config: RunConfig | None = None, result_path: Path | None = None) -> dict:
    """Run zoo model ``name`` end to end in this process; the result dict (also written to
    ``result_path`` as each stage starts)."""
    import zoo
    from zoo.build import QuantOptions, build, output_scale

    config = config or RunConfig()
    entry = zoo.REGISTRY[name]
    size = entry.resolve_size(config.size, config.small)
    rec = _Recorder({"model": name, "source": entry.source, "description": entry.description, "tags": list(entry.tags),
                     "size": size,
                     "status": "running", "stage": "build", "error": "", "config": asdict(config)}, result_path)
    res = rec.result
    try:
        stamps: dict = {}
        built = build(entry, Path(config.cache), size=size, dynamo=config.dynamo,
                      options=QuantOptions(config.fmt, config.s8s8, config.calibration, config.reduce_range), timings=stamps)
    except ZooUnavailable as err:
        res.update(status="skipped", error=f"build: {err}")
        rec.flush()
        return res
    except Exception as err:  # noqa: BLE001 - every failure is a row
        _fail(rec, err)
        return res
    res.update({k: round(v, 2) for k, v in stamps.items()})
    res.update(input=", ".join(f"{i.name} {'x'.join(map(str, i.shape))}" for i in built.spec.inputs),
               fp32=str(built.fp32_path), int8=str(built.int8_path), output=built.spec.output,
               nodes_fp32=built.manifest["fp32"]["nodes"], nodes_int8=built.manifest["int8"]["nodes"],
               ops_int8=built.manifest["int8"]["ops"])
    return _run_built(rec, built, config, output_scale(built.int8_path, built.spec.output))


def _run_built(rec: _Recorder, built, config: RunConfig, scale: float | None) -> dict:
    import tvm_lowprec
    from model_bench import check_row, cosine, max_abs_diff, perturbed, reference_outputs
    from models.build import make_feed
    from tvm_lowprec.bench.providers import ort_session

    res = rec.result
    feed = make_feed(built.spec)
    rec.stage("reference")
    try:
        refs = reference_outputs(built, feed)
        noisy = perturbed(feed)
        if noisy is not None and scale:
            qdq = ort_session(built.int8_path, 1, optimize=False)
            moved = max_abs_diff(qdq.run([built.spec.output], noisy)[0], refs.int8_qdq)
            res["sensitivity_steps"] = moved / scale
    except Exception as err:  # noqa: BLE001
        _fail(rec, err)
        return res
    res.update(output_scale=scale, sensitivity_cosine=refs.qdq_sensitivity,
               ort_spread=cosine(refs.int8_fused, refs.int8_qdq))

    compiled = None
    rec.stage("import")
    try:
        if config.quantizer == "tvm_lowprec":  # our own post-training quantization of the FP32 export
            from models.build import calibration_samples

            start = time.perf_counter()
            mod = tvm_lowprec.quantize(tvm_lowprec.from_onnx(str(built.fp32_path)),
                                       calibration_samples(built.spec)[: config.calibration], progress=False)
            res["tvm_quantize_s"] = round(time.perf_counter() - start, 2)
        else:
            mod = tvm_lowprec.from_onnx(str(built.int8_path))
        rec.stage("compile")
        start = time.perf_counter()
        compiled = tvm_lowprec.compile(mod, target="native")
        res["compile_s"] = round(time.perf_counter() - start, 2)
        res["target"] = compiled.spec.name
        res["unscheduled"] = [k.name for k in compiled.kernels() if k.schedule == "none"]  # serial, scalar loops
        rec.stage("check")
        outputs = compiled(feed)
        out = outputs[refs.index] if len(outputs) == refs.count else outputs[0]
        checks = check_row("tvm-lowprec-int8", out, refs)
        res.update(cosine=checks["cos_vs_ort_int8_qdq"], max_abs_diff=checks["max_abs_diff_vs_ort_int8_qdq"],
                   cos_vs_ort_int8_fused=checks["cos_vs_ort_int8"], cos_vs_ort_fp32=checks["cos_vs_ort_fp32"],
                   steps=(checks["max_abs_diff_vs_ort_int8_qdq"] / scale) if scale else None)
        res["status"] = zoo_status(checks["status"], res)
        if config.quantizer == "tvm_lowprec":  # not ORT's graph: judged against the FP32 model
            res["status"] = "ok" if (res.get("cos_vs_ort_fp32") or 0.0) >= PTQ_COSINE_OK else "mismatch"
        if len(outputs) != refs.count:
            res["note"] = f"tvm-lowprec returned {len(outputs)} outputs, ORT {refs.count}"
    except Exception as err:  # noqa: BLE001 - RecursionError, TVM's errors, LowPrecError, ...
        _fail(rec, err)
        compiled = None
    if config.timing:
        rec.stage("time")
        try:
            res["times"] = _time(built, feed, compiled, config)
        except Exception as err:  # noqa: BLE001
            res["time_error"] = f"{type(err).__name__}: {err}"[:400]
        if compiled is not None and config.profile:
            rec.stage("profile")
            res["profile_top"] = _profile(compiled, feed, config)
        if config.profile:
            res["ort_gemm"] = _ort_gemm(built, feed, config, Path(rec.path).parent if rec.path else None)
    if res["status"] == "running":
        res["status"] = "ok"
    res["stage"] = "done" if res["status"] in ("ok", "mismatch") else res.get("failed_stage", res["stage"])
    rec.flush()
    return res


def _time(built, feed: dict, compiled, config: RunConfig) -> dict:
    """Milliseconds per call of each runtime at each thread count: tvm-lowprec (``Compiled.__call__``),
    ORT INT8 (default graph optimizations) and ORT FP32 (``session.run``), all by wall clock, interleaved
    and quiesced (``measure_interleaved(..., quiesce=True)``), each warmed up by one call first."""
    from tvm_lowprec.bench.providers import ort_session
    from tvm_lowprec.bench.timing import measure_interleaved, wall_loop

    timing = _timing(config.timing)
    times = {}
    for threads in config.threads:
        calls = {}
        if compiled is not None:
            compiled.num_threads = threads  # the pool is resized at the next call (Compiled._set_threads)
            calls["tvm-lowprec"] = lambda: compiled(feed)
        int8 = ort_session(built.int8_path, threads)
        fp32 = ort_session(built.fp32_path, threads)
        calls["ort-int8"] = lambda: int8.run(None, feed)
        calls["ort-fp32"] = lambda: fp32.run(None, feed)
        for call in calls.values():
            call()
        measured = measure_interleaved({k: wall_loop(c) for k, c in calls.items()}, timing, quiesce=True)
        times[str(threads)] = {k: {"ms": m.seconds * 1e3, "number": m.number, "repeat": m.repeat}
                               for k, m in measured.items()}
        log(f"  {threads} thr: " + ", ".join(f"{k} {v['ms']:.2f} ms" for k, v in times[str(threads)].items()))
    return times


def _profile(compiled, feed: dict, config: RunConfig) -> list[dict] | dict:
    """The ``config.top`` slowest kernels at one thread, each timed alone (``Compiled.profile(isolated=
    True)``), with the figures model_bench reports (GOPS for GEMMs, % of copy bandwidth for the rest)."""
    from model_bench import _op_summary, error_text
    from tvm_lowprec.bench.report import profile_figures

    compiled.num_threads = 1
    try:
        rows = compiled.profile(feed, repeat=2 if config.timing == "quick" else 5, isolated=True)
    except Exception as err:  # noqa: BLE001
        return {"error": error_text(err)}
    def row(r):
        return {"name": r["name"], "op": _op_summary(r), "intrinsic": r.get("intrinsic"), "ms": r["ms"],
                "share": r["share"], "gops": r.get("gops"), "pct_copy": r.get("pct_copy"), "figures": profile_figures(r)}

    return [row(r) for r in rows[: config.top]] + [
        {**row(r), "over_copy": True} for r in rows[config.top:] if over_copy_cost(r)]


def _ort_gemm(built, feed: dict, config: RunConfig, scratch: Path | None) -> dict:
    """ONNX Runtime's GEMM/conv work at one thread, from its own profiler (``ort_profile.ort_profile``,
    default optimizations, the trace's node times and shapes): GOPS, ms per run, Gop, and the ms of
    GEMM/conv nodes whose operations are not derivable. The zoo's class bar for CNNs is lower where
    ORT already runs this work near the instruction's peak (``checks.class_bar``)."""
    import tempfile

    from ort_profile import gemm_rate, ort_profile

    try:
        with tempfile.TemporaryDirectory(dir=scratch) as tmp:
            prof = ort_profile(built.int8_path, feed, 1, 2, 3 if config.timing == "quick" else 10,
                               Path(tmp) / "ort")
        rate = gemm_rate(prof["rows"], lambda r: r.get("ops"))
    except Exception as err:  # noqa: BLE001 - the profile is a figure, not a stage that fails the model
        return {"error": f"{type(err).__name__}: {err}"[:300]}
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in rate.items()} | {"threads": 1}


# A kernel that is not a GEMM and takes more than this many times what its bytes cost at copy bandwidth
# (below 10% of it), and at least SLOW_MIN_MS (under that, a call's fixed cost is most of it)
COPY_COST_LIMIT = 10.0
SLOW_MIN_MS = 0.02


def over_copy_cost(row: dict) -> bool:
    """Whether a profile row is a kernel slower than :data:`COPY_COST_LIMIT` times its bytes' copy."""
    pct = row.get("pct_copy")
    return pct is not None and pct < 100.0 / COPY_COST_LIMIT and row["ms"] >= SLOW_MIN_MS


# ---------------------------------------------------------------- isolation

def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


def _last_error_line(log_path: Path) -> str:
    """The most telling line of a dead child's log: the last one naming an error, else the last line."""
    try:
        lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    for line in reversed(lines[-200:]):
        if any(word in line for word in ("ERROR", "Error", "error:", "Fatal", "fault", "Abort")):
            return line[:300]
    return lines[-1][:300] if lines else ""


def run_isolated(name: str, config: RunConfig, timeout: float | None, log_path: Path,
                 result_path: Path | None = None) -> dict:
    """:func:`run_model` in a child process: its result, or, where the child crashed, was killed by a
    signal or ran past ``timeout`` seconds, the partial result with ``status`` ``crashed`` or ``timeout``
    and the reason (the stage it was in, the signal, the last error line of ``log_path``)."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    result_path = Path(result_path) if result_path else log_path.with_suffix(".result.json")
    result_path.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(BENCH_DIR), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "zoo.runner", "--name", name, "--config", json.dumps(asdict(config)),
           "--result", str(result_path)]
    start = time.perf_counter()
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cmd, cwd=str(BENCH_DIR), env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the child and whatever it started
            code, timed_out = proc.wait(), True
    wall = time.perf_counter() - start
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError):
        result = {"model": name, "stage": "start", "status": "running", "error": ""}
    result["wall_s"] = round(wall, 1)
    result["log"] = str(log_path)
    stage = result.get("stage", "?")
    if timed_out:
        result.update(status="timeout", error=f"{stage}: timed out after {timeout:g} s")
    elif code < 0:
        last = _last_error_line(log_path)
        result.update(status="crashed", error=f"{stage}: killed by {_signal_name(-code)}" + (f" ({last})" if last else ""))
    elif code != 0 and result.get("status") in ("running", None):
        result.update(status="crashed", error=f"{stage}: exit code {code} ({_last_error_line(log_path)})")
    elif result.get("status") == "running":
        result.update(status="crashed", error=f"{stage}: the child exited without a result")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="run one zoo model (the child of zoo.runner.run_isolated)")
    parser.add_argument("--name", required=True)
    parser.add_argument("--config", required=True, help="RunConfig as JSON")
    parser.add_argument("--result", type=Path, required=True)
    args = parser.parse_args(argv)
    run_model(args.name, RunConfig(**json.loads(args.config)), args.result)
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown (TVM's and ORT's thread pools at exit)


if __name__ == "__main__":
    sys.exit(main())
