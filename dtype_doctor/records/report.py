"""The report: what was scanned (Target) and the Report, with its JSON (the keys docs/report.md lists)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from dtype_doctor.records.devices import DevicePlan, World
from dtype_doctor.records.findings import SEVERITIES, SEVERITY_RANK, Finding, Suppressed
from dtype_doctor.records.model import LoadFacts, Loading, QuantizationInfo
from dtype_doctor.records.trace import Lineage, Trace, coverage_of
from dtype_doctor.records.requested import requested_of

if TYPE_CHECKING:  # pragma: no cover
    from dtype_doctor.fix.outcome import FixOutcome


@dataclass(frozen=True, slots=True)
class Target:
    model: str
    dataset: str | None
    split: str | None
    device: str
    simulated: bool
    model_dtype: str | None
    autocast: str | None
    train: bool
    gpu: str | None = None  # a simulated CUDA target's GPU profile, "a100 (compute capability 8.0)"
    loading: Loading | None = None  # only when the checkpoint lacked or had extra weights
    quantization: QuantizationInfo | None = None  # only for a quantized model
    devices: DevicePlan | None = None  # a simulated multi-GPU device map (--gpus/--device-map)
    world: World | None = None  # a distributed step: rank 0 of N (--gpus with a launcher, FSDP)
    loaded_dtype: LoadFacts | None = None  # docs/report.md `target.loaded_dtype`: the dtype loaded and where it came from
    attention: Mapping[str, Any] | None = None  # docs/report.md `target.attention`: the implementation, the SDPA backend CUDA picks
    components: tuple[Mapping[str, Any], ...] | None = None  # a pipeline's components: class, dtype, devices (docs/report.md `target.components`)

    def to_dict(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"loading": self.loading.to_dict()} if self.loading is not None else {}
        if self.loaded_dtype is not None:
            extra["loaded_dtype"] = self.loaded_dtype.to_dict()
        if self.attention is not None:
            extra["attention"] = dict(self.attention)
        if self.components is not None:
            extra["components"] = [dict(c) for c in self.components]
        if self.quantization is not None:
            extra["quantization"] = self.quantization.to_dict()
        if self.devices is not None:
            extra["devices"] = [d.to_dict() for d in self.devices.devices]
            extra["device_map"] = {"strategy": self.devices.strategy, "gpus": self.devices.gpus, "map": dict(self.devices.device_map)}
        if self.world is not None:
            extra["world"] = self.world.to_dict()
        return {
            "model": self.model,
            "dataset": self.dataset,
            "split": self.split,
            "device": self.device,
            "simulated": self.simulated,
            "model_dtype": self.model_dtype,
            "autocast": self.autocast,
            "train": self.train,
            "gpu": self.gpu,
            **extra,
        }


@dataclass(frozen=True, slots=True)
class Subject:
    """What a report says was traced: the model and dataset as the user named them."""

    model: str | None = None
    dataset: str | None = None
    split: str | None = None


def summarize(findings: tuple[Finding, ...] | list[Finding], trace: Trace | None) -> dict[str, int]:
    counts = {s: 0 for s in SEVERITIES}
    for f in findings:
        counts[f.severity] += 1
    counts["modules_traced"] = len({m.name for m in trace.modules}) if trace else 0
    counts["ops_traced"] = len(trace.ops) if trace else 0
    return counts


@dataclass(frozen=True)
class Report:
    findings: tuple[Finding, ...]
    target: Target
    environment: Mapping[str, Any]
    trace: Trace | None = None
    # The `fix` block (docs/report.md), set by `dtype-doctor fix` (a dtype_doctor.fix.outcome.FixOutcome).
    fix: FixOutcome | None = None
    # Findings held back by a `# dtype-doctor: ignore[...]` comment or a --baseline (report/suppress.py).
    suppressed: tuple[Suppressed, ...] = ()

    @property
    def lineage(self) -> Lineage:
        return self.trace.lineage if self.trace else {}

    @property
    def summary(self) -> dict[str, int]:
        return summarize(self.findings, self.trace)

    def blamed(self) -> dict[str, dict[str, tuple[str, ...]]]:
        """input → lineage stage → codes of the findings whose remedy says the input went wrong there."""
        out: dict[str, dict[str, tuple[str, ...]]] = {}
        for f in self.findings:
            for r in f.remedies:
                if r.stage and r.target in self.lineage:
                    codes = out.setdefault(r.target, {}).get(r.stage, ())
                    if f.code not in codes:
                        out[r.target][r.stage] = (*codes, f.code)
        return out

    def at_or_above(self, severity: str) -> tuple[Finding, ...]:
        if severity == "never":
            return ()
        rank = SEVERITY_RANK[severity]
        return tuple(f for f in self.findings if SEVERITY_RANK[f.severity] >= rank)

    def _lineage_dict(self) -> dict[str, list[dict[str, Any]]]:
        """The lineage (docs/report.md); a step a finding blames carries `blamed_by` (its codes)."""
        blamed = self.blamed()
        out = {}
        for name, steps in self.lineage.items():
            rows = []
            for s in steps:
                row = s.to_dict()
                if codes := blamed.get(name, {}).get(s.stage):
                    row["blamed_by"] = list(codes)
                rows.append(row)
            out[name] = rows
        return out

    def to_dict(self) -> dict[str, Any]:
        from dtype_doctor import __version__

        d: dict[str, Any] = {
            "schema_version": 1,
            "tool": {"name": "dtype-doctor", "version": __version__},
            "target": self.target.to_dict(),
            "environment": dict(self.environment),
            "findings": [f.to_dict() for f in self.findings],
            "lineage": self._lineage_dict(),
            "summary": self.summary,
        }
        if self.trace is not None:
            # Whether DD301-DD303 had values to judge: fake tensors (simulate) hold none.
            d["values"] = {"measured": self.trace.values_measured, "note": self.trace.values}
        if self.trace is not None:
            # What the trace reached of the step, and the values a simulation stood in for (docs/report.md, `coverage`).
            d["coverage"] = coverage_of(self.trace).to_dict()
            d["stand_ins"] = [s.to_dict() for s in self.trace.stand_ins]
        if self.trace is not None and self.trace.precision is not None:
            d["precision"] = self.trace.precision.to_dict()  # the process's precision switches (docs/precision.md)
        if self.trace is not None and (requested := requested_of(self.trace)):
            d["requested"] = [r.to_dict() for r in requested]  # asked against ran, with each fallback (docs/report.md)
        if self.trace is not None and self.trace.recompute is not None:
            d["recompute"] = self.trace.recompute.to_dict()  # activation checkpointing's recompute (docs/precision.md)
        if self.trace is not None and self.trace.resume is not None:
            d["resume"] = self.trace.resume.to_dict()  # load_state_dict calls and the optimizer state they left (docs/precision.md)
        if self.trace is not None and self.trace.checkpoint is not None:
            d["checkpoint"] = self.trace.checkpoint.to_dict()  # scan --checkpoint: the saved dtypes (docs/precision.md)
        if self.trace is not None and self.trace.writes is not None:
            d["writes"] = [w.to_dict() for w in self.trace.writes]  # held back by a simulated run (machine/disk.py)
        if self.trace and self.trace.failure:
            fl = self.trace.failure
            d["trace_failure"] = {
                "kind": fl.kind,
                "message": fl.message,
                "module": fl.module,
                "module_type": fl.module_type,
                "op": fl.op,
                "phase": fl.phase,
            }
        if self.suppressed:
            # Held back by a source comment or a baseline: counted, and listed so nothing is hidden silently.
            d["suppressed"] = {
                "total": len(self.suppressed),
                "comment": sum(s.by == "comment" for s in self.suppressed),
                "baseline": sum(s.by == "baseline" for s in self.suppressed),
                "findings": [s.to_dict() for s in self.suppressed],
            }
        if self.fix is not None:
            # Top-level findings and summary describe the pipeline as scanned, before the fix;
            # fix.before repeats that summary beside fix.after's, so neither is mistaken for the other.
            d["fix"] = {**self.fix.to_dict(), "before": {"summary": self.summary}}
        return d
