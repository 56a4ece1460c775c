"""Where a tensor the recorder has seen came from (Provenance), and the names of a traced model
once it is one of several in a step (_RootNames: its modules, state and products under a prefix)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from dtype_doctor.records import TensorMeta


@dataclass(frozen=True, slots=True)
class Provenance:
    kind: str  # param | buffer | input | created
    name: str | None
    origin: str | None


class _RootNames:
    """The root model's names under a prefix: its module paths, its state's origins, what it made."""

    def __init__(self, prefix: str, paths: set[str], state: set[str]) -> None:
        self.prefix, self.paths, self.state = prefix, paths, state

    def module(self, path: str) -> str:
        return (f"{self.prefix}.{path}" if path else self.prefix) if path in self.paths else path

    def origin(self, origin: str | None) -> str | None:
        if origin is None:
            return None
        if origin in self.state:
            kind, _, name = origin.partition(":")
            return f"{kind}:{self.prefix}.{name}"
        if origin.startswith("created:") and "@" in origin:
            made, _, at = origin.partition("@")
            return f"{made}@{self.module(at)}" if at else origin
        return origin

    def metas(self, metas: tuple[TensorMeta, ...]) -> tuple[TensorMeta, ...]:
        out = []
        for t in metas:
            origin = self.origin(t.origin)
            if origin == t.origin:
                out.append(t)
                continue
            name = origin.partition(":")[2] if t.origin in self.state else t.name
            out.append(replace(t, origin=origin, name=name))
        return tuple(out)

    def provenance(self, p: "Provenance") -> "Provenance":
        origin = self.origin(p.origin)
        if origin == p.origin:
            return p
        name = origin.partition(":")[2] if p.origin in self.state else p.name  # type: ignore[union-attr]
        return Provenance(p.kind, name, origin)


def tensor_attributes(model: Any) -> list[tuple[str, Any]]:
    """The tensors a model's modules hold as plain attributes (`self.freqs_cos = ...` in __init__),
    neither parameters nor buffers: `model.to()` and `state_dict` never see them."""
    import torch

    found = []
    for prefix, mod in model.named_modules():
        for key, value in vars(mod).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter) and not key.startswith("__"):
                found.append((f"{prefix}.{key}" if prefix else key, value))
    return found


def boundary_tensors(named: Any) -> dict[str, Any]:
    """The tensors among a forward's inputs by name (`named`: parameter name → value): a tensor by its name,
    each tensor of a tuple or list by NAME[i] (an LSTM's `(h, c)` hidden state), so a finding on one names
    it and its lineage reaches the line that made it."""
    import torch

    found: dict[str, Any] = {}
    for key, value in named.items():
        if isinstance(value, torch.Tensor):
            found[key] = value
        elif isinstance(value, (tuple, list)) and 0 < len(value) <= 8:
            found.update({f"{key}[{i}]": v for i, v in enumerate(value) if isinstance(v, torch.Tensor)})
    return found
