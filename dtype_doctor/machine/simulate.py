"""`dtype-doctor run --simulate`: the user's script sees a CUDA machine on a CPU-only one.

`torch.cuda.is_available()` is True and one device is there; `.cuda()`, `.to("cuda")`,
`device="cuda"` (and `with torch.device("cuda")`) land on tensors without data. Those live
on `meta`, which every build of torch has: a CPU-only build aborts on fake CUDA tensors
(machine/home.py says why), so the doctor labels meta as the CUDA
device in the report, as `diagnose(simulate=True)` does. `torch.autocast("cuda")` and
`torch.cuda.amp.autocast()` apply CUDA's autocast lists (trace/cuda_autocast.py) instead of
being turned off, and `GradScaler("cuda")` is enabled, so the step is the one a GPU runs.

Tensors without data cannot answer a question about their values (`loss.item()`, `if
mask.any():`, `.cpu()`, `.tolist()`): where the script asks one it gets a stated stand-in and
goes on (machine/stand_ins.py). Where no stand-in can be given (an op without a fake
implementation, a read of a kind not covered), the script is stopped there (`SimulationStop`)
and what was traced up to that point is reported, the op named as a limit of the simulation.
The machine answers as the `--gpu` profile's GPU (machine/cuda_surface.py), and `model.to("cuda")`
keeps each parameter the same object, as on a GPU.
"""

from __future__ import annotations

import os
import sys
import weakref
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from dtype_doctor.records import SourceLoc
from dtype_doctor.records.errors import StopScript
from dtype_doctor.machine.home import simulated_home
from dtype_doctor.machine.stand_ins import AGREE_READS, COPY_READS, SCALAR_READS, SIZE_OPS, STAND_IN, StandIns, sized
from dtype_doctor.machine.user_code import display_path, first_outside_tool, first_user_frame, frames_above, is_tool_file
from dtype_doctor.machine.cuda_surface import device_index
from dtype_doctor.machine.gpus import GpuProfile
from dtype_doctor.machine.modes import tensors_in
from dtype_doctor.machine.module_moves import host_and_cuda, is_cuda, set_data_across
from dtype_doctor.machine.sim_patches import METHOD_WRAPPER as _METHOD_WRAPPER, LibraryPatches, read_by_script as _read_by_script, simulated as _simulated



def stand_in_for(index: int, gpus: int = 1) -> torch.device:
    """Where run's simulated cuda:`index` lives (machine.home's rule: meta, meta:k with several GPUs)."""
    return simulated_home(index, indexed=gpus > 1)


# What PyTorch says when an op needs values a meta tensor does not hold.
NO_DATA = (
    "cannot be called on meta tensors",
    "Cannot copy out of meta tensor",
    "meta device type tensor to numpy",
    "data-independent implementation",  # nonzero, masked_select: the output's shape depends on values
    "with Meta tensors",  # an op without a meta kernel (_unique2, histc)
    "data-dependent shape",  # a library op whose fake implementation asks a size the values decide
)


class SimulationStop(StopScript):
    """Raised into the script where it needs a value a simulated tensor does not hold."""

    def __init__(self, what: str, site: SourceLoc | None, in_user_code: bool, in_forward: bool, limit: str | None = None,
                 unanswered: bool = False) -> None:
        super().__init__(what)
        self.what = what
        self.unanswered = unanswered  # the limit is a CUDA API call the simulation does not answer (machine/cuda_api.py)
        self.limit = limit  # the library op the simulation cannot run (no fake implementation), if that is why
        self.site = site
        self.in_user_code = in_user_code
        self.in_forward = in_forward  # raised inside the model's forward: the step is incomplete

    @property
    def limit_said(self) -> str:
        """Why the limit stops the simulation, in the report's words."""
        from dtype_doctor.machine.wording import no_fake_impl, not_simulated

        return not_simulated(self.limit or self.what) if self.unanswered else no_fake_impl(self.limit or self.what)

    @property
    def limit_short(self) -> str:
        return f"{self.limit} is not simulated" if self.unanswered else f"{self.limit} has no fake implementation"

    @property
    def where(self) -> str:
        return f"{self.site.file}:{self.site.line}" if self.site else "library code"


def _is_device_arg(a: Any) -> bool:
    return isinstance(a, (str, torch.device)) or (isinstance(a, int) and not isinstance(a, bool))


# Reads of where a tensor lives: the script reads a simulated tensor as the CUDA tensor it stands for.
_GETTERS = {torch._C.TensorBase.__dict__[name]: name for name in ("device", "is_cuda", "is_meta")}


def _where_read(func: Any) -> str | None:
    """"device", "is_cuda", "is_meta" or "get_device" when `func` reads where a tensor lives, else None."""
    if type(func) is _METHOD_WRAPPER:
        return _GETTERS.get(func.__self__)
    if func is torch._C.TensorBase.get_device:
        return "get_device"
    return "type" if func is torch._C.TensorBase.type else None


def _names_meta(device: Any) -> bool:
    return isinstance(device, (str, torch.device)) and torch.device(device).type == STAND_IN.type


_DATA = torch._C.TensorBase.__dict__["data"]
_COMPATIBLE = torch._has_compatible_shallow_copy_type


def _sets_data(func: Any) -> bool:
    """`param.data = t`: torch's `set_data`, handed to a function mode as the descriptor's `__set__`."""
    return type(func) is _METHOD_WRAPPER and func.__self__ is _DATA and func.__name__ == "__set__"


_PINNING = (torch.Tensor.pin_memory, torch.Tensor.is_pinned)
_SHARING = (torch.Tensor.share_memory_, torch.Tensor.is_shared)
# The functions _CudaMode answers itself or changes before they run (with a method-wrapper getter and a `device=`
# argument); every other call only runs, its outputs known and counted (_CudaMode._ran).
_ASKED = frozenset({*_GETTERS, _COMPATIBLE, torch._C.TensorBase.get_device, torch._C.TensorBase.type, torch._C._nn._parse_to, torch.device,
                    torch.Tensor.cuda, torch.Tensor.to, *_PINNING, *_SHARING, torch.Tensor.__getitem__, torch.Tensor.copy_,
                    *SCALAR_READS, *COPY_READS, *AGREE_READS, torch.Tensor.__format__, torch.Tensor.__repr__})


class _CudaMode(TorchFunctionMode):
    """Every CUDA placement the script asks for lands on the stand-in device (cuda:k on meta:k with
    several GPUs); every read of a simulated tensor's values gets a stand-in (machine/stand_ins.py)."""

    def __init__(self, sim: "CudaSimulation") -> None:
        super().__init__()
        self.sim = sim
        self.pinned: dict[int, weakref.ref] = {}  # what pin_memory() handed out, by id (tensors compare by value)

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if type(func) is not _METHOD_WRAPPER and func not in _ASKED and "device" not in kwargs:
            return self._ran(func, args, kwargs)  # an op asking nothing of the machine: most of a step's
        read = _where_read(func)
        if read is not None and (read != "type" or (len(args) == 1 and not kwargs)):  # x.type(), not x.type(torch.half)
            return self.sim.where_read(read, args[0], func, args, kwargs)
        if func is torch._C._nn._parse_to or func is torch.device:
            return _device_parsed(func, args, kwargs)
        if (func is _COMPATIBLE or _sets_data(func)) and len(args) == 2 and not self.sim.indexed \
                and host_and_cuda(args[0], args[1], self.sim.sees_cuda):
            # CPU and CUDA tensors take each other's `.data` on a GPU (machine/module_moves.py says why).
            return True if func is _COMPATIBLE else set_data_across(args[0], args[1])
        values = self.sim.stand_ins
        placed = False
        # The script (or a library: transformers' empty init) asks for meta itself: those tensors are not CUDA's.
        meta_asked = _names_meta(kwargs.get("device")) or (func is torch.Tensor.to and len(args) > 1 and _names_meta(args[1]))
        if func is torch.Tensor.cuda:
            return self.sim.cuda_copy(args[0], args[1] if len(args) > 1 else kwargs.get("device"), kwargs.get("non_blocking", False))
        if func is torch.Tensor.to and args:
            # .to("cuda"), .to(0), .to(torch.device("cuda"), torch.float16): the device is the first argument.
            if len(args) > 1 and _is_device_arg(args[1]) and is_cuda(args[1]):
                args, placed = (args[0], self.sim.stand_in(args[1]), *args[2:]), True
            elif "device" in kwargs and is_cuda(kwargs["device"]):
                kwargs, placed = {**kwargs, "device": self.sim.stand_in(kwargs["device"])}, True
            elif _simulated(args[0]) and _to_host(args, kwargs):
                copy = values.read(torch.Tensor.cpu, args, kwargs, "Tensor.to('cpu')")
                dtype = next((a for a in (*args[1:], kwargs.get("dtype")) if isinstance(a, torch.dtype)), None)
                return copy.to(dtype) if dtype is not None else copy
            target = args[1] if len(args) > 1 and _is_device_arg(args[1]) else kwargs.get("device")
            if self.sim.indexed and target is not None and torch.device(target).type == "meta":
                args = (self.sim.faked(args[0]), *args[1:])  # a plain meta tensor forgets its GPU; a fake one keeps it
        elif args and (func in _PINNING or (func in _SHARING and _simulated(args[0]))):
            return self._pinned(func, args[0]) if func in _PINNING else self._shared(func, args[0])
        elif func is torch.Tensor.__getitem__ and len(args) == 2 and not _simulated(args[0]) and _simulated(args[1]) \
                and args[1].dim() == 0:
            # A host table indexed by a CUDA scalar (a scheduler's alphas_cumprod[timestep]): torch reads the
            # index's value; the index's stand-in is read instead, and the result is the host's, as on a GPU.
            index = values.read(torch.Tensor.cpu, (args[1],), {}, "Tensor.__getitem__ (a host tensor at a CUDA index)")
            return func(args[0], index)
        elif func is torch.Tensor.copy_ and len(args) > 1 and not _simulated(args[0]) and _simulated(args[1]):
            # A host tensor filled from simulated CUDA (load_state_dict of a checkpoint loaded to "cuda"): stand-in values.
            copy = values.read(torch.Tensor.cpu, (args[1],), {}, "Tensor.copy_ (from CUDA)")
            return func(args[0], copy, *args[2:], **kwargs)
        if args and _simulated(args[0]):
            if func in SCALAR_READS or func in COPY_READS or func in AGREE_READS:
                return values.read(func, args, kwargs, _func_name(func))
            if func is torch.Tensor.__format__:
                return values.formatted(args[0], args[1] if len(args) > 1 else "", str(self.sim.label))
            if func is torch.Tensor.__repr__:
                return values.formatted(args[0], "", str(self.sim.label))
        if "device" in kwargs and is_cuda(kwargs["device"]):
            kwargs["device"], placed = self.sim.stand_in(kwargs["device"]), True
        return self._ran(func, args, kwargs, placed, meta_asked)

    def _ran(self, func: Any, args: tuple, kwargs: dict, placed: bool = False, meta_asked: bool = False) -> Any:
        """Run `func`; a read of values PyTorch refuses on meta gets its stand-in (or stops the script), and what
        it makes is known, counted as the GPU's memory, and placed where the script put it."""
        values = self.sim.stand_ins
        try:
            out = self._call(func, args, kwargs)
        except (RuntimeError, NotImplementedError, TypeError) as exc:
            out = self._without_data(func, args, kwargs, exc)
            if out is NotImplemented:
                raise
            return out
        if out is not None or func is torch._amp_foreach_non_finite_check_and_unscale_:
            values.learn(func, args, kwargs, out)
        if meta_asked or (self.sim.explicit and not placed and self.sim.all_explicit(args, kwargs)):
            self.sim.mark_meta(out)
        elif out is not None:
            self.sim.memory.saw(out)
        return self.sim.place(out) if placed else out


    def _without_data(self, func: Any, args: tuple, kwargs: dict, exc: Exception) -> Any:
        """An op that needs values simulated tensors do not hold: a data-dependent size is taken as the largest
        the op can give (stand_ins.sized, bitsandbytes' outlier columns), else the simulation stops there.
        NotImplemented: not such an error, or a simulation that does not stop (torch's own error stands)."""
        if not (any(s in str(exc) for s in NO_DATA) and _simulated_any(args, kwargs)):
            return NotImplemented
        from dtype_doctor.machine.libraries import outlier_columns

        values = self.sim.stand_ins
        out = sized(func, args, kwargs, values) if func in SIZE_OPS else NotImplemented
        if out is NotImplemented:
            out = outlier_columns(func, args, kwargs, values.took_size)
        if out is not NotImplemented:
            return out
        op = _without_fake_impl(str(exc))
        if op is not None:
            self.sim.data_read(op, limit=op)
        self.sim.data_read(_func_name(func))
        return NotImplemented

    @staticmethod
    def _shared(func: Any, t: torch.Tensor) -> Any:
        """CUDA memory is shareable as it is (torch/_tensor.py: share_memory_ "is a no-op ... for CUDA tensors",
        is_shared "always True for CUDA tensors"); a meta stand-in's storage has no file descriptor to share."""
        return t if func is torch.Tensor.share_memory_ else True

    def _pinned(self, func: Any, t: torch.Tensor) -> Any:
        """Page-locked host memory is a CUDA machine's: pin_memory() hands out a copy (the same data) that
        reads pinned, as there; is_pinned() answers for the copies handed out."""
        if func is torch.Tensor.is_pinned:
            held = self.pinned.get(id(t))
            return held is not None and held() is t
        out = t.view_as(t)
        self.pinned[id(out)] = weakref.ref(out, lambda _, key=id(out): self.pinned.pop(key, None))
        return out

    def _call(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if not self.sim.indexed:
            return func(*args, **kwargs)
        if self.sim.fake_mode is not None and _simulated_any(args, kwargs):
            with self.sim.fake_mode:  # ops on GPUs k > 0 run in the fake mode, whose factories keep meta:k
                out = func(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        want = kwargs.get("device")
        if isinstance(out, torch.Tensor) and want is not None and torch.device(want).type == "meta" \
                and torch.device(want).index is not None and out.device != torch.device(want):
            out = self.sim.faked(out).to(want)  # torch.tensor(..., device=meta:k) builds on plain meta: keep the GPU asked for
        return out


def _device_parsed(func: Any, args: tuple, kwargs: dict) -> Any:
    """`torch.device(3)`: the accelerator's, which a CPU-only build refuses; on a CUDA machine cuda:3.
    Module.to(device="cuda") parses its arguments first (`_parse_to`): the device it reads stays CUDA, so
    the module's tensors are placed (and read) as CUDA's, as with .to("cuda")."""
    if func is torch.device and len(args) == 1 and isinstance(args[0], int) and not isinstance(args[0], bool):
        return torch.device("cuda", args[0])
    return func(*args, **kwargs)


def _without_fake_impl(message: str) -> str | None:
    """The op PyTorch names when it has no kernel for simulated tensors (a library's compiled CUDA op)."""
    import re

    found = re.search(r"Could not run '([^']+)' with arguments from the 'Meta' backend", message) or re.search(
        r"(\S+?):? attempted to run this operator with Meta tensors, but there was no fake impl", message)
    return found.group(1) if found else None


def _to_host(args: tuple, kwargs: dict) -> bool:
    """`.to("cpu")`, `.to(torch.device("cpu"))`, `.to(device="cpu")`, `.to(cpu_tensor)`."""
    for a in (*args[1:], kwargs.get("device"), kwargs.get("other")):
        if isinstance(a, torch.Tensor):
            return a.device.type == "cpu"
        if isinstance(a, (str, torch.device)):
            return torch.device(a).type == "cpu"
    return False


def _simulated_any(args: tuple, kwargs: dict) -> bool:
    for a in (*args, *kwargs.values()):
        if _simulated(a) or (isinstance(a, (list, tuple)) and any(_simulated(x) for x in a)):
            return True
    return False


def _func_name(func: Any) -> str:
    qual = getattr(func, "__qualname__", "") or getattr(func, "__name__", str(func))
    if qual.startswith(("TensorBase.", "Tensor.", "_TensorBase.")):
        return "Tensor." + qual.split(".", 1)[1]
    return f"torch.{getattr(func, '__name__', qual)}"


def _reading_frame() -> tuple[SourceLoc | None, bool]:
    """Where the value was asked for: the nearest user frame, else the first frame outside torch."""
    stack = list(frames_above(2))
    user = first_user_frame(stack)
    if user is not None:
        return SourceLoc(display_path(user.f_code.co_filename), user.f_lineno), True
    outside = first_outside_tool(f for f in stack if not f.f_code.co_filename.startswith("<"))
    return (SourceLoc(display_path(outside.f_code.co_filename), outside.f_lineno) if outside else None), False


class CudaSimulation:
    """`with CudaSimulation(label, gpu, ...):` — the script sees one CUDA device (see the module doc).

    `on_amp` is called with the autocast dtype in force (None when off) each time the script
    enters or leaves a CUDA autocast region; `in_forward` says whether the model's forward is
    running (a value asked for there leaves the step incomplete).
    """

    def __init__(
        self,
        label: torch.device,
        gpu: GpuProfile | None = None,
        *,
        on_amp: Callable[[torch.dtype | None], None] = lambda _dtype: None,
        in_forward: Callable[[], bool] = lambda: False,
        gpus: int = 1,
        indexed: bool = False,
        stops: bool = True,
    ) -> None:
        self.label = label
        self.gpu = gpu
        self.gpus = max(gpus, (label.index or 0) + 1)
        self.indexed = indexed or gpus > 1  # several GPUs: cuda:k lives on meta:k
        self.stops = stops  # False: a value read raises PyTorch's own error (a traced step records it)
        self._env: str | None = None
        self._accelerate: Any = None
        self.fake_mode: Any = None  # several GPUs: the FakeTensorMode the script's CUDA tensors belong to
        self.on_amp = on_amp
        self.in_forward = in_forward
        self.amp: list[torch.dtype | None] = []
        self.stopped: SimulationStop | None = None
        self.stand_ins = StandIns(site=lambda: _reading_frame()[0])
        self._placed: set[int] = set()  # storages the script placed on (simulated) CUDA
        import weakref

        # Storages the script or a library put on meta itself (`with torch.device("meta")`, init_empty_weights):
        # every other stand-in tensor is a CUDA tensor to the script (sees_cuda).
        self.explicit: Any = weakref.WeakSet()
        from dtype_doctor.machine.cuda_surface import CurrentDevice, SimulatedMemory

        self.current = CurrentDevice(label.index or 0, self.gpus)  # torch.cuda.set_device's GPU
        self.memory = SimulatedMemory(self.sees_cuda, self.cuda_index, self.current)
        self._import_hooks: tuple[Any, ...] = ()
        self._mode = _CudaMode(self)
        self.patches = LibraryPatches(self)  # what it changes in torch and the libraries (machine/sim_patches.py)
        self.not_simulated: list[str] = []  # the CUDA functions the script called that the simulation does not answer

    def faked(self, t: Any) -> Any:
        """`t` as a fake tensor of this simulation (several GPUs: the only tensors that keep meta:k)."""
        from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

        if not isinstance(t, torch.Tensor) or isinstance(t, FakeTensor):
            return t
        if self.fake_mode is None:
            self.fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        fake = self.fake_mode.from_tensor(t)
        return torch.nn.Parameter(fake, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else fake

    def stand_in(self, device: Any = None) -> torch.device:
        """The stand-in of a CUDA device argument ("cuda", "cuda:3", 3, torch.device; None: the current GPU)."""
        return stand_in_for(device_index(device, self.current.index), 2 if self.indexed else 1)

    def cuda_copy(self, t: torch.Tensor, device: Any, non_blocking: bool = False) -> torch.Tensor:
        """`t.cuda(device)`: on the stand-in of `device` (None: the current GPU, set_device's)."""
        source = self.faked(t) if self.indexed else t  # several GPUs: only a fake tensor keeps meta:k
        return self.place(source.to(self.stand_in(device), non_blocking=bool(non_blocking)))

    @property
    def amp_dtype(self) -> torch.dtype | None:
        return self.amp[-1] if self.amp else None

    def place(self, out: Any) -> Any:
        """`out` was placed on simulated CUDA by the script (not a `meta` tensor of its own)."""
        if isinstance(out, torch.Tensor) and out.device.type == STAND_IN.type:
            self._placed.add(out.untyped_storage()._cdata)
        return out

    def sees_cuda(self, t: torch.Tensor) -> bool:
        """`t` (a tensor on the stand-in device) is a CUDA tensor to the script: one it did not put on meta itself."""
        if t.device.type != STAND_IN.type:
            return False
        if not self.explicit:
            return True
        try:
            return t.untyped_storage() not in self.explicit
        except (RuntimeError, NotImplementedError, TypeError):  # a tensor without storage (a functional wrapper)
            return True

    def cuda_index(self, t: torch.Tensor) -> int:
        """The GPU a stand-in tensor is on: meta:k is cuda:k; plain meta is the simulated device."""
        index = t.device.index
        return index if index is not None and self.indexed else (self.label.index or 0)

    def all_explicit(self, args: tuple, kwargs: dict) -> bool:
        """An op on tensors the script put on meta itself (and on none of its CUDA ones) stays on meta."""
        found = False
        for t in tensors_in(args, kwargs):
            if t.device.type == STAND_IN.type:
                if self.sees_cuda(t):
                    return False
                found = True
        return found

    def mark_meta(self, out: Any) -> None:
        for t in tensors_in((out,), {}) if not isinstance(out, torch.Tensor) else [out]:
            if t.device.type == STAND_IN.type:
                try:
                    self.explicit.add(t.untyped_storage())
                except (RuntimeError, NotImplementedError, TypeError):
                    pass

    def where_read(self, read: str, t: Any, func: Any, args: tuple, kwargs: dict) -> Any:
        """`x.device`, `x.is_cuda`, `x.is_meta`, `x.get_device()`: a simulated CUDA tensor reads as CUDA's
        to the script and its libraries; torch's own code and the doctor's read the stand-in."""
        real = func(*args, **kwargs)
        if not isinstance(t, torch.Tensor) or t.device.type != STAND_IN.type or not _read_by_script(sys._getframe(2), func) \
                or not self.sees_cuda(t):
            return real
        index = self.cuda_index(t)
        if read == "type":
            return real.replace("torch.meta.", "torch.cuda.")  # "torch.cuda.FloatTensor", as PyTorch's errors name it
        return {"device": torch.device("cuda", index), "is_cuda": True, "is_meta": False, "get_device": index}[read]

    def on_cuda(self, t: torch.Tensor) -> bool:
        return t.device.type == STAND_IN.type and t.untyped_storage()._cdata in self._placed

    def data_read(self, what: str, limit: str | None = None, unanswered: bool = False) -> None:
        if not self.stops:
            return
        site, user = _reading_frame()
        self.stopped = SimulationStop(what, site, user, self.in_forward(), limit, unanswered)
        raise self.stopped

    # ---------------------------------------------------------------- arming

    def __enter__(self) -> "CudaSimulation":
        build_cuda = torch.version.cuda  # this build's own, before the simulation answers a CUDA build's
        self.patches.cuda()
        self.patches.module_moves()
        from dtype_doctor.machine.libraries import patch_bitsandbytes

        self._import_hooks = patch_bitsandbytes(self.on_cuda, self.patches.set, build_cuda)
        self.patches.autocast()
        self.patches.transformers()
        self.patches.load()
        from dtype_doctor.machine.modes import push_function_mode

        push_function_mode(self._mode)
        # transformers loads weights in a thread pool; a function mode holds in its own thread only,
        # so the load runs in this one, where .to("cuda:k") reaches the stand-in.
        self._env = os.environ.get("HF_DEACTIVATE_ASYNC_LOAD")
        os.environ["HF_DEACTIVATE_ASYNC_LOAD"] = "1"
        if self.indexed:
            self.patches.fake_device()
            from dtype_doctor.machine.accelerate_hooks import accelerate_on_fakes

            self._accelerate = accelerate_on_fakes(self.faked)
            self._accelerate.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        from dtype_doctor.machine.modes import remove_function_mode

        remove_function_mode(self._mode)
        for hook in self._import_hooks:
            if hook in sys.meta_path:
                sys.meta_path.remove(hook)
        if self._accelerate is not None:
            self._accelerate.__exit__(None, None, None)
            self._accelerate = None
        if self._env is None:
            os.environ.pop("HF_DEACTIVATE_ASYNC_LOAD", None)
        else:
            os.environ["HF_DEACTIVATE_ASYNC_LOAD"] = self._env
        self.patches.disarm()

    def refusal(self, name: str) -> Callable[..., Any]:
        """A CUDA function the simulation does not answer (machine/cuda_api.py): the call is named in the
        report's coverage and stops the script there, as a value no stand-in can give does."""

        def not_simulated(*args: Any, **kwargs: Any) -> Any:
            if name not in self.not_simulated:
                self.not_simulated.append(name)
            if not self.stops:
                raise RuntimeError(f"{name} is not simulated (dtype-doctor --simulate)")
            self.data_read(f"{name} (not simulated)", limit=name, unanswered=True)

        return not_simulated
