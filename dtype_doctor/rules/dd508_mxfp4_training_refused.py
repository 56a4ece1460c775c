"""DD508: training a model that stayed MXFP4: transformers' Trainer refuses it before the first step.

Mxfp4HfQuantizer.is_trainable is False (quantizers/quantizer_mxfp4.py:209), and Trainer's
`validate_quantization_for_training` (trainer_utils.py:131 and :137, called at trainer.py:456)
raises "You cannot perform fine-tuning on purely quantized models" without adapters, and "The
model you are trying to fine-tune is quantized with mxfp4 but that quantization method do not
support training" with them. Only the target GPU shows it: on a machine where the checkpoint is
dequantized (DD507) the model is bf16 and trains.
"""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, Trace
from dtype_doctor.rules.base import Rule

ERROR = ("ValueError: The model you are trying to fine-tune is quantized with mxfp4 but that quantization method do "
         "not support training")


def check(trace: Trace) -> Iterator[Finding]:
    low = trace.loaded.lowbit if trace.loaded is not None else None
    if not trace.train or low is None or low.method != "mxfp4" or low.dequantized:
        return
    yield RULE.finding(
        f"training an MXFP4 model on {trace.gpu or trace.device}: transformers' Trainer refuses it before the first step "
        f"(MXFP4 is not trainable: {ERROR})",
        stage="model-loading",
        pytorch_error=ERROR,
        hints=("load it for training with quantization_config=Mxfp4Config(dequantize=True) (bf16 experts), then train "
               "those or LoRA adapters on them",),
    )


RULE = Rule(
    code="DD508",
    name="mxfp4-training-refused",
    severity="error",
    summary="Training a model loaded in MXFP4: transformers' Trainer refuses MXFP4 before the job starts.",
    why=(
        "The MXFP4 experts are packed 4-bit blocks with no gradient; transformers marks the quantizer not trainable and "
        "Trainer raises before the first step — after the job was queued and the checkpoint loaded on the GPU."
    ),
    example=(
        "model = AutoModelForCausalLM.from_pretrained('openai/gpt-oss-20b')   # MXFP4 on an H100\n"
        "Trainer(model=model, ...).train()\n"
        "ValueError: The model you are trying to fine-tune is quantized with mxfp4 but that quantization method do not support training"
    ),
    fix="Load with Mxfp4Config(dequantize=True) for training.",
    fix_safety="display-only.",
    check=check,
    references=("https://github.com/huggingface/transformers/blob/main/src/transformers/trainer_utils.py",
                "https://huggingface.co/docs/transformers/quantization/mxfp4"),
    device_note="Only a target that keeps MXFP4 (triton, kernels, compute capability 7.5+) shows it; elsewhere see DD507.",
)
