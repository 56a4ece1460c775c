"""The module hooks of a trace: each module's name on the stack while it runs, the autocast state
it ran under, the model's boundary inputs named, and a ModuleCall when it returns.

`ModuleHooks` holds these methods of the Recorder (trace/recorder.py), which inherits them; the
state they read and write (the stack, the module names and hooks, the root's spans) is the Recorder's own.
"""

from __future__ import annotations

from typing import Any

import torch

from dtype_doctor.numerics import dtype_name, tensors_in
from dtype_doctor.records import ModuleCall, in_modules
from dtype_doctor.trace.dispatch import NoTorchFunction
from dtype_doctor.trace.provenance import boundary_tensors
from dtype_doctor.trace.unseen import hook_module, unhook

_ANY_AUTOCAST = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)


class ModuleHooks:
    def attach(self) -> None:
        for name, mod in self.model.named_modules():
            self._module_names[id(mod)] = name
            self._handles += hook_module(mod, self._pre_hook, self._post_hook)

    @property
    def hook_handles(self) -> list[Any]:
        """The handles of the hooks attached (the model's modules and those adopted beside it)."""
        return self._handles

    def module_name(self, mod: torch.nn.Module) -> str | None:
        return self._module_names.get(id(mod))

    def detach(self) -> None:
        unhook(self._handles)
        self._handles.clear()

    def _pre_hook(self, mod: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        name = self._module_names.get(id(mod), "?")
        self.stack.append((name, type(mod).__name__))
        self.autocast_stack.append(self.amp.current() if self.amp is not None else autocast_state())
        if id(mod) in self._roots:
            self._in_root += 1
            if self._in_root == 1 and self._root_spans is not None and mod is self.model:
                self._root_spans.append(len(self.ops))
            if self._in_root == 1 and mod is self.model:
                with NoTorchFunction():
                    self._tag_boundary(mod, args, kwargs)
        if isinstance(mod, torch.nn.RNNBase):
            from dtype_doctor.trace.recovery import rnn_checked

            return rnn_checked(self, mod, name, args, kwargs)
        return None

    def _post_hook(self, mod: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        with NoTorchFunction():
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


def autocast_state() -> str | None:
    if not _ANY_AUTOCAST():  # one C call per module, where the two device queries cost several
        return None
    for device_type in ("cuda", "cpu"):
        if torch.is_autocast_enabled(device_type):
            return dtype_name(torch.get_autocast_dtype(device_type))
    return None
