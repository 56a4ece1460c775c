"""A diffusers pipeline folder (`model_index.json`, as `save_pretrained` writes it) as a scan target.

    if is_pipeline_dir(spec):          # a stat, no torch
        index = check_pipeline_dir(spec, trust_remote_code=False)   # read and checked, no torch
        loaded = load_pipeline(spec, dtype="auto", device="cpu")     # DiffusionPipeline.from_pretrained, offline

Loaded as a user's script would: `DiffusionPipeline.from_pretrained(DIR, torch_dtype=...)`, offline
(`local_files_only`), safetensors only unless pickles are allowed, and no code from the folder
unless `--trust-remote-code` says so (a custom pipeline or component names a module of its own).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtype_doctor.records.errors import InputError, UsageError

INDEX = "model_index.json"
_MAX_INDEX_BYTES = 16 * 2**20
# The libraries a component may come from without running the folder's own code.
_LIBRARIES = frozenset({"diffusers", "transformers", "peft"})
EXTRA = "pip install 'dtype-doctor[diffusers]'"


def is_pipeline_dir(spec: str) -> bool:
    """Whether `spec` is a local folder holding a diffusers pipeline's model_index.json."""
    return (Path(spec).expanduser() / INDEX).is_file()


@dataclass(frozen=True)
class PipelineIndex:
    """What model_index.json says: the pipeline class and each component's (library, class)."""

    path: Path
    class_name: str
    components: tuple[tuple[str, str | None, str | None], ...]  # (name, library, class)

    @property
    def modules(self) -> tuple[str, ...]:
        """The components that are loaded (not left empty, as a missing safety checker is)."""
        return tuple(name for name, lib, cls in self.components if lib and cls)

    @property
    def custom_code(self) -> tuple[str, ...]:
        """The folder's own modules the pipeline would import (a custom pipeline or component)."""
        own = [f"{lib}.py" for _, lib, _ in self.components if lib and lib not in _LIBRARIES]
        if (self.path / "pipeline.py").is_file():
            own.append("pipeline.py")
        return tuple(dict.fromkeys(own))


def check_pipeline_dir(spec: str, *, trust_remote_code: bool = False) -> PipelineIndex:
    """model_index.json read and checked before torch: a JSON object naming a class, each component's
    folder present, and no code of the folder's own without --trust-remote-code (InputError)."""
    path = Path(spec).expanduser().resolve()
    file = path / INDEX
    try:
        if file.stat().st_size > _MAX_INDEX_BYTES:
            raise InputError(f"{file} is {file.stat().st_size:,} bytes; a model_index.json is a few kB, so this is not one")
        raw = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InputError(f"{file} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except (OSError, UnicodeDecodeError, RecursionError) as e:
        raise InputError(f"{file} cannot be read: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("_class_name"), str):
        raise InputError(f'{file} names no pipeline class ("_class_name"); pass a folder that DiffusionPipeline.save_pretrained wrote')
    components = []
    for name, entry in raw.items():
        if name.startswith("_") or not isinstance(entry, list) or len(entry) != 2:
            continue
        lib, cls = entry
        components.append((name, lib if isinstance(lib, str) else None, cls if isinstance(cls, str) else None))
        if lib is not None and cls is not None and not (path / name).is_dir():
            raise InputError(f"{file} lists the component {name!r} ({cls}) but {path / name} is missing")
    index = PipelineIndex(path, raw["_class_name"], tuple(components))
    if index.custom_code and not trust_remote_code:
        raise InputError(f"{spec} runs code of its own ({', '.join(index.custom_code)}); pass --trust-remote-code to allow it")
    return index


def require_diffusers(spec: str) -> None:
    """InputError, before torch is imported, where diffusers is not installed."""
    import importlib.util

    if importlib.util.find_spec("diffusers") is None:
        raise InputError(f"{spec} is a diffusers pipeline; scanning one needs diffusers: {EXTRA}")


@dataclass(frozen=True)
class LoadedPipeline:
    """A pipeline as from_pretrained gave it, with how its dtype was decided (docs/report.md, `target.loaded_dtype`)."""

    pipeline: Any
    index: PipelineIndex
    load_facts: Any  # records.LoadFacts


def load_pipeline(spec: str, *, dtype: str = "auto", device: str = "cpu", trust_remote_code: bool = False,
                  allow_pickle: bool = False, components: tuple[tuple[str, str], ...] = ()) -> LoadedPipeline:
    """`DiffusionPipeline.from_pretrained(spec, torch_dtype=...)` offline, moved to `device`.
    `dtype="auto"` passes no torch_dtype: diffusers then loads every component in float32.
    `components` (name, dtype) gives a component its own: dtype={"vae": float32, "default": ...}
    (diffusers 0.42 names it dtype=; torch_dtype= before)."""
    index = check_pipeline_dir(spec, trust_remote_code=trust_remote_code)
    try:
        import diffusers
    except ImportError:
        raise InputError(f"{spec} is a diffusers pipeline; scanning one needs diffusers: {EXTRA}") from None
    import torch

    from dtype_doctor.records import LoadFacts

    kwargs: dict[str, Any] = {"local_files_only": True, "trust_remote_code": trust_remote_code}
    if not allow_pickle:
        kwargs["use_safetensors"] = True
    if components:
        kwargs["dtype"] = {"default": getattr(torch, "float32" if dtype == "auto" else dtype),
                                 **{name: getattr(torch, d) for name, d in components}}
    elif dtype != "auto":
        kwargs["dtype"] = getattr(torch, dtype)
    try:
        pipe = diffusers.DiffusionPipeline.from_pretrained(str(index.path), **kwargs)
    except (OSError, ValueError, EnvironmentError, ImportError, AttributeError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        pickled = not allow_pickle and any(index.path.glob("*/*.bin"))
        hint = " (its weights are pickled: .bin files load only with --allow-pickle)" if pickled else ""
        raise InputError(f"{spec}: diffusers cannot load this pipeline: {first}{hint}") from None
    if device != "cpu":
        pipe.to(device)
    set_bar = getattr(pipe, "set_progress_bar_config", None)
    if callable(set_bar):
        set_bar(disable=True)
    asked = ",".join([*([dtype] if dtype != "auto" else []), *(f"{n}={d}" for n, d in components)]) or None
    facts = LoadFacts(dtype=_main_dtype(pipe), origin="argument" if asked else "default", asked=asked,
                      library=f"diffusers {diffusers.__version__}")
    return LoadedPipeline(pipe, index, facts)


def _main_dtype(pipe: Any) -> str:
    """The dtype most of the pipeline's parameter elements have."""
    import torch

    sizes: dict[str, int] = {}
    for c in pipe.components.values():
        if isinstance(c, torch.nn.Module):
            for p in c.parameters():
                if p.is_floating_point():
                    name = str(p.dtype).removeprefix("torch.")
                    sizes[name] = sizes.get(name, 0) + p.numel()
    return max(sizes, key=sizes.__getitem__) if sizes else "float32"


def refuse_options(options: Any, *, fixing: bool = False) -> None:
    """The scan options that shape a model's batch or load, which a pipeline folder has no use for
    (`fixing`: fix's, which also refuses --simulate: its fix is verified on real weights)."""
    refused = (("--preprocess", options.preprocess), ("--train", options.train), ("--simulate", fixing and options.simulate),
               ("--load-in-4bit", options.load_in_4bit), ("--load-in-8bit", options.load_in_8bit),
               ("--gpus", options.gpus != 1), ("--device-map", options.device_map), ("--autocast", options.autocast != "off"))
    for flag, given in refused:
        if given:
            if flag == "--simulate":
                raise UsageError("--simulate does not apply to fix PIPELINE_DIR: its fix is verified by running the "
                                 "pipeline with real weights (scan PIPELINE_DIR --simulate previews it on a simulated GPU)")
            raise UsageError(f"{flag} does not apply to a diffusers pipeline folder: a pipeline is traced as its own call runs it")
