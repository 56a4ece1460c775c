"""DD406: a checkpoint's weights saved in another dtype than the model they are loaded into.

`Module.load_state_dict` copies each saved tensor into the parameter's own dtype (`param.copy_`),
with no warning: float32 weights loaded into a bfloat16 model are rounded to bfloat16, bfloat16
weights loaded into a float32 model come back float32 with bfloat16's precision. Read from the
`load_state_dict` calls a `run` saw (run/resume.py), and by `scan --checkpoint PATH` from the
checkpoint's saved dtypes, read without loading its tensors (load/checkpoint.py).
"""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.load.checkpoint import matched
from dtype_doctor.records import Finding, Trace
from dtype_doctor.rules.base import Rule

_WIDTH = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}


def _effect(saved: str, own: str) -> tuple[str, str]:
    if _WIDTH.get(own, 4) < _WIDTH.get(saved, 4):
        return f"rounded to {own} as they are copied in", "warning"
    return f"copied into {own}, holding {saved}'s precision", "info"


def check(trace: Trace) -> Iterator[Finding]:
    casts = [c for c in trace.resume.casts if c.kind == "model"] if trace.resume is not None else []
    for c in casts:
        effect, severity = _effect(c.saved, c.loaded)
        yield RULE.finding(
            f"{c.class_name}.load_state_dict loaded {c.count} {c.saved} tensor(s) (e.g. {c.param}) into the model's "
            f"{c.loaded} parameters: {effect}.", severity=severity, stage="model-loading", source=c.source,
            hints=(f"build the model in {c.saved} before loading, or convert the checkpoint on purpose",))
    saved = trace.checkpoint
    if saved is None:
        return
    state = {s.name: s.dtype for s in trace.model.state}
    found = matched(saved, list(state))
    groups: dict[tuple[str, str], list[str]] = {}
    for name, dtype in found.items():
        if dtype != state[name] and dtype in _WIDTH and state[name] in _WIDTH:
            groups.setdefault((dtype, state[name]), []).append(name)
    for (dtype, own), names in groups.items():
        effect, severity = _effect(dtype, own)
        yield RULE.finding(
            f"{saved.path} ({saved.format}) holds {len(names)} tensor(s) as {dtype} (e.g. {names[0]}) that the model holds "
            f"as {own}: loaded with load_state_dict, they are {effect}.", severity=severity, stage="model-loading",
            module=names[0].rsplit(".", 1)[0] if "." in names[0] else "",
            hints=(f"build the model in {dtype} to resume it as saved, or convert the checkpoint on purpose",))
    if not found and saved.tensors:
        yield RULE.finding(
            f"{saved.path} ({saved.format}): none of its {len(saved.tensors)} tensor name(s) (e.g. {saved.tensors[0][0]}) is a "
            "parameter or buffer of the model scanned: its dtypes could not be compared.", severity="info",
            stage="model-loading")


RULE = Rule(
    code="DD406",
    name="checkpoint-dtype-differs",
    severity="warning",
    summary="A checkpoint's weights are saved in another dtype than the model they are loaded into (load_state_dict casts them).",
    why=(
        "Module.load_state_dict copies each saved tensor into the parameter's own dtype, with no warning: float32 weights "
        "resumed into a bfloat16 model are rounded; a run resumed in another precision than it was saved in is not the "
        "run it continues."
    ),
    example="model = build().to(torch.bfloat16)\nmodel.load_state_dict(torch.load('ckpt.pt')['model'])  # float32 weights, rounded",
    fix="Build the model in the checkpoint's dtype before loading (then convert it on purpose), or save in the dtype you resume in.",
    fix_safety="display-only: the dtypes are the script's resume.",
    check=check,
    references=("https://docs.pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.load_state_dict",
                "https://github.com/pytorch/torchtitan/issues/4615"),
    device_note="The same on every device: the copy's cast.",
)
