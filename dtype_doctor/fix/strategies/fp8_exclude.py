"""fp8-exclude: leave the layers whose fp8 matmul CUDA refuses (a dimension not a multiple of 16) out of fp8 conversion.

DD506 names the module a refused `torch._scaled_mm` runs in. In memory the fp8 layer is swapped
back for a plain `nn.Linear` holding the same weight and bias (an fp8 linear — torchao's
`Float8Linear`, or a user's own — is an nn.Linear subclass that keeps its high-precision
weight and casts per matmul), and the re-run traces it clean. In the user's code the change is
the conversion call's `module_filter_fn` (the ExcludeFromConversion codemod): the layer is
never converted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from dtype_doctor.fix.outcome import Change
from dtype_doctor.fix.strategies.base import SAFE, Context, Pipeline, Site, Skip, Strategy, listed, one_attempt
from dtype_doctor.records import Remedy, Report

if TYPE_CHECKING:
    from dtype_doctor.fix.patches import Attempt


class Fp8Exclude(
    Strategy, name="fp8-exclude", applicability=SAFE, rank=18,
    summary="leave the layers whose fp8 matmul CUDA refuses out of fp8 conversion (the conversion call's module_filter_fn)",
):
    def suggestion(self, remedies: Sequence[Remedy]) -> str:
        names = sorted({r.target for r in remedies})
        quoted = ", ".join(f'"{n}"' for n in names)
        return (f"leave {listed(names)} out of fp8 conversion: "
                f"convert_to_float8_training(model, module_filter_fn=lambda mod, fqn: fqn not in {{{quoted}}})")

    def describe(self, c: Change) -> str:
        return f"leave {c.target} out of fp8 conversion (computes in {c.to})"

    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]:
        wanted = {r.target: r.to for r in self.remedies(report, ctx)}
        if not wanted:
            raise Skip("no fp8 layer has a dimension CUDA refuses")
        return tuple(Change(self.name, name, to, "fp8", "model-code") for name, to in sorted(wanted.items()))

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        import copy

        import torch

        model = copy.deepcopy(pipeline.model)
        for c in changes:
            layer = model.get_submodule(c.target)
            if not isinstance(layer, torch.nn.Linear):
                raise TypeError(f"{c.target} ({type(layer).__name__}) is not an nn.Linear: no plain layer to put back")
            plain = torch.nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None,
                                    device="meta", dtype=layer.weight.dtype)
            plain.weight = layer.weight
            plain.bias = layer.bias
            parent, _, leaf = c.target.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, leaf, plain)
        return pipeline.with_(model=model)

    def edits(self, c: Change, site: Site) -> list["Attempt"]:
        from dtype_doctor.fix import codemods as cm

        return [a for f in site.user_files for a in one_attempt(f, [cm.ExcludeFromConversion([c.target])])]
