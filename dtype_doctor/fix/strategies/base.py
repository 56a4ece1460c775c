"""What a fix strategy is: one class that owns everything about one fix.

A strategy has a name (the `--strategy` value, the `Remedy.strategy` a rule names, and the
`Change.kind` of what it plans), an applicability (safe | unsafe), a one-line summary (the
`--strategy` help and the docs), the text a rule's finding suggests (`suggestion`), how a change
reads (`describe`), `plan`/`apply` on the model and batch, `edits(change, site)` for the user's
files (the codemods to try in order) and its part of the generated fix module: the parameters
its changes give (`module_part`), the text (`fix_module`, a `ModulePart`) and its fields
(`module_fields`). NewFixModule only assembles the parts.

A strategy never edits the pipeline it is given: it returns a new one (sharing what it did
not change), so rolling back a fix is dropping the new pipeline.

This module imports no torch (the CLI's help is built from the table): the strategies import
it where they plan and apply.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Iterable, Mapping, Sequence

from dtype_doctor.records.errors import is_out_of_memory
from dtype_doctor.fix.outcome import JSON_KINDS, Change, Step
from dtype_doctor.records import Finding, Remedy, Report, SourceLoc
from dtype_doctor.trace.request import TraceRequest
from dtype_doctor.rules.words import listed  # noqa: F401 - the strategies say their lists with it

if TYPE_CHECKING:
    import torch

    from dtype_doctor.fix import codemods as cm
    from dtype_doctor.fix.patches import UserCode

SAFE, UNSAFE = "safe", "unsafe"


@dataclass
class Pipeline:
    """What a trace runs: the working copy a fix changes (model, batch, and how it is traced)."""

    model: "torch.nn.Module"
    inputs: dict[str, Any]
    request: TraceRequest = field(default_factory=TraceRequest)

    @property
    def autocast(self) -> str | None:
        return self.request.autocast

    @property
    def simulate(self) -> bool:
        return self.request.simulate

    def with_(self, **changes: Any) -> "Pipeline":
        return replace(self, **changes)


@dataclass(frozen=True)
class ModulePart:
    """A strategy's part of the generated ``dtype_doctor_fix.py``, which NewFixModule assembles:
    its function, where `apply_fix` calls it, the docstring's paragraphs, and its code."""

    function: str  # the function's name in the module
    # How apply_fix uses it: "model" converts the model in place, "batch" returns the batch,
    # "context" is the context the forward runs in (apply_fix does not call it).
    role: str
    order: int  # where apply_fix calls it among several parts: the model first, then the batch
    why: str  # "Why this fix", a paragraph
    usage: str  # "How to use it", when it is the module's only part
    # The code: a str.format template over module_fields(params) ({{ }} for a literal brace).
    source: str
    call: str = ""  # how apply_fix calls it; default "FUNCTION(model, batch)"

    @property
    def call_text(self) -> str:
        return self.call or f"{self.function}(model, batch)"


def identifier(key: str) -> str:
    """A batch key the module can name in code; Skip when it is not an identifier."""
    import re

    if not re.fullmatch(r"[A-Za-z_]\w*", key):
        raise Skip(f"batch keys must be identifiers: {key!r}")
    return key


def set_literal(keys: "Iterable[str]") -> str:
    """A Python set literal of `keys`, sorted, so the module text is the same on every run."""
    return "{" + ", ".join(f'"{k}"' for k in sorted(set(keys))) + "}"


def half_dtype(params: Mapping[str, Any], what: str) -> str:
    """params["dtype"] (float16 when absent), which must be a half dtype; Skip otherwise."""
    from dtype_doctor.records import HALF
    from dtype_doctor.source.analysis import normalize_dtype

    dtype = normalize_dtype(params.get("dtype") or "float16")
    if dtype not in HALF:
        raise Skip(f"{what} float16 or bfloat16, not {dtype}")
    return dtype


class Skip(Exception):
    """Raised inside plan() to say the strategy does not apply, with the reason."""


@dataclass(frozen=True)
class Context:
    fail_on: str = "error"
    unsafe: bool = False  # --unsafe-fixes, or the strategy asked for by name
    force: bool = False  # apply half-model despite overflow evidence
    overflow: dict[str, float] | None = None  # module → max |value| in the fp32 reference
    requested: str | None = None  # the strategy asked for by name (None under auto)


@dataclass(frozen=True)
class Site:
    """Where a change can land in the user's code.

    `scan --script`/`fix MODEL DATA` (`run` False): the --preprocess function (`code`) and the
    --script pipeline. `fix --run` (`run` True): the script run, with the forward call's file and
    line (`call`, `call_line`), positional inputs and the model conversion the run saw.
    """

    device_type: str = "cpu"
    model_dtype: str | None = None
    script: Path | None = None
    run: bool = False
    code: "UserCode | None" = None  # the scanned pipeline's preprocess function
    call: Path | None = None  # fix --run: the file holding the model call
    call_line: int | None = None
    model_name: str | None = None  # fix --run: the name the call's line calls the model by (`encoder`, `vae`)
    positions: Mapping[str, int] = field(default_factory=dict)  # input → position in the call
    step_inputs: frozenset[str] = frozenset()  # fix --run: the inputs the model call took
    converted: bool = False  # fix --run: the script converted its model's dtype
    conversion: SourceLoc | None = None  # fix --run: the line of its last conversion, when known
    # fix --run: input (or loss target) name → the last user line that handled it (run.lineage.Handled)
    handled: Mapping[str, Any] = field(default_factory=dict)
    bf16: bool | None = None  # fix --run: whether the target GPU runs bfloat16 natively (None: no GPU)
    model_class: str | None = None  # fix --run: the class of the model the step called ("Net"), to find where it is built

    @property
    def user_files(self) -> list[Path]:
        """The files of the user's code that set up the model: the script, then the model call's file."""
        return [f for f in dict.fromkeys((self.script, self.call)) if f is not None]

    @property
    def conversion_file(self) -> Path | None:
        """Where the model's dtype is set: the converting line's file, else the script."""
        return resolve(self.conversion) if self.converted else self.script

    def retarget_conversion(self, c: Change) -> list["cm.Attempt"]:
        """fix --run, a script that builds its model itself: the conversion on the line that
        made it half, retargeted to `c.to`."""
        from dtype_doctor.fix.codemods.base import Attempt
        from dtype_doctor.fix.codemods.casts import RetargetCast

        where = self.conversion_file
        if not self.run or where is None or self.conversion is None:
            return []
        function = enclosing_function(where, self.conversion.line)
        return [Attempt(where, RetargetCast(function, c.to, lines=[self.conversion.line]))]


def said(r: Remedy) -> str:
    """A remedy's target in words: a model input by its name, a tensor made in forward
    ("created:OP@MODULE") by its op and module, a weight or buffer by its name; an unnamed one
    as the input (or, made in model code, the tensor)."""
    target = r.target
    if target.startswith("created:"):
        factory, module = factory_of(target)
        if factory[:1].isupper() and module:  # a model's output, under run with several models
            return f"{module}'s output ({factory})"
        if r.source is not None:
            return f"torch.{factory} at {r.source.file}:{r.source.line}"
        return f"the tensor torch.{factory} makes in {module}" if module else f"the tensor torch.{factory} makes in the model's forward"
    if target.startswith("attribute:"):
        at = f" at {r.source.file}:{r.source.line}" if r.source is not None else ""
        return f"the tensor attribute {target.removeprefix('attribute:')}{at}"
    for prefix, kind in (("param:", "weight"), ("buffer:", "buffer")):
        if target.startswith(prefix):
            return f"the {kind} {target.removeprefix(prefix)}"
    return target or ("the tensor" if made_in_model(r) else "the input")


# aten's name for what a torch factory makes, where it is not the factory's own name.
_ATEN_FACTORY = {"lift_fresh": "tensor"}


def factory_of(origin: str) -> tuple[str, str]:
    """The torch factory and the module of a tensor made in forward: ("arange", "transformer.h.0")
    for "created:aten.arange.start@transformer.h.0" (aten's overload is not the user's word)."""
    op, _, module = origin.removeprefix("created:").partition("@")
    base = op.removeprefix("aten.").split(".")[0]
    return _ATEN_FACTORY.get(base, base), module


def seen_as(finding: Finding, target: str, to: str) -> str | None:
    """What the finding saw `target` as: its device when `to` is a device, else its dtype."""
    for t in finding.tensors:
        if t.origin in (target, f"input:{target}") or t.name == target:
            return t.device if ":" in to or to in ("cpu", "cuda", "meta") else t.dtype
    return None


def made_in_model(r: Remedy) -> bool:
    """Whether the remedy's target is made by the model (its code or its weights), not the pipeline."""
    return r.target.startswith(("created:", "param:", "buffer:", "attribute:")) or r.stage in ("model-code", "model-loading")


def resolve(loc: SourceLoc | None) -> Path | None:
    """The existing file a source location names (relative to the working directory)."""
    if loc is None:
        return None
    path = Path(loc.file)
    path = path if path.is_absolute() else Path.cwd() / path
    return path.resolve() if path.is_file() else None


def enclosing_function(file: Path, line: int) -> str | None:
    """The qualified name of the innermost def around `line` ("Class.method"), None at top level."""
    import libcst

    from dtype_doctor.fix.patch import read_source
    from dtype_doctor.source.analysis import SourceAnalysis

    try:
        return SourceAnalysis(read_source(file), file.name).enclosing_function(line)
    except (libcst.ParserSyntaxError, UnicodeDecodeError, OSError):
        return None


def at_source(c: Change) -> list["cm.Attempt"]:
    """Rewrite the cast on the line the lineage names, in the function (or top-level code) holding it."""
    from dtype_doctor.fix.codemods.base import Attempt
    from dtype_doctor.fix.codemods.casts import RetargetCast

    file = resolve(c.source)
    if file is None or c.source is None:
        return []
    return [Attempt(file, RetargetCast(enclosing_function(file, c.source.line), c.to, lines=[c.source.line]))]


def inputs_cast(pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
    """The pipeline with each change's input cast to its dtype, in memory (cast-inputs, mps-float32)."""
    import torch

    inputs = dict(pipeline.inputs)
    for c in changes:
        inputs[c.target] = inputs[c.target].to(getattr(torch, c.to))
    return pipeline.with_(inputs=inputs)


def one_attempt(file: Path | None, mods: list["cm.Codemod"]) -> list["cm.Attempt"]:
    """The codemods as one attempt on `file` (all of them, or none)."""
    from dtype_doctor.fix.codemods.base import AllOf, Attempt

    if file is None or not mods:
        return []
    return [Attempt(file, mods[0] if len(mods) == 1 else AllOf(mods))]


class Strategy(ABC):
    """Declared as `class CastInputs(Strategy, name=..., applicability=..., rank=..., summary=...)`."""

    name: ClassVar[str]
    applicability: ClassVar[str]  # safe | unsafe
    summary: ClassVar[str]  # one line for --strategy help and the docs
    # `auto` tries strategies in ascending rank: least invasive first.
    rank: ClassVar[int]
    # Asked for by name, it runs even when the scan is clean: a conversion the user wants.
    on_request: ClassVar[bool] = False
    # The `kind` a change of it has in the report's JSON (`strategy` gives the name): the name,
    # or the word reports gave it before strategies had names (the report's names only grow, never change: docs/report.md).
    json_kind: ClassVar[str]
    # Its remedies move a tensor to another device (their `to` is a device, not a dtype).
    moves_tensor: ClassVar[bool] = False
    # Its edit acts where the value enters the script, before every other edit of it (mps-float32's cast
    # before the copy to mps): fix --run tries it first and the other findings on that input wait a round.
    at_entry: ClassVar[bool] = False

    def __init_subclass__(
        cls, *, name: str, applicability: str, rank: int, summary: str, on_request: bool = False,
        json_kind: str | None = None, **kw: Any,
    ) -> None:
        super().__init_subclass__(**kw)
        cls.name, cls.applicability, cls.rank, cls.summary, cls.on_request = name, applicability, rank, summary, on_request
        cls.json_kind = json_kind or name
        JSON_KINDS[name] = cls.json_kind

    # -- what a rule's finding says -------------------------------------------------------

    @abstractmethod
    def suggestion(self, remedies: Sequence[Remedy]) -> str:
        """The fix a finding suggests in words, for its remedies of this strategy (one or more,
        each giving its target a dtype or device): a rule states its fix as a Remedy, and the
        words come from here."""

    def describe(self, c: Change) -> str:
        """One change of this strategy, as the report says it."""
        return f"{c.kind} {c.target} → {c.to}"

    # -- on the model and batch -----------------------------------------------------------

    def run(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Pipeline, Step]:
        changes = self.planned(pipeline, report, ctx)
        if isinstance(changes, Step):
            return pipeline, changes
        try:
            new = self.apply(pipeline, changes)
        except Exception as exc:  # noqa: BLE001 - a failing fix is a result, not a crash
            if is_out_of_memory(exc):
                raise  # the machine's limit, not the strategy's: the caller names the batch size
            return pipeline, Step(self.name, "failed", f"{type(exc).__name__}: {exc}".splitlines()[0], changes)
        return new, self.applied(changes)

    def planned(self, pipeline: Pipeline | None, report: Report, ctx: Context) -> tuple[Change, ...] | Step:
        """The changes this strategy plans for `report`, or the skipped Step that says why it plans
        none: an unsafe strategy the user did not allow, or its own Skip. `pipeline` is None where
        no model was loaded (a load transformers refused: `run`'s fix plans from the report alone)."""
        if self.applicability == UNSAFE and not ctx.unsafe:
            return Step(self.name, "skipped", "changes weight precision; pass --unsafe-fixes or --strategy " + self.name)
        try:
            return self.plan(pipeline, report, ctx)  # type: ignore[arg-type]
        except Skip as why:
            return Step(self.name, "skipped", str(why))

    def applied(self, changes: tuple[Change, ...]) -> Step:
        return Step(self.name, "applied", "; ".join(describe(c) for c in changes), changes)

    def relevant(self, report: Report, ctx: Context) -> list[Finding]:
        """The findings at or above --fail-on whose rule offers this strategy as a remedy."""
        return [f for f in report.at_or_above(ctx.fail_on) if any(r.strategy == self.name for r in f.remedies)]

    def remedies(self, report: Report, ctx: Context) -> list[Remedy]:
        return [r for f in self.relevant(report, ctx) for r in f.remedies if r.strategy == self.name]

    @abstractmethod
    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]: ...

    # -- fix --run: planned from a finding, verified by running the script again ----------

    def scripted(self, finding: Finding, report: Report, ctx: Context) -> tuple[Change, ...] | Step:
        """The changes this strategy makes in the user's files for `finding` (its remedies of this
        strategy), or the skipped Step that says why none: as `planned`, with no model to run."""
        if self.applicability == UNSAFE and not ctx.unsafe:
            return Step(self.name, "skipped", "changes weight precision; pass --unsafe-fixes or --strategy " + self.name)
        remedies = [r for r in finding.remedies if r.strategy == self.name]
        try:
            return self.script_changes(finding, remedies, report, ctx)
        except Skip as why:
            return Step(self.name, "skipped", str(why))

    def script_changes(self, finding: Finding, remedies: Sequence[Remedy], report: Report, ctx: Context) -> tuple[Change, ...]:
        """One change a remedy: its target given its `to`, from what the finding saw it as."""
        if not remedies:
            raise Skip(f"{finding.code} names no {self.name} remedy")
        changes = {(r.target, r.to): Change(self.name, r.target, r.to, seen_as(finding, r.target, r.to), r.stage, r.source) for r in remedies}
        return tuple(changes.values())

    @abstractmethod
    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline: ...

    # -- in the user's files ----------------------------------------------------------------

    def edits(self, c: Change, site: Site) -> list["cm.Attempt"]:
        """The codemods to try, in order, to write change `c` into the user's code at `site`;
        the first that applies wins. [] when no user code can take it (the fix module does)."""
        return []

    def pipeline_lines(self, c: Change) -> list[str]:
        """Change `c` to a diffusers pipeline as lines of the user's loading code, `{pipe}` standing
        for the pipeline's name ("{pipe}.vae.to(torch.float32)"); [] for a strategy of one model."""
        return []

    # -- in the generated fix module (dtype_doctor_fix.py) ---------------------------------

    # The part's text; None: the strategy has no part in the fix module.
    fix_module: ClassVar[ModulePart | None] = None

    def module_part(self, parts: dict[str, dict[str, Any]], c: Change, site: Site) -> None:
        """Add change `c` to this strategy's part of the generated fix module (NewFixModule's
        `parts`, one a strategy)."""
        parts.setdefault(self.name, {})

    def module_fields(self, params: Mapping[str, Any]) -> dict[str, str]:
        """The fields of `fix_module.source` for the part's `params`; Skip for bad params."""
        return {}

    def module_casts(self, params: Mapping[str, Any]) -> Mapping[str, str] | None:
        """The casts ({input: dtype}) the part makes that a datasets transform could make as each
        batch is read (the module's `preprocess`); None when it makes none."""
        return None

    def scan_options(self, params: Mapping[str, Any]) -> Mapping[str, str] | None:
        """The `scan` options ("--dtype", "--autocast": a value) that check a pipeline holding this strategy's
        part of the fix module, with `params`; None where scan cannot express the part (hooks,
        a move the user's loop makes). Casts reach scan through the module's `preprocess`
        (module_casts), not here."""
        return {}


def defined() -> dict[str, type[Strategy]]:
    """Every Strategy class defined so far, by name: the strategy modules (discovered by the
    table, fix.strategies.STRATEGIES) and any a test defines."""
    return {cls.name: cls for cls in Strategy.__subclasses__()}


def describe(c: Change) -> str:
    """One change as the report says it, in the words of the strategy it belongs to (a change
    one strategy plans may be another's: fp32-trainable's autocast)."""
    strategy = defined().get(c.kind)
    return strategy().describe(c) if strategy else f"{c.kind} {c.target} → {c.to}"
