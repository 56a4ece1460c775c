"""Low-bit loads read before and after `from_pretrained`: an MXFP4 checkpoint's fallback to bfloat16
and its keys against its quantization config (safetensors headers only, no tensor read).
A training recipe's converted Linears are the trace's to read (trace/lowbit.py).

The MXFP4 fallback mirrors transformers' `Mxfp4HfQuantizer` (quantizers/quantizer_mxfp4.py in
transformers 5.24): `validate_environment` dequantizes a pre-quantized checkpoint to bfloat16 on
a GPU below compute capability 7.5 (line 95), without Triton (line 104) or without the `kernels`
package (line 113); `_process_model_before_weight_loading` does it on the CPU without
`use_kernels=True` (line 179) and on a GPU with it (line 172).
"""

from __future__ import annotations

import json
import struct
from importlib import metadata, util
from pathlib import Path
from typing import Any, Iterable

from dtype_doctor.records import CheckpointKeys, Fallback, LowBit

QUANTIZER = "transformers quantizers/quantizer_mxfp4.py"
# Mxfp4HfQuantizer.serialized_names: each expert weight is saved as its 4-bit blocks and its scales
MXFP4_SERIALIZED = {"gate_up_proj": ("gate_up_proj_blocks", "gate_up_proj_scales"),
                    "down_proj": ("down_proj_blocks", "down_proj_scales")}
TRITON_CUDA, TRITON_CPU = (3, 4), (3, 5)  # is_triton_available("3.4.0") on CUDA, "3.5.0" on CPU/XPU
MXFP4_CAPABILITY = (7, 5)
HEADER_LIMIT = 100_000_000  # the safetensors format's own bound on a header


def header_keys(model_dir: str | Path) -> tuple[str, tuple[str, ...]]:
    """(the files read, every tensor name) of the safetensors files in `model_dir`: the 8-byte
    length and the JSON header of each, never a tensor."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    keys: list[str] = []
    for f in files:
        with open(f, "rb") as fh:
            head = fh.read(8)
            size = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
            if not 0 < size <= HEADER_LIMIT:
                continue  # not a safetensors file: the loader's own check names it
            try:
                header = json.loads(fh.read(size))
            except ValueError:
                continue
        if isinstance(header, dict):
            keys.extend(k for k in header if k != "__metadata__")
    return ", ".join(f.name for f in files), tuple(keys)


def keys_check(method: str | None, keys: Iterable[str], checkpoint: str) -> CheckpointKeys | None:
    """The expert weights the config's loader looks for and the checkpoint lacks, or None when they agree.

    An mxfp4 config looks for `<experts>.gate_up_proj_blocks`/`_scales`; a checkpoint that holds the
    plain `<experts>.gate_up_proj` instead leaves them missing. A checkpoint of blocks and scales
    loaded without an mxfp4 config leaves the plain weights missing. Either way the experts start
    from random weights."""
    names = set(keys)
    plain = [k for k in names if k.rsplit(".", 1)[-1] in MXFP4_SERIALIZED]
    blocks = [k for k in names if k.rsplit(".", 1)[-1] in {b for b, _ in MXFP4_SERIALIZED.values()}]
    if method == "mxfp4":
        wanted = sorted(f"{k}_blocks" for k in plain if f"{k}_blocks" not in names)
        found = sorted(k for k in plain if f"{k}_blocks" not in names)
    elif method is None:
        found = sorted(k for k in blocks if k.removesuffix("_blocks") not in names)
        wanted = [k.removesuffix("_blocks") for k in found]
    else:
        return None
    if not wanted:
        return None
    return CheckpointKeys(method, checkpoint, tuple(wanted[:3]), tuple(found[:3]), len(wanted))


def _version(package: str) -> tuple[int, ...] | None:
    if util.find_spec(package) is None:
        return None
    try:
        return tuple(int(p) for p in metadata.version(package).split(".")[:2] if p.isdigit())
    except metadata.PackageNotFoundError:
        return None


def installed() -> tuple[tuple[int, ...] | None, bool]:
    """(triton's version, whether `kernels` is importable) in this environment."""
    return _version("triton"), util.find_spec("kernels") is not None


def mxfp4_fallback(capability: tuple[int, int] | None, *, triton: tuple[int, ...] | None, kernels: bool,
                   use_kernels: bool = False) -> Fallback | None:
    """Why a pre-quantized MXFP4 checkpoint is dequantized to bfloat16 on this target, in
    transformers' words, or None when it runs in MXFP4. `capability` None is the CPU."""
    cuda = capability is not None
    if cuda and capability < MXFP4_CAPABILITY:
        reason, line = (f"MXFP4 quantization is only supported on GPUs with compute capability >= 7.5; this GPU has "
                        f"{capability[0]}.{capability[1]}"), 95
    elif triton is None or triton < (TRITON_CUDA if cuda else TRITON_CPU):
        need = ".".join(map(str, TRITON_CUDA if cuda else TRITON_CPU))
        have = "not installed" if triton is None else ".".join(map(str, triton))
        have += " in this environment"
        reason, line = f"MXFP4 quantization requires Triton >= {need} (here: {have})", 104
    elif not kernels:
        reason, line = "MXFP4 quantization requires the `kernels` package (not installed in this environment)", 113
    elif cuda and use_kernels:
        reason, line = "use_kernels=True on a GPU runs full-precision kernels", 172
    elif not cuda and not use_kernels:
        reason, line = "MXFP4 inference on CPU requires use_kernels=True", 179
    else:
        return None
    return Fallback("quantization", "mxfp4", "bfloat16 (dequantized)", reason + "; transformers dequantizes the model to bf16",
                    f"{QUANTIZER}:{line}")


def lowbit_of(raw_config: dict[str, Any], model_dir: str | Path | None, capability: tuple[int, int] | None, *,
              use_kernels: bool = False) -> LowBit | None:
    """What an MXFP4 (or MXFP4-saved) checkpoint asks and what ran: None for any other model."""
    qc = raw_config.get("quantization_config") or {}
    method = qc.get("quant_method") if isinstance(qc, dict) else None
    keys = None
    if model_dir is not None and method in (None, "mxfp4"):
        checkpoint, names = header_keys(model_dir)
        keys = keys_check(method, names, checkpoint) if names else None
    if method != "mxfp4":
        return LowBit(method, keys=keys) if keys is not None else None
    if qc.get("dequantize"):
        return LowBit(method, dequantized=True, keys=keys)  # asked for: no fallback
    triton, kernels = installed()
    fallback = mxfp4_fallback(capability, triton=triton, kernels=kernels, use_kernels=use_kernels)
    return LowBit(method, dequantized=fallback is not None, fallback=fallback, keys=keys)


def target_capability(placement: Any) -> tuple[int, int] | None:
    """The compute capability the load targets: the simulated profile's (an A100's when none is
    named), the real GPU's, or None for the CPU."""
    device = str(placement.device or "cpu")
    if not device.startswith("cuda"):
        return None
    if placement.simulated:
        from dtype_doctor.machine.gpus import CAPABILITIES

        profile = placement.profile
        return profile.capability if profile is not None else CAPABILITIES["a100"]
    import torch

    return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]


def lowbit_after_load(model: Any, raw_config: dict[str, Any], model_dir: str | Path | None,
                      kwargs: dict[str, Any]) -> LowBit | None:
    """What a script's own from_pretrained made of an MXFP4 checkpoint (`run`): transformers drops
    the quantizer when it dequantizes, so the model says whether it did; the reason is the
    quantizer's check for this process's GPU (simulated or real) and packages."""
    asked = kwargs.get("quantization_config")
    fields = asked if isinstance(asked, dict) else getattr(asked, "__dict__", {})
    method = getattr(fields.get("quant_method"), "value", fields.get("quant_method"))  # QuantizationMethod is an enum
    config = raw_config if method is None else {
        **raw_config, "quantization_config": {"quant_method": str(method), "dequantize": bool(fields.get("dequantize"))}}
    found = lowbit_of(config, model_dir, _process_capability(), use_kernels=bool(kwargs.get("use_kernels")))
    if found is None or found.method != "mxfp4":
        return found
    kept = getattr(model, "hf_quantizer", None) is not None
    if kept:
        return LowBit("mxfp4", keys=found.keys)
    if found.fallback is not None or found.dequantized:  # a reason of ours, or dequantize=True asked for
        return found
    # dequantized for a reason none of our checks mirrors (a device other than cuda/xpu/cpu: line 64)
    why = Fallback("quantization", "mxfp4", "bfloat16 (dequantized)",
                   "transformers dequantized the model to bf16 (its quantizer's warning on the terminal says why)",
                   f"{QUANTIZER}:64")
    return LowBit("mxfp4", dequantized=True, fallback=why, keys=found.keys)


def _process_capability() -> tuple[int, int] | None:
    import torch

    return tuple(torch.cuda.get_device_capability()) if torch.cuda.is_available() else None  # type: ignore[return-value]
