"""A step of several models, as the Recorder (trace/recorder.py) traces it: a module the script
runs outside the model, another model of the step, the traced model named under its place among
them, and a model's repeated calls (a denoising loop's later steps) recorded, then dropped.

`SeveralModels` holds these methods of the Recorder, which inherits them; the state they read and
write (the module names, hooks, provenance, ops and modules recorded) is the Recorder's own.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from dtype_doctor.numerics import tensors_in
from dtype_doctor.trace.dispatch import NoTorchFunction
from dtype_doctor.trace.provenance import Provenance, _RootNames
from dtype_doctor.trace.unseen import hook_module


class SeveralModels:
    def adopt(self, mod: torch.nn.Module, name: str, *, model: bool = False) -> None:
        """Trace `mod`, a module outside the model that the step runs (a script's own head), under `name`;
        `model`: another model of the step (a UNet beside the text encoder), whose forward is a model's."""
        if model:
            self._roots.add(id(mod))
        if id(mod) in self._module_names:
            return
        for sub, p in mod.named_parameters(remove_duplicate=False):
            if self.prov.get(p) is None:
                self.prov[p] = Provenance("param", f"{name}.{sub}", f"param:{name}.{sub}")
        for sub, child in mod.named_modules():
            if id(child) in self._module_names:  # a model already traced inside it (vae.encoder, then vae)
                continue
            self._module_names[id(child)] = f"{name}.{sub}" if sub else name
            self._handles += hook_module(child, self._pre_hook, self._post_hook)

    def name_root(self, name: str) -> None:
        """The model becomes one of several in the step: its modules, state and what it made are named
        under `name` ("text_encoder.text_model..."), in what was recorded already and from now on; the
        ops outside every model (the script's own) name no model."""
        if self._root_spans is None:
            return
        spans, self._root_spans = self._root_spans, None
        inside = {id(m): n for n, m in self.model.named_modules() if self._module_names.get(id(m)) == n}
        for key, n in inside.items():
            self._module_names[key] = f"{name}.{n}" if n else name
        paths = set(inside.values())
        state = {f"param:{n}" for n, _ in self.model.named_parameters(remove_duplicate=False)}
        state |= {f"buffer:{n}" for n, _ in self.model.named_buffers(remove_duplicate=False)}
        renamed = _RootNames(name, paths, state)
        self.prov.update_values(renamed.provenance)
        self._metas.clear()
        self.stack = [("", "")] + [(renamed.module(n), t) for n, t in self.stack[1:]]
        ends = iter(spans + [len(self.ops)] * (len(spans) % 2))
        bounds = list(zip(ends, ends))
        for i, op in enumerate(self.ops):
            in_model = any(a <= i < b for a, b in bounds)
            module = renamed.module(op.module) if (in_model or op.module) else op.module
            module_type = op.module_type if (in_model or op.module) else ""
            self.ops[i] = replace(op, module=module, module_type=module_type, operands=renamed.metas(op.operands),
                                  outputs=renamed.metas(op.outputs))
        for i, m in enumerate(self.modules):
            self.modules[i] = replace(m, name=renamed.module(m.name) if m.name in paths else m.name,
                                      inputs=renamed.metas(m.inputs), outputs=renamed.metas(m.outputs))

    def made_by(self, out: Any, module: torch.nn.Module) -> None:
        """The outputs of a model's repeated call, whose ops were not recorded, are known as that model's
        (the negative prompt's embeddings go on into the UNet): "created:CLASS@NAME"."""
        name = self._module_names.get(id(module), "")
        with NoTorchFunction():
            for t in tensors_in(out):
                if self.prov.get(t) is None:
                    self.prov[t] = Provenance("activation", None, f"created:{type(module).__name__}@{name}")

    def pause_keeping(self) -> None:
        """Ops from here on are recorded (and repaired) as the step's, then dropped at resume_keeping:
        a model's repeated calls (a denoising loop's later steps) add nothing the first did not say."""
        if self._unkept is None:
            self._unkept = (len(self.ops), len(self.modules), self.values)
            self.values = None  # nothing measured that is dropped

    def resume_keeping(self, *, drop: bool = True) -> int:
        """Keep ops again; those since pause_keeping are dropped (kept with `drop` False). Returns how many."""
        if self._unkept is None:
            return 0
        ops, modules, self.values = self._unkept
        self._unkept = None
        if not drop:
            return 0
        dropped = len(self.ops) - ops
        del self.ops[ops:]
        del self.modules[modules:]
        self.dropped += dropped
        return dropped
