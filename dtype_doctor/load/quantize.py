"""Quantizing while loading: `--load-in-4bit|--load-in-8bit --bnb-compute-dtype D --bnb-quant-type T`.

`Quantize` is the request as one record; `config()` builds the BitsAndBytesConfig that
`from_pretrained(quantization_config=...)` takes, exactly as a user's script would. A checkpoint
whose config.json already holds a `quantization_config` is quantized by transformers itself.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

from dtype_doctor.records.choices import COMPUTE_DTYPES, DTYPE_ALIASES, choice
from dtype_doctor.records.errors import InputError, UsageError

QUANT_TYPES = ("nf4", "fp4")
INSTALL = "pip install 'dtype-doctor[quant]'"


@dataclass(frozen=True, slots=True)
class Quantize:
    bits: int  # 4 or 8
    compute_dtype: str | None = None  # bnb_4bit_compute_dtype; None: BitsAndBytesConfig's default (float32)
    quant_type: str = "nf4"

    @classmethod
    def from_options(cls, in_4bit: bool, in_8bit: bool, compute_dtype: str | None, quant_type: str,
                     *, simulate: bool = False, mapped: bool = False) -> "Quantize | None":
        if in_4bit and in_8bit:
            raise UsageError("--load-in-4bit and --load-in-8bit exclude each other; pass one")
        choice("--bnb-compute-dtype", compute_dtype, COMPUTE_DTYPES, aliases=tuple(DTYPE_ALIASES))
        if quant_type not in QUANT_TYPES:
            raise UsageError(f"unknown --bnb-quant-type {quant_type!r}; choose nf4 or fp4")
        if not (in_4bit or in_8bit):
            if compute_dtype is not None:
                raise UsageError("--bnb-compute-dtype sets the compute dtype of --load-in-4bit; add --load-in-4bit")
            return None
        if simulate and not mapped:  # with a device map, scan judges the load (DD505) before refusing to simulate it
            raise UsageError("--load-in-4bit/--load-in-8bit quantize real weights; drop --simulate (bitsandbytes runs on the CPU)")
        require_bitsandbytes("--load-in-4bit" if in_4bit else "--load-in-8bit")
        return cls(4 if in_4bit else 8, compute_dtype, quant_type)

    def config(self) -> Any:
        import torch
        from transformers import BitsAndBytesConfig

        if self.bits == 8:
            return BitsAndBytesConfig(load_in_8bit=True)
        kw: dict[str, Any] = {"load_in_4bit": True, "bnb_4bit_quant_type": self.quant_type}
        if self.compute_dtype is not None:
            kw["bnb_4bit_compute_dtype"] = getattr(torch, self.compute_dtype)
        return BitsAndBytesConfig(**kw)

    def describe(self) -> str:
        if self.bits == 8:
            return "--load-in-8bit"
        return f"--load-in-4bit {self.quant_type}" + (f" (compute {self.compute_dtype})" if self.compute_dtype else "")


def require_bitsandbytes(what: str) -> None:
    """UsageError naming the extra to install when bitsandbytes is absent."""
    if importlib.util.find_spec("bitsandbytes") is None:
        raise UsageError(f"{what} needs bitsandbytes, which is not installed; {INSTALL}")


def checkpoint_quantization(raw_config: dict[str, Any], model_dir: Any) -> str | None:
    """The quant_method of a checkpoint's config.json quantization_config; InputError when it is
    bitsandbytes and bitsandbytes is absent (transformers' own message names no fix)."""
    q = raw_config.get("quantization_config")
    if not isinstance(q, dict):
        return None
    method = str(q.get("quant_method", ""))
    if method == "bitsandbytes" and importlib.util.find_spec("bitsandbytes") is None:
        raise InputError(f"{model_dir}/config.json holds a bitsandbytes quantization_config, but bitsandbytes is not installed; {INSTALL}")
    return method
