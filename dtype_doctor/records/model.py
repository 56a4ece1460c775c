"""What the doctor knows of a model: its quantization and adapters, its rotary embeddings, how it
was loaded (LoadFacts, Loading) and its state (ModelInfo)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dtype_doctor.records.lowbit import LowBit, MxRecipe
from dtype_doctor.records.tensors import StateTensor, main_dtype_of, numel


@dataclass(frozen=True, slots=True)
class AdapterInfo:
    """One kind of adapter weight (peft's lora_A, lora_B …) on a quantized base: how many, in what dtype."""

    kind: str  # "lora_A", "lora_B", "lora_embedding_A" …
    dtype: str
    count: int
    trainable: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "dtype": self.dtype, "count": self.count, "trainable": self.trainable}


@dataclass(frozen=True, slots=True)
class QuantizationInfo:
    """What a quantized model is (docs/report.md, `target.quantization`): the method, the dtype its
    quantized weights are stored in, the dtype its layers compute in, and the adapters on it."""

    method: str  # "bitsandbytes-4bit" | "bitsandbytes-8bit"
    storage_dtype: str  # dtype of the packed weights (uint8 by default, bnb_4bit_quant_storage)
    compute_dtype: str | None  # bnb_4bit_compute_dtype (float16 for 8-bit: int8 matmuls take half inputs)
    quant_type: str | None  # nf4 | fp4 | int8
    layers: int  # quantized Linear layers
    adapters: tuple[AdapterInfo, ...] = ()
    double_quant: bool = False
    fp32_cpu_offload: bool = False  # llm_int8_enable_fp32_cpu_offload
    # module → device for a model dispatched over several devices (accelerate's hf_device_map)
    device_map: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "storage_dtype": self.storage_dtype,
            "compute_dtype": self.compute_dtype,
            "quant_type": self.quant_type,
            "quantized_layers": self.layers,
            "double_quant": self.double_quant,
            "fp32_cpu_offload": self.fp32_cpu_offload,
            "adapters": [a.to_dict() for a in self.adapters],
        }

    def describe(self) -> str:
        """One header line: "bitsandbytes 4-bit nf4: 14 layers, uint8 storage, compute float16; adapters lora_A float32 ×14"."""
        bits = self.method.removeprefix("bitsandbytes-").replace("bit", "-bit")
        kind = f"{bits} {self.quant_type}" if self.quant_type and self.quant_type != "int8" else bits
        layers = f"{self.layers} quantized layers" if self.layers else "not loaded"
        line = (f"bitsandbytes {kind}: {layers}, {self.storage_dtype} storage, "
                f"compute {self.compute_dtype or 'the input dtype'}")
        if self.adapters:
            line += "; adapters " + ", ".join(f"{a.kind} {a.dtype} ×{a.count}" for a in self.adapters)
        return line


@dataclass(frozen=True, slots=True)
class RotaryFacts:
    """A rotary embedding's frequencies (recomputed in float32 from the model's config) and what a
    half-precision copy of them does at the model's longest position (DD109)."""

    module: str  # the rotary embedding module, "model.rotary_emb"
    max_position: int  # config.max_position_embeddings
    head_dim: int  # 2 × the number of frequencies
    rope_type: str
    # per half dtype: (largest phase error in radians at max_position - 1, that error in positions)
    error: tuple[tuple[str, float, float], ...] = ()

    def error_in(self, dtype: str) -> tuple[float, float] | None:
        return next(((rad, pos) for d, rad, pos in self.error if d == dtype), None)


@dataclass(frozen=True, slots=True)
class LoadFacts:
    """How `from_pretrained` loaded the model (docs/report.md, `target.loaded_dtype`), as the doctor saw the load.

    `origin`: "argument" (dtype= named one), "auto" (dtype="auto" asked for), "config" (nothing asked:
    transformers 5 reads config.json's dtype), "checkpoint" (nothing in the config: the weights'
    dtype), "default" (torch's default dtype). `v4_dtype` is what transformers 4 gave the same call.
    """

    dtype: str
    origin: str
    asked: str | None = None  # the call's dtype= ("auto", "bfloat16"), None when it named none
    config_dtype: str | None = None
    checkpoint_dtype: str | None = None
    library: str | None = None  # "transformers 5.24.0"
    v4_dtype: str | None = None
    attn_implementation: str | None = None  # asked for, in config.json or the call
    attn_origin: str | None = None  # "config" | "call"
    attn_traced_as: str | None = None  # what the trace ran in its place (flash-attn cannot run on this machine)
    lowbit: "LowBit | None" = None  # a low-bit load's fallback and keys check (records/lowbit.py)

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "origin": self.origin, "asked": self.asked, "config_dtype": self.config_dtype,
                "checkpoint_dtype": self.checkpoint_dtype, "library": self.library, "v4_dtype": self.v4_dtype}


@dataclass(frozen=True, slots=True)
class ModelInfo:
    class_name: str
    state: tuple[StateTensor, ...]
    keep_in_fp32_modules: tuple[str, ...] = ()
    module_types: tuple[tuple[str, str], ...] = ()  # (dotted name, class name)
    # The classification head's configuration as the model was handed over: transformers'
    # *ForSequenceClassification / *ForImageClassification models pick problem_type from the
    # labels' dtype the first time, when it is None (DD111). None where the model has no config.
    num_labels: int | None = None
    problem_type: str | None = None
    quantization: QuantizationInfo | None = None  # a bitsandbytes model (DD5xx read it)
    # The attention implementation the model's config holds (transformers' config._attn_implementation).
    attn_implementation: str | None = None
    rotary: tuple["RotaryFacts", ...] = ()  # the rotary embeddings' frequencies at the model's longest position (DD109)
    # A pipeline traced as one (diffusers): (component name, class) of each component, the model's children.
    components: tuple[tuple[str, str], ...] = ()
    mx_recipe: "MxRecipe | None" = None  # the Linears a microscaling training recipe converted (DD510-DD512)

    def component_of(self, name: str) -> str | None:
        """The pipeline component a dotted module or parameter name lies in, None outside any."""
        head = name.split(".", 1)[0]
        return head if any(c == head for c, _ in self.components) else None

    @property
    def parameters(self) -> tuple[StateTensor, ...]:
        return tuple(s for s in self.state if s.kind == "parameter")

    @property
    def buffers(self) -> tuple[StateTensor, ...]:
        return tuple(s for s in self.state if s.kind == "buffer")

    @property
    def main_dtype(self) -> str | None:
        """The dtype most parameter elements are in: what "the model's dtype" means."""
        return main_dtype_of((p.dtype, numel(p.shape)) for p in self.parameters)

    def module_type(self, name: str) -> str:
        for n, t in self.module_types:
            if n == name:
                return t
        return ""


@dataclass(frozen=True, slots=True)
class Loading:
    """What transformers' load report said about the checkpoint (docs/report.md, `target.loading`):
    weights the model needs that the files lack (initialised at random), weights the files hold
    that the model has no place for."""

    checkpoint: str  # the weight file(s), as named in the model directory
    expected: int  # weights the model's state dict holds
    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()

    @property
    def missing_share(self) -> float:
        return len(self.missing) / self.expected if self.expected else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "expected": self.expected, "missing": list(self.missing),
                "unexpected": list(self.unexpected)}

    def warning(self) -> str | None:
        """One line for stderr, or None when every weight was found."""
        if not self.missing and not self.unexpected:
            return None
        parts = []
        if self.missing:
            parts.append(f"lacks {len(self.missing)} of the {self.expected} weights the model needs "
                         f"({_names(self.missing)}), which were initialised at random")
        if self.unexpected:
            parts.append(f"holds {len(self.unexpected)} the model has no place for ({_names(self.unexpected)})")
        return f"{self.checkpoint} " + "; it ".join(parts)


def _names(keys: tuple[str, ...], shown: int = 3) -> str:
    return ", ".join(keys[:shown]) + (f", … {len(keys) - shown} more" if len(keys) > shown else "")
