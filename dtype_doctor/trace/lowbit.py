"""The Linear layers a microscaling training recipe converted (torchao's MX/NVFP4 weights,
TransformerEngine's modules under a block-scaling recipe), read by class name so neither library
is imported here: the ModelInfo's `mx_recipe`, which DD510-DD512 read."""

from __future__ import annotations

from typing import Any

from dtype_doctor.records import MxLinear, MxRecipe, dtype_name


# Weights a torchao training recipe swapped in, by class name → the recipe
TORCHAO_WEIGHTS = {"MXFP8TrainingWeightWrapperTensor": "mxfp8", "MXTensor": "mxfp8", "NVFP4Tensor": "nvfp4"}
# TransformerEngine's block-scaling recipes → the recipe
TE_RECIPES = {"MXFP8BlockScaling": "mxfp8", "NVFP4BlockScaling": "nvfp4"}


def torchao_recipe(model: Any) -> MxRecipe | None:
    """The Linear layers whose weights torchao's MX/NVFP4 training swapped, or None."""
    linears, recipe, emulated = [], None, False
    for name, mod in model.named_modules():
        # the registered parameter, not the attribute: a parametrized weight (weight_norm) would run its parametrization
        weight = mod._parameters.get("weight")
        kind = TORCHAO_WEIGHTS.get(type(weight).__name__)
        if kind is None or not hasattr(mod, "in_features"):
            continue
        config = getattr(weight, "config", None)
        emulated = emulated or "EMULATED" in str(getattr(config, "kernel_preference", ""))
        elem = str(getattr(weight, "elem_dtype", getattr(config, "elem_dtype", "")))
        recipe = "mxfp4" if kind == "mxfp8" and "float4" in elem else kind
        linears.append(MxLinear(name, type(mod).__name__, int(mod.in_features), int(mod.out_features), recipe,
                                dtype_name(weight.dtype)))
    if not linears:
        return None
    return MxRecipe("torchao", recipe or "mxfp8", emulated=emulated, linears=tuple(linears))


def te_recipe(recipe: Any, model: Any) -> MxRecipe | None:
    """TransformerEngine's recipe object (MXFP8BlockScaling, NVFP4BlockScaling) over `model`'s TE Linears."""
    kind = TE_RECIPES.get(type(recipe).__name__)
    if kind is None:
        return None
    fmt = str(getattr(getattr(recipe, "fp8_format", None), "name", "E4M3")).lower()
    linears = tuple(
        MxLinear(n, type(m).__name__, int(m.in_features), int(m.out_features), kind, dtype_name(m.weight.dtype))
        for n, m in model.named_modules()
        if type(m).__module__.startswith("transformer_engine") and hasattr(m, "in_features"))
    return MxRecipe("transformer_engine", kind, grad_format=fmt, linears=linears)


def mx_recipe_of(model: Any) -> MxRecipe | None:
    """torchao's converted weights, else the recipe a TransformerEngine module last ran under
    (its `fp8_meta["recipe"]`, set by te.fp8_autocast), else None."""
    found = torchao_recipe(model)
    if found is not None:
        return found
    for _, mod in model.named_modules():
        recipe = (getattr(mod, "fp8_meta", None) or {}).get("recipe") if type(mod).__module__.startswith("transformer_engine") else None
        if recipe is not None:
            return te_recipe(recipe, model)
    return None
