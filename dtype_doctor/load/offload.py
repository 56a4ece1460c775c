"""A bitsandbytes model whose device map offloads to cpu/disk: what transformers refuses while loading.

transformers' bitsandbytes quantizers (`Bnb8BitHfQuantizer`, `Bnb4BitHfQuantizer`) check the
device map in `validate_environment`: a map with modules on "cpu" or "disk" beside others
(a GPU, or cpu beside disk) is a `ValueError` unless the config sets
`llm_int8_enable_fp32_cpu_offload=True`, which keeps the offloaded modules in float32. The load
stops there, before any step, so there is no step to trace: the refusal itself is the trace
(`refused_trace`, a Trace of no ops whose failure is at phase "load"), which DD505 judges.

Two ways in:
- `run`: the script's own `from_pretrained` raised; `refusal_of(error)` reads the quantizer
  and the device map off transformers' frame (`validate_environment`), so the verdict is the
  library's own check on the script's own map.
- `scan --simulate --device-map ... --load-in-8bit`: `planned_refusal` plans the map the way
  `from_pretrained(device_map=..., max_memory=...)` does (transformers' own placement, with the
  quantizer's sizes) over the simulated GPUs, and asks the quantizer's `validate_environment`.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any, Mapping

from dtype_doctor.quantization import offload_refused
from dtype_doctor.records import ModelInfo, QuantizationInfo, Trace, TraceFailure

_QUANTIZERS = {"Bnb8BitHfQuantizer": "bitsandbytes-8bit", "Bnb4BitHfQuantizer": "bitsandbytes-4bit"}


@dataclass(frozen=True, slots=True)
class LoadRefusal:
    """transformers refused to load a quantized model for its device map: the quantization (its
    `device_map` the map refused) and transformers' words."""

    quantization: QuantizationInfo
    message: str
    class_name: str = ""


def info_of(config: Any, method: str, device_map: Mapping[str, Any], layers: int = 0) -> QuantizationInfo:
    """The QuantizationInfo a BitsAndBytesConfig and a device map describe (before any layer exists)."""
    from dtype_doctor.records import dtype_name

    readable = tuple((str(m), _device(d)) for m, d in device_map.items())
    offload = bool(getattr(config, "llm_int8_enable_fp32_cpu_offload", False))
    if method == "bitsandbytes-8bit":
        return QuantizationInfo(method, "int8", "float16", "int8", layers, fp32_cpu_offload=offload, device_map=readable)
    storage = getattr(config, "bnb_4bit_quant_storage", None)
    compute = getattr(config, "bnb_4bit_compute_dtype", None)
    return QuantizationInfo(
        method, dtype_name(storage) if storage is not None else "uint8",
        dtype_name(compute) if compute is not None else None, getattr(config, "bnb_4bit_quant_type", None), layers,
        double_quant=bool(getattr(config, "bnb_4bit_use_double_quant", False)), fp32_cpu_offload=offload, device_map=readable,
    )


def _device(d: Any) -> str:
    """A device-map value as the report reads it: cuda:k for a GPU index, else as written."""
    if isinstance(d, int) and not isinstance(d, bool):
        return f"cuda:{d}"
    text = str(d)
    return f"cuda:{text}" if text.isdigit() else text


def refusal_of(error: BaseException) -> LoadRefusal | None:
    """The LoadRefusal a `from_pretrained` error is, read off transformers' bitsandbytes quantizer
    frame (its `self` and the `device_map` it checked); None for any other error."""
    if not isinstance(error, ValueError):
        return None
    for frame, _line in traceback.walk_tb(error.__traceback__):
        if frame.f_code.co_name != "validate_environment":
            continue
        quantizer = frame.f_locals.get("self")
        method = _QUANTIZERS.get(type(quantizer).__name__)
        device_map = frame.f_locals.get("device_map")
        if method is None or not isinstance(device_map, Mapping):
            continue
        info = info_of(quantizer.quantization_config, method, device_map)
        if offload_refused(info.device_map) and not info.fp32_cpu_offload:
            return LoadRefusal(info, str(error).strip().splitlines()[0])
    return None


def refused_trace(refusal: LoadRefusal, *, device: str = "cpu", simulated: bool = False, gpu: Any = None) -> Trace:
    """The Trace of a load transformers refused: no ops, the quantization, the failure at phase "load"."""
    failure = TraceFailure("other", refusal.message, "", "", None, phase="load")
    model = ModelInfo(refusal.class_name, (), quantization=refusal.quantization)
    return Trace((), (), model, (), device=device, simulated=simulated, failure=failure,
                 values="not measured: the model was not loaded",
                 gpu=str(gpu) if gpu is not None else None, gpu_capability=getattr(gpu, "capability", None))


def planned_refusal(cls: Any, config: Any, bnb_config: Any, strategy: str | Mapping[str, Any],
                    gpus: int, gpu: Any, max_memory: Any = ()) -> LoadRefusal | None:
    """What `cls.from_pretrained(..., quantization_config=bnb_config, device_map=strategy,
    max_memory=...)` decides on `gpus` simulated GPUs of profile `gpu`: the model built on meta,
    converted by the quantizer as transformers converts it, placed by transformers' own
    placement with the quantizer's sizes, then the quantizer's own check. None when it loads."""
    import torch
    from transformers.integrations import accelerate as hf_accelerate
    from transformers.quantizers import AutoHfQuantizer

    from dtype_doctor.machine.device_map import max_memory_of, plan, simulated_gpus
    from dtype_doctor.machine.placement import DEVICE_MAPS

    quantizer = AutoHfQuantizer.from_config(bnb_config, pre_quantized=False)
    method = _QUANTIZERS.get(type(quantizer).__name__)
    if method is None:
        return None
    with torch.device("meta"):
        model = cls._from_config(config)
    if isinstance(strategy, Mapping) or strategy not in DEVICE_MAPS:  # the user's own map
        device_map: Mapping[str, Any] = plan(model, strategy, gpus, gpu, max_memory)[0]
    else:
        quantizer.preprocess_model(model, device_map=strategy)
        no_split = model._no_split_modules
        with simulated_gpus(gpus, gpu):
            memory: dict[Any, Any] = dict(max_memory_of(gpus, gpu, max_memory))
            if strategy != "sequential":
                memory = hf_accelerate.get_balanced_memory(model, max_memory=memory, no_split_module_classes=no_split,
                                                           hf_quantizer=quantizer, low_zero=strategy == "balanced_low_0")
            memory = quantizer.adjust_max_memory(dict(memory))
            device_map = hf_accelerate.infer_auto_device_map(model, max_memory=memory, no_split_module_classes=no_split,
                                                             hf_quantizer=quantizer)
    layers = sum(1 for m in model.modules() if type(m).__module__.startswith("bitsandbytes"))
    try:
        quantizer.validate_environment(device_map=dict(device_map))
    except ValueError as exc:
        info = info_of(bnb_config, method, device_map, layers)
        return LoadRefusal(info, str(exc).strip().splitlines()[0], type(model).__name__)
    return None


def scan_refusal(spec: str, quantize: Any, placement: Any) -> LoadRefusal | None:
    """`scan --simulate` of a bitsandbytes model with a device map (--device-map/--gpus/--max-memory):
    the refusal `from_pretrained` would raise on those simulated GPUs, or None (then the usual
    loading goes on, which refuses to simulate a quantized model). `quantize` is the --load-in-*
    request, else the checkpoint's own bitsandbytes quantization_config is read."""
    if not placement.simulated or placement.device_map is None:
        return None
    import json

    import transformers

    from dtype_doctor.load.model import resolve_model_dir

    model_dir = resolve_model_dir(spec)
    try:
        raw = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # the loader names what is wrong with it
    if quantize is not None:
        bnb_config = quantize.config()
    elif isinstance(raw.get("quantization_config"), dict) and raw["quantization_config"].get("quant_method") == "bitsandbytes":
        bnb_config = transformers.BitsAndBytesConfig.from_dict(raw["quantization_config"])
    else:
        return None
    arch = (raw.get("architectures") or [""])[0]
    cls = getattr(transformers, arch, None) if str(arch).isidentifier() else None
    if not isinstance(cls, type) or not issubclass(cls, transformers.PreTrainedModel):
        return None  # remote code: the loader refuses or loads it, never this check
    config = transformers.AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    return planned_refusal(cls, config, bnb_config, placement.device_map, placement.gpus,
                           placement.profile, placement.max_memory)
