"""The values the dtype options take, defined once: the CLI's checks and help, ScanOptions,
the loader and the tests read them here (no torch). The other enumerations have their own one
home: GPU names machine.gpus.CAPABILITIES, strategies fix.strategies.NAMES, report formats
report.FORMATS, dataset formats load.batch.state.DATASET_FORMATS."""

from __future__ import annotations

import difflib
from typing import Iterable

from dtype_doctor.records.errors import UsageError

MODEL_DTYPES = ("auto", "float32", "float16", "bfloat16")  # --dtype (auto: from_pretrained's default)
AUTOCAST_DTYPES = ("off", "float16", "bfloat16")  # --autocast
COMPUTE_DTYPES = ("float32", "float16", "bfloat16")  # --bnb-compute-dtype
# What users also type for a dtype: each alias and the name it stands for.
DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}


def did_you_mean(value: str, candidates: Iterable[str], cutoff: float = 0.6) -> str:
    """`; did you mean 'x'?` when a candidate is near `value`, else ``."""
    candidates = list(candidates)
    near = difflib.get_close_matches(value.lower(), [c.lower() for c in candidates], n=1, cutoff=cutoff)
    if not near:
        return ""
    by_lower = {c.lower(): c for c in candidates}
    return f"; did you mean {by_lower[near[0]]!r}?"


def choice(flag: str, value: str | None, choices: Iterable[str], *, aliases: Iterable[str] = ()) -> None:
    """UsageError naming a near choice when `value` is not one of `choices`."""
    choices = tuple(choices)
    if value is None or value in choices:
        return
    hint = did_you_mean(value, (*choices, *aliases))
    raise UsageError(f"unknown {flag} {value!r}{hint} (choose one of: {', '.join(choices)})")


def said(names: tuple[str, ...]) -> str:
    """('auto', 'float32') → 'auto|float32', as the help spells a choice."""
    return "|".join(names)


class CheckedOnce:
    """An option record checked once per entry: the entry calls `validated()` (or the first stage
    does, for the Python API), and every stage after it gets the same record back unchecked
    again. A copy (dataclasses.replace) is checked afresh: its values may differ."""

    def validate(self) -> None:  # pragma: no cover - each record defines its checks
        raise NotImplementedError

    def validated(self) -> "CheckedOnce":
        if not self.__dict__.get("_checked"):
            self.validate()
            object.__setattr__(self, "_checked", True)  # a frozen record's memo, as cached_property keeps one
        return self
