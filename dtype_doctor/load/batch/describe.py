"""Dtype, shape, device and a few words for what a pipeline stage holds: a datasets feature
(as stored in Arrow) or a value (a tensor, an array, python values, an image)."""

from __future__ import annotations

from typing import Any

from dtype_doctor.records import LineageStep, dtype_name


def feature_dtype(feat: Any) -> tuple[str | None, str]:
    """(dtype, detail) of a datasets feature as stored."""
    import datasets

    if isinstance(feat, datasets.ClassLabel):
        return "int64", f"ClassLabel with {feat.num_classes} names"
    if isinstance(feat, datasets.Value):
        dt = feat.dtype
        if dt in ("string", "large_string"):
            return None, "string"
        if dt in ("float", "double"):
            return {"float": "float32", "double": "float64"}[dt], f"Value('{dt}')"
        return dt, f"Value('{dt}')"
    if isinstance(feat, datasets.Image):
        return "uint8", "image (decoded to a PIL image with uint8 pixels)"
    if isinstance(feat, datasets.Audio):
        return None, "audio (decoded to a float array)"
    inner = getattr(feat, "feature", None)
    if inner is not None and type(feat).__name__ in ("List", "Sequence", "LargeList"):
        dt, det = feature_dtype(inner)
        return dt, f"list of {det if dt is None else dt}"
    dt = getattr(feat, "dtype", None)
    if isinstance(dt, str) and type(feat).__name__.startswith("Array"):
        return dt, f"{type(feat).__name__}({dt})"
    return None, type(feat).__name__


def feature_repr(feat: Any) -> str:
    return repr(feat).replace("\n", " ")


def describe_value(v: Any) -> tuple[str | None, tuple[int, ...] | None, str | None, str]:
    """(dtype, shape, device, words) of one value a function returned or a formatter gave."""
    mod = type(v).__module__
    if mod.startswith("torch") and hasattr(v, "dtype") and hasattr(v, "shape"):
        dt = dtype_name(v.dtype)
        return dt, tuple(v.shape), str(v.device), f"torch.{dt} tensor"
    if mod.startswith("numpy") and hasattr(v, "dtype"):
        dt = str(v.dtype)
        return dt, tuple(getattr(v, "shape", ())), None, f"numpy {dt} {'array' if getattr(v, 'ndim', 0) else 'scalar'}"
    if isinstance(v, bool):
        return "bool", (), None, "python bool"
    if isinstance(v, int):
        return None, (), None, "python int"
    if isinstance(v, float):
        return None, (), None, "python float"
    if isinstance(v, str):
        return None, None, None, "string"
    if isinstance(v, (list, tuple)):
        if v:
            dt, shape, dev, words = describe_value(v[0])
            return dt, (len(v), *shape) if shape is not None else None, dev, f"list of {words}"
        return None, (0,), None, "empty list"
    if mod.startswith("PIL"):
        return "uint8", None, None, f"PIL image ({getattr(v, 'mode', '?')})"
    return None, None, None, type(v).__name__


def value_step(stage: str, v: Any, detail: str, *, device: str | None = None) -> LineageStep:
    """The lineage step of value `v` (a tensor, mostly) at `stage`; `device` names a simulated
    tensor's device as the step asked for it (cuda:0), not where its fake lives (meta)."""
    dt, shape, where, _ = describe_value(v)
    return LineageStep(stage, dt, device or where, shape, detail)
