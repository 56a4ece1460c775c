"""GPU profiles for simulation: `--gpu t4|v100|a10|l4|a100|h100` or a compute capability."""

from __future__ import annotations

from dataclasses import dataclass

from dtype_doctor.errors import UsageError

# NVIDIA's published compute capabilities.
CAPABILITIES = {"t4": (7, 5), "v100": (7, 0), "a10": (8, 6), "l4": (8, 9), "rtx4090": (8, 9), "a100": (8, 0), "h100": (9, 0), "h200": (9, 0)}
# Their memory in GiB, as sold (the largest model of each: V100 32 GB, A100/H100 80 GB, H200 141 GB).
MEMORY_GIB = {"t4": 16, "v100": 32, "a10": 24, "l4": 24, "rtx4090": 24, "a100": 80, "h100": 80, "h200": 141}
DEFAULT_MEMORY_GIB = 80  # a bare compute capability, or no --gpu


@dataclass(frozen=True, slots=True)
class GpuProfile:
    name: str  # "a100", or "sm_8.0" for a bare capability
    capability: tuple[int, int]

    @property
    def memory(self) -> int:
        """Bytes one GPU of this profile holds (what torch.cuda.mem_get_info's total would say)."""
        return MEMORY_GIB.get(self.name, DEFAULT_MEMORY_GIB) * 2**30

    @property
    def bf16(self) -> bool:
        """Native bfloat16 (bf16 tensor cores, cuDNN bf16 convolution) starts with Ampere, 8.0:
        what torch.cuda.is_bf16_supported(including_emulation=False) answers. Before it, bf16
        kernels still run (emulated, slow), see bf16_supported."""
        return self.capability >= (8, 0)

    def bf16_supported(self, including_emulation: bool = True) -> bool:
        """torch.cuda.is_bf16_supported(including_emulation) on this GPU: with emulation, any GPU
        that can hold a bf16 tensor (CUDA 11+ builds: all of them) says True."""
        return self.bf16 or including_emulation

    def __str__(self) -> str:
        return f"{self.name} (compute capability {self.capability[0]}.{self.capability[1]})"


def gpu_memory(gpu: GpuProfile | None) -> int:
    """Bytes per simulated GPU: the profile's, else the default (80 GiB)."""
    return gpu.memory if gpu is not None else DEFAULT_MEMORY_GIB * 2**30


def gpu_profile(spec: str | None) -> GpuProfile | None:
    """'a100' → GpuProfile('a100', (8, 0)); '7.5' → GpuProfile('sm_7.5', (7, 5)); None → None."""
    if spec is None:
        return None
    key = spec.strip().lower()
    if key in CAPABILITIES:
        return GpuProfile(key, CAPABILITIES[key])
    try:
        major, minor = (int(x) for x in key.removeprefix("sm_").split("."))
    except ValueError:
        raise UsageError(f"--gpu must be one of {', '.join(CAPABILITIES)} or a compute capability such as 8.0, not {spec!r}") from None
    return GpuProfile(f"sm_{major}.{minor}", (major, minor))
