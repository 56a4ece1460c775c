"""The value statistics of a trace (trace/values.py), as the Recorder (trace/recorder.py) takes
them: each op's result and operands, each module's inputs and outputs, and the tensors a model
keeps in float32 when it is converted to half.

`ValueWatch` holds these methods of the Recorder, which inherits them; the state they read and
write (`values`, `prov`, `ops`, `modules` and the handles kept per op and module) is the Recorder's own.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from dtype_doctor.numerics import tensors_in
from dtype_doctor.records import ModuleCall, OpCall
from dtype_doctor.trace.opfacts import facts
from dtype_doctor.trace.values import PLAIN_TYPES


class ValueWatch:
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
        with (torch._C._DisableTorchDispatch() if plain else no_modes()), torch._C.DisableTorchFunction():
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
        with (torch._C._DisableTorchDispatch() if plain else no_modes()), torch._C.DisableTorchFunction():
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


def no_modes() -> Any:
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()
