"""DD404: an optimizer state tensor of another dtype or device than its parameter when the step runs.

Adam and AdamW update `exp_avg.lerp_(grad, 1 - beta1)`: float32 moments beside bfloat16 gradients
raise RuntimeError ("expected dtype float for `end` but got dtype c10::BFloat16", on this CPU too;
pytorch#191918, DeepSpeed#7746). It happens after a resume that loaded the optimizer's state before
the model was converted (torch's load_state_dict casts the state to the parameters' dtype as they
are then), or a model converted after its optimizer stepped. An optimizer whose update takes the
mix (SGD's momentum `buf.mul_(m).add_(grad)`) steps on, its state and parameter in two dtypes: a
warning. The check runs in the optimizer's step pre-hook, before the crash (run/resume.py).
"""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, Trace
from dtype_doctor.rules.base import Rule


def check(trace: Trace) -> Iterator[Finding]:
    resume = trace.resume
    if resume is None:
        return
    by_optimizer: dict[str, list] = {}
    for m in resume.mismatches:
        by_optimizer.setdefault(m.class_name, []).append(m)
    refused = {op.index: op.error for op in trace.ops if op.error}
    error = next((refused[i] for i in resume.refused_ops if i in refused), None)
    for cls, found in by_optimizer.items():
        m = found[0]
        keys = ", ".join(dict.fromkeys(x.key for x in found))
        params = list(dict.fromkeys(x.param for x in found))
        more = f" (and {len(params) - 1} more parameter(s) alike)" if len(params) > 1 else ""
        loaded = (f" The state was restored at {m.loaded_at.file}:{m.loaded_at.line} (load_state_dict casts it to the "
                  "parameters' dtype as they were then)." if m.loaded_at else "")
        stepped = all(x.stepped for x in found)
        outcome = ("its update refuses the two dtypes, and the step raises" if not stepped else
                   "its step went on, the update computed in the state's dtype and written into the parameter's")
        yield RULE.finding(
            f"{cls}'s {keys} of {m.param} is {m.state} where the parameter is {m.parameter}{more}: {outcome}.{loaded}",
            severity="warning" if stepped else "error", stage="optimizer", source=m.source,
            pytorch_error=f"RuntimeError: {error}" if error and not stepped else None,
            hints=("load the optimizer's state after the model has its final dtype and device (torch casts it to the "
                   "parameters' on load), or build the optimizer after converting the model",))


def explains(trace: Trace) -> bool:
    return trace.resume is not None and any(not m.stepped for m in trace.resume.mismatches)


RULE = Rule(
    code="DD404",
    name="optimizer-state-dtype-mismatch",
    severity="error",
    summary="An optimizer state tensor (Adam's exp_avg) has another dtype or device than its parameter when the step runs.",
    why=(
        "Adam's update mixes each moment with its gradient in place (exp_avg.lerp_(grad)); float32 moments beside "
        "bfloat16 gradients raise RuntimeError. A resume that loads the optimizer's state before converting the model, "
        "or a model converted after its optimizer stepped, leaves the two apart."
    ),
    example="optimizer.load_state_dict(ckpt['optimizer'])  # float32 moments\nmodel.to(torch.bfloat16)\n"
            "optimizer.step()  # RuntimeError: expected dtype float for `end` but got dtype c10::BFloat16",
    fix="Load the optimizer's state after the model has its final dtype and device, or build the optimizer after the conversion.",
    fix_safety="display-only: the order of the script's resume.",
    check=check,
    explains=explains,
    references=("https://github.com/pytorch/pytorch/issues/191918", "https://github.com/deepspeedai/DeepSpeed/issues/7746"),
    device_note="The same on every device: the in-place update's dtype check.",
)
