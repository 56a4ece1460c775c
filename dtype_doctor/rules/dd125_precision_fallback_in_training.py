"""DD125: a precision the user asked for fell back silently, and the step trains in another.

The fallbacks are the report's `requested` rows (records/requested.py): an MXFP4 checkpoint
dequantized to bfloat16 (transformers' quantizer_mxfp4.py, see DD507), autocast asked for (scan's
--autocast, the API's autocast=) and no forward op run under it, a launcher's mixed precision that
left a float32 model without autocast. A script's own torch.autocast that disables itself is not yet
seen (it is no request the doctor records).
"""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, Trace
from dtype_doctor.records.requested import requested_of
from dtype_doctor.rules.base import Rule


def check(trace: Trace) -> Iterator[Finding]:
    if not trace.train:
        return
    for row in requested_of(trace):
        fb = row.fallback
        if fb is None or not fb.changes_training:
            continue
        yield RULE.finding(
            f"{row.model} was asked for {fb.requested} ({row.setting}) and trains in {fb.actual}: {fb.reason}"
            + (f" ({fb.mirrors})" if fb.mirrors else ""),
            stage="model-loading" if row.setting in ("dtype", "quantization") else "model-code",
            hints=("make the precision you train in the one you ask for: fix the cause above, or ask for the precision "
                   "that runs, so the run's memory and numbers are the ones you planned",),
        )


RULE = Rule(
    code="DD125",
    name="precision-fallback-in-training",
    severity="warning",
    summary="A requested precision (quantization, autocast, launcher mixed precision) fell back silently and the step trains in another.",
    why=(
        "Libraries fall back with one log line: transformers dequantizes an MXFP4 checkpoint to bfloat16 when triton, "
        "the kernels package or the GPU is missing, and a launcher's mixed precision can leave a float32 model without "
        "autocast. The run then trains at another precision than planned — other memory, other numbers — and "
        "nothing fails (unsloth#8165)."
    ),
    example=(
        "model = AutoModelForCausalLM.from_pretrained('openai/gpt-oss-20b')   # no triton here\n"
        "MXFP4 quantization requires Triton ... We will default to dequantizing the model to bf16.\n"
        "Trainer(model=model, ...).train()   # trains bf16 experts, not MXFP4"
    ),
    fix="Remove the cause the finding names, or ask for the precision that actually runs.",
    fix_safety="display-only.",
    check=check,
    references=("https://github.com/unslothai/unsloth/issues/8165",
                "https://github.com/huggingface/transformers/blob/main/src/transformers/quantizers/quantizer_mxfp4.py"),
    device_note="Training only; the report's `requested` rows show every fallback, training or not.",
)
