"""The records the batch stages hand each other: what every stage may read (`BatchContext`),
what each stage passes on (`BatchState`, with the inputs' `Lineage`), and the result (`Batch`).

No torch import here; the values inside (a ``datasets.Dataset``, rows, tensors) are opaque.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Callable, Mapping

from dtype_doctor.records import LineageStep, SourceLoc

PREPROCESS_MODES = ("map", "transform")
DATASET_FORMATS = ("torch", "numpy", "python")
COLLATORS = ("auto", "none")
LABEL_NAMES = ("label", "labels", "label_ids")


def _frozen(d: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(d))


@dataclass(frozen=True)
class Lineage:
    """Per current column name, the steps its value went through; follows renames."""

    steps: Mapping[str, tuple[LineageStep, ...]] = field(default_factory=lambda: _frozen({}))

    def _with(self, steps: dict[str, tuple[LineageStep, ...]]) -> Lineage:
        return Lineage(_frozen(steps))

    def add(self, name: str, step: LineageStep) -> Lineage:
        return self._with({**self.steps, name: (*self.steps.get(name, ()), step)})

    def copy(self, src: str, dst: str) -> Lineage:
        return self._with({**self.steps, dst: self.steps.get(src, ())})

    def rename(self, src: str, dst: str) -> Lineage:
        steps = dict(self.steps)
        steps[dst] = steps.pop(src, ())
        return self._with(steps)

    def keep(self, names: Any) -> Lineage:
        wanted = set(names)
        return self._with({k: v for k, v in self.steps.items() if k in wanted})

    def last(self, name: str) -> LineageStep | None:
        s = self.steps.get(name)
        return s[-1] if s else None


@dataclass(frozen=True)
class PreprocessFn:
    """The user's preprocess function, loaded from its file."""

    fn: Callable[..., Any]
    file: str  # as the user wrote it
    path: Any  # pathlib.Path, resolved
    name: str
    batched: bool
    accepts: tuple[str, ...]  # which of tokenizer/image_processor/… it takes by keyword

    @property
    def label(self) -> str:
        return f"{self.file}:{self.name}"


@dataclass(frozen=True)
class BatchContext:
    """What every stage may read: the loaded model, its processors, and the options asked for."""

    loaded: Any  # dtype_doctor.load.model.LoadedModel
    preprocess: PreprocessFn | None = None
    preprocess_mode: str = "map"
    dataset_format: str = "torch"
    device: str = "cpu"
    max_length: int = 128
    collator: str = "auto"
    timeout: float | None = None  # seconds the user's preprocess code may take (machine.control)

    @property
    def forward(self) -> frozenset[str]:
        return frozenset(self.loaded.forward_params)

    @property
    def causal_lm(self) -> bool:
        return str(self.loaded.class_name).endswith("ForCausalLM")

    @property
    def encoder_decoder(self) -> bool:
        loaded = self.loaded
        return bool(getattr(loaded, "is_encoder_decoder", False) or getattr(loaded.config, "is_encoder_decoder", False))

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer or getattr(self.loaded.processor, "tokenizer", None)

    @property
    def image_processor(self) -> Any:
        return self.loaded.image_processor or getattr(self.loaded.processor, "image_processor", None)

    @property
    def feature_extractor(self) -> Any:
        return self.loaded.feature_extractor or getattr(self.loaded.processor, "feature_extractor", None)

    def side_objects(self) -> dict[str, Any]:
        """What a preprocess function may take by keyword."""
        return {
            "tokenizer": self.tokenizer,
            "image_processor": self.image_processor,
            "feature_extractor": self.feature_extractor,
            "processor": self.loaded.processor,
            "config": self.loaded.config,
        }


@dataclass(frozen=True)
class BatchState:
    """The batch between two stages.

    Until the formatter stage reads them, rows live in ``dataset`` (Arrow); from then on, and
    from the preprocess stage in transform mode (``with_transform`` rows are never stored),
    in ``rows``. After the collator, ``inputs`` holds the batch.
    """

    dataset: Any  # datasets.Dataset
    original_columns: tuple[str, ...]
    lineage: Lineage = field(default_factory=Lineage)
    sources: Mapping[str, SourceLoc] = field(default_factory=lambda: _frozen({}))
    rows: tuple[Mapping[str, Any], ...] | None = None
    made_by_processor: frozenset[str] = frozenset()
    label_column: str | None = None
    dropped_columns: tuple[str, ...] = ()
    formatter: str = ""
    collator: str = ""
    inputs: Mapping[str, Any] | None = None
    notes: tuple[str, ...] = ()

    @property
    def columns(self) -> tuple[str, ...]:
        if self.rows is not None:
            return tuple(self.rows[0]) if self.rows else ()
        return tuple(self.dataset.column_names)

    def step(self, name: str, step: LineageStep) -> BatchState:
        """This state with one lineage step added (and its source, when it has one)."""
        sources = self.sources if step.source is None else _frozen({**self.sources, name: step.source})
        return replace(self, lineage=self.lineage.add(name, step), sources=sources)

    def note(self, text: str) -> BatchState:
        return replace(self, notes=(*self.notes, text))

    def but(self, **changes: Any) -> BatchState:
        if "sources" in changes:
            changes["sources"] = _frozen(changes["sources"])
        if "inputs" in changes and changes["inputs"] is not None:
            changes["inputs"] = _frozen(changes["inputs"])
        return replace(self, **changes)


@dataclass(frozen=True)
class Batch:
    """Inputs ready for ``model(**inputs)`` and where each one's dtype came from."""

    inputs: dict[str, Any]
    lineage: dict[str, tuple[LineageStep, ...]]
    sources: dict[str, SourceLoc] = field(default_factory=dict)
    dropped_columns: tuple[str, ...] = ()
    collator: str = ""
    formatter: str = ""
    preprocess: str | None = None  # "FILE.py:FUNC" as given
    preprocess_fn: PreprocessFn | None = None  # that function, loaded: how it is mapped, what it takes
    preprocess_mode: str = "map"
    device: str = "cpu"
    notes: tuple[str, ...] = ()  # one-line remarks (pad token set, column renamed …)
