"""GPU profiles for simulation: `--gpu NAME` (a key of CAPABILITIES) or a compute capability."""

from __future__ import annotations

from dataclasses import dataclass

from dtype_doctor.records.errors import UsageError

# NVIDIA's published compute capabilities.
CAPABILITIES = {"t4": (7, 5), "v100": (7, 0), "a10": (8, 6), "l4": (8, 9), "rtx4090": (8, 9), "a100": (8, 0), "h100": (9, 0), "h200": (9, 0),
                "b200": (10, 0), "rtx5090": (12, 0)}
# What torch.cuda reports for each: the device name, total memory in bytes (the common model;
# the H100's as torch 2.11 reported it on one), streaming multiprocessors.
PROPERTIES = {
    "t4": ("Tesla T4", 15_828_320_256, 40),
    "v100": ("Tesla V100-SXM2-16GB", 16_935_682_048, 80),
    "a10": ("NVIDIA A10", 23_836_098_560, 72),
    "l4": ("NVIDIA L4", 23_580_639_232, 58),
    "rtx4090": ("NVIDIA GeForce RTX 4090", 24 * 2**30, 128),  # 24 GB as sold
    "a100": ("NVIDIA A100-SXM4-80GB", 85_097_971_712, 108),
    "h100": ("NVIDIA H100 80GB HBM3", 85_017_493_504, 132),
    "h200": ("NVIDIA H200", 150_754_820_096, 132),
    # Blackwell. The B200 is 192 GB of HBM3e physically and "180 GB" as datacenters list it:
    # nvidia-smi shows 183359MiB (NVIDIA/TensorRT-LLM#10278) and CUDA's device query 178.35 GiB
    # with 148 SMs (pytorch/ao#4002); the RTX 5090 is 32 GB of GDDR7 as sold, 170 SMs.
    "b200": ("NVIDIA B200", round(178.35 * 2**30), 148),
    "rtx5090": ("NVIDIA GeForce RTX 5090", 32 * 2**30, 170),
}
DEFAULT_GPU = "a100"  # no --gpu: the simulated machine answers as an A100
DEFAULT_PROPERTIES = PROPERTIES[DEFAULT_GPU]  # no --gpu, or a bare compute capability: an A100's size


@dataclass(frozen=True, slots=True)
class GpuProfile:
    name: str  # "a100", or "sm_8.0" for a bare capability
    capability: tuple[int, int]

    @property
    def memory(self) -> int:
        """Bytes one GPU of this profile holds (what torch.cuda.mem_get_info's total would say)."""
        return PROPERTIES.get(self.name, DEFAULT_PROPERTIES)[1]

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


def capability_of(gpu: GpuProfile | None) -> tuple[int, int]:
    """The compute capability the simulated machine answers with (torch.cuda.get_device_capability):
    the profile's, else the default GPU's."""
    return gpu.capability if gpu is not None else CAPABILITIES[DEFAULT_GPU]


def gpu_memory(gpu: GpuProfile | None) -> int:
    """Bytes per simulated GPU: the profile's, else the default (an A100 80GB's)."""
    return gpu.memory if gpu is not None else DEFAULT_PROPERTIES[1]


def check_gpu(spec: str | None) -> None:
    """Refuse a --gpu that is neither a profile's name nor a compute capability (a UsageError),
    for the entries that check their options before deciding the Placement (which gives the
    profile: Placement.profile)."""
    gpu_profile(spec)


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
