"""keep-fp32: keep the smallest set of modules float32 that makes the half model finite and
close to float32 (the search is dtype_doctor.fix.keep_fp32): on a float16 model whose findings
ask for it, or asked for by name on a float32 model, which it converts to float16 keeping that set.

It always lands in the fix module: keep_fp32(model) carries the module list and the
input-casting hooks, which no one-line edit of a script could.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from dtype_doctor.fix.outcome import Change
from dtype_doctor.fix.strategies.base import SAFE, Context, ModulePart, Pipeline, Site, Skip, Strategy, half_dtype, listed
from dtype_doctor.records import HALF, Remedy, Report


class KeepFp32(
    Strategy, name="keep-fp32", applicability=SAFE, rank=50, on_request=True,
    summary="keep the smallest set of modules float32 that makes the half model finite and close to float32",
):
    def suggestion(self, remedies: Sequence[Remedy]) -> str:
        modules = [r.target for r in remedies if r.target and r.target != "model"]
        among = f", {listed(modules)} among them" if modules else ""
        return f"keep the smallest set of modules float32 that makes the half model finite{among} (--strategy keep-fp32)"

    def describe(self, c: Change) -> str:
        if c.target != "model":
            return f"keep {c.target} float32" + (f" instead of {c.before}" if c.before else "")
        return (
            (f"convert the model {c.before} → {c.to}" if c.before != c.to else f"keep the model {c.to}")
            + " except the modules kept float32 (and those it declares fp32); each module casts its inputs to its own dtype"
        )

    def plan(self, pipeline: Pipeline, report: Report, ctx: Context) -> tuple[Change, ...]:
        import torch

        if pipeline.simulate:
            raise Skip("finding the modules to keep needs real values; it does not run under --simulate")
        if pipeline.autocast:
            raise Skip(f"the forward runs under autocast ({pipeline.autocast}), which picks each op's dtype whatever the weights'")
        from dtype_doctor.numerics import main_dtype

        main = main_dtype(pipeline.model)
        if main not in HALF and ctx.requested != self.name:
            raise Skip(f"the model is {main}: nothing runs in half precision (--strategy keep-fp32 converts it to float16)")
        if main not in HALF and main != "float32":
            raise Skip(f"the model is {main}; keep-fp32 converts float32 models to float16")
        if main in HALF and not self.remedies(report, ctx) and ctx.requested != self.name:
            raise Skip("no finding asks for modules in float32")
        target = main if main in HALF else "float16"
        from dtype_doctor.fix.keep_fp32 import minimal_fp32_set

        found = minimal_fp32_set(pipeline.model, pipeline.inputs, dtype=getattr(torch, target))
        if not found.needed:
            raise Skip(found.reason)
        if not found.verified:
            raise Skip("no set of modules kept float32 works: " + found.reason)
        return (
            Change(self.name, "model", target, main),
            *(Change(self.name, name, "float32", target) for name in found.modules),
        )

    def apply(self, pipeline: Pipeline, changes: tuple[Change, ...]) -> Pipeline:
        import copy

        import torch

        from dtype_doctor.fix.keep_fp32 import apply_keep_fp32

        dtype = getattr(torch, next(c.to for c in changes if c.target == "model"))
        model = copy.deepcopy(pipeline.model)
        apply_keep_fp32(model, [c.target for c in changes if c.target != "model"], dtype)
        return pipeline.with_(model=model)

    def scan_options(self, params: Mapping[str, Any]) -> None:
        return None  # forward hooks: no scan option says them

    def module_part(self, parts: dict[str, dict[str, Any]], c: Change, site: Site) -> None:
        part = parts.setdefault(self.name, {"modules": []})
        if c.target == "model":
            part["dtype"] = c.to
        else:
            part["modules"].append(c.target)

    def module_fields(self, params: Mapping[str, Any]) -> dict[str, str]:
        """``modules`` (dotted names kept float32), ``dtype`` (float16)."""
        import re

        dtype = half_dtype(params, "keep-fp32 converts to")
        modules = [str(m) for m in params.get("modules") or ()]
        # "" is the model itself (a bare nn.Linear): named_modules() calls it that.
        if not modules or not all(re.fullmatch(r"([A-Za-z_][\w.]*)?", m) for m in modules):
            raise Skip(f"keep-fp32 needs module names from named_modules(), got {modules}")
        listed = "".join(f"\n    {m!r}," for m in modules)
        return {"dtype": dtype, "modules": "(" + listed.replace("'", '"') + "\n)"}

    fix_module = ModulePart(
        function="keep_fp32",
        role="model",
        order=10,
        call="keep_fp32(model)",
        why=(
            "The model runs in half precision except the few modules in KEEP_FP32 (and those the\n"
            "model declares fp32), which stay float32: in plain half precision their values pass\n"
            "float16's 65504 and become inf/NaN. dtype-doctor found this set by re-running the\n"
            "forward: the smallest one that gives a finite output close to float32. Every module\n"
            "that holds weights casts its floating inputs to its own dtype, so the float32 modules\n"
            "compute in float32 and the half ones after them get half inputs again."
        ),
        usage="model = keep_fp32(model)\noutputs = model(**batch)",
        source='''

# The modules kept in float32 (dotted names from model.named_modules()).
KEEP_FP32 = {modules}


def keep_fp32(model, dtype=torch.{dtype}):
    \"\"\"Convert `model` to `dtype` in place, keeping KEEP_FP32 and the modules the model
    declares fp32 in float32, and make every module cast its inputs to its own dtype; return it.\"\"\"
    missing = sorted(set(KEEP_FP32) - {{name for name, _ in model.named_modules()}})
    if missing:
        raise ValueError(f"no module named {{', '.join(missing)}} in {{type(model).__name__}}: not the model this fix was made for")
    declared = list(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    if dtype == torch.float16:
        declared += list(getattr(model, "_keep_in_fp32_modules", None) or ())
    patterns = [re.compile(name) for name in declared]
    wanted = {{}}
    for name, module in model.named_modules(remove_duplicate=False):
        kept = any(k == "" or name == k or name.startswith(k + ".") for k in KEEP_FP32)
        skip = getattr(module, "_non_persistent_buffers_set", set())
        tensors = [*module._parameters.items(), *((n, b) for n, b in module._buffers.items() if n not in skip)]
        for tensor_name, tensor in tensors:
            if tensor is None or not tensor.is_floating_point():
                continue
            key = f"{{name}}.{{tensor_name}}" if name else tensor_name
            keep = kept or any(p.search(key) for p in patterns)
            if id(tensor) not in wanted or keep:  # a tied weight stays float32 if either side keeps it
                wanted[id(tensor)] = (tensor, torch.float32 if keep else dtype)
    with torch.no_grad():
        for tensor, want in wanted.values():
            if tensor.dtype != want:
                tensor.data = tensor.data.to(want)
    # Declared the way transformers models declare theirs, for what honours the declaration.
    declare = [k for k in sorted(KEEP_FP32) if k]
    if declare:
        current = getattr(model, "_keep_in_fp32_modules_strict", None) or ()
        merged = [*current, *(k for k in declare if k not in current)]
        model._keep_in_fp32_modules_strict = set(merged) if isinstance(current, set) else merged
    for module in model.modules():
        owns = any(p.is_floating_point() for p in module.parameters(recurse=False))
        if owns and _cast_to_own_dtype not in module._forward_pre_hooks.values():
            module.register_forward_pre_hook(_cast_to_own_dtype, with_kwargs=True)
    return model


def _cast_to_own_dtype(module, args, kwargs):
    \"\"\"Forward pre-hook: the module's floating tensor inputs in the dtype of its own parameters.\"\"\"
    dtype = next((p.dtype for p in module.parameters(recurse=False) if p.is_floating_point()), None)
    if dtype is None:
        return args, kwargs

    def cast(value):
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
            return value.to(dtype)
        return value

    return tuple(cast(a) for a in args), {{key: cast(value) for key, value in kwargs.items()}}
''',
    )
