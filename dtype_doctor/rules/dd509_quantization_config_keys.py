"""DD509: a quantization config that does not match the checkpoint's weight names: the experts
load with random weights.

An mxfp4 config's loader looks for each expert weight as `<name>_blocks` and `<name>_scales`
(Mxfp4HfQuantizer.serialized_names, quantizers/quantizer_mxfp4.py:220); a checkpoint saved in
bf16 holds `<name>`; a checkpoint of blocks and scales loaded without an mxfp4 config leaves the
plain weights unfound. transformers reports them as missing and initialises them at random.
Read from the safetensors headers: no tensor is loaded.
"""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, Trace
from dtype_doctor.rules.base import Rule


def check(trace: Trace) -> Iterator[Finding]:
    low = trace.loaded.lowbit if trace.loaded is not None else None
    keys = low.keys if low is not None else None
    if keys is None:
        return
    # a dequantized mxfp4 load takes the plain names too: the mismatch waits for the GPU that keeps MXFP4
    waits = low.method == "mxfp4" and low.dequantized
    asked = f"an {keys.method} quantization config" if keys.method else "no quantization config"
    yield RULE.finding(
        f"{asked} against {keys.checkpoint}: the loader looks for {', '.join(keys.expected)} and the header holds "
        f"{', '.join(keys.found)} — {keys.missing} expert weights start from random values"
        + (" on a machine that keeps MXFP4 (this one dequantizes, and loads them)" if waits else ""),
        stage="model-loading",
        severity="warning" if waits else "error",
        hints=("load with the quantization_config the checkpoint was saved with (config.json's quantization_config: "
               "mxfp4 for *_blocks/*_scales, none for plain weights)",),
    )


RULE = Rule(
    code="DD509",
    name="quantization-config-checkpoint-keys-mismatch",
    severity="error",
    summary="A quantization config whose weight names the checkpoint does not hold (mxfp4 *_blocks/*_scales against plain weights, or the reverse): experts with random weights.",
    why=(
        "A quantizer renames what it loads: MXFP4's experts are saved as blocks and scales. Under the wrong config the "
        "loader finds none of them and transformers initialises the experts at random — the model loads, runs and "
        "trains, and answers nonsense."
    ),
    example=(
        "config.json: \"quantization_config\": {\"quant_method\": \"mxfp4\"}; model.safetensors: model.layers.0.mlp.experts.gate_up_proj\n"
        "from_pretrained(...)  # on a GPU with triton and kernels: gate_up_proj_blocks MISSING, initialised at random"
    ),
    fix="Load with the quantization config the checkpoint was saved with.",
    fix_safety="display-only.",
    check=check,
    references=("https://github.com/huggingface/transformers/blob/main/src/transformers/quantizers/quantizer_mxfp4.py",),
    device_note="Read from the safetensors header; the same on every machine that keeps MXFP4 (a warning where it is dequantized).",
)
