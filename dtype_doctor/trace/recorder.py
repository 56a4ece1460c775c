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
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

import torch

from dtype_doctor.records.errors import first_line
from dtype_doctor.numerics import device_name, dtype_name, tensors_in
from dtype_doctor.records import ModuleCall, OpCall, TensorMeta, in_modules
from dtype_doctor.trace.dispatch import _NEVER_NUMBERS, _DispatchRecorder, _FunctionRecorder, _NoTorchFunction, _big_number
from dtype_doctor.trace.opfacts import ARG_ROLES, facts
from dtype_doctor.trace.provenance import Provenance, boundary_tensors, tensor_attributes
from dtype_doctor.trace.several_models import SeveralModels
from dtype_doctor.trace.values import PLAIN_TYPES, ValueProbe
from dtype_doctor.trace.unseen import hook_module, unhook
from dtype_doctor.trace.verdicts import classify_error
from dtype_doctor.trace.weakid import WeakIdMap

if TYPE_CHECKING:
    from dtype_doctor.trace.guard import WriteGuard


# Ops whose rules need a fact of the call beyond its operands, by kind: a loss or a statistic
# (DD112) keeps the user's line that called it, the first frame outside torch and the doctor when
# it is the user's own file (few ops of a step are these: the frame walk is paid only for them);
# softmax keeps the axis it normalises over; SDPA the arguments its CUDA backend choice reads.
_CALL_FACTS: dict[str, str] = {
    **dict.fromkeys(
        ("aten.nll_loss_forward.default", "aten.nll_loss2d_forward.default", "aten.mse_loss.default",
         "aten.l1_loss.default", "aten.smooth_l1_loss.default", "aten.huber_loss.default",
         "aten.binary_cross_entropy_with_logits.default", "aten.binary_cross_entropy.default", "aten.kl_div.default",
         "aten.var.correction", "aten.var.dim", "aten.var.default", "aten.std.correction", "aten.std.dim",
         "aten.std.default", "aten.var_mean.correction", "aten.std_mean.correction", "aten.linalg_vector_norm.default",
         "aten.norm.Scalar", "aten.norm.ScalarOpt_dim", "torch.quantile", "torch.nanquantile"),
        "site",
    ),
    "aten._softmax.default": "dim",
    "aten._log_softmax.default": "dim",
    "torch.nn.functional.scaled_dot_product_attention": "sdpa",
}
_SDPA_ARGS = (("dropout_p", 4, 0.0), ("is_causal", 5, False), ("enable_gqa", 7, False))


@dataclass(frozen=True, slots=True)
class _Site:
    """Where one op runs, as record() sees it before running it."""

    operand_tensors: list[tuple[torch.Tensor, str | None]]
    operands: tuple[TensorMeta, ...]
    module: str
    module_type: str
    phase: str
    autocast: str | None


class Recorder(SeveralModels):
    """Collects ModuleCall and OpCall records; `modes()` gives the context to run under."""

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
        site = self._site(func, args, kwargs)
        predicted = refusal or (
            self.predict(func, args, kwargs, OpCall(0, op_name, site.module, site.module_type, site.operands,
                                                    autocast=site.autocast, level=level))
            if self.predict is not None
            else None
        )
        error: str | None = None
        recovered = False
        out = _FAILED
        made = getattr(self.predict, "as_made", None)
        if made is not None:
            # A simulated target's forward saves what its own kernel saves (the probe knows).
            plain_run = run
            run = lambda a, k: made(func, a, k, plain_run(a, k))  # noqa: E731
        if self.values is not None:
            with _NoTorchFunction():
                self._observe_written(func, site.operand_tensors, kwargs)
        if predicted is not None:
            # Fake kernels would run this op; a real device would not. Repair as after a real error.
            error = predicted
            out = self._run_repaired(op_name, site.operand_tensors, args, kwargs, classify_error(predicted, site.operands), run)
            recovered = out is not _FAILED
        if out is _FAILED:
            try:
                out = run(args, kwargs)
            except Exception as exc:  # noqa: BLE001 - every failure is recorded, then re-raised or repaired
                error = error or self.aliased(_first_line(exc))
                kind = classify_error(_first_line(exc), site.operands)
                if kind == "dtype" and getattr(self.predict, "last_accepted", False):
                    out = self._accepted(func, op_name, args, kwargs, run, site, kind, predicted, level)
                    if out is not _FAILED:
                        return out
                if self.recover and kind in ("dtype", "device", "overflow") and predicted is None:
                    out = self._run_repaired(op_name, site.operand_tensors, args, kwargs, kind, run)
                if out is _FAILED:
                    self.ops.append(OpCall(len(self.ops), op_name, site.module, site.module_type, site.operands, (),
                                           site.phase, site.autocast, error, False, level))
                    raise
                recovered = True
        with _NoTorchFunction():
            outputs = self._tag_outputs(func, op_name, out, site.operand_tensors, site.module)
            self._observe_op(func, out, site.operand_tensors)
        self.ops.append(OpCall(len(self.ops), op_name, site.module, site.module_type, site.operands, outputs, site.phase,
                               site.autocast, error, recovered, level, self._attrs(op_name, args, kwargs, self._in_root)))
        return out

    def _site(self, func: Any, args: tuple, kwargs: dict) -> _Site:
        """Where an op runs: its operands, the module calling it, the phase and the autocast state."""
        # The doctor's own reads of tensor metadata (.dtype, .shape) are not the model's calls: with
        # torch functions off they skip every function mode (each read would be one).
        with _NoTorchFunction():
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
        it had one (the CPU ran it, CUDA would not). The op's output, recorded, or _FAILED."""
        out = self._run_repaired(op_name, site.operand_tensors, args, kwargs, kind, run)
        if out is _FAILED:
            out = self._run_as_accepted(args, kwargs, run)
        if out is not _FAILED:
            outputs = self._tag_outputs(func, op_name, out, site.operand_tensors, site.module)
            self._observe_op(func, out, site.operand_tensors)
            self.ops.append(OpCall(len(self.ops), op_name, site.module, site.module_type, site.operands, outputs, site.phase,
                                   site.autocast, predicted, predicted is not None, level,
                                   self._attrs(op_name, args, kwargs, self._in_root)))
        return out

    # ------------------------------------------------------------------ values

    def observe(self, tensors: Iterable[Any], *, as_last_seen: bool = False, bounded_by: list[int] | None = None) -> list[int | None]:
        values = self.values
        assert values is not None
        tensors = list(tensors)
        handles = [values.known(t, as_last_seen=as_last_seen) for t in tensors]
        new = [t for h, t in zip(handles, tensors) if h is None and isinstance(t, torch.Tensor)]
        if not new:
            return handles  # all seen before: no kernels to run
        # The statistics' own kernels are not the model's ops: they run outside every mode. Plain
        # tensors need only the dispatcher's Python key off (a C++ guard); a tensor subclass keeps
        # its own __torch_dispatch__, with the modes popped instead.
        plain = all(type(t) in PLAIN_TYPES for t in new)
        with (torch._C._DisableTorchDispatch() if plain else _no_modes()), torch._C.DisableTorchFunction():
            return [
                h if h is not None else values.observe(t, as_last_seen=as_last_seen, bounded_by=bounded_by)
                for h, t in zip(handles, tensors)
            ]

    def _observe_op(self, func: Any, out: Any, operands: list[tuple[torch.Tensor, str | None]]) -> None:
        values = self.values
        if values is None:
            return
        if self._keep and any(t in self._fp32_kept for t, _ in operands):
            self._kept_ops.add(len(self.ops))
            for o in tensors_in(out):
                self._fp32_kept[o] = True
        kind = facts(func)
        outs = (out,) if isinstance(out, torch.Tensor) else tuple(tensors_in(out))
        first = None
        if kind.measured:
            for o in outs:
                if o.is_floating_point():
                    first = o
                    break
        # Operands as they were last seen (an in-place op has since changed them; _observe_written
        # measured them before it ran), the output as it is now. For an `out=` op its results are
        # its `out=` arguments. The statistics' own kernels are not the model's ops: they run
        # outside every mode (see observe()); `plain` says no tensor subclass is among them.
        activations = self._read_operands(operands, outs if kind.out_args else ())
        plain = (first is None or type(first) in PLAIN_TYPES) and all(type(t) in PLAIN_TYPES for t in activations)
        # The result of an op that wrote into its operand: measured anew, as its version counter moves
        # on only when this dispatch returns (ADInplaceOrView bumps it after the kernel).
        written = kind.mutates and first is not None and any(t is first for t, _ in operands)
        with (torch._C._DisableTorchDispatch() if plain else _no_modes()), torch._C.DisableTorchFunction():
            before = [values.observe(t, as_last_seen=kind.mutates) for t in activations]
            bound = [h for h in before if h is not None] if kind.bounded else None
            self._op_values[len(self.ops)] = (values.observe(first, bounded_by=bound or None, written=written), before)

    def _observe_written(self, func: Any, operands: list[tuple[torch.Tensor, str | None]], kwargs: dict) -> None:
        """Before an op that writes into its operands runs: their values as they are now, which
        the op's statistics report as its operands' (an `out=` argument's old values are no one's)."""
        kind = facts(func)
        if not kind.mutates:
            return
        write_only = [kwargs[n] for n in kind.out_args if isinstance(kwargs.get(n), torch.Tensor)]
        self.observe(self._read_operands(operands, write_only), as_last_seen=True)

    def _read_operands(self, operands: list[tuple[torch.Tensor, str | None]], write_only: Iterable[torch.Tensor]) -> list[torch.Tensor]:
        """The operands an op's statistics report: not the parameters ("made here" compares a
        result with the activations it came from, and measuring every weight, an embedding table
        being most of a small model, costs a pass each), nor its write-only `out=` arguments,
        whose old values it never reads."""
        prov_of = self.prov.get
        skip = tuple(write_only)
        found = []
        for t, _ in operands:
            p = prov_of(t)
            if (p is not None and p.kind == "param") or (skip and any(t is o for o in skip)):
                continue
            found.append(t)
        return found

    def finished_ops(self) -> tuple[OpCall, ...]:
        """The recorded ops, with their value statistics once the trace is done."""
        if self.values is None or not self._op_values:
            return tuple(self.ops)
        values, handles, kept = self.values, self._op_values, self._kept_ops
        out = []
        for op in self.ops:
            h = handles.get(op.index)
            if h is not None:
                attrs = (*op.attrs, ("fp32_kept", True)) if op.index in kept else op.attrs
                op = op.measured(values.get(h[0]), values.merged(h[1]), attrs)
            out.append(op)
        return tuple(out)

    def finished_modules(self) -> tuple[ModuleCall, ...]:
        if self.values is None or not self._module_values:
            return tuple(self.modules)
        values = self.values
        out = []
        for i, m in enumerate(self.modules):
            h = self._module_values.get(i)
            out.append(m if h is None else m.measured(values.merged(h[0]), values.merged(h[1])))
        return tuple(out)

    def _run_repaired(
        self, op_name: str, operand_tensors: list, args: tuple, kwargs: dict, kind: str, run: Callable[[tuple, dict], Any]
    ) -> Any:
        from dtype_doctor.trace.recovery import repair

        attempts = repair(op_name, operand_tensors, args, kwargs, kind)
        while True:
            self._suspended += 1  # the repair's own casts are not the model's ops
            try:
                attempt = next(attempts)
            except StopIteration:
                return _FAILED
            except Exception:  # noqa: BLE001 - a repair that cannot be built (e.g. out of meta) is skipped
                continue
            finally:
                self._suspended -= 1
            try:
                return run(*attempt)
            except Exception:  # noqa: BLE001 - try the next repair
                continue

    def _run_as_accepted(self, args: tuple, kwargs: dict, run: Callable[[tuple, dict], Any]) -> Any:
        """An op the real kernel just ran (the probe) whose fake kernel wants other dtypes than any
        repair gives (_grouped_mm's meta kernel takes bfloat16 only; the CPU kernel and CUDA's
        fallback take any float): its output shapes do not depend on the dtype, so it runs with
        the floating operands in a dtype it takes, and its outputs get the real kernel's dtypes."""
        real = getattr(self.predict, "last_output_dtypes", None)
        if not real:
            return _FAILED
        from dtype_doctor.trace.recovery import _rebuild

        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            self._suspended += 1
            try:
                with _NoTorchFunction():
                    a, k = _rebuild(args, kwargs, lambda t, d=dtype: t.to(d) if t.is_floating_point() and t.dtype != d else t)
            finally:
                self._suspended -= 1
            try:
                out = run(a, k)
            except Exception:  # noqa: BLE001 - not a dtype this fake kernel takes
                continue
            outs = out if isinstance(out, tuple) else (out,)
            if len([o for o in outs if isinstance(o, torch.Tensor)]) != len(real):
                return _FAILED
            wanted = iter(real)
            self._suspended += 1
            try:
                with _NoTorchFunction():
                    made = tuple(_as_dtype(o, next(wanted)) if isinstance(o, torch.Tensor) else o for o in outs)
            finally:
                self._suspended -= 1
            return made if isinstance(out, tuple) else made[0]
        return _FAILED

    @staticmethod
    def _attrs(op_name: str, args: tuple, kwargs: dict, in_root: int = 1) -> tuple[tuple[str, Any], ...]:
        attrs: list[tuple[str, Any]] = []
        if "nll_loss" in op_name and len(args) >= 5:
            attrs.append(("ignore_index", args[4]))
        if "_scaled_mm" in op_name and len(args) >= 2:
            # fp8 matmul: CUDA takes mat1 row-major and mat2 column-major only (DD506)
            attrs.append(("layouts", tuple(_layout(t) for t in args[:2])))
        # Python numbers beyond float16's range (-1e10 fills, 2**30 writes): DD301 reads them.
        # Most operands are tensors and lists: one set lookup each before _big_number's tests.
        big = [v for v in args if type(v) not in _NEVER_NUMBERS and _big_number(v)]
        if kwargs:
            big += [v for v in kwargs.values() if type(v) not in _NEVER_NUMBERS and _big_number(v)]
        if big:
            attrs.append(("constants", tuple(big)))
        kind = _CALL_FACTS.get(op_name)
        if kind == "site":
            if (site := _user_line()) is not None:
                attrs.append(("site", site))
            if not in_root:  # after the model's forward (run: the script's own loss)
                attrs.append(("outside_forward", True))
        elif kind == "dim" and len(args) >= 2 and isinstance(args[1], int):
            attrs.append(("dim", args[1]))
        elif kind == "sdpa":
            attrs.extend((key, kwargs.get(key, args[i] if len(args) > i else default)) for key, i, default in _SDPA_ARGS)
        return tuple(attrs) if attrs else ()

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

    # ----------------------------------------------------------------- modules

    def attach(self) -> None:
        for name, mod in self.model.named_modules():
            self._module_names[id(mod)] = name
            self._handles += hook_module(mod, self._pre_hook, self._post_hook)

    def module_name(self, mod: torch.nn.Module) -> str | None:
        return self._module_names.get(id(mod))

    def detach(self) -> None:
        unhook(self._handles)
        self._handles.clear()

    def _pre_hook(self, mod: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        name = self._module_names.get(id(mod), "?")
        self.stack.append((name, type(mod).__name__))
        self.autocast_stack.append(self.amp.current() if self.amp is not None else _autocast_state())
        if id(mod) in self._roots:
            self._in_root += 1
            if self._in_root == 1 and self._root_spans is not None and mod is self.model:
                self._root_spans.append(len(self.ops))
            if self._in_root == 1 and mod is self.model:
                with _NoTorchFunction():
                    self._tag_boundary(mod, args, kwargs)
        if isinstance(mod, torch.nn.RNNBase):
            from dtype_doctor.trace.recovery import rnn_checked

            return rnn_checked(self, mod, name, args, kwargs)
        return None

    def _post_hook(self, mod: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        with _NoTorchFunction():
            self._module_done(mod, args, kwargs, output)

    def _module_done(self, mod: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        name, module_type = self.stack.pop() if len(self.stack) > 1 else ("", type(mod).__name__)
        self.autocast_stack.pop() if len(self.autocast_stack) > 1 else None
        if id(mod) in self._roots:
            self._in_root -= 1
            if self._in_root == 0 and self._root_spans is not None and mod is self.model:
                self._root_spans.append(len(self.ops))
        inputs = tuple(self.meta(t) for t in tensors_in(args, kwargs))
        outputs = tuple(self.meta(t, "output") for t in tensors_in(output))
        if self.values is not None:
            self._module_values[len(self.modules)] = (self.observe(tensors_in(output)), self.observe(tensors_in(args, kwargs)))
            if self._keep and name and in_modules(self._keep, name):
                for o in tensors_in(output):
                    self._fp32_kept[o] = True
            elif self._keep and any(p.is_floating_point() for p in mod.parameters(recurse=False)):
                for o in tensors_in(output):  # a converted module hands on its own (half) dtype
                    self._fp32_kept.pop(o, None)
        self.modules.append(ModuleCall(name, module_type, inputs, outputs, "forward"))

    def _tag_boundary(self, mod: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        import inspect

        named: dict[str, Any] = dict(kwargs)
        if args:
            try:
                bound = inspect.signature(mod.forward).bind_partial(*args)
                named.update(bound.arguments)
            except TypeError:
                named.update({f"arg{i}": a for i, a in enumerate(args)})
        self.boundary_inputs = []
        for k, v in boundary_tensors(named).items():
            if (p := self.prov.get(v)) is not None and p.kind == "input":
                self.boundary_inputs.append(self.meta(v, "input", k))
            else:
                self.boundary_inputs.append(self.tag_input(k, v))

    # ------------------------------------------------------------------- modes

    def dispatch_mode(self) -> "_DispatchRecorder":
        return _DispatchRecorder(self)

    def function_mode(self) -> "_FunctionRecorder":
        return _FunctionRecorder(self)




def _no_modes() -> Any:
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


_FAILED = object()


def _as_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t if t.dtype == dtype else t.to(dtype)
_ANY_AUTOCAST = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)


def _layout(t: Any) -> str:
    """'row' | 'column' | 'other': a 2-D tensor's memory order, as torch's _scaled_mm checks it."""
    if not isinstance(t, torch.Tensor) or t.dim() != 2:
        return "other"
    s0, s1 = t.stride()
    if s1 == 1 and s0 > s1:
        return "row"
    return "column" if s0 == 1 and s1 > 1 else "other"


def _user_line() -> tuple[str, int] | None:
    """(file, line) of the user's own code that called the op being recorded: the first frame
    outside torch and the doctor, when it is the user's (a library's loss has no user line)."""
    from dtype_doctor.machine.user_code import display_path, first_outside_tool, frames_above, is_user_file

    frame = first_outside_tool(frames_above(2))
    if frame is None or not is_user_file(frame.f_code.co_filename):
        return None
    return display_path(frame.f_code.co_filename), frame.f_lineno


def _autocast_state() -> str | None:
    if not _ANY_AUTOCAST():  # one C call per module, where the two device queries cost several
        return None
    for device_type in ("cuda", "cpu"):
        if torch.is_autocast_enabled(device_type):
            return dtype_name(torch.get_autocast_dtype(device_type))
    return None


def _first_line(exc: BaseException) -> str:
    return first_line(exc, 500)
