"""What a faked CUDA-only package is (machine/fake_packages.py arms them; one module each fakes a package)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

Refuse = Callable[[str], Callable[..., Any]]  # "package.function" → a callable that stops the script, naming it


@dataclass(frozen=True)
class FakePackage:
    """One CUDA-only package as the target machine has it installed."""

    top: str  # its import name
    distribution: str
    version: str  # the version its source states (each fake module cites where)
    modules: Callable[[Refuse], dict[str, dict[str, Any]]]  # module name → its attributes, given the refusal maker
    refuses_rest: bool = False  # any other module or attribute under `top` imports, and refuses when called
