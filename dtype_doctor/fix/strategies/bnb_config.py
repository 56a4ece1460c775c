"""bnb-compute-dtype and bnb-quant-storage: change the user's BitsAndBytesConfig, not the weights' values.

bnb-compute-dtype sets every 4-bit layer's compute dtype to the dtype its inputs have (DD501);
bnb-quant-storage stores the packed 4-bit weights in the dtype FSDP flattens with the rest (DD504).
In memory both work on a copy of the model (the compute dtype retargeted; the packed bytes viewed
as the new storage dtype, as quantizing with it stores them) and are verified by the re-run; in
the user's code both are one keyword of the script's BitsAndBytesConfig(...) call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from dtype_doctor.fix.outcome import Change
from dtype_doctor.fix.strategies.base import SAFE, Context, Pipeline, Site, Skip, Strategy, one_attempt
from dtype_doctor.records import Remedy, Report

if TYPE_CHECKING:
    from dtype_doctor.fix.patches import Attempt


def config_edits(keyword: str, c: Change, site: Site) -> list["Attempt"]:
    from dtype_doctor.fix import codemods as cm

    return [a for f in site.user_files for a in one_attempt(f, [cm.SetConfigKeyword(keyword, c.to)])]


class BnbComputeDtype(
    Strategy, name="bnb-compute-dtype", applicability=SAFE, rank=15,
    summary="set bnb_4bit_compute_dtype to the dtype the 4-bit layers' inputs have (BitsAndBytesConfig)",
):
    def suggestion(self, remedies: Sequence[Remedy]) -> str:
        return f"BitsAndBytesConfig(bnb_4bit_compute_dtype=torch.{remedies[0].to}): the 4-bit layers compute in their inputs' dtype"

    def describe(self, c: Change) -> str:
        return f"set bnb_4bit_compute_dtype to {c.to}" + (f" (was {c.before})" if c.before else "")

    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]:
        wanted = sorted({r.to for r in self.remedies(report, ctx)})
        if not wanted:
            raise Skip("no 4-bit layer computes in another dtype than its inputs")
        q = report.trace.model.quantization if report.trace else None
        return (Change(self.name, "model", wanted[0], q.compute_dtype if q else None),)

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        import copy

        import torch

        from dtype_doctor.quantization import LINEAR_4BIT

        dtype = getattr(torch, changes[0].to)
        model = copy.deepcopy(pipeline.model)
        for mod in model.modules():
            if type(mod).__name__ in LINEAR_4BIT and type(mod).__module__.startswith("bitsandbytes"):
                mod.compute_dtype, mod.compute_type_is_set = dtype, True
        return pipeline.with_(model=model)

    def edits(self, c: Change, site: Site) -> list["Attempt"]:
        return config_edits("bnb_4bit_compute_dtype", c, site)


class BnbQuantStorage(
    Strategy, name="bnb-quant-storage", applicability=SAFE, rank=16,
    summary="store the packed 4-bit weights in the dtype FSDP flattens (bnb_4bit_quant_storage, BitsAndBytesConfig)",
):
    def suggestion(self, remedies: Sequence[Remedy]) -> str:
        return f"BitsAndBytesConfig(bnb_4bit_quant_storage=torch.{remedies[0].to}): the 4-bit weights stored in the dtype FSDP flattens"

    def describe(self, c: Change) -> str:
        return f"store the 4-bit weights as {c.to} (bnb_4bit_quant_storage)"

    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]:
        wanted = sorted({r.to for r in self.remedies(report, ctx)})
        if not wanted:
            raise Skip("the 4-bit weights are already stored in a floating dtype")
        q = report.trace.model.quantization if report.trace else None
        return (Change(self.name, "model", wanted[0], q.storage_dtype if q else None),)

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        """The same packed bytes, viewed as the new storage dtype: what quantizing with
        bnb_4bit_quant_storage=dtype stores (the quant_state, which says the real shape, is kept)."""
        import copy

        import bitsandbytes as bnb
        import torch

        from dtype_doctor.quantization import LINEAR_4BIT

        dtype = getattr(torch, changes[0].to)
        model = copy.deepcopy(pipeline.model)
        for mod in model.modules():
            if type(mod).__name__ not in LINEAR_4BIT or not type(mod).__module__.startswith("bitsandbytes"):
                continue
            w = mod.weight
            data = w.data.reshape(-1).view(dtype).reshape(-1, 1)
            mod.weight = bnb.nn.Params4bit(
                data, requires_grad=False, quant_state=w.quant_state, blocksize=w.blocksize,
                compress_statistics=w.compress_statistics, quant_type=w.quant_type, quant_storage=dtype, module=mod,
                bnb_quantized=True,
            )
        return pipeline.with_(model=model)

    def edits(self, c: Change, site: Site) -> list["Attempt"]:
        return config_edits("bnb_4bit_quant_storage", c, site)
