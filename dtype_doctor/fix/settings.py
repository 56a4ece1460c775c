"""How a fix goes, one record for every fix entry (the API's fix_model and pipeline.fix, `fix
--run`'s fix_script, a diffusers pipeline folder's fix): the strategy, the severity the re-run
must clear, whether unsafe strategies may run, whether a patch may overwrite, how many rounds.
Built once (the CLI's FixOptions.engine, or the API's keywords through `of`), checked once."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from dtype_doctor.records.choices import CheckedOnce, choice

MAX_ROUNDS = 5


@dataclass(frozen=True)
class FixSettings(CheckedOnce):
    strategy: str = "auto"  # a strategy's name (fix.strategies.NAMES) or auto
    fail_on: str = "error"  # the re-run trace is verified when nothing at or above it is left
    unsafe_fixes: bool = False
    force: bool = False  # a patch file may be overwritten
    max_rounds: int = MAX_ROUNDS

    def validate(self) -> None:
        from dtype_doctor.fix.strategies import NAMES

        choice("--strategy", self.strategy, NAMES)

    @classmethod
    def of(cls, settings: "FixSettings | None", keywords: dict[str, Any]) -> "FixSettings":
        """`settings`, or the record the API's keywords spell (strategy=, fail_on=, ...), taken out
        of `keywords` (what is left there is the caller's), checked once."""
        given = {f.name: keywords.pop(f.name) for f in fields(cls) if f.name in keywords}
        if settings is not None and given:
            raise TypeError(f"pass settings= or {', '.join(given)}=, not both")
        return (settings or cls(**given)).validated()  # type: ignore[return-value]
