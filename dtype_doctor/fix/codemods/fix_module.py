"""The last resort when no user code can be patched: NewFixModule writes one documented
``dtype_doctor_fix.py`` holding every strategy the fix needs, with ``apply_fix(model, batch)``
and, for the casts, ``preprocess``: a datasets transform that ``scan`` can check.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dtype_doctor.fix.codemods.base import HALF, _Skip, Codemod, normalize_dtype


# ---------------------------------------------------------------------------------------
# A new module when there is no user code to patch

_WHY = {
    "cast-inputs": (
        "Floating inputs are cast to the dtype of the model's weights, and integer index and\n"
        "label tensors to int64, the dtype embeddings and losses expect. The weights stay as\n"
        "they are, so nothing about the model's precision changes."
    ),
    "to-device": (
        "Every tensor in the batch is moved to the device the model's weights are on, so no\n"
        "op sees operands on two devices."
    ),
    "autocast": (
        "The forward runs under torch.autocast: weights stay float32 (the master copy an\n"
        "optimizer needs) and autocast runs each op in the dtype it is safe in."
    ),
    "half-model": (
        "The model is converted to half precision to match its inputs and save memory; the\n"
        "modules the model declares must stay float32 (_keep_in_fp32_modules) are kept float32.\n"
        "Unsafe: half precision can overflow or lose accuracy — check the parity numbers."
    ),
    "fp32-trainable": (
        "Trainable parameters are kept in float32 so the optimizer state and the gradients\n"
        "torch.amp.GradScaler unscales are float32; frozen weights keep their half dtype."
    ),
    "keep-fp32": (
        "The model runs in half precision except the few modules in KEEP_FP32 (and those the\n"
        "model declares fp32), which stay float32: in plain half precision their values pass\n"
        "float16's 65504 and become inf/NaN. dtype-doctor found this set by re-running the\n"
        "forward: the smallest one that gives a finite output close to float32. Every module\n"
        "that holds weights casts its floating inputs to its own dtype, so the float32 modules\n"
        "compute in float32 and the half ones after them get half inputs again."
    ),
}

_USAGE = {
    "cast-inputs": "batch = apply_fix(model, batch)\noutputs = model(**batch)",
    "to-device": "batch = apply_fix(model, batch)\noutputs = model(**batch)",
    "autocast": "with apply_fix(model, batch):\n    outputs = model(**batch)",
    "half-model": "model = apply_fix(model, batch)\noutputs = model(**batch)",
    "fp32-trainable": "model = apply_fix(model, batch)\noptimizer = torch.optim.AdamW(p for p in model.parameters() if p.requires_grad)",
    "keep-fp32": "model = keep_fp32(model)\noutputs = model(**batch)",
}

_HELPERS = '''

def _model_dtype_and_device(model):
    """The dtype and device of the model's first floating parameter."""
    for param in model.parameters():
        if param.is_floating_point():
            return param.dtype, param.device
    raise ValueError("the model has no floating parameters")
'''

_BODIES = {
    "cast-inputs": '''

# Inputs and the dtype each must have: the casts dtype-doctor applied and verified.
CASTS = {casts}
# Integer tensors the model uses as indices or class targets: made int64.
INDEX_KEYS = {index_keys}
# Floating tensors cast to the model's dtype; None: every floating tensor.
CAST_KEYS = {cast_keys}


def cast_inputs(model, batch):
    """Return a copy of `batch` with {cast_doc}."""
    dtype = {dtype_expr}
    fixed = dict(batch)
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor):
            continue
        if key in CASTS:
            fixed[key] = value.to(CASTS[key])
        elif key in INDEX_KEYS and not value.is_floating_point() and value.dtype not in (torch.int64, torch.bool):
            fixed[key] = value.long()
        elif key in {{"input_ids", "token_type_ids", "position_ids"}} and value.is_floating_point():
            fixed[key] = value.long()
        elif value.is_floating_point() and (CAST_KEYS is None or key in CAST_KEYS):
            fixed[key] = value.to(dtype)
    return fixed
''',
    "to-device": '''

def to_device(model, batch):
    """Return a copy of `batch` with every tensor on {device_doc}."""
    device = {device_expr}
    return {{key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in batch.items()}}
''',
    "autocast": '''

def autocast_context(model, batch):
    """Return the torch.autocast context to run the forward of `model` on `batch` in."""
    device_type = {device_type_expr}
    return torch.autocast(device_type=device_type, dtype=torch.{dtype})
''',
    "half-model": '''

def half_model(model, batch):
    """Convert `model` to {dtype} in place, keeping its declared fp32 modules float32; return it."""
    model.to(torch.{dtype})
    keep = getattr(model, "_keep_in_fp32_modules", None) or ()
    for name, module in model.named_modules():
        if any(part in name.split(".") for part in keep):
            module.float()
    return model
''',
    "fp32-trainable": '''

def fp32_trainable(model, batch):
    """Make the trainable parameters of `model` float32 in place (frozen ones keep their dtype); return it."""
    for param in model.parameters():
        if param.requires_grad and param.dtype in (torch.float16, torch.bfloat16):
            param.data = param.data.float()
    return model
''',
    "keep-fp32": '''

# The modules kept in float32 (dotted names from model.named_modules()).
KEEP_FP32 = {modules}


def keep_fp32(model, dtype=torch.{dtype}):
    \"\"\"Convert `model` to `dtype` in place, keeping KEEP_FP32 and the modules the model
    declares fp32 in float32, and make every module cast its inputs to its own dtype; return it.\"\"\"
    missing = sorted(set(KEEP_FP32) - {{name for name, _ in model.named_modules()}})
    if missing:
        raise ValueError(f"no module named {{', '.join(missing)}} in {{type(model).__name__}}: not the model this fix was made for")
    declared = list(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    if dtype == torch.float16:
        declared += list(getattr(model, "_keep_in_fp32_modules", None) or ())
    patterns = [re.compile(name) for name in declared]
    wanted = {{}}
    for name, module in model.named_modules(remove_duplicate=False):
        kept = any(k == "" or name == k or name.startswith(k + ".") for k in KEEP_FP32)
        skip = getattr(module, "_non_persistent_buffers_set", set())
        tensors = [*module._parameters.items(), *((n, b) for n, b in module._buffers.items() if n not in skip)]
        for tensor_name, tensor in tensors:
            if tensor is None or not tensor.is_floating_point():
                continue
            key = f"{{name}}.{{tensor_name}}" if name else tensor_name
            keep = kept or any(p.search(key) for p in patterns)
            if id(tensor) not in wanted or keep:  # a tied weight stays float32 if either side keeps it
                wanted[id(tensor)] = (tensor, torch.float32 if keep else dtype)
    with torch.no_grad():
        for tensor, want in wanted.values():
            if tensor.dtype != want:
                tensor.data = tensor.data.to(want)
    # Declared the way transformers models declare theirs, for what honours the declaration.
    declare = [k for k in sorted(KEEP_FP32) if k]
    if declare:
        current = getattr(model, "_keep_in_fp32_modules_strict", None) or ()
        merged = [*current, *(k for k in declare if k not in current)]
        model._keep_in_fp32_modules_strict = set(merged) if isinstance(current, set) else merged
    for module in model.modules():
        owns = any(p.is_floating_point() for p in module.parameters(recurse=False))
        if owns and _cast_to_own_dtype not in module._forward_pre_hooks.values():
            module.register_forward_pre_hook(_cast_to_own_dtype, with_kwargs=True)
    return model


def _cast_to_own_dtype(module, args, kwargs):
    \"\"\"Forward pre-hook: the module's floating tensor inputs in the dtype of its own parameters.\"\"\"
    dtype = next((p.dtype for p in module.parameters(recurse=False) if p.is_floating_point()), None)
    if dtype is None:
        return args, kwargs

    def cast(value):
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
            return value.to(dtype)
        return value

    return tuple(cast(a) for a in args), {{key: cast(value) for key, value in kwargs.items()}}
''',
}


# What each part's function is called; the order apply_fix runs them in: the model first
# (converted in place), then the batch; autocast wraps the forward itself.
_FUNCS = {
    "keep-fp32": "keep_fp32",
    "half-model": "half_model",
    "fp32-trainable": "fp32_trainable",
    "to-device": "to_device",
    "cast-inputs": "cast_inputs",
    "autocast": "autocast_context",
}
_BATCH_PARTS = ("to-device", "cast-inputs")

_PREPROCESS = '''

def preprocess(batch{params}):
    """A datasets transform: `dataset = dataset.with_transform(preprocess)`.

{about}
    """
{build}
    return {{key: _cast_column(value, CASTS[key]) if key in CASTS else value for key, value in out.items()}}


def _cast_column(value, dtype):
    """One column of a batch in `dtype`: a batch tensor at once, anything else row by row."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype)
    return [torch.as_tensor(row).to(dtype) for row in value]
'''

# How `preprocess` builds the batch before the casts: the user's own function, or the model's
# processor called as the scanned pipeline called it.
_USER_BATCHED = """\
    out = dict(batch)  # what the function leaves alone stays, as with Dataset.map
    out.update(_user_function()(batch{call}))"""
_USER_PER_ROW = """\
    function = _user_function()
    outs = [dict(function(dict(zip(batch, values)){call})) for values in zip(*batch.values())]
    out = dict(batch)  # what the function leaves alone stays, as with Dataset.map
    out.update({{key: [row[key] for row in outs] for key in outs[0]}} if outs else {{}})"""
_PROCESSOR_BUILDS = {
    "image": """\
    out = {{key: value for key, value in batch.items() if key != {column}}}
    images = [image{convert} for image in batch[{column}]]
    out.update(image_processor(images, return_tensors="pt"))""",
    "audio": """\
    out = {{key: value for key, value in batch.items() if key != {column}}}
    cells = batch[{column}]
    arrays = [cell["array"] if isinstance(cell, dict) else cell for cell in cells]
    rates = [cell.get("sampling_rate") for cell in cells if isinstance(cell, dict)]
    out.update(feature_extractor(arrays, sampling_rate=rates[0] if rates else feature_extractor.sampling_rate))""",
    "text": """\
    out = {{key: value for key, value in batch.items() if key != {column}}}
    out.update(tokenizer(batch[{column}], truncation=True{max_length}))""",
}
_SIDE = {"image": "image_processor", "audio": "feature_extractor", "text": "tokenizer"}

_USER_FUNCTION = '''

@functools.lru_cache(maxsize=None)
def _user_function():
    """{function}() from {path}: the preprocess function the casts above follow."""
    path = pathlib.Path(__file__).resolve().parent / {path_literal}
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))  # it imports its neighbours as it always did
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, {function_literal})
'''


def _set_literal(keys: Iterable[str]) -> str:
    # Sorted, so the module text is the same on every run.
    return "{" + ", ".join(f'"{k}"' for k in sorted(set(keys))) + "}"


def _literal(text: str) -> str:
    """`text` as a double-quoted Python string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _identifier(key: str) -> str:
    if not re.fullmatch(r"[A-Za-z_]\w*", key):
        raise _Skip(f"batch keys must be identifiers: {key!r}")
    return key


class NewFixModule(Codemod):
    """The text of a new ``dtype_doctor_fix.py``: one function per strategy and a documented
    ``apply_fix(model, batch)``; with a ``transform``, also ``preprocess``, a datasets transform
    that builds the batch and makes its casts (what ``scan --preprocess ... --preprocess-mode
    transform`` checks).

    ``NewFixModule(strategy, params)`` holds one strategy; ``NewFixModule(parts=[(strategy,
    params), ...])`` every strategy one fix needs, in one module. ``apply`` takes the current
    text of the target file ("" when it does not exist) and skips when the file already has
    content, unless ``replace`` (``--force``). Strategies and their ``params``:

    - ``cast-inputs``: ``casts`` ({key: dtype}, the casts to make), or ``dtype`` (default: the
      model's), ``keys`` (floating keys to cast; default all) and ``index_keys``;
      ``cast_inputs(model, batch)`` returns the batch.
    - ``to-device``: ``device`` (default: the model's device); ``to_device(model, batch)``.
    - ``autocast``: ``dtype`` (float16), ``device_type`` (default: the model's device type);
      ``with autocast_context(model, batch): ...``.
    - ``half-model``: ``dtype`` (float16); ``half_model(model, batch)`` returns the model.
    - ``fp32-trainable``: ``fp32_trainable(model, batch)`` returns the model.
    - ``keep-fp32``: ``modules`` (dotted names kept float32), ``dtype`` (float16);
      ``keep_fp32(model)`` returns the model.

    With one strategy ``apply_fix`` is that strategy's function; with several it converts the
    model in place and returns the batch. ``findings`` (or ``params["findings"]``): lines naming
    what the doctor found, for the docstring; ``check``: the command that checks the fix.
    ``transform``, how ``preprocess`` builds the batch: ``{"kind": "user", "path", "function",
    "batched", "accepts"}`` (the user's function, by its path relative to the module) or
    ``{"kind": "image" | "audio" | "text", "column", "rgb", "max_length"}`` (the model's processor).
    """

    DESCRIPTION = "Write a small dtype_doctor_fix.py with apply_fix(model, batch) when there is no user code to patch."

    FILENAME = "dtype_doctor_fix.py"
    _INDEX_KEYS = ("input_ids", "token_type_ids", "position_ids", "decoder_input_ids", "labels", "label", "label_ids")

    def __init__(
        self,
        strategy: str | None = None,
        params: Mapping[str, Any] | None = None,
        *,
        parts: Sequence[tuple[str, Mapping[str, Any]]] = (),
        findings: Iterable[str] = (),
        transform: Mapping[str, Any] | None = None,
        check: str | None = None,
        replace: bool = False,
    ):
        given = [(strategy, dict(params or {}))] if strategy is not None else [(s, dict(p)) for s, p in parts]
        order = list(_FUNCS)
        self.parts = sorted(given, key=lambda part: order.index(part[0]) if part[0] in order else len(order))
        self.strategy = ", ".join(s for s, _ in self.parts)
        self.findings = list(findings) or [f for _, p in self.parts for f in p.get("findings", ())]
        self.transform = dict(transform) if transform else None
        self.check = check
        self.replace = replace

    def render(self) -> str:
        """The module's text; raises _Skip for an unknown strategy or bad params."""
        unknown = [s for s, _ in self.parts if s not in _BODIES]
        if unknown or not self.parts:
            known = ", ".join(sorted(_BODIES))
            raise _Skip(f"no fix module for strategy {unknown[0] if unknown else None!r} (known: {known})")
        parts = self.parts
        body = "".join(_BODIES[s].format(**self._fields(s, p)) for s, p in parts)
        casts = next((p.get("casts") for s, p in parts if s == "cast-inputs" and p.get("casts")), None)
        preprocess = self._preprocess() if self.transform and casts else ""
        body += preprocess + self._apply_fix(parts)
        if "_user_function()" in preprocess:
            path, function = str(self.transform["path"]), str(self.transform["function"])  # type: ignore[index]
            body += _USER_FUNCTION.format(path=path, function=function, path_literal=_literal(path), function_literal=_literal(function))
        helpers = _HELPERS if "_model_dtype_and_device" in body else ""
        stdlib = [m for m in ("functools", "importlib.util", "pathlib", "re", "sys") if f"{m.split('.')[0]}." in body]
        imports = "".join(f"import {m}\n" for m in stdlib) + ("\n" if stdlib else "") + "import torch\n"
        return self._docstring(parts, bool(preprocess)) + "\n" + imports + helpers + body

    def _docstring(self, parts: list[tuple[str, dict[str, Any]]], preprocess: bool) -> str:
        names = [s for s, _ in parts]
        findings = [" ".join(str(f).split()) for f in self.findings]
        found = "\n".join(textwrap.fill(f, 88, initial_indent="  - ", subsequent_indent="    ") for f in findings)
        if len(parts) == 1:
            usage = _USAGE[names[0]]
        else:
            usage = "batch = apply_fix(model, batch)  # converts the model in place, returns the batch"
            if "autocast" in names:
                usage += "\nwith autocast_context(model, batch):\n    outputs = model(**batch)"
            else:
                usage += "\noutputs = model(**batch)"
        doc = [
            f"Fix written by dtype-doctor (strategy: {', '.join(names)}).",
            "",
            "What the doctor found:",
            found or "  - (no findings were passed to the fix)",
            "",
            "Why this fix:",
            "\n\n".join(textwrap.indent(_WHY[s], "  ") for s in names),
            "",
            "How to use it:",
            "",
            textwrap.indent(usage, "    "),
        ]
        if preprocess:
            doc += [
                "",
                "Or let datasets make the casts as each batch is read (not with Dataset.map: its torch",
                "formatter turns every float into float32):",
                "",
                "    dataset = dataset.with_transform(preprocess)",
            ]
        if self.check:
            doc += ["", "Check the fixed pipeline:", "", textwrap.indent(self.check, "    ")]
        return '"""' + "\n".join(doc).replace('"""', "'''").replace("\\", "\\\\") + '\n"""\n'

    def _apply_fix(self, parts: list[tuple[str, dict[str, Any]]]) -> str:
        if len(parts) == 1:
            strategy = parts[0][0]
            call = "keep_fp32(model)" if strategy == "keep-fp32" else f"{_FUNCS[strategy]}(model, batch)"
            return (
                "\n\ndef apply_fix(model, batch):\n"
                f'    """The same as {call}, in the signature every dtype-doctor fix module has."""\n'
                f"    return {call}\n"
            )
        lines = []
        for strategy, _ in parts:
            if strategy in _BATCH_PARTS:
                lines.append(f"    batch = {_FUNCS[strategy]}(model, batch)")
            elif strategy == "keep-fp32":
                lines.append("    keep_fp32(model)")
            elif strategy != "autocast":
                lines.append(f"    {_FUNCS[strategy]}(model, batch)")
        around = "; run the forward in autocast_context(model, batch)" if any(s == "autocast" for s, _ in parts) else ""
        return (
            "\n\ndef apply_fix(model, batch):\n"
            f'    """Apply every fix above: convert `model` in place, return the batch to run it on{around}."""\n'
            + "".join(line + "\n" for line in lines)
            + "    return batch\n"
        )

    def _preprocess(self) -> str:
        t = self.transform or {}
        kind = t.get("kind")
        if kind == "user":
            function = str(t["function"])
            if not function.isidentifier():
                raise _Skip(f"bad function name {function!r}")
            accepts = [_identifier(str(a)) for a in t.get("accepts", ())]
            params = "".join(f", {a}=None" for a in accepts)
            call = "".join(f", {a}={a}" for a in accepts)
            build = (_USER_BATCHED if t.get("batched") else _USER_PER_ROW).format(call=call)
            built_by = f"{function}() in {t['path']}"
        elif kind in _PROCESSOR_BUILDS:
            params = f", {_SIDE[kind]}"
            max_length = f", max_length={int(t['max_length'])}" if t.get("max_length") else ""
            convert = '.convert("RGB")' if t.get("rgb", True) else ""
            build = _PROCESSOR_BUILDS[kind].format(column=_literal(str(t["column"])), convert=convert, max_length=max_length)
            built_by = f"the model's {_SIDE[kind].replace('_', ' ')}"
        else:
            raise _Skip(f"no preprocess for a {kind!r} pipeline")
        about = textwrap.fill(
            f"Builds the batch as {built_by} does, then casts each input in CASTS as each batch is read "
            "(Dataset.map would store the values, and its torch formatter make every float float32).",
            92, initial_indent="    ", subsequent_indent="    ",
        )
        return _PREPROCESS.format(params=params, about=about, build=build)

    def _fields(self, strategy: str, p: Mapping[str, Any]) -> dict[str, Any]:
        if strategy == "cast-inputs":
            casts = {_identifier(str(k)): normalize_dtype(str(v)) for k, v in (p.get("casts") or {}).items()}
            dtype = normalize_dtype(p["dtype"]) if p.get("dtype") else None
            keys = [_identifier(str(k)) for k in p.get("keys") or ()]
            # Given the exact casts, nothing else is touched; else rules of thumb for every input.
            index_keys = [_identifier(str(k)) for k in p.get("index_keys") or (() if casts else self._INDEX_KEYS)]
            listed = ", ".join(f'"{k}": torch.{d}' for k, d in sorted(casts.items()))
            if casts and not keys and not index_keys:
                doc = "the inputs in CASTS in their dtype"
            else:
                doc = f"floating tensors in {f'torch.{dtype}' if dtype else 'the model dtype'} and index/label tensors int64"
            return {
                "casts": "{" + listed + "}",
                "index_keys": _set_literal(index_keys) if index_keys else "set()",
                "cast_keys": _set_literal(keys) if keys else ("set()" if casts else "None"),
                "cast_doc": doc,
                "dtype_expr": f"torch.{dtype}" if dtype else "_model_dtype_and_device(model)[0]",
            }
        if strategy == "to-device":
            device = p.get("device")
            if device is not None and not re.fullmatch(r"[a-z]+(:\d+)?", str(device)):
                raise _Skip(f"bad device {device!r}")
            return {
                "device_doc": f'"{device}"' if device else "the model's device",
                "device_expr": f'torch.device("{device}")' if device else "_model_dtype_and_device(model)[1]",
            }
        if strategy == "autocast":
            dtype = normalize_dtype(p.get("dtype") or "float16")
            if dtype not in HALF:
                raise _Skip(f"autocast runs in float16 or bfloat16, not {dtype}")
            device_type = p.get("device_type")
            if device_type is not None and not re.fullmatch(r"[a-z_]+", str(device_type)):
                raise _Skip(f"bad device_type {device_type!r}")
            return {
                "dtype": dtype,
                "device_type_expr": f'"{device_type}"' if device_type else "_model_dtype_and_device(model)[1].type",
            }
        if strategy == "half-model":
            dtype = normalize_dtype(p.get("dtype") or "float16")
            if dtype not in HALF:
                raise _Skip(f"half-model converts to float16 or bfloat16, not {dtype}")
            return {"dtype": dtype}
        if strategy == "keep-fp32":
            dtype = normalize_dtype(p.get("dtype") or "float16")
            if dtype not in HALF:
                raise _Skip(f"keep-fp32 converts to float16 or bfloat16, not {dtype}")
            modules = [str(m) for m in p.get("modules") or ()]
            # "" is the model itself (a bare nn.Linear): named_modules() calls it that.
            if not modules or not all(re.fullmatch(r"([A-Za-z_][\w.]*)?", m) for m in modules):
                raise _Skip(f"keep-fp32 needs module names from named_modules(), got {modules}")
            listed = "".join(f"\n    {m!r}," for m in modules)
            return {"dtype": dtype, "modules": "(" + listed.replace("'", '"') + "\n)"}
        return {}

    def _apply(self, source: str, filename: str, warnings: list[str]) -> tuple[str, str]:
        if source.strip() and not self.replace:
            raise _Skip(f"{filename} already exists; pass --force to replace it with the generated fix module")
        text = self.render()
        funcs = ", ".join(f"{_FUNCS[s]}()" for s, _ in self.parts if s in _FUNCS)
        extra = " and preprocess() for datasets.with_transform" if "\ndef preprocess(" in text else ""
        verb = "replaced" if source.strip() else "new"
        return text, f"{verb} {filename}: apply_fix(model, batch) ({funcs}){extra} for {self.strategy}"
