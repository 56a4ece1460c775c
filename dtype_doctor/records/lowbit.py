"""Low-bit formats as the doctor saw them (docs/report.md, `precision.requested`): what a model's
quantization config asked for against what its checkpoint holds and what ran, and the Linear
layers a microscaling (MX/NVFP4) training recipe converts. Read by DD125 and DD507-DD512."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Elements that share one scale: the OCP MX formats (MXFP8, MXFP6, MXFP4) take 32, NVFP4 16.
BLOCK_SIZE = {"mxfp8": 32, "mxfp6": 32, "mxfp4": 32, "nvfp4": 16}
# Blackwell's block-scaled tensor cores (tcgen05): torchao's `is_sm_at_least_100()`.
MX_CAPABILITY = (10, 0)


@dataclass(frozen=True, slots=True)
class Fallback:
    """A precision the user asked for that did not run, and why, in the library's own words."""

    setting: str  # "quantization" | "attention" | "autocast"
    requested: str  # "mxfp4", "flash_attention_2", "autocast(cuda, float16)"
    actual: str  # "bfloat16 (dequantized)", "sdpa"
    reason: str
    mirrors: str = ""  # the library check it mirrors: "transformers quantizers/quantizer_mxfp4.py:104"
    changes_training: bool = False  # the step trains in another precision than the one asked for

    def to_dict(self) -> dict[str, Any]:
        return {"setting": self.setting, "requested": self.requested, "actual": self.actual, "reason": self.reason,
                "mirrors": self.mirrors, "changes_training": self.changes_training}


@dataclass(frozen=True, slots=True)
class CheckpointKeys:
    """A quantization config's expected weight names against the checkpoint's safetensors header."""

    method: str | None  # the config's quant_method, None for no quantization config
    checkpoint: str  # the weight file(s) read (header only)
    expected: tuple[str, ...]  # names the config's loader looks for and the header lacks (first few)
    found: tuple[str, ...]  # the header's names for the same weights (first few)
    missing: int  # how many weights the loader will not find: initialised at random

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "checkpoint": self.checkpoint, "expected": list(self.expected),
                "found": list(self.found), "missing": self.missing}


@dataclass(frozen=True, slots=True)
class MxLinear:
    """One Linear a microscaling training recipe converts."""

    module: str
    module_type: str
    in_features: int
    out_features: int
    recipe: str  # "mxfp8" | "mxfp4" | "nvfp4"
    weight_dtype: str

    @property
    def block_size(self) -> int:
        return BLOCK_SIZE[self.recipe]


@dataclass(frozen=True, slots=True)
class MxRecipe:
    """A microscaling training recipe (torchao MX/NVFP4 configs, TransformerEngine's block scaling)."""

    library: str  # "torchao" | "transformer_engine"
    recipe: str  # "mxfp8" | "mxfp4" | "nvfp4"
    grad_format: str = "e4m3"  # the gradients' element format: e4m3 | e5m2 | hybrid
    emulated: bool = False  # torchao's KernelPreference.EMULATED runs anywhere (slowly)
    linears: tuple[MxLinear, ...] = ()


@dataclass(frozen=True, slots=True)
class LowBit:
    """The low-bit facts of one model's load: its MXFP4 fallback, its keys check, its MX recipe."""

    method: str | None = None  # the quantization config's quant_method ("mxfp4")
    dequantized: bool = False  # the quantizer dequantized the checkpoint (to bfloat16)
    fallback: Fallback | None = None
    keys: CheckpointKeys | None = None
    recipe: MxRecipe | None = None
