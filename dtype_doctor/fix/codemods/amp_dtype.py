"""The autocast a script already runs, in another half dtype: RetargetAutocast rewrites the `dtype=` of a
file's `torch.autocast(...)` / `torch.amp.autocast(...)` / `torch.cuda.amp.autocast(...)` calls that name
one dtype literally (`dtype=torch.bfloat16` → `dtype=torch.float16`: bfloat16 autocast on a GPU without
bfloat16 tensor cores, a T4, runs emulated, DD107). A dtype the script computes (`dtype=ptdtype`) is the
script's own choice by its options, and is left as it is."""

from __future__ import annotations

from typing import ClassVar

import libcst as cst
from libcst.helpers import get_full_name_for_node

from dtype_doctor.fix.codemods.base import Codemod, _Skip


class RetargetAutocast(Codemod):
    """Every autocast call of the file with `dtype=torch.FROM` made `dtype=torch.TO`."""

    DESCRIPTION: ClassVar[str] = "Run the script's autocast in the half dtype the GPU has tensor cores for."

    def __init__(self, from_dtype: str, to_dtype: str) -> None:
        self.from_dtype, self.to_dtype = from_dtype, to_dtype

    def _apply(self, source: str, filename: str, warnings: list[str]) -> tuple[str, str]:
        from libcst.metadata import MetadataWrapper, PositionProvider

        wrapper = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
        positions = wrapper.resolve(PositionProvider)
        lines: list[int] = []
        old, new = self.from_dtype, self.to_dtype

        class Edit(cst.CSTTransformer):
            def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
                if (get_full_name_for_node(original.func) or "").rpartition(".")[2] != "autocast":
                    return updated
                args = []
                for a in updated.args:
                    if a.keyword is not None and a.keyword.value == "dtype" and get_full_name_for_node(a.value) in (f"torch.{old}", old):
                        prefix = "torch." if get_full_name_for_node(a.value) == f"torch.{old}" else ""
                        a = a.with_changes(value=cst.parse_expression(f"{prefix}{new}"))
                        lines.append(positions[original].start.line)
                    args.append(a)
                return updated.with_changes(args=args)

        out = wrapper.module.visit(Edit())
        if not lines:
            raise _Skip(f"no autocast(dtype=torch.{old}) in {filename}")
        return out.code, "; ".join(f"{filename}:{n}: autocast dtype=torch.{old} → torch.{new}" for n in lines)
