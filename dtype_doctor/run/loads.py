"""The `from_pretrained` calls a script makes, read as `target.loaded_dtype` (scan reads its own load).

While `run` runs the script, transformers' `PreTrainedModel.from_pretrained` and diffusers'
`ModelMixin.from_pretrained` (patched when their modules are imported; a pipeline's
`from_pretrained` loads each component through them) are watched: the dtype the call named
(`dtype=`, `torch_dtype=`, or none), config.json's dtype, the dtype the model came out in, and the
attention implementation the call asked for. The origin follows scan's (load/model.py `load_facts`):
"argument", "auto" (dtype="auto" named), "config", "checkpoint" (nothing named, no dtype in the
config, and the weights not in torch's default), "default".
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable
from weakref import WeakKeyDictionary

from dtype_doctor.records import LoadFacts, dtype_name, main_dtype_of

# (module, class): the from_pretrained whose calls are read.
_LOADERS = (("transformers.modeling_utils", "PreTrainedModel"), ("diffusers.models.modeling_utils", "ModelMixin"))


class LoadWatch:
    """`with LoadWatch() as w:` — `w.facts_of(model)` is how the script's from_pretrained loaded `model`,
    `w.site_of(model)` the user's line that called it."""

    def __init__(self) -> None:
        self._facts: WeakKeyDictionary = WeakKeyDictionary()
        self._hooks: list[Any] = []
        self._restore: list[Callable[[], None]] = []
        self._inside = 0

    def facts_of(self, model: Any) -> LoadFacts | None:
        found = self._facts.get(model) if model is not None else None
        return found[0] if found is not None else None

    def site_of(self, model: Any, *, dtype: str | None = None) -> Any:
        """The user's line whose from_pretrained loaded `model` (in `dtype`, when given), or None."""
        found = self._facts.get(model) if model is not None else None
        return found[1] if found is not None and dtype in (None, found[0].dtype) else None

    def with_component_loads(self, target: Any, root: Any) -> Any:
        """`target` whose components (several models) each say how the script's from_pretrained loaded them."""
        if not target.components:
            return target
        children = dict(root.named_children())
        components = []
        for c in target.components:
            facts = self.facts_of(children.get(c["name"]))
            components.append({**c, "loaded_dtype": facts.to_dict()} if facts is not None else c)
        return dataclasses.replace(target, components=tuple(components))

    def __enter__(self) -> "LoadWatch":
        from dtype_doctor.machine.libraries import after_import

        for module, cls in _LOADERS:
            self._hooks.append(after_import(module, lambda m, _cls=cls: self._patch(getattr(m, _cls, None))))
        return self

    def __exit__(self, *exc: Any) -> None:
        import sys

        for hook in self._hooks:
            if hook is not None and hook in sys.meta_path:
                sys.meta_path.remove(hook)
        for restore in reversed(self._restore):
            restore()
        self._hooks, self._restore = [], []

    def _patch(self, cls: Any) -> None:
        original = cls.__dict__.get("from_pretrained") if cls is not None else None
        if not isinstance(original, classmethod):
            return
        watch = self

        def from_pretrained(klass: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
            watch._inside += 1
            try:
                model = original.__func__(klass, path, *args, **kwargs)
            finally:
                watch._inside -= 1
            if not watch._inside:
                try:
                    from dtype_doctor.machine.user_code import user_site

                    watch._facts[model] = (load_facts_of(model, path, kwargs, cls.__module__.split(".")[0]), user_site(1))
                except Exception:  # noqa: BLE001 - bookkeeping never breaks the script
                    pass
            return model

        cls.from_pretrained = classmethod(from_pretrained)
        self._restore.append(lambda: setattr(cls, "from_pretrained", original))


def load_facts_of(model: Any, path: Any, kwargs: dict[str, Any], library: str) -> LoadFacts:
    """How one from_pretrained call loaded `model`, as scan's LoadFacts say it."""
    import importlib.metadata

    from dtype_doctor.records import numel

    asked = kwargs.get("dtype", kwargs.get("torch_dtype"))
    asked = asked if asked is None or isinstance(asked, str) else dtype_name(asked)
    loaded = main_dtype_of((dtype_name(p.dtype), numel(tuple(p.shape))) for p in model.parameters()) or "float32"
    raw = _config(path, kwargs.get("subfolder"))
    config_dtype = raw.get("dtype") or raw.get("torch_dtype")
    config_dtype = config_dtype if isinstance(config_dtype, str) else None
    if asked == "auto":
        origin, v4 = "auto", loaded
    elif asked is not None:
        origin, v4 = "argument", asked
    elif config_dtype is not None and library == "transformers":
        origin, v4 = "config", "float32"
    elif loaded != "float32":
        origin, v4 = "checkpoint", "float32"
    else:
        origin, v4 = "default", "float32"
    attn = kwargs.get("attn_implementation")
    facts = LoadFacts(loaded, origin, asked, config_dtype, loaded if origin == "checkpoint" else None,
                      f"{library} {importlib.metadata.version(library)}", v4 if library == "transformers" else None)
    if isinstance(attn, str):
        facts = dataclasses.replace(facts, attn_implementation=attn, attn_origin="call")
    if library == "transformers":
        from dtype_doctor.load.lowbit import lowbit_after_load

        local = path if isinstance(path, (str, os.PathLike)) and os.path.isdir(path) else None
        facts = dataclasses.replace(facts, lowbit=lowbit_after_load(model, raw, local, kwargs))
    return facts


def _config(path: Any, subfolder: Any) -> dict[str, Any]:
    """config.json of a local directory, or of a hub id in the local cache ({} when neither)."""
    name = os.path.join(subfolder, "config.json") if isinstance(subfolder, str) and subfolder else "config.json"
    file: Any = None
    if isinstance(path, (str, os.PathLike)) and os.path.isdir(path):
        file = os.path.join(path, name)
    elif isinstance(path, str):
        try:
            from huggingface_hub import try_to_load_from_cache

            file = try_to_load_from_cache(path, name)
        except Exception:  # noqa: BLE001 - not a hub id
            file = None
    if not isinstance(file, (str, os.PathLike)) or not os.path.isfile(file):
        return {}
    try:
        raw = json.loads(open(file, encoding="utf-8").read())
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}
