"""DD505: a bitsandbytes model whose device map offloads modules to cpu/disk without
llm_int8_enable_fp32_cpu_offload: transformers refuses to load it."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.quantization import offload_refused, offloaded
from dtype_doctor.records import Finding, Remedy, Trace
from dtype_doctor.rules.base import Rule
from dtype_doctor.rules.words import listed


def _offload(trace: Trace) -> tuple[str, ...]:
    """The offloaded modules of a quantized model transformers refuses to load, else ()."""
    q = trace.model.quantization
    if q is None or not q.method.startswith("bitsandbytes") or q.fp32_cpu_offload or not offload_refused(q.device_map):
        return ()
    return offloaded(q.device_map)


def check(trace: Trace) -> Iterator[Finding]:
    modules = _offload(trace)
    if not modules:
        return
    q = trace.model.quantization
    assert q is not None
    bits = q.method.removeprefix("bitsandbytes-").replace("bit", "-bit")
    places = {d for _, d in q.device_map}
    where = " and ".join(d for d in ("cpu", "disk") if d in places)
    gpus = sorted(d for d in places if d not in ("cpu", "disk"))
    beside = f" beside {listed(gpus)}" if gpus else ""
    error = trace.failure.message if trace.failure is not None and trace.failure.phase == "load" else None
    yield RULE.finding(
        f"the device map puts {len(modules)} module(s) of this {bits} model on {where}{beside} ({listed(modules, most=5)}), and "
        "llm_int8_enable_fp32_cpu_offload is off: transformers refuses to load it (\"Some modules are dispatched on the "
        "CPU or the disk\"), before any step; with the flag on, the offloaded modules are kept float32 and not quantized",
        module=modules[0],
        stage="model-loading",
        pytorch_error=error,
        remedies=(Remedy("bnb-fp32-cpu-offload", "model", "True", "model-loading"),),
        hints=("or give the GPUs more memory (max_memory) so that nothing is offloaded",),
    )


def _explains(trace: Trace) -> bool:
    return trace.failure is not None and trace.failure.phase == "load" and bool(_offload(trace))


RULE = Rule(
    code="DD505",
    name="bnb-offload-without-fp32",
    severity="error",
    summary="A bitsandbytes (8-bit or 4-bit) model whose device map offloads modules to cpu/disk without llm_int8_enable_fp32_cpu_offload=True: transformers refuses to load it.",
    why=(
        "bitsandbytes' quantized layers are placed on the device the map gives them; transformers' bitsandbytes quantizers "
        "(quantizer_bnb_8bit.py, quantizer_bnb_4bit.py, validate_environment) refuse a device map that puts some modules on "
        "\"cpu\" or \"disk\" beside others unless the config sets llm_int8_enable_fp32_cpu_offload=True, which leaves the "
        "offloaded modules unquantized in float32. The load stops with a ValueError before any step: this usually means the "
        "quantized model does not fit the GPU memory the map was planned with."
    ),
    example=(
        "AutoModelForCausalLM.from_pretrained(path, quantization_config=BitsAndBytesConfig(load_in_8bit=True),\n"
        "    device_map={'model.embed_tokens': 0, 'model.layers.0': 0, 'model.layers.1': 'cpu', 'model.norm': 'cpu', 'lm_head': 'cpu', ...})\n"
        "ValueError: Some modules are dispatched on the CPU or the disk. Make sure you have enough GPU RAM to fit the quantized model. ..."
    ),
    fix="BitsAndBytesConfig(load_in_8bit=True, llm_int8_enable_fp32_cpu_offload=True): the offloaded modules stay float32; or give the GPU more memory.",
    fix_safety="Safe: the modules the map offloads are kept float32 (more memory on the cpu/disk, no quantization error there); the GPU modules are quantized as before.",
    check=check,
    references=("https://huggingface.co/docs/transformers/main/en/quantization/bitsandbytes#offloading",),
    device_note="transformers' check, the same on every machine: judged on the device map before any weight is placed.",
    explains=_explains,
)
