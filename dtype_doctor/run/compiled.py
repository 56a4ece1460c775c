"""What the script hands to torch.compile, and whether it ran in the traced step: `CompileWatch`.

Under the recorder's dispatch mode dynamo compiles nothing (it skips a frame while a non-infra
dispatch mode is active), so every compiled region of the traced step runs eagerly, op by op:
the trace sees what eager PyTorch does. The report says so (`coverage.compiled`), and DD304
reads the regions to say where inductor's code computes otherwise. `torch.compile` and
`nn.Module.compile` are wrapped while the script runs; what they return is torch's own.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from typing import Any, Callable

import torch

from dtype_doctor.machine.user_code import user_site
from dtype_doctor.records import CompiledRegion


@dataclasses.dataclass
class _Region:
    compiled: Any  # what torch.compile returned (an OptimizedModule, a wrapped function), or the module compiled in place
    module: torch.nn.Module | None  # the module compiled
    record: CompiledRegion


class CompileWatch:
    """`with CompileWatch(is_tracing) as w:` — `w.regions(model)` are the script's compiled regions."""

    def __init__(self, is_tracing: Callable[[], bool]) -> None:
        self.is_tracing = is_tracing
        self._regions: list[_Region] = []
        self._called: set[int] = set()  # ids of the regions that ran while tracing
        self._saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> "CompileWatch":
        original, module_compile = torch.compile, torch.nn.Module.compile
        watch = self

        def compile(model: Any = None, **kwargs: Any) -> Any:
            if model is None:  # @torch.compile(mode=...): the decorator, then the function
                return lambda fn: compile(fn, **kwargs)
            out = original(model, **kwargs)
            return watch._made(model, out, kwargs)

        def compile_in_place(module: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
            module_compile(module, *args, **kwargs)
            watch._made(module, module, kwargs)

        functools.update_wrapper(compile, original)
        self._set(torch, "compile", compile)
        self._set(torch.nn.Module, "compile", compile_in_place)
        return self

    def __exit__(self, *exc: Any) -> None:
        for owner, name, value in reversed(self._saved):
            setattr(owner, name, value)
        self._saved.clear()

    def _set(self, owner: Any, name: str, value: Any) -> None:
        self._saved.append((owner, name, owner.__dict__.get(name, getattr(owner, name))))
        setattr(owner, name, value)

    def _made(self, target: Any, out: Any, kwargs: dict) -> Any:
        module = target if isinstance(target, torch.nn.Module) else None
        name = type(target).__name__ if module is not None else getattr(target, "__qualname__", repr(target))
        backend = kwargs.get("backend", "inductor")
        options = kwargs.get("options") or {}
        record = CompiledRegion(name, "module" if module is not None else "function", None,
                                backend if isinstance(backend, str) else getattr(backend, "__name__", type(backend).__name__),
                                kwargs.get("mode"), bool(options.get("emulate_precision_casts", _emulating())), False, user_site(2))
        if module is None and callable(out):
            watch = self

            @functools.wraps(out)
            def region(*args: Any, **kw: Any) -> Any:
                if watch.is_tracing():
                    watch._called.add(id(region))
                return out(*args, **kw)

            out_fn: Any = region
            self._regions.append(_Region(region, None, record))
            return out_fn
        self._regions.append(_Region(out, module, record))
        return out

    def regions(self, model: torch.nn.Module | None, called_modules: set[str]) -> tuple[CompiledRegion, ...]:
        """The regions, each named in `model` where it is part of it, and whether it ran in the step
        (a module: its name among `called_modules`, the modules the trace saw called)."""
        names = {id(m): n for n, m in model.named_modules()} if model is not None else {}
        out = []
        for r in self._regions:
            record = r.record
            if r.module is not None:
                name = names.get(id(r.compiled), names.get(id(r.module)))
                record = dataclasses.replace(record, module=name, called=name is not None and (name in called_modules or name == ""))
            else:
                record = dataclasses.replace(record, called=id(r.compiled) in self._called)
            out.append(record)
        return tuple(out)


def _emulating() -> bool:
    """Inductor's emulate_precision_casts as it stands: its config once imported, else its environment variable."""
    config = sys.modules.get("torch._inductor.config")
    if config is not None:
        return bool(getattr(config, "emulate_precision_casts", False))
    return os.environ.get("TORCHINDUCTOR_EMULATE_PRECISION_CASTS", "0") == "1"
