"""A pipeline's components as the report lists them (docs/report.md, `target.components`): no torch."""

from __future__ import annotations

from typing import Any

from dtype_doctor.records import ModelInfo, main_dtype_of, numel


def is_vae(name: str, cls: str) -> bool:
    """Whether a pipeline component is its VAE (an Autoencoder class, or named vae)."""
    return "Autoencoder" in cls or name == "vae"


def component_dtypes(model: ModelInfo) -> dict[str, str | None]:
    """Each component's dtype: the floating dtype most of its parameter elements have."""
    sizes: dict[str, list[tuple[str, int]]] = {name: [] for name, _ in model.components}
    for p in model.parameters:
        c = model.component_of(p.name)
        if c is not None:
            sizes[c].append((p.dtype, numel(p.shape)))
    return {name: main_dtype_of(s) for name, s in sizes.items()}


def components_of(model: ModelInfo) -> tuple[dict[str, Any], ...] | None:
    """[{name, class, dtype, devices, parameters}] of a pipeline traced as one; None for a single model."""
    if not model.components:
        return None
    dtypes = component_dtypes(model)
    out = []
    for name, cls in model.components:
        params = [p for p in model.parameters if model.component_of(p.name) == name]
        out.append({"name": name, "class": cls, "dtype": dtypes[name],
                    "devices": sorted({p.device for p in params}), "parameters": sum(numel(p.shape) for p in params)})
    return tuple(out)
