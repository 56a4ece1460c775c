"""DD405: an optimizer's saved state cast to its parameters' dtype by load_state_dict.

torch.optim.Optimizer.load_state_dict casts every floating state tensor (Adam's exp_avg and
exp_avg_sq) to its parameter's dtype and device (Optimizer._process_value_according_to_param_policy),
silently: float32 moments resumed into a bfloat16 model become bfloat16 (the update's precision
is lost), bfloat16 moments resumed into a float32 model become float32 (twice the memory, and the
run no longer matches the one it resumes; torchtitan#4615). The load is shown first in the test.
"""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, Trace
from dtype_doctor.rules.base import Rule

_WIDTH = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}


def check(trace: Trace) -> Iterator[Finding]:
    resume = trace.resume
    if resume is None:
        return
    groups: dict[tuple, list] = {}
    for c in resume.casts:
        if c.kind == "optimizer":
            groups.setdefault((c.class_name, c.saved, c.loaded, c.source), []).append(c)
    for (cls, saved, loaded, source), casts in groups.items():
        keys = sorted({c.key for c in casts})
        narrower = _WIDTH.get(loaded, 4) < _WIDTH.get(saved, 4)
        effect = (f"the update now keeps its moments in {loaded}, not the {saved} they were trained in" if narrower else
                  f"the state takes {_WIDTH.get(loaded, 4) // max(_WIDTH.get(saved, 4), 1)}x the memory it was saved in, and "
                  "the resumed run no longer matches the one it resumes")
        yield RULE.finding(
            f"{cls}.load_state_dict cast {len(casts)} saved state tensor(s) ({', '.join(keys)}) from {saved} to {loaded}, the "
            f"dtype of their parameters (e.g. {casts[0].param}): {effect}.",
            stage="optimizer", source=source,
            hints=(f"resume into a model in the dtype the state was saved with ({saved}), or convert the state on purpose",),
        )


RULE = Rule(
    code="DD405",
    name="optimizer-state-cast-on-load",
    severity="warning",
    summary="Optimizer.load_state_dict cast the saved state (Adam's moments) to another dtype: the parameters'.",
    why=(
        "Optimizer.load_state_dict casts every floating state tensor to its parameter's dtype and device, with no "
        "warning: float32 moments resumed into a bfloat16 model lose their precision, bfloat16 moments resumed into a "
        "float32 model double their memory and change the resumed run."
    ),
    example="optimizer.load_state_dict(torch.load('ckpt.pt')['optimizer'])  # saved float32\n"
            "optimizer.state[p]['exp_avg'].dtype  # torch.bfloat16: the model is bfloat16",
    fix="Resume into a model in the dtype the state was saved with, or convert the state deliberately.",
    fix_safety="display-only: the dtypes are the script's resume.",
    check=check,
    references=("https://github.com/pytorch/torchtitan/issues/4615",
                "https://docs.pytorch.org/docs/stable/generated/torch.optim.Optimizer.load_state_dict.html"),
    device_note="The same on every device: the load's own cast.",
)
