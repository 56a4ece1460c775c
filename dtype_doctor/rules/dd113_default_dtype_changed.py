"""DD113: a training step runs in the dtype transformers 5's default loaded, where transformers 4 gave float32.

Reported for a step that trains (a backward): the harm the new default does is a fine-tuning script
that trained in float32 and now trains in bf16 with no error. For inference, loading the
checkpoint's dtype is what the default is for, and most hub checkpoints are bf16: an info on every
such scan would be noise, so `target.loaded_dtype` alone says what loaded, from where, and what
transformers 4 would have loaded.
"""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, Trace
from dtype_doctor.rules.base import Rule

_WHENCE = {"config": "config.json's \"dtype\"", "checkpoint": "the checkpoint's weights"}


def check(trace: Trace) -> Iterator[Finding]:
    loaded = trace.loaded
    if loaded is None or loaded.asked is not None or loaded.v4_dtype is None or loaded.dtype == loaded.v4_dtype:
        return
    if not trace.train:
        return  # inference in the checkpoint's dtype is what the new default is for; target.loaded_dtype says it
    if not (loaded.library or "").startswith("transformers 5"):
        return
    whence = _WHENCE.get(loaded.origin, loaded.origin)
    training = f" The step trains in {loaded.dtype}: its weights and the optimizer's state are {loaded.dtype} (DD110)."
    yield RULE.finding(
        f"from_pretrained named no dtype and loaded {loaded.dtype} from {whence}: transformers 5 defaults to "
        f"dtype=\"auto\"; transformers 4 loaded {loaded.v4_dtype} for the same call.{training}",
        module="",
        module_type=trace.model.class_name,
        stage="model-loading",
        hints=(f"name the dtype you mean: from_pretrained(..., dtype=torch.{loaded.dtype}) to keep this, "
               f"or dtype=torch.{loaded.v4_dtype} for what transformers 4 gave",),
    )


RULE = Rule(
    code="DD113",
    name="default-dtype-changed",
    severity="info",
    summary="A training step runs in the checkpoint's dtype because transformers 5 defaults to dtype=\"auto\"; transformers 4 loaded float32.",
    why=(
        "transformers 5 made dtype=\"auto\" the default of from_pretrained (huggingface/transformers#42805, superseding "
        "#34919; documented in #42883): a call that names no dtype loads config.json's dtype, or the weights' own, "
        "where transformers 4 loaded torch's default float32. A script that fine-tuned in float32 now trains a bf16 "
        "checkpoint in bf16, with no error and a different result."
    ),
    example="model = AutoModelForCausalLM.from_pretrained('meta-llama/Llama-3.2-1B')\n"
            "model.dtype  # transformers 4: torch.float32; transformers 5: torch.bfloat16",
    fix="Name the dtype in the call: dtype=torch.bfloat16 to keep the new behaviour, dtype=torch.float32 for the old.",
    fix_safety="display-only: the dtype is an argument of your loading code.",
    check=check,
    references=("https://github.com/huggingface/transformers/pull/42805", "https://github.com/huggingface/transformers/pull/34919",
                "https://github.com/huggingface/transformers/pull/42883"),
    device_note="The same on every device: it is the load's dtype, before any kernel.",
)
