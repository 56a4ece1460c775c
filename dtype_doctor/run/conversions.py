"""Where the script converted or moved its model: `model.half()`, `.to(torch.bfloat16)`, `.cuda()`.

Parameters have no lineage of their own: their dtype is decided by the load and by these
calls. While the script runs, the nn.Module methods that convert are wrapped; each call made
from the user's own code is kept with its file and line, so a finding about parameters
(DD102, DD109, DD110, DD401) can name the line that made them what they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable
from weakref import WeakKeyDictionary

import torch

from dtype_doctor.machine.placement import CUDA0
from dtype_doctor.records import SourceLoc
from dtype_doctor.machine.user_code import user_site
from dtype_doctor.numerics import dtype_name

_METHOD_DTYPES = {"half": torch.float16, "float": torch.float32, "double": torch.float64, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Conversion:
    """One conversion of a module: the dtype and/or device it gave, and the user's line."""

    what: str  # ".half()", ".to(torch.bfloat16)", ".cuda()"
    dtype: str | None
    device: str | None
    source: SourceLoc


class ConversionLog:
    """`with ConversionLog() as log:` — `log.of(module)` is its conversions, in order."""

    def __init__(self, device_alias: Callable[[str], str] = lambda d: d) -> None:
        self.events: WeakKeyDictionary = WeakKeyDictionary()
        self.device_alias = device_alias
        self._saved: dict[str, Any] = {}
        self._inside = 0

    def of(self, module: torch.nn.Module) -> list[Conversion]:
        return self.events.get(module, [])

    def source_for(self, model: torch.nn.Module, param: str, *, dtype: str | None = None, device: str | None = None) -> SourceLoc | None:
        """The user line of the last conversion that gave parameter `param` of `model` its dtype (or device)."""
        found: list[tuple[int, Conversion]] = []
        for name, module in model.named_modules():
            if name and not (param == name or param.startswith(name + ".")):
                continue
            for i, c in enumerate(self.of(module)):
                if (dtype is not None and c.dtype == dtype) or (device is not None and c.device == device):
                    found.append((i, c))
        return found[-1][1].source if found else None

    # ---------------------------------------------------------------- arming

    def __enter__(self) -> "ConversionLog":
        cls = torch.nn.Module
        for name in (*_METHOD_DTYPES, "to", "cuda"):
            self._saved[name] = cls.__dict__[name]
            setattr(cls, name, self._wrap(name, cls.__dict__[name]))
        return self

    def __exit__(self, *exc: Any) -> None:
        for name, original in self._saved.items():
            setattr(torch.nn.Module, name, original)
        self._saved.clear()

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        log = self

        def converting(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            if log._inside:
                return original(module, *args, **kwargs)
            log._inside += 1
            try:
                out = original(module, *args, **kwargs)
            finally:
                log._inside -= 1
            try:
                log._record(module, name, args, kwargs)
            except Exception:  # noqa: BLE001 - bookkeeping must never break the script
                pass
            return out

        converting.__wrapped__ = original  # type: ignore[attr-defined]
        return converting

    def _record(self, module: torch.nn.Module, name: str, args: tuple, kwargs: dict) -> None:
        site = user_site(2)
        if site is None:
            return
        dtype = device = None
        if name in _METHOD_DTYPES:
            dtype, what = dtype_name(_METHOD_DTYPES[name]), f".{name}()"
        elif name == "cuda":
            device, what = CUDA0, ".cuda()"
        else:
            to_device, to_dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
            dtype = dtype_name(to_dtype) if to_dtype is not None else None
            device = str(to_device) if to_device is not None else None
            what = ".to(" + ", ".join(x for x in (device, f"torch.{dtype}" if dtype else None) if x) + ")"
        if device is not None:
            device = self.device_alias(CUDA0 if device == "cuda" else device)
        self.events.setdefault(module, []).append(Conversion(what, dtype, device, site))


