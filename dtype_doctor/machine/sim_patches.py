"""What the CUDA simulation changes in torch and the libraries while it runs, and puts back after
(machine/simulate.py's CudaSimulation arms it): torch.cuda's answers (machine/cuda_api.py), the
Generator, the optimizers' fused-kernel devices, a fake tensor's `device` read by the script, checkpoints
loaded to CUDA, the module moves, transformers' fake-tensor checks, storage pointers, activation
checkpointing's device type and CUDA autocast. Each change is recorded by `set` and undone by `disarm`.
"""

from __future__ import annotations

import sys
import warnings
from typing import TYPE_CHECKING, Any

import torch

from dtype_doctor.machine.modes import tensors_in
from dtype_doctor.machine.stand_ins import STAND_IN
from dtype_doctor.machine.user_code import is_tool_file

if TYPE_CHECKING:
    from dtype_doctor.machine.simulate import CudaSimulation

_ABSENT = object()
METHOD_WRAPPER = type(torch._C.TensorBase.__dict__["device"].__get__)


def simulated(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == STAND_IN.type


def read_by_script(frame: Any, func: Any = None) -> bool:
    """Whether the code that read a tensor's device is the script's or a library's (not torch's, not the
    doctor's). A mode above this one that hands the very read on (its __torch_function__, or a helper of
    it such as the recorder's `_opened`, calling `func`) is passed over; a mode's own reads, made for its
    own work, are the doctor's or torch's."""
    while frame is not None and func is not None and is_tool_file(frame.f_code.co_filename) \
            and same_read(frame.f_locals.get("func"), func):
        frame = frame.f_back
    return frame is not None and not is_tool_file(frame.f_code.co_filename)


def same_read(a: Any, b: Any) -> bool:
    return a is b or (type(a) is METHOD_WRAPPER and type(b) is METHOD_WRAPPER and a.__self__ is b.__self__)


class LibraryPatches:
    """The changes one simulation makes outside its own objects, in the order it made them."""

    def __init__(self, sim: "CudaSimulation") -> None:
        self.sim = sim
        self._saved: list[tuple[Any, str, Any]] = []
        self.restore_entry: Any = None  # the checkpoint restore location torch.load consults first

    def disarm(self) -> None:
        import torch.serialization as serialization

        if self.restore_entry is not None and self.restore_entry in serialization._package_registry:
            serialization._package_registry.remove(self.restore_entry)
        for owner, name, original in reversed(self._saved):
            if original is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._saved.clear()

    def saved(self) -> list[tuple[Any, str, Any]]:
        """(owner, name, the value before any patch) of each attribute patched that had one (machine/mps_simulation.py
        puts a Mac's answers back)."""
        first: dict[tuple[int, str], tuple[Any, str, Any]] = {}
        for owner, name, original in self._saved:
            first.setdefault((id(owner), name), (owner, name, original))
        return [row for row in first.values() if row[2] is not _ABSENT]

    def set(self, owner: Any, name: str, value: Any) -> None:
        self._saved.append((owner, name, owner.__dict__.get(name, getattr(owner, name, _ABSENT))))
        setattr(owner, name, value)

    def cuda(self) -> None:
        from dtype_doctor.machine.cuda_api import patches
        from dtype_doctor.machine.cuda_surface import generator_class, raw_stream, surface_answers

        for owner, attr, value in patches(surface_answers(self.sim.gpu, self.sim.current, self.sim.memory), self.sim.refusal):
            self.set(owner, attr, value)
        self.set(torch, "Generator", generator_class(self.sim.current))  # torch.Generator(device="cuda")
        # bitsandbytes hands the current stream's raw handle to its kernels.
        self.set(torch._C, "_cuda_getCurrentRawStream", raw_stream)
        # The optimizers pick their foreach and fused kernels for CUDA devices, as on a GPU.
        import torch.optim.optimizer as optimizer
        import torch.utils._foreach_utils as foreach

        for module in (foreach, optimizer):
            for name in ("_get_foreach_kernels_supported_devices", "_get_fused_kernels_supported_devices"):
                original = getattr(module, name, None)
                if original is not None:
                    self.set(module, name, lambda _original=original: [*_original(), STAND_IN.type])

    def fake_device(self) -> None:
        """Several GPUs: cuda:k lives on fake tensors on meta:k, whose `device` is a Python property of
        their own (no torch function sees it read). The script reads it as cuda:k, as `where_read` answers."""
        from torch._subclasses.fake_tensor import FakeTensor

        stand_in = FakeTensor.__dict__["device"]
        sim = self.sim

        def device(t: Any) -> torch.device:
            d = stand_in.__get__(t)
            if d.type != STAND_IN.type or not read_by_script(sys._getframe(1)) or not sim.sees_cuda(t):
                return d
            return torch.device("cuda", sim.cuda_index(t))

        self.set(FakeTensor, "device", property(device))

    def load(self) -> None:
        """`torch.load(f, map_location="cuda")`, or a checkpoint saved on a GPU: its storages land on the
        stand-in without their data, as a model moved to CUDA does (a CPU-only build refuses CUDA storages)."""
        import torch.serialization as serialization

        sim = self.sim

        def restore(storage: Any, location: str) -> Any:
            if isinstance(location, str) and location.split(":")[0] == "cuda":
                return torch.UntypedStorage(storage.nbytes(), device=sim.stand_in(location))
            return None

        entry = (19, lambda storage: None, restore)  # before torch's own cuda entry (20)
        registry = serialization._package_registry
        registry.insert(0, entry)
        registry.sort(key=lambda e: e[0])
        self.restore_entry = entry

    def module_moves(self) -> None:
        from dtype_doctor.machine.module_moves import patch_module_moves

        patch_module_moves(self.set, swap=not self.sim.indexed)

    def transformers(self) -> None:
        """Transformers skips its value checks (`if padding_mask.all():`, made to pick a faster kernel)
        on fake tensors, as under torch.compile; the stand-in tensors are fake tensors too."""
        module = sys.modules.get("transformers.utils.import_utils")
        if module is None:
            try:
                import transformers.utils.import_utils as module  # type: ignore[no-redef]
            except ImportError:  # pragma: no cover - transformers is a dependency
                return
        original = module.is_fake_tensor

        def is_fake_tensor(x: Any) -> bool:
            return simulated(x) or original(x)

        self.set(module, "is_fake_tensor", is_fake_tensor)
        self.storage_ptr()
        self.checkpoint()

    def checkpoint(self) -> None:
        """Activation checkpointing takes the autocast its recompute re-enters from the device type of the
        checkpointed function's tensors: a simulated CUDA tensor's is CUDA, as on the GPU, so the recompute
        runs under the same CUDA autocast as its forward (read as `meta`, it ran without, in float32)."""
        import torch.utils.checkpoint as checkpoint

        original = checkpoint._infer_device_type

        def infer_device_type(*args: Any) -> str:
            found = original(*args)
            if found == STAND_IN.type and any(isinstance(t, torch.Tensor) and self.sim.sees_cuda(t) for t in tensors_in(args, {})):
                return "cuda"
            return found

        self.set(checkpoint, "_infer_device_type", infer_device_type)

    def storage_ptr(self) -> None:
        """save_pretrained and safetensors find tied weights by their storages' addresses; a simulated
        tensor's storage has none (every one reads 0, so every same-sized weight looked shared and
        save_pretrained refused): each storage is told apart by its own identity instead."""
        import importlib

        for name in ("safetensors.torch", "transformers.pytorch_utils"):
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
            original = getattr(module, "storage_ptr", None)
            if original is None:
                continue

            def storage_ptr(tensor: torch.Tensor, _original: Any = original) -> int:
                return tensor.untyped_storage()._cdata if simulated(tensor) else _original(tensor)

            self.set(module, "storage_ptr", storage_ptr)

    def autocast(self) -> None:
        from torch.amp import autocast_mode

        cls = autocast_mode.autocast
        original_init, original_enter, original_exit = cls.__init__, cls.__enter__, cls.__exit__
        sim = self.sim

        def __init__(self: Any, device_type: str, dtype: torch.dtype | None = None, enabled: bool = True, cache_enabled: bool | None = None) -> None:
            # "meta" is the stand-in: code that asks a tensor for its device type (x.device.type) means CUDA.
            if device_type not in ("cuda", STAND_IN.type):
                return original_init(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
            # What torch's own __init__ sets, without its "CUDA is not available: disabling".
            self.device = "cuda"
            self.fast_dtype = dtype if dtype is not None else torch.get_autocast_dtype("cuda")
            self._cache_enabled = cache_enabled if cache_enabled is not None else torch.is_autocast_cache_enabled()
            self.custom_backend_name = torch._C._get_privateuse1_backend_name()
            self._dd_simulated = True
            # torch asks is_bf16_supported() with emulation, which every CUDA 11+ GPU passes.
            if enabled and self.fast_dtype == torch.bfloat16 and sim.gpu is not None and not sim.gpu.bf16_supported():
                raise RuntimeError("Current CUDA Device does not support bfloat16. Please switch dtype to float16.")
            if enabled and self.fast_dtype not in (torch.float16, torch.bfloat16):
                warnings.warn(f"In CUDA autocast, but the target dtype {self.fast_dtype} is not supported. Disabling autocast.", stacklevel=2)
                enabled = False
            self._enabled = enabled

        def __enter__(self: Any) -> Any:
            # torch's own __enter__ sets CUDA autocast's thread-local state, which a CPU-only build
            # keeps too: model code that reads it (torch.is_autocast_enabled("cuda")) sees a GPU's answer.
            out = original_enter(self)
            if getattr(self, "_dd_simulated", False):
                sim.amp.append(self.fast_dtype if self._enabled else None)
                sim.on_amp(sim.amp_dtype)
            return out

        def __exit__(self: Any, *exc: Any) -> Any:
            out = original_exit(self, *exc)
            if getattr(self, "_dd_simulated", False):
                if sim.amp:
                    sim.amp.pop()
                sim.on_amp(sim.amp_dtype)
            return out

        self.set(cls, "__init__", __init__)
        self.set(cls, "__enter__", __enter__)
        self.set(cls, "__exit__", __exit__)
