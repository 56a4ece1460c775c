"""DD115: torch's default dtype left changed by a library: set by its `torch.set_default_dtype`
call and not set back before the step.

Every floating tensor made without dtype= (torch.zeros, torch.tensor([1.0]), torch.arange(0.)),
and every module built, takes the default dtype: a library that sets it to bfloat16 to build its
model and does not restore it (sglang#34440) leaves the script's own tensors and models bfloat16,
silently. transformers' from_pretrained sets it and restores it: only a change still in force
when the step runs is reported, with the library's line and the script's call into it.
"""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, Trace
from dtype_doctor.rules.base import Rule

NAME = "torch.get_default_dtype()"


def check(trace: Trace) -> Iterator[Finding]:
    state = trace.precision
    if state is None or not state.default_dtype:
        return
    last = state.default_dtype[-1]
    now = state.switch(NAME)
    if last.setter.by != "library" or now is None or now.value != last.dtype or last.dtype == (now.initial or "float32"):
        return
    setter = last.setter
    made = [p for p in trace.model.parameters if p.dtype == last.dtype]
    built = (f" The model's parameters are {last.dtype} too ({len(made)} of {len(trace.model.parameters)})."
             if made else "")
    yield RULE.finding(
        f"torch's default dtype is {last.dtype}: {setter.words()} called torch.set_default_dtype(torch.{last.dtype}) "
        f"(it was {last.before}) and did not set it back. Every floating tensor made without dtype= since, and every "
        f"module built since, is {last.dtype}.{built}",
        module_type=trace.model.class_name, stage="model-loading", source=setter.via,
        hints=(f"set it back after the library's call: torch.set_default_dtype(torch.{last.before})"
               + (f" after your line {setter.via.file}:{setter.via.line}" if setter.via else ""),),
    )


RULE = Rule(
    code="DD115",
    name="default-dtype-left-changed",
    severity="warning",
    summary="A library changed torch's default dtype (torch.set_default_dtype) and did not set it back before the step.",
    why=(
        "The default dtype is process-wide: every floating tensor made without dtype= and every module built takes it. "
        "A library that sets it to bfloat16 or float16 to build its own model and does not restore it leaves the script's "
        "tensors, losses and models in half precision, with no error."
    ),
    example="import some_library  # calls torch.set_default_dtype(torch.bfloat16) and never restores it\n"
            "torch.zeros(3).dtype  # torch.bfloat16",
    fix="Set the default back after the library's call (torch.set_default_dtype(torch.float32)), or name dtype= where it matters.",
    fix_safety="display-only: where to restore it is a choice of the script's.",
    check=check,
    references=("https://github.com/sgl-project/sglang/issues/34440",
                "https://docs.pytorch.org/docs/stable/generated/torch.set_default_dtype.html"),
    device_note="The same on every device: it is the dtype tensor factories choose, before any kernel.",
)
