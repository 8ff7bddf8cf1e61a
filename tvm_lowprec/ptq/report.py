"""Accuracy of a quantized module against its FP32 original: per layer and on the final outputs.

For every layer (:mod:`.layers`) the output of the quantized model, as its integer kernels compute it,
is compared with the FP32 model's output of the same layer on the same inputs: SQNR in dB
(``10 log10(sum ref^2 / sum (q - ref)^2)``, over all inputs) and cosine similarity. Errors accumulate
along the network, so a layer's row shows the damage up to and including that layer. When
:func:`~tvm_lowprec.ptq.quantize` ran with ``target_sqnr``, each layer also has its isolated harm
(``alone``: the binding output's SQNR with only that layer quantized, measured on the validation
data by the fallback; one compile per layer, so only then). Each output has its own row, by name; the
lowest is the *binding* output (what ``target_sqnr`` must hold on).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np
import tvm
from tvm import relax

from .calibrate import model_inputs, normalise_sample, tensor_vars, with_outputs
from .layers import prepare


@dataclass
class _Accumulator:
    ref2: float = 0.0
    err2: float = 0.0
    dot: float = 0.0
    q2: float = 0.0

    def add(self, ref: np.ndarray, q: np.ndarray) -> None:
        ref, q = np.asarray(ref, np.float64).reshape(-1), np.asarray(q, np.float64).reshape(-1)
        self.ref2 += float(ref @ ref)
        self.err2 += float((q - ref) @ (q - ref))
        self.dot += float(ref @ q)
        self.q2 += float(q @ q)

    @property
    def sqnr_db(self) -> float:
        if self.err2 == 0.0:
            return float("inf")
        return float(10.0 * np.log10(max(self.ref2, 1e-300) / self.err2))

    @property
    def cosine(self) -> float:
        denom = np.sqrt(self.ref2 * self.q2)
        return float(self.dot / denom) if denom > 0 else 1.0


@dataclass(frozen=True)
class TensorAccuracy:
    name: str
    kind: str  # the layer's operator, or "output"
    quantized: bool
    sqnr_db: float
    cosine: float
    scheme: str = ""  # how the layer was quantized ("W int4 sym g128 GPTQ, A float"); "" for outputs
    # the binding output's SQNR with only this layer quantized (measured by quantize's target_sqnr fallback)
    alone_db: float | None = None


@dataclass
class AccuracyReport:
    layers: list[TensorAccuracy] = field(default_factory=list)
    outputs: list[TensorAccuracy] = field(default_factory=list)
    samples: int = 0
    notes: list[str] = field(default_factory=list)  # what quantize decided for the target (7-bit weights, ...)

    @property
    def output_sqnr_db(self) -> float:
        """The lowest SQNR among the final outputs (each output on its own: what
        :class:`~.config.QuantConfig`'s target_sqnr must hold on)."""
        return min((o.sqnr_db for o in self.outputs), default=float("inf"))

    @property
    def binding_output(self) -> str | None:
        """The name of the output with the lowest SQNR."""
        return min(self.outputs, key=lambda o: o.sqnr_db).name if self.outputs else None

    def to_dict(self) -> dict:
        return {"samples": self.samples, "layers": [asdict(r) for r in self.layers],
                "outputs": [asdict(r) for r in self.outputs], "notes": list(self.notes)}

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def table(self) -> str:
        """A Markdown table, layers in execution order, then the outputs."""
        lines = [(f"Accuracy against FP32 over {self.samples} input(s). SQNR: accumulated up to the tensor; "
                  "alone: the binding output's SQNR with only that layer quantized (measured by quantize's "
                  "target_sqnr fallback; '-' when it did not run)"), "",
                 "| tensor | op | quantized | scheme | SQNR (dB) | alone (dB) | cosine |",
                 "|---|---|---|---|---:|---:|---:|"]
        for r in self.layers + self.outputs:
            alone = "-" if r.alone_db is None else f"{r.alone_db:.2f}"
            lines.append(f"| {r.name} | {r.kind} | {'yes' if r.quantized else 'FP32'} | {r.scheme} | {r.sqnr_db:.2f} "
                         f"| {alone} | {r.cosine:.6f} |")
        if self.outputs:
            lines += ["", f"Binding output (lowest SQNR): {self.binding_output} at {self.output_sqnr_db:.2f} dB"]
        lines += [""] + [f"Note: {n}" for n in self.notes] if self.notes else []
        return "\n".join(lines)

    def plot(self, path) -> None:
        """SQNR per layer as a bar chart (PNG or PDF by ``path``'s suffix); needs matplotlib."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = self.layers + self.outputs
        finite = [r.sqnr_db for r in rows if np.isfinite(r.sqnr_db)]
        top = (max(finite) if finite else 0.0) + 5.0
        fig, ax = plt.subplots(figsize=(max(6.0, 0.4 * len(rows) + 2), 4.5))
        colors = ["tab:orange" if r.kind == "output" else "tab:blue" if r.quantized else "tab:gray" for r in rows]
        bars = ax.bar(range(len(rows)), [r.sqnr_db if np.isfinite(r.sqnr_db) else top for r in rows], color=colors)
        for bar, r in zip(bars, rows):
            if not np.isfinite(r.sqnr_db):
                ax.annotate("exact", (bar.get_x() + bar.get_width() / 2, top), ha="center", va="bottom", fontsize=7)
        alone = [(i, r.alone_db) for i, r in enumerate(rows) if r.alone_db is not None and np.isfinite(r.alone_db)]
        if alone:  # each layer's isolated harm (quantize's target_sqnr fallback measured it)
            ax.scatter([i for i, _ in alone], [v for _, v in alone], marker="_", s=120, color="black", zorder=3,
                       label="binding output, only this layer quantized")
            ax.legend(fontsize=7, loc="lower left")
        labels = [r.name if len(r.name) <= 28 else "…" + r.name[-27:] for r in rows]
        ax.set_xticks(range(len(rows)), labels, rotation=70, ha="right", fontsize=7)
        ax.set_ylabel("SQNR vs FP32 (dB)")
        ax.set_title("Per-layer accuracy (grey: kept in FP32, orange: final outputs)")
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)


def ptq_layers(qmod) -> list[tuple[str, str, str, bool, str]]:
    """(layer name, op, output var name, quantized, scheme) recorded by :func:`~tvm_lowprec.ptq.quantize`
    (modules recorded before the scheme was: scheme "")."""
    attrs = qmod["main"].attrs
    if attrs is None or "lowprec.ptq_layers" not in attrs:
        raise ValueError("the module was not made by tvm_lowprec.ptq.quantize (no lowprec.ptq_layers attribute)")
    rows = [[str(field) for field in row] for row in attrs["lowprec.ptq_layers"]]
    return [(n, k, v, bool(int(q)), rest[0] if rest else "") for n, k, v, q, *rest in rows]


def _observing(mod, var_names: list[str], target):
    import tvm_lowprec

    table = tensor_vars(mod)
    missing = [v for v in var_names if v not in table]
    if missing:
        raise ValueError(f"tensors {missing} not found in the module")
    observed = with_outputs(mod, [table[v] for v in var_names])
    return tvm_lowprec.compile(relax.transform.ConvertToDataflow()(observed), target=target)


def accuracy_report(fp32_mod: tvm.IRModule, quantized_mod: tvm.IRModule, inputs, *, target="native",
                    progress: bool = True) -> AccuracyReport:
    """Compare ``quantized_mod`` (from :func:`~tvm_lowprec.ptq.quantize`) with ``fp32_mod`` on ``inputs``
    (an iterable of samples, as for calibration)."""
    from tqdm.auto import tqdm

    from ..frontend.relax_module import prepare_module
    from .quantize import output_names

    fp32_mod, quantized_mod = prepare_module(fp32_mod), prepare_module(quantized_mod)
    layers = ptq_layers(quantized_mod)
    var_names = [v for _, _, v, _, _ in layers]
    fp32 = _observing(prepare(fp32_mod), var_names, target)
    quant = _observing(relax.transform.ToNonDataflow()(quantized_mod), var_names, target)
    names = model_inputs(fp32_mod)
    acc_layers = [_Accumulator() for _ in layers]
    acc_outputs: list[_Accumulator] = []
    count = 0
    for index, sample in enumerate(tqdm(inputs, desc="accuracy", disable=not progress, leave=False)):
        feed = normalise_sample(sample, names, index)
        ref, got = fp32(feed), quant(feed)
        n_out = len(ref) - len(layers)
        if not acc_outputs:
            acc_outputs = [_Accumulator() for _ in range(n_out)]
        for acc, r, q in zip(acc_outputs, ref[:n_out], got[:n_out]):
            acc.add(r, q)
        for acc, r, q in zip(acc_layers, ref[n_out:], got[n_out:]):
            acc.add(r, q)
        count += 1
    attrs = quantized_mod["main"].attrs
    notes = [str(n) for n in attrs["lowprec.ptq_notes"]] if "lowprec.ptq_notes" in attrs else []
    isolated = {str(n): float(str(v)) for n, v in attrs["lowprec.ptq_isolated"]} if "lowprec.ptq_isolated" in attrs \
        else {}
    report = AccuracyReport(samples=count, notes=notes)
    for (name, kind, _, quantized, scheme), acc in zip(layers, acc_layers):
        report.layers.append(TensorAccuracy(name, kind, quantized, acc.sqnr_db, acc.cosine, scheme, isolated.get(name)))
    out_names = output_names(fp32_mod)
    for i, acc in enumerate(acc_outputs):
        name = out_names[i] if len(out_names) == len(acc_outputs) else f"output {i}"
        report.outputs.append(TensorAccuracy(name, "output", True, acc.sqnr_db, acc.cosine))
    return report
