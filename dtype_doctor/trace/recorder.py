"""Record every op of a forward/backward: module hooks give names, the dispatcher gives ops.

`TorchDispatchMode` sees each aten op with its real operands after autocast's casts.
`TorchFunctionMode` is used only for the few functions whose checks run before
dispatch (SDPA validates its mask in C++ before any aten op is called). Both modes are
trace/dispatch.py; they hand each op to `Recorder.record`.

When an op raises a dtype or device error the recorder keeps the error, repairs the
operands (the way the fix would) and runs the op again, so one pass names every
mismatch instead of stopping at the first one as PyTorch does.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from dtype_doctor.records.errors import first_line
from dtype_doctor.numerics import device_name, dtype_name
from dtype_doctor.records import ModuleCall, OpCall, TensorMeta
from dtype_doctor.trace.dispatch import DispatchRecorder, FunctionRecorder, NoTorchFunction
from dtype_doctor.trace.layer_share import SharedRuns
from dtype_doctor.trace.meta_outputs import MetaOutputs
from dtype_doctor.trace.module_hooks import ModuleHooks
from dtype_doctor.trace.op_attrs import call_attrs
from dtype_doctor.trace.opfacts import ARG_ROLES, facts
from dtype_doctor.trace.provenance import Provenance, tensor_attributes
from dtype_doctor.trace.repaired_runs import FAILED, RepairedRuns
from dtype_doctor.trace.several_models import SeveralModels
from dtype_doctor.trace.value_watch import ValueWatch
from dtype_doctor.trace.values import ValueProbe
from dtype_doctor.trace.verdicts import classify_error
from dtype_doctor.trace.weakid import WeakIdMap

if TYPE_CHECKING:
    from dtype_doctor.trace.guard import WriteGuard


@dataclass(frozen=True, slots=True)
class _Site:
    """Where one op runs, as record() sees it before running it."""

    operand_tensors: list[tuple[torch.Tensor, str | None]]
    operands: tuple[TensorMeta, ...]
    module: str
    module_type: str
    phase: str
    autocast: str | None


class Recorder(ValueWatch, ModuleHooks, RepairedRuns, SharedRuns, SeveralModels):
    """Collects ModuleCall and OpCall records; `modes()` gives the context to run under. Its value
    statistics (trace/value_watch.py), module hooks (trace/module_hooks.py) and repaired runs
    (trace/repaired_runs.py) are methods it inherits, on its own state."""

    _attrs = staticmethod(call_attrs)  # an op call's facts beyond its operands (trace/op_attrs.py)

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        state: dict[str, torch.Tensor] | None = None,
        recover: bool = True,
        device_alias: dict[str, str] | None = None,
        predict: Callable[[Any, tuple, dict, OpCall], str | None] | None = None,
        values: ValueProbe | None = None,
    ) -> None:
        self.model = model
        # Value statistics (trace/values.py): handles now, ValueStats when the trace is done.
        self.values = values
        self._op_values: dict[int, tuple[int | None, list[int | None]]] = {}
        self._module_values: dict[int, tuple[list[int | None], list[int | None]]] = {}
        # Tensors that stay float32 when the model is converted to half: outputs of the modules
        # the model keeps in fp32, and what they flow into until a converted module takes them.
        self._keep = tuple(getattr(model, "_keep_in_fp32_modules", None) or ()) + tuple(
            getattr(model, "_keep_in_fp32_modules_strict", None) or ()
        )
        self._fp32_kept: WeakIdMap[bool] = WeakIdMap()
        self._kept_ops: set[int] = set()
        # Simulated traces run fake kernels, which accept mixed dtypes: `predict` says where a
        # real device would raise (the engine passes a KernelProbe, trace/probe.py).
        self.predict = predict
        # What ops make of data-less tensors, worked out once per call signature (trace/meta_outputs.py).
        self.meta_outputs = MetaOutputs() if predict is not None else None
        # A simulated CUDA autocast on a CPU-only build: CUDA's casts, applied per function.
        self.amp: Any = None
        self.amp_state: str | None = None  # its dtype where the model last called a torch function
        self.device_alias = device_alias or {}
        self.recover = recover
        self.ops: list[OpCall] = []
        self.modules: list[ModuleCall] = []
        self.stack: list[tuple[str, str]] = [("", type(model).__name__)]
        self.autocast_stack: list[str | None] = [None]
        self.prov: WeakIdMap[Provenance] = WeakIdMap()
        self.boundary_inputs: list[TensorMeta] = []
        self._handles: list[Any] = []
        self._module_names: dict[int, str] = {}
        # The same few metadata recur op after op: each TensorMeta (frozen) is built once.
        self._metas: dict[tuple, TensorMeta] = {}
        self._device_names: dict[torch.device, str] = {}
        self._in_root = 0  # forwards of the model (or of another model of the step) in progress
        self._roots = {id(model)}  # the model and the models adopted beside it (a script's several models)
        # Op indices where the root's outermost calls began and ended, until it is named (name_root).
        self._root_spans: list[int] | None = []
        self._unkept: tuple[int, int, Any] | None = None  # where ops stopped being kept (pause_keeping)
        self.dropped = 0  # ops recorded and then dropped (a model's repeated calls)
        # The write guard of a trace on the model's own parameters (trace/guard.py), called before
        # every op by the dispatch mode: one Python mode per op instead of a second one.
        self.writes: WriteGuard | None = None
        self._suspended = 0  # > 0 while the recorder makes its own repair casts
        params = dict(model.named_parameters(remove_duplicate=False))
        buffers = dict(model.named_buffers(remove_duplicate=False))
        if state is not None:
            # functional_call swaps these in; their names are the same.
            for name, t in state.items():
                (params if name in params else buffers)[name] = t
        for name, p in params.items():
            self.prov[p] = Provenance("param", name, f"param:{name}")
        for name, b in buffers.items():
            if isinstance(b, torch.Tensor):
                self.prov[b] = Provenance("buffer", name, f"buffer:{name}")
        for name, t in tensor_attributes(model):  # a RoPE table kept as a plain attribute: model.to() leaves it
            if self.prov.get(t) is None:
                self.prov[t] = Provenance("attribute", name, f"attribute:{name}")

    # ---------------------------------------------------------------- metadata

    def aliased(self, message: str) -> str:
        """PyTorch's words with the stand-in GPUs named as users read them: meta:2 → cuda:2."""
        if not self.device_alias or "meta:" not in message:
            return message
        import re

        return re.sub(r"\bmeta:\d+\b", lambda m: self.device_alias.get(m.group(0), m.group(0)), message)

    def meta(self, t: torch.Tensor, role: str | None = None, name: str | None = None) -> TensorMeta:
        p = self.prov.get(t)
        origin = None
        if p is not None:
            if role is None or role == "input":
                if p.kind == "param":
                    role = "bias" if p.name and p.name.endswith("bias") else "weight"
                elif p.kind == "buffer":
                    role = "buffer"
            name = name or p.name
            origin = p.origin
        role = role or "input"
        dev = t.device
        device = self._device_names.get(dev)
        if device is None:
            device = device_name(dev)
            device = self._device_names[dev] = self.device_alias.get(device, device)
        try:
            key = (t.dtype, device, t.shape, role, name, origin)
            found = self._metas.get(key)
        except TypeError:  # a symbolic size cannot be a key
            key, found = None, None
        if found is None:
            found = TensorMeta(dtype=dtype_name(t.dtype), device=device, shape=tuple(t.shape), role=role, name=name, origin=origin)
            if key is not None:
                self._metas[key] = found
        return found

    def tag_input(self, name: str, t: torch.Tensor) -> TensorMeta:
        self.prov[t] = Provenance("input", name, f"input:{name}")
        return self.meta(t, "input", name)

    def _operands(self, func: Any, args: tuple, kwargs: dict) -> list[tuple[torch.Tensor, str | None]]:
        op = facts(func)
        roles, names = op.roles, op.names
        found: list[tuple[torch.Tensor, str | None]] = []
        n = len(roles)
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                found.append((a, roles[i] if i < n else None))
            elif isinstance(a, (list, tuple)):
                role = roles[i] if i < n else None
                found.extend((x, role) for x in a if isinstance(x, torch.Tensor))
        if kwargs:
            for k, v in kwargs.items():
                if isinstance(v, torch.Tensor):
                    found.append((v, ARG_ROLES.get(k) if names is None or k in names else None))
        return found

    # ------------------------------------------------------------------ record

    def record(
        self,
        func: Any,
        op_name: str,
        args: tuple,
        kwargs: dict,
        run: Callable[[tuple, dict], Any],
        level: str,
        *,
        refusal: str | None = None,
    ) -> Any:
        """Record one op and run it; `refusal` is an error the target would raise that this
        machine would not (CUDA autocast's banned functions), handled as a predicted one."""
        if self.shared and refusal is None and (shared := self.shared_run(func, args, kwargs, run))[0]:
            return shared[1]  # an op of a layer identical to one traced (trace/layer_share.py)
        site = self._site(func, args, kwargs)
        predicted = refusal or (
            self.predict(func, args, kwargs, OpCall(0, op_name, site.module, site.module_type, site.operands,
                                                    autocast=site.autocast, level=level))
            if self.predict is not None
            else None
        )
        error: str | None = None
        recovered = False
        out = FAILED
        made = getattr(self.predict, "as_made", None)
        if made is not None:
            # A simulated target's forward saves what its own kernel saves (the probe knows).
            plain_run = run
            run = lambda a, k: made(func, a, k, plain_run(a, k))  # noqa: E731
        if self.values is not None:
            with NoTorchFunction():
                self._observe_written(func, site.operand_tensors, kwargs)
        if predicted is not None:
            # Fake kernels would run this op; a real device would not. Repair as after a real error.
            error = predicted
            out = self._run_repaired(op_name, site.operand_tensors, args, kwargs, classify_error(predicted, site.operands), run)
            recovered = out is not FAILED
        if out is FAILED:
            try:
                out = run(args, kwargs)
            except Exception as exc:  # noqa: BLE001 - every failure is recorded, then re-raised or repaired
                error = error or self.aliased(_first_line(exc))
                kind = classify_error(_first_line(exc), site.operands)
                if kind == "dtype" and getattr(self.predict, "last_accepted", False):
                    out = self._accepted(func, op_name, args, kwargs, run, site, kind, predicted, level)
                    if out is not FAILED:
                        return out
                if self.recover and kind in ("dtype", "device", "overflow") and predicted is None:
                    out = self._run_repaired(op_name, site.operand_tensors, args, kwargs, kind, run)
                if out is FAILED:
                    self.ops.append(OpCall(len(self.ops), op_name, site.module, site.module_type, site.operands, (),
                                           site.phase, site.autocast, error, False, level))
                    raise
                recovered = True
        with NoTorchFunction():
            outputs = self._tag_outputs(func, op_name, out, site.operand_tensors, site.module)
            self._observe_op(func, out, site.operand_tensors)
        self.ops.append(OpCall(len(self.ops), op_name, site.module, site.module_type, site.operands, outputs, site.phase,
                               site.autocast, error, recovered, level, self._attrs(op_name, args, kwargs, self._in_root)))
        return out

    def _site(self, func: Any, args: tuple, kwargs: dict) -> _Site:
        """Where an op runs: its operands, the module calling it, the phase and the autocast state."""
        # The doctor's own reads of tensor metadata (.dtype, .shape) are not the model's calls: with
        # torch functions off they skip every function mode (each read would be one).
        with NoTorchFunction():
            operand_tensors = self._operands(func, args, kwargs)
            meta = self.meta
            operands = tuple([meta(t, role) for t, role in operand_tensors])
        module, module_type = self.stack[-1]
        phase = "backward" if torch._C._current_autograd_node() is not None else "forward"
        if phase == "backward":
            module, module_type = "", ""
        # An emulated CUDA autocast knows its state per op (a disabled block inside a module), as
        # the function mode last saw it: a dispatch mode runs with autocast's keys excluded.
        autocast = (self.amp_state if self.amp is not None else self.autocast_stack[-1]) if phase == "forward" else None
        return _Site(operand_tensors, operands, module, module_type, phase, autocast)

    def _accepted(self, func: Any, op_name: str, args: tuple, kwargs: dict, run: Callable[[tuple, dict], Any], site: _Site,
                  kind: str, predicted: str | None, level: str) -> Any:
        """A fake kernel (a Python decomposition) stricter than the real one, which the probe just
        ran: not a refusal. Go on as the repair would, recording only the target's own refusal, if
        it had one (the CPU ran it, CUDA would not). The op's output, recorded, or FAILED."""
        out = self._run_repaired(op_name, site.operand_tensors, args, kwargs, kind, run)
        if out is FAILED:
            out = self._run_as_accepted(args, kwargs, run)
        if out is not FAILED:
            outputs = self._tag_outputs(func, op_name, out, site.operand_tensors, site.module)
            self._observe_op(func, out, site.operand_tensors)
            self.ops.append(OpCall(len(self.ops), op_name, site.module, site.module_type, site.operands, outputs, site.phase,
                                   site.autocast, predicted, predicted is not None, level,
                                   self._attrs(op_name, args, kwargs, self._in_root)))
        return out

    def _tag_outputs(
        self, func: Any, op_name: str, out: Any, operands: list[tuple[torch.Tensor, str | None]], module: str
    ) -> tuple[TensorMeta, ...]:
        outs = out if isinstance(out, (tuple, list)) else (out,)
        is_view = facts(func).is_view
        prov_of = self.prov.get
        metas = []
        for o in outs:
            if not isinstance(o, torch.Tensor):
                continue
            prov = prov_of(o)
            if prov is None:  # an in-place op returns its operand, whose provenance is kept
                prov = prov_of(operands[0][0]) if is_view and operands else None
                if prov is None:
                    prov = Provenance("activation", None, self._origin(o.dtype, op_name, operands, module))
                self.prov[o] = prov
            metas.append(self.meta(o, "output"))
        return tuple(metas)

    def _origin(self, dtype: torch.dtype, op_name: str, operands: list[tuple[torch.Tensor, str | None]], module: str) -> str | None:
        """Where an output of `dtype` got its dtype: from the first operand that has it, activations
        before parameters and buffers; else this op made it."""
        prov_of = self.prov.get
        state: Provenance | None = None
        for t, _ in operands:
            if t.dtype == dtype:
                p = prov_of(t)
                if p is None or p.kind not in ("param", "buffer"):
                    if p is not None:
                        return p.origin
                    break  # the first activation of the dtype is one the recorder does not know
                if state is None:
                    state = p
        else:
            if state is not None:
                return state.origin
        return f"created:{op_name}@{module}"

    # ------------------------------------------------------------ suspension

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """Ops run inside are not the model's: a DataLoader fetch, a second model, the recorder's
        own repairs and autocast casts."""
        self._suspended += 1
        try:
            yield
        finally:
            self._suspended -= 1

    @property
    def is_suspended(self) -> bool:
        return self._suspended > 0

    def knows(self, t: torch.Tensor) -> bool:
        """Whether `t` is the model's own or was made in the traced step (a parameter, an input, an op's output)."""
        return self.prov.get(t) is not None

    # ------------------------------------------------------------------- modes

    def dispatch_mode(self) -> "DispatchRecorder":
        return DispatchRecorder(self)

    def function_mode(self) -> "FunctionRecorder":
        return FunctionRecorder(self)


def _first_line(exc: BaseException) -> str:
    return first_line(exc, 500)
