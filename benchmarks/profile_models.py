"""Per-kernel profiles of the reference models: the before/after table a kernel or pass change reports.

    python benchmarks/profile_models.py --out DIR [--models detector,cnn] [--rounds 3] [--peak 462]
    python benchmarks/profile_models.py --compare BEFORE_DIR AFTER_DIR     # the two side by side

Each reference model (benchmarks/models/build.py's, from its cache) is compiled for ``native`` at one
thread; every kernel is timed alone (``Compiled.profile(feed, isolated=True)``), best of ``--rounds``.
Writes ``DIR/profiles.json`` (every kernel's row) and ``DIR/outputs-<model>.npz`` (the model's outputs
on the benchmark feed, to check two revisions give the same numbers), and prints the top kernels of
each model: GEMMs (``qgemm``, ``qdepthwise``) in GOPS and % of the instruction's single-thread peak
(``--peak``: ``benchmarks/results/<host>/peak.txt``), the others in GB/s and % of copy bandwidth.

To compare two revisions in one session, run it twice with the older library first on the path:
``git worktree add /tmp/before REV && PYTHONPATH=/tmp/before python benchmarks/profile_models.py --out A``.
Only APIs that have long existed are used (``compile``, ``Compiled.profile``, the models' cache).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.build import MODELS, ensure_model, make_feed, parse_models  # noqa: E402

GEMM_OPS = ("qgemm", "qdepthwise")


def profile_model(name: str, rounds: int) -> tuple[list[dict], list[np.ndarray]]:
    """Every kernel's row (best ``ms`` of ``rounds`` isolated profiles, one thread) and the outputs."""
    import tvm_lowprec

    spec = MODELS[name]
    built = ensure_model(spec)
    compiled = tvm_lowprec.compile(tvm_lowprec.from_onnx(str(built.int8_path)), target="native", num_threads=1)
    feed = make_feed(spec)
    outputs = [np.asarray(o) for o in compiled(feed)]
    best: dict = {}
    for _ in range(rounds):
        for row in compiled.profile(feed, isolated=True):
            if row["name"] not in best or row["ms"] < best[row["name"]]["ms"]:
                best[row["name"]] = row
    return sorted(best.values(), key=lambda r: -r["ms"]), outputs


def rate(row: dict, peak: float) -> str:
    if row.get("op") in GEMM_OPS and row.get("gops") is not None:
        return f"{row['gops']:.0f} GOPS ({100 * row['gops'] / peak:.0f}% peak)"
    if row.get("gbs") is not None:
        pct = row.get("pct_copy")
        return f"{row['gbs']:.1f} GB/s" + (f" ({pct:.0f}% copy)" if pct is not None else "")
    return ""


def summary(rows: list[dict]) -> dict:
    total = sum(r["ms"] for r in rows)  # a row's ms is already its calls' sum per run (Compiled.profile)
    other = [r for r in rows if r.get("op") not in GEMM_OPS]
    non_gemm = sum(r["ms"] for r in other)
    slow = sum(1 for r in other if r.get("pct_copy") is not None and r["pct_copy"] < 40)
    return {"kernels_ms": total, "non_gemm_ms": non_gemm, "non_gemm_share": non_gemm / total if total else 0.0,
            "non_gemm_below_40pct_copy": slow, "kernels": len(rows)}


def table(name: str, rows: list[dict], peak: float, top: int) -> str:
    s = summary(rows)
    lines = [f"kernels {s['kernels_ms']:.3f} ms ({s['kernels']}), non-GEMM {s['non_gemm_ms']:.3f} ms "
             f"({100 * s['non_gemm_share']:.1f}%), {s['non_gemm_below_40pct_copy']} non-GEMM kernels below 40% of copy",
             "", "| # | kernel | calls | ms | rate |", "|---:|---|---:|---:|---|"]
    for i, r in enumerate(rows[:top], 1):
        lines.append(f"| {i} | `{r['name']}` | {r.get('calls', 1)} | {r['ms']:.4f} | {rate(r, peak)} |")
    return "\n".join(lines)


def compare(before: Path, after: Path, peak: float, top: int) -> str:
    """Markdown: for each model in both runs, the summaries and top kernels before and after, and
    whether the outputs on the benchmark feed are bit-identical."""
    runs = [json.loads((d / "profiles.json").read_text())["models"] for d in (before, after)]
    lines = []
    for name in [m for m in runs[0] if m in runs[1]]:
        same = _same_outputs(before / f"outputs-{name}.npz", after / f"outputs-{name}.npz")
        lines += [f"## {name}", "", f"outputs on the benchmark feed: {'bit-identical' if same else 'DIFFERENT'}", ""]
        for label, run in zip(("before", "after"), runs):
            lines += [f"**{label}**: " + table(name, run[name]["rows"], peak, top), ""]
    return "\n".join(lines)


def _same_outputs(a: Path, b: Path) -> bool:
    with np.load(a) as x, np.load(b) as y:
        return x.files == y.files and all(np.array_equal(x[k], y[k]) for k in x.files)


def _jsonable(row: dict) -> dict:
    return {k: v for k, v in row.items() if isinstance(v, (str, int, float, type(None)))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=parse_models, default=list(MODELS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peak", type=float, default=462.0, help="the GEMM instruction's GOPS at one thread")
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--compare", type=Path, nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args(argv)
    if args.compare:
        print(compare(*args.compare, args.peak, args.top))
        return 0
    if args.out is None:
        parser.error("--out is required (or --compare BEFORE AFTER)")
    import tvm_lowprec

    args.out.mkdir(parents=True, exist_ok=True)
    result = {"library": str(Path(tvm_lowprec.__file__).parent), "models": {}}
    for name in args.models:
        rows, outputs = profile_model(name, args.rounds)
        np.savez(args.out / f"outputs-{name}.npz", *outputs)
        result["models"][name] = {"summary": summary(rows), "rows": [_jsonable(r) for r in rows]}
        print(f"## {name}\n\n{table(name, rows, args.peak, args.top)}\n", flush=True)
    (args.out / "profiles.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
