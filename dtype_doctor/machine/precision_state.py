"""The process's precision switches: read them (`current_state`), and, while a script runs, see who
sets them and which TF32 reads PyTorch refuses (`PrecisionWatch`).

PyTorch 2.9 split the TF32 switches into a new API (`torch.backends.cuda.matmul.fp32_precision`,
`torch.backends.cudnn.conv.fp32_precision`, ...) beside the legacy one (`allow_tf32`,
`torch.set_float32_matmul_precision`). Once the new API has set a switch, reading it through the
legacy one raises a RuntimeError ("... you have used mix of the legacy and new APIs ..."), on a
CPU build too. The watch does not model that rule: PyTorch decides, and the watch records the
refused read with the lines of its reader and of the setter of the other API.

The watch wraps the Python entry points the switches have (cuBLASModule, CudnnModule's
ContextProps, _FP32Precision, GenericModule, and torch's functions), and puts the process back as
it found it when the script is done: the doctor runs in the script's process.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch

from dtype_doctor.machine.user_code import display_path, first_outside_tool, first_user_frame, frames_above, is_user_file
from dtype_doctor.numerics import dtype_name
from dtype_doctor.records import DefaultDtypeChange, PrecisionState, Setter, SourceLoc, Switch, Tf32Mix
from dtype_doctor.records.precision import LEGACY, NEW, PLAIN, UNREADABLE

_C = torch._C
MATMUL, CUDNN = "cuda.matmul", "cudnn"  # the TF32 families whose two APIs PyTorch refuses to read across


@dataclass(frozen=True)
class SwitchSpec:
    """A switch: its name as scripts write it, its API, the TF32 families it sets, how to read it raw."""

    name: str
    api: str
    families: tuple[str, ...]
    read: Callable[[], Any]


def _fp32(backend: str, op: str) -> Callable[[], str]:
    return lambda: _C._get_fp32_precision_getter(backend, op)


SWITCHES: tuple[SwitchSpec, ...] = (
    SwitchSpec("torch.get_default_dtype()", PLAIN, (), lambda: dtype_name(torch.get_default_dtype())),
    SwitchSpec("torch.backends.cuda.matmul.allow_tf32", LEGACY, (MATMUL,), lambda: _C._get_cublas_allow_tf32()),
    SwitchSpec("torch.set_float32_matmul_precision", LEGACY, (MATMUL,), lambda: _C._get_float32_matmul_precision()),
    SwitchSpec("torch.backends.cudnn.allow_tf32", LEGACY, (CUDNN,), lambda: _C._get_cudnn_allow_tf32()),
    SwitchSpec("torch.backends.fp32_precision", NEW, (MATMUL, CUDNN), _fp32("generic", "all")),
    SwitchSpec("torch.backends.cuda.matmul.fp32_precision", NEW, (MATMUL,), _fp32("cuda", "matmul")),
    SwitchSpec("torch.backends.cudnn.fp32_precision", NEW, (CUDNN,), _fp32("cuda", "all")),
    SwitchSpec("torch.backends.cudnn.conv.fp32_precision", NEW, (CUDNN,), _fp32("cuda", "conv")),
    SwitchSpec("torch.backends.cudnn.rnn.fp32_precision", NEW, (CUDNN,), _fp32("cuda", "rnn")),
    SwitchSpec("torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction", PLAIN, (),
               lambda: _C._get_cublas_allow_fp16_reduced_precision_reduction()[0]),
    SwitchSpec("torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction", PLAIN, (),
               lambda: _C._get_cublas_allow_bf16_reduced_precision_reduction()[0]),
    SwitchSpec("torch.use_deterministic_algorithms", PLAIN, (), lambda: _C._get_deterministic_algorithms()),
    SwitchSpec("torch.backends.cudnn.deterministic", PLAIN, (), lambda: _C._get_cudnn_deterministic()),
    SwitchSpec("torch.backends.cudnn.benchmark", PLAIN, (), lambda: _C._get_cudnn_benchmark()),
)
SPEC = {s.name: s for s in SWITCHES}


def is_mix_refusal(error: BaseException) -> bool:
    """PyTorch's refusal to read a TF32 switch set through the other API (its own words, any backend)."""
    return isinstance(error, RuntimeError) and "mix of the legacy and new APIs" in str(error)


def _value(spec: SwitchSpec) -> str:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = spec.read()
    except RuntimeError as error:
        if is_mix_refusal(error):
            return UNREADABLE
        raise
    return str(value)


def _default() -> Setter:
    return Setter("default")


def current_state(setters: dict[str, Setter] | None = None, initial: dict[str, str] | None = None, **extra: Any) -> PrecisionState:
    """The switches as they are now, each with who set it (`setters`; unknown: torch's default)."""
    setters = setters or {}
    switches = tuple(Switch(s.name, _value(s), s.api, setters.get(s.name, _default()), (initial or {}).get(s.name)) for s in SWITCHES)
    return PrecisionState(switches, **extra)


def who(skip: int = 1) -> Setter:
    """The caller of a precision API, `skip` frames up: the script's line, or a library's line (and its
    package) with the user's line that called into the library (`via`)."""
    frames = list(frames_above(skip + 1))
    frame = first_outside_tool(frames)
    if frame is None:
        return Setter("library", None, "torch")
    here = SourceLoc(display_path(frame.f_code.co_filename), frame.f_lineno)
    if is_user_file(frame.f_code.co_filename):
        return Setter("script", here)
    user = first_user_frame(frames)
    via = SourceLoc(display_path(user.f_code.co_filename), user.f_lineno) if user is not None else None
    return Setter("library", here, _package(frame.f_code.co_filename, frame.f_globals), via)


def _package(filename: str, globals_: dict[str, Any]) -> str:
    name = globals_.get("__name__") or ""
    if name and name != "__main__":
        return name.split(".")[0]
    return display_path(filename)


class PrecisionWatch:
    """`with PrecisionWatch() as w:` the script runs; `w.state()` is the switches with their setters,
    the refused TF32 reads, the default dtype's changes; on exit the process is as it was."""

    def __init__(self) -> None:
        self.setters: dict[str, Setter] = {}
        self.mixes: list[Tf32Mix] = []
        self.refusals: list[BaseException] = []  # the errors of the refused reads, to know them when the script stops on one
        self.dtype_changes: list[DefaultDtypeChange] = []
        self._api_set: dict[tuple[str, str], tuple[str, Setter]] = {}  # (family, api) → the last switch set and its setter
        self._undo: list[Callable[[], None]] = []
        self._initial: dict[str, str] = {}
        self._final: PrecisionState | None = None

    # -- arming ---------------------------------------------------------------------------

    def __enter__(self) -> "PrecisionWatch":
        self._initial = {s.name: _value(s) for s in SWITCHES}
        self._saved = _raw_state()
        try:
            self._patch_cublas()
            self._patch_props()
            self._patch_fp32_precision()
            self._patch_functions()
        except BaseException:
            self._unpatch()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._unpatch()
        self._final = self.state()  # as the script left it: a report made after the run reads this
        _restore(self._saved)

    def _unpatch(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _set_attr(self, owner: Any, name: str, value: Any) -> None:
        had = name in vars(owner)
        old = vars(owner).get(name)
        setattr(owner, name, value)
        self._undo.append(lambda: setattr(owner, name, old) if had else delattr(owner, name))

    # -- what the script does -------------------------------------------------------------

    def set(self, name: str, setter: Setter) -> None:
        spec = SPEC.get(name)
        self.setters[name] = setter
        for family in spec.families if spec else ():
            self._api_set[(family, spec.api)] = (name, setter)  # type: ignore[union-attr]

    def refused(self, read: str, error: BaseException, reader: Setter) -> None:
        """A read of `read` that PyTorch refused: the setter of the other API in its family named."""
        spec = SPEC.get(read)
        api = spec.api if spec else LEGACY
        families = spec.families if spec else (MATMUL,)
        other = next((self._api_set[(f, a)] for f in families for a in (NEW, LEGACY) if a != api and (f, a) in self._api_set), None)
        set_name, setter = other or ("an earlier setting", _default())
        set_api = SPEC[set_name].api if set_name in SPEC else (NEW if api == LEGACY else LEGACY)
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        self.mixes.append(Tf32Mix(set_name, set_api, setter, read, reader, first))
        self.refusals.append(error)

    def owns(self, error: BaseException | None) -> bool:
        """Whether `error` (or what it wraps) is a TF32 read this watch saw refused."""
        seen: set[int] = set()
        while error is not None and id(error) not in seen:
            if any(error is r for r in self.refusals):
                return True
            seen.add(id(error))
            error = error.__cause__ or error.__context__
        return False

    def state(self) -> PrecisionState:
        if self._final is not None:
            return self._final
        return current_state(self.setters, self._initial, mixes=tuple(self.mixes), default_dtype=tuple(self.dtype_changes), watched=True)

    def _reading(self, name: str, read: Callable[[], Any]) -> Any:
        try:
            return read()
        except RuntimeError as error:
            if is_mix_refusal(error):
                self.refused(name, error, who(1))
            raise

    # -- the entry points -----------------------------------------------------------------

    def _patch_cublas(self) -> None:
        cls = type(torch.backends.cuda.matmul)
        get, put = cls.__getattr__, cls.__setattr__
        watch = self
        prefix = "torch.backends.cuda.matmul."

        def __getattr__(obj: Any, name: str) -> Any:
            return watch._reading(prefix + name, lambda: get(obj, name))

        def __setattr__(obj: Any, name: str, value: Any) -> Any:
            out = put(obj, name, value)
            watch.set(prefix + name, who(1))
            return out

        self._set_attr(cls, "__getattr__", __getattr__)
        self._set_attr(cls, "__setattr__", __setattr__)

    def _patch_props(self) -> None:
        from torch.backends import ContextProp

        cudnn = type(torch.backends.cudnn)
        for owner, prefix in ((cudnn, "torch.backends.cudnn."), (type(torch.backends), "torch.backends.")):
            for attr, prop in list(vars(owner).items()):
                if isinstance(prop, ContextProp) and prefix + attr in SPEC:
                    self._set_attr(owner, attr, _WatchedProp(prop, prefix + attr, self))

    def _patch_fp32_precision(self) -> None:
        from torch.backends import _FP32Precision

        get, put = _FP32Precision.__getattr__, _FP32Precision.__setattr__
        watch = self

        def name_of(obj: Any) -> str:
            backend = object.__getattribute__(obj, "__dict__").get("backend", "")
            op = object.__getattribute__(obj, "__dict__").get("op", "")
            return f"torch.backends.{'cudnn' if backend == 'cuda' else backend}.{op}.fp32_precision"

        def __getattr__(obj: Any, name: str) -> Any:
            if name != "fp32_precision":
                return get(obj, name)
            return watch._reading(name_of(obj), lambda: get(obj, name))

        def __setattr__(obj: Any, name: str, value: Any) -> Any:
            out = put(obj, name, value)
            if name == "fp32_precision":
                watch.set(name_of(obj), who(1))
            return out

        self._set_attr(_FP32Precision, "__getattr__", __getattr__)
        self._set_attr(_FP32Precision, "__setattr__", __setattr__)

    def _patch_functions(self) -> None:
        watch = self
        set_matmul, get_matmul = torch.set_float32_matmul_precision, torch.get_float32_matmul_precision
        set_default, deterministic = torch.set_default_dtype, torch.use_deterministic_algorithms

        def set_float32_matmul_precision(precision: str) -> None:
            set_matmul(precision)
            watch.set("torch.set_float32_matmul_precision", who(1))

        def get_float32_matmul_precision() -> str:
            return watch._reading("torch.set_float32_matmul_precision", get_matmul)

        def set_default_dtype(d: torch.dtype) -> None:
            before = dtype_name(torch.get_default_dtype())
            set_default(d)
            setter = who(1)
            watch.set("torch.get_default_dtype()", setter)
            watch.dtype_changes.append(DefaultDtypeChange(dtype_name(torch.get_default_dtype()), before, setter))

        def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
            deterministic(mode, warn_only=warn_only)
            watch.set("torch.use_deterministic_algorithms", who(1))

        for fn in (set_float32_matmul_precision, get_float32_matmul_precision, set_default_dtype, use_deterministic_algorithms):
            self._set_attr(torch, fn.__name__, fn)


class _WatchedProp:
    """A CudnnModule / GenericModule ContextProp that says who set it, and which reads PyTorch refused."""

    def __init__(self, prop: Any, name: str, watch: PrecisionWatch) -> None:
        self.prop, self.name, self.watch = prop, name, watch

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self.watch._reading(self.name, lambda: self.prop.__get__(obj, objtype))

    def __set__(self, obj: Any, value: Any) -> None:
        self.prop.__set__(obj, value)
        self.watch.set(self.name, who(1))


def _raw_state() -> dict[str, Any]:
    """What `_restore` puts back: the new API's values (which also clear a mix), the legacy flags,
    the reductions, the default dtype, the deterministic settings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {
            "default_dtype": torch.get_default_dtype(),
            "legacy": _legacy(),
            "fp32": {(b, o): _C._get_fp32_precision_getter(b, o)
                     for b, o in (("generic", "all"), ("cuda", "matmul"), ("cuda", "all"), ("cuda", "conv"), ("cuda", "rnn"))},
            "fp16_reduction": _C._get_cublas_allow_fp16_reduced_precision_reduction(),
            "bf16_reduction": _C._get_cublas_allow_bf16_reduced_precision_reduction(),
            "deterministic": (_C._get_deterministic_algorithms(), _C._get_deterministic_algorithms_warn_only()),
            "cudnn": (_C._get_cudnn_deterministic(), _C._get_cudnn_benchmark()),
        }


def _legacy() -> tuple[bool, bool, str] | None:
    try:
        return _C._get_cublas_allow_tf32(), _C._get_cudnn_allow_tf32(), _C._get_float32_matmul_precision()
    except RuntimeError:  # already mixed when the script started: left as the new API's values put it
        return None


def _restore(saved: dict[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.set_default_dtype(saved["default_dtype"])
        if saved["legacy"] is not None:  # the legacy flags first: the new API's values, set after them, clear a mix
            allow_cublas, allow_cudnn, matmul = saved["legacy"]
            _C._set_cublas_allow_tf32(allow_cublas)
            _C._set_cudnn_allow_tf32(allow_cudnn)
            _C._set_float32_matmul_precision(matmul)
        for (backend, op), value in saved["fp32"].items():
            _C._set_fp32_precision_setter(backend, op, value)
        _C._set_cublas_allow_fp16_reduced_precision_reduction(*saved["fp16_reduction"])
        _C._set_cublas_allow_bf16_reduced_precision_reduction(*saved["bf16_reduction"])
        torch.use_deterministic_algorithms(saved["deterministic"][0], warn_only=saved["deterministic"][1])
        _C._set_cudnn_deterministic(saved["cudnn"][0])
        _C._set_cudnn_benchmark(saved["cudnn"][1])

