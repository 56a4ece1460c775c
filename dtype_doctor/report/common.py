"""What every output format shares: the words a user reads, and how a record becomes a label.

Formatters only arrange these; a sentence or a severity mapping lives here once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from dtype_doctor.fix.outcome import Alternative, FixOutcome
from dtype_doctor.records import (
    SEVERITIES,
    SEVERITY_RANK,
    FixSuggestion,
    LineageStep,
    Report,
    SourceLoc,
    TensorMeta,
    TraceFailure,
)

TOOL_NAME = "dtype-doctor"
# The project's home; SARIF requires the driver to name one.

NO_PROBLEMS = "no dtype or device problems found"
NO_PROBLEMS_BUT_STOPPED = "no findings, but the trace stopped early"
MODEL_BOUNDARY = "<model>"  # how a finding on module "" (the model's own inputs) is shown
UNKNOWN = "—"
NOT_SET = "—"
FAILURE_TITLE = "trace stopped"
FAILURE_NOTE = "ops after this point were not traced; fix it and re-run to see what follows."
CHANGED_ARROW = "→"
CHANGED_MARK = "▸"
BLAMED_MARK = "✗"
FIX_NOT_VERIFIED = "the fix did not make the re-run trace clean"

FAIL_ON = ("error", "warning", "info", "never")

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}
APPLICABILITY_STYLE = {"safe": "green", "unsafe": "yellow", "display-only": "dim"}
FIX_STATUS_MARK = {"applied": "✓", "skipped": "–", "failed": "✗"}
FIX_STATUS_STYLE = {"applied": "green", "skipped": "dim", "failed": "red"}

# Half dtypes warm, fp32 cool, fp64 loud: the colours a reader scans a tree or table by.
_DTYPE_STYLE = {
    "float16": "yellow",
    "bfloat16": "magenta",
    "float32": "cyan",
    "float64": "bold red",
    "bool": "green",
}


@dataclass(frozen=True, slots=True)
class RenderOptions:
    """What a format may be asked for besides the report itself."""

    width: int = 100
    color: bool = False
    # Findings at or above this severity fail (JUnit); mirrors the CLI's --fail-on.
    fail_on: str = "error"
    # The rule catalogue (objects with code, name, summary, …) when the caller has it;
    # formats that describe rules (SARIF) fall back to the finding's own name without it.
    rules: tuple[Any, ...] = ()
    # The --plot picture's path as the output should link it (markdown embeds it), if one was drawn.
    plot: str | None = None


def dtype_style(dtype: str | None) -> str:
    if dtype is None:
        return "dim"
    if dtype in _DTYPE_STYLE:
        return _DTYPE_STYLE[dtype]
    if dtype.startswith(("int", "uint")):
        return "blue"
    return ""


def shape_label(shape: Sequence[int] | None) -> str:
    if shape is None:
        return ""
    return "[" + ",".join(str(d) for d in shape) + "]"


def tensor_name(t: TensorMeta, *, relative_to: str | None = None) -> str:
    """The tensor's name, shortened to the part after `relative_to` when it is that module's own."""
    name = t.name or t.role
    if relative_to and name.startswith(relative_to + "."):
        return name[len(relative_to) + 1 :]
    return name


def tensor_label(t: TensorMeta, *, relative_to: str | None = None) -> str:
    """`name dtype@device[shape]`, e.g. `pixel_values float32@cpu[2,3,32,32]`."""
    return f"{tensor_name(t, relative_to=relative_to)} {t.dtype}@{t.device}{shape_label(t.shape)}"


def module_label(module: str) -> str:
    return module or MODEL_BOUNDARY


def source_label(source: SourceLoc | None) -> str | None:
    return f"{source.file}:{source.line}" if source else None


def fix_label(fix: FixSuggestion) -> str:
    return f"{fix.strategy} ({fix.applicability}): {fix.description}"


def humanize(name: str) -> str:
    """`dtype-mismatch-in-op` → `dtype mismatch in op`."""
    return name.replace("-", " ")


def plural(n: int, word: str) -> str:
    if word == "info" or n == 1:
        return f"{n} {word}"
    return f"{n} {word}s"


def counts_line(summary: Mapping[str, int]) -> str:
    """`2 errors, 1 warning, 0 info`."""
    return ", ".join(plural(int(summary.get(s, 0)), s) for s in SEVERITIES)


def traced_line(summary: Mapping[str, int]) -> str:
    """`57 modules, 812 ops traced`."""
    modules = int(summary.get("modules_traced", 0))
    ops = int(summary.get("ops_traced", 0))
    return f"{plural(modules, 'module')}, {plural(ops, 'op')} traced"


def values_note(report: Report) -> str:
    """` · values not measured (…)` when the trace had no values to measure (DD301-DD303 need them)."""
    trace = report.trace
    if trace is None or trace.values_measured:
        return ""
    return " · values " + trace.values.replace("not measured: ", "not measured (", 1) + ")"


def coverage_line(report: Report) -> str | None:
    """`coverage: forward ✓ loss ✓ backward ✓ scaler ✓ optimizer ✓ · 4 of 4 modules called · 117 ops · 6 stand-ins`."""
    from dtype_doctor.records import coverage_of

    if report.trace is None:
        return None
    c = coverage_of(report.trace)
    marks = " ".join(f"{p} {'✓' if p in c.phases else '✗'}" for p in c.expected)
    parts = [f"coverage: {marks}", f"{c.modules_called} of {c.modules_total} modules called", plural(c.ops, "op")]
    if report.trace.stand_ins:
        parts.append(plural(len(report.trace.stand_ins), "stand-in"))
    if c.stopped and report.trace.failure is None:  # a failure has its own panel
        parts.append(f"stopped {c.stopped}" if c.stopped.startswith("at ") else f"stopped: {c.stopped}")
    return " · ".join(parts)


def precision_line(report: Report) -> str | None:
    """`precision: torch.backends.cuda.matmul.allow_tf32=True (train.py:107) · ...`: the switches the run saw set,
    with their lines, and the checkpointed regions and resume it traced (docs/precision.md); None when nothing was."""
    trace = report.trace
    if trace is None:
        return None
    parts = []
    state = trace.precision
    for s in state.switches if state is not None else ():
        if s.changed:
            where = s.setter.source or s.setter.via
            parts.append(f"{s.name.removeprefix('torch.')}={s.value}" + (f" ({where.file}:{where.line})" if where else ""))
    if trace.recompute is not None:
        parts.append(f"{plural(trace.recompute.regions, 'checkpointed region')}, {trace.recompute.recomputed} recomputed")
    if trace.resume is not None and trace.resume.restored:
        parts.append("resumed: " + ", ".join(f"{r.kind} ({r.source.file}:{r.source.line})" if r.source else r.kind
                                              for r in trace.resume.restored))
    return "precision: " + " · ".join(parts) if parts else None


def requested_line(report: Report) -> str | None:
    """`requested: quantization mxfp4 → bfloat16 (dequantized): MXFP4 quantization requires Triton …`: the
    settings that fell back, one each (docs/report.md, requested against actual); None when all ran as asked."""
    from dtype_doctor.records.requested import requested_of

    if report.trace is None:
        return None
    rows = [r for r in requested_of(report.trace) if r.fallback is not None]
    return "\n".join(f"requested: {r.setting} {r.requested} → {r.actual}: {r.fallback.reason}" for r in rows) or None


def partial_trace(report: Report) -> str | None:
    """When the trace did not reach the step's end: what it covered, for the no-findings line."""
    from dtype_doctor.records import coverage_of

    if report.trace is None:
        return None
    c = coverage_of(report.trace)
    if c.complete:
        return None
    reached = ", ".join(c.phases) or "nothing"
    missing = f"; not reached: {', '.join(c.missing)}" if c.missing else ""
    return f"no findings in what was traced ({reached}{missing})"


def summary_line(summary: Mapping[str, int]) -> str:
    return f"{counts_line(summary)} · {traced_line(summary)}"


def failure_line(failure: TraceFailure) -> str:
    """One sentence: where the trace stopped and what PyTorch said."""
    where = module_label(failure.module)
    if failure.module_type:
        where += f" ({failure.module_type})"
    op = f", op {failure.op}" if failure.op else ""
    return f"{failure.kind} error during the {failure.phase} at {where}{op}: {failure.message}"


def is_failing(severity: str, fail_on: str) -> bool:
    if fail_on == "never":
        return False
    return SEVERITY_RANK[severity] >= SEVERITY_RANK[fail_on]


def yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def target_fields(report: Report) -> list[tuple[str, str]]:
    """The header every human format shows: (label, value) in reading order."""
    t = report.target
    model = t.model
    if report.trace is not None and report.trace.model.class_name:
        model += f" ({report.trace.model.class_name})"
    dataset = t.dataset or NOT_SET
    if t.dataset and t.split:
        dataset += f" · split {t.split}"
    device = t.device + (" (simulated)" if t.simulated else "")
    rows = [
        ("model", model),
        ("dataset", dataset),
        ("device", device),
        *device_map_fields(t),
        ("model dtype", t.model_dtype or NOT_SET),
        ("autocast", t.autocast or "off"),
        ("train", yes_no(t.train)),
    ]
    if t.quantization is not None:
        rows.insert(4, ("quantized", t.quantization.describe()))
    return rows


# Where a loaded dtype came from (records.LoadFacts.origin), in words.
_ORIGIN = {"auto": 'dtype="auto"', "config": "config.json's dtype", "checkpoint": "the checkpoint's dtype",
           "default": "the library's default"}


def load_fields(t: Any) -> list[tuple[str, str]]:
    """The header's long lines after model and dataset, where the report has them: the dtype the
    model loaded in and where it came from; the attention implementation and the SDPA backend CUDA picks."""
    rows = []
    f = t.loaded_dtype
    if f is not None:
        origin = f"asked for: {f.asked}" if f.origin == "argument" and f.asked else _ORIGIN.get(f.origin, f.origin)
        text = f"{f.dtype} · {origin}" + (f" · {f.library}" if f.library else "")
        if f.v4_dtype and f.v4_dtype != f.dtype:
            text += f" (transformers 4 loaded {f.v4_dtype})"
        rows.append(("loaded", text))
    a = t.attention
    if a:
        impl = a.get("implementation") or ("sdpa" if a.get("sdpa") else NOT_SET)
        text = impl + (f" ({a['origin']})" if a.get("origin") else "") + (f", traced as {a['traced_as']}" if a.get("traced_as") else "")
        if a.get("sdpa_backend"):
            text += f" · CUDA picks {a['sdpa_backend']}: {a.get('why') or ''}".rstrip(": ")
        elif a.get("why"):
            text += f" · SDPA backend: {a['why']}"
        rows.append(("attention", text))
    return rows


def component_rows(t: Any) -> list[tuple[str, str, str, str, str]]:
    """A pipeline's components as (name, class, dtype, devices, parameters); [] for one model."""
    return [(c["name"], c["class"], c["dtype"] or NOT_SET, ", ".join(c["devices"]) or NOT_SET, f"{c['parameters']:,}")
            for c in t.components or ()]


def device_map_fields(t: Any) -> list[tuple[str, str]]:
    """The device map a multi-GPU simulation used (weights per device against its memory, what is
    offloaded) and the world a distributed step was traced in."""
    rows: list[tuple[str, str]] = []
    plan = t.devices
    if plan is not None:
        loads = [f"{d.device} {byte_size(d.weights)}" + (f" / {byte_size(d.capacity)}" if d.capacity else "")
                 for d in plan.devices if d.device.startswith("cuda:")]
        rows.append(("device map", f"{plan.strategy} over {plan.gpus} GPUs: " + ", ".join(loads)))
        offloaded = plan.offloaded
        if offloaded:
            by_device: dict[str, list[str]] = {}
            for module, dev in offloaded:
                by_device.setdefault(dev, []).append(module)
            rows.append(("offloaded", "; ".join(f"{len(m)} to {d} ({_span(m)})" for d, m in by_device.items())))
    if t.world is not None:
        w = t.world
        how = " · ".join(x for x in (w.strategy, f"launched by {w.launcher}" if w.launcher else None) if x)
        rows.append(("world", f"rank {w.rank} of {w.size} on the {w.backend} process group" + (f" ({how})" if how else "")))
    return rows


def _span(modules: list[str]) -> str:
    names = [m or "the whole model" for m in modules]
    return names[0] if len(names) == 1 else f"{names[0]} … {names[-1]}"


_ENV_LABEL = {"cuda_available": "cuda"}


def environment_line(environment: Mapping[str, Any]) -> str:
    """`python 3.11.7 · torch 2.13.0 · cuda no`; missing entries left out."""
    parts = []
    for key, value in environment.items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = yes_no(value)
        parts.append(f"{_ENV_LABEL.get(key, key)} {value}")
    return " · ".join(parts)


@dataclass(frozen=True, slots=True)
class LineageRow:
    step: LineageStep
    previous_dtype: str | None  # set only where this stage changed the dtype
    previous_device: str | None  # set only where this stage changed the device
    blamed_by: tuple[str, ...] = ()  # codes of the findings that say the input went wrong here

    @property
    def dtype_changed(self) -> bool:
        return self.previous_dtype is not None

    @property
    def device_changed(self) -> bool:
        return self.previous_device is not None

    def dtype_text(self) -> str:
        """`uint8 → float32` where the stage changed it, else the dtype."""
        dtype = self.step.dtype or UNKNOWN
        if self.previous_dtype is not None:
            return f"{self.previous_dtype} {CHANGED_ARROW} {dtype}"
        return dtype

    def device_text(self) -> str:
        device = self.step.device or ""
        if self.previous_device is not None:
            return f"{self.previous_device} {CHANGED_ARROW} {device}"
        return device

    def detail_text(self) -> str:
        src = source_label(self.step.source)
        text = f"{self.step.detail} ({src})" if src and self.step.detail else (self.step.detail or src or "")
        if self.blamed_by:
            blame = f"{BLAMED_MARK} {', '.join(self.blamed_by)}: went wrong here"
            text = f"{blame}; {text}" if text else blame
        return text


def lineage_rows(steps: Iterable[LineageStep], blamed: Mapping[str, tuple[str, ...]] | None = None) -> list[LineageRow]:
    """Each stage with what it changed, compared with the last stage that knew the value, and
    the codes that blame it (`blamed`: stage → codes, from Report.blamed())."""
    rows = []
    last_dtype: str | None = None
    last_device: str | None = None
    for step in steps:
        prev_dtype = last_dtype if step.dtype and last_dtype and step.dtype != last_dtype else None
        prev_device = last_device if step.device and last_device and step.device != last_device else None
        rows.append(LineageRow(step, prev_dtype, prev_device, (blamed or {}).get(step.stage, ())))
        last_dtype = step.dtype or last_dtype
        last_device = step.device or last_device
    return rows


def rule_for(code: str, rules: Iterable[Any]) -> Any | None:
    for rule in rules:
        if getattr(rule, "code", None) == code:
            return rule
    return None


def rule_description(code: str, name: str, rules: Iterable[Any]) -> str:
    """The rule's one-line summary from the catalogue, else its name in words."""
    rule = rule_for(code, rules)
    summary = getattr(rule, "summary", None) if rule is not None else None
    return summary or humanize(name)


# ----------------------------------------------------------------------------- fix block
# The `fix` block is a plain mapping (docs/report.md, `fix`); these read it tolerantly so a formatter
# shows what is there and skips what is not.


@dataclass(frozen=True, slots=True)
class AppliedStep:
    strategy: str
    status: str
    detail: str

    @property
    def mark(self) -> str:
        return FIX_STATUS_MARK.get(self.status, "?")


def fix_steps(fix: FixOutcome) -> list[AppliedStep]:
    return [AppliedStep(s.strategy, s.status, s.detail) for s in fix.steps]


def fix_outcome(fix: FixOutcome, before: Mapping[str, int]) -> tuple[bool, str, str]:
    """(verified, `fixed and verified: 0 errors, ...`, `before: 1 error, ...`): how a fix ends."""
    verified = fix.verified
    counts = counts_line(fix.after_summary)
    return verified, f"{fix.headline}: {counts}", f"before: {counts_line(before)}"


def fix_fields(fix: FixOutcome) -> list[tuple[str, str]]:
    """(label, value) lines for the fix outcome: verified, after, parity, patch."""
    rows: list[tuple[str, str]] = []
    verified = fix.verified
    not_verified = "the patched script failed past the traced step" if fix.script_failed else FIX_NOT_VERIFIED
    rows.append(("verified", "yes — the re-run trace is clean" if verified else f"no — {not_verified}"))
    rows.append(("after", counts_line(fix.after_summary)))
    parity = fix.parity
    if parity is not None:
        bits = []
        if parity.max_abs_diff is not None:
            bits.append(f"max |diff| {parity.max_abs_diff:.3g}")
        if parity.cosine is not None:
            bits.append(f"cosine {parity.cosine:.8f}")
        ref = f" against {parity.reference}" if parity.reference else ""
        if bits:
            rows.append(("parity", ", ".join(bits) + ref))
        elif parity.error:
            rows.append(("parity", f"not measured: {parity.error}"))
    cost = fix.cost
    if cost is not None:
        rows.append(("weights", f"{byte_size(cost.weight_bytes_before)} → {byte_size(cost.weight_bytes_after)}"))
    tradeoff = fix.tradeoff
    if tradeoff is not None:
        for key, entry in (("autocast", tradeoff.autocast), ("half-model", tradeoff.half_model)):
            if entry is not None:
                rows.append((key, _tradeoff_line(entry, tradeoff.dtype)))
    patch = fix.patch
    if patch is not None and patch.path:
        files = ", ".join(patch.files)
        rows.append(("patch", f"{patch.path}" + (f" ({files})" if files else "")))
        if patch.unwritten:
            rows.append(("left out", "; ".join(patch.unwritten)))
        if patch.check:
            rows.append(("check", patch.check))
        rows += [("note", note) for note in patch.notes]
    rows += fix.rows()
    if fix.detail and not verified:
        rows.append(("why", fix.detail))
    return rows


def byte_size(n: int) -> str:
    """`12.2 KiB`: a byte count as the reports show it."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _tradeoff_line(entry: Alternative, dtype: str | None) -> str:
    """`12.2 KiB weights, max |diff| 0.00027, cosine 1.0000 (float16)` — one alternative measured."""
    if entry.error:
        return f"fails: {entry.error}"
    bits = []
    if entry.weight_bytes is not None:
        bits.append(f"{byte_size(entry.weight_bytes)} weights")
    if entry.max_abs_diff is not None:
        bits.append(f"max |diff| {entry.max_abs_diff:.3g}")
    if entry.cosine is not None:
        bits.append(f"cosine {entry.cosine:.4f}")
    peak = entry.max_activation
    if peak is not None:
        bits.append(f"peak |x| {peak.value:.4g} of {peak.float16_max:.0f}")
    return ", ".join(bits) + (f" ({dtype})" if dtype else "")


def json_default(obj: Any) -> Any:
    """Serialise what a `fix` block may carry besides plain values (records, sets)."""
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    return str(obj)
