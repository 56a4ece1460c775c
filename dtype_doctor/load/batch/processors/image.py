"""Images → the image processor, called as the model docs and task guides call it inside
``Dataset.map``: ``image_processor([im.convert("RGB") …], return_tensors="pt")`` with its own
size, rescale and normalisation defaults."""

from __future__ import annotations

from typing import Any

from dtype_doctor.load.batch import columns
from dtype_doctor.load.batch.describe import describe_value
from dtype_doctor.load.batch.hf_map import map_processor
from dtype_doctor.load.batch.processors.base import Modality, record_outputs, require
from dtype_doctor.load.batch.state import BatchContext, BatchState


def applies(state: BatchState, ctx: BatchContext) -> bool:
    return "pixel_values" in ctx.forward and "pixel_values" not in state.columns and columns.image_column(state.dataset) is not None


def wants_rgb(loaded: Any) -> bool:
    """Whether the model takes 3 channels, so images are ``.convert("RGB")``-ed first."""
    channels = getattr(loaded.config, "num_channels", None)
    if channels is None:
        channels = getattr(getattr(loaded.config, "vision_config", None), "num_channels", 3)
    return channels == 3


def rgb_images(images: list[Any], loaded: Any) -> list[Any]:
    """``.convert("RGB")`` as the example scripts do, for a model that takes 3 channels."""
    rgb = wants_rgb(loaded)
    return [im.convert("RGB") if rgb and hasattr(im, "convert") else im for im in images]


def run(state: BatchState, ctx: BatchContext) -> BatchState:
    column = columns.image_column(state.dataset)
    assert column is not None
    ip = require(ctx.image_processor, column, "holds images", ctx.loaded, "image processor", "preprocessor_config.json")
    seen: dict[str, Any] = {}

    def process(batch: dict[str, list[Any]]) -> dict[str, Any]:
        out = dict(ip(rgb_images(batch[column], ctx.loaded), return_tensors="pt"))
        if not seen:
            seen.update(out)
        return out

    before = set(state.columns)
    name = type(ip).__name__
    new = map_processor(state.dataset, process, "image", f"{name} could not process column '{column}'")

    def detail(out: str, dt: str | None) -> str:
        got = seen.get(out)
        words = f"returned {describe_value(got)[3]} {tuple(got.shape) if hasattr(got, 'shape') else ''}".rstrip()
        return f"{name} {words}; stored by datasets.map as {dt}"

    return record_outputs(state, new, {c: column for c in new.column_names if c not in before}, detail)


MODALITY = Modality("image", applies, run)
