"""The last resort when no user code can be patched: NewFixModule writes a documented
``dtype_doctor_fix.py`` with ``apply_fix(model, batch)``.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable, Mapping
from typing import Any

from dtype_doctor.fix.codemods.base import _HALF, _Skip, Codemod, normalize_dtype


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

# Integer tensors the model uses as indices or class targets: made int64.
INDEX_KEYS = {index_keys}
# Floating tensors cast to the model's dtype; None: every floating tensor.
CAST_KEYS = {cast_keys}


def apply_fix(model, batch):
    """Return a copy of `batch` with floating tensors in {dtype_doc} and index/label tensors int64."""
    dtype = {dtype_expr}
    fixed = dict(batch)
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor):
            continue
        if key in INDEX_KEYS and not value.is_floating_point() and value.dtype not in (torch.int64, torch.bool):
            fixed[key] = value.long()
        elif key in {{"input_ids", "token_type_ids", "position_ids"}} and value.is_floating_point():
            fixed[key] = value.long()
        elif value.is_floating_point() and (CAST_KEYS is None or key in CAST_KEYS):
            fixed[key] = value.to(dtype)
    return fixed
''',
    "to-device": '''

def apply_fix(model, batch):
    """Return a copy of `batch` with every tensor on {device_doc}."""
    device = {device_expr}
    return {{key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in batch.items()}}
''',
    "autocast": '''

def apply_fix(model, batch):
    """Return the torch.autocast context to run the forward of `model` on `batch` in."""
    device_type = {device_type_expr}
    return torch.autocast(device_type=device_type, dtype=torch.{dtype})
''',
    "half-model": '''

def apply_fix(model, batch):
    """Convert `model` to {dtype} in place, keeping its declared fp32 modules float32; return it."""
    model.to(torch.{dtype})
    keep = getattr(model, "_keep_in_fp32_modules", None) or ()
    for name, module in model.named_modules():
        if any(part in name.split(".") for part in keep):
            module.float()
    return model
''',
    "fp32-trainable": '''

def apply_fix(model, batch):
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


def apply_fix(model, batch):
    \"\"\"The same as keep_fp32(model), in the signature every dtype-doctor fix module has.\"\"\"
    return keep_fp32(model)
''',
}


def _set_literal(keys: Iterable[str]) -> str:
    # Sorted, so the module text is the same on every run.
    return "{" + ", ".join(f'"{k}"' for k in sorted(set(keys))) + "}"


class NewFixModule(Codemod):
    """The text of a new ``dtype_doctor_fix.py`` with a documented ``apply_fix(model, batch)``.

    For when neither a preprocessing file nor a script is given. ``apply`` takes the
    current text of the target file ("" when it does not exist) and skips when the file
    already has content. Strategies and their ``params``:

    - ``cast-inputs``: ``dtype`` (default: the model's), ``keys`` (floating keys to cast;
      default all), ``index_keys``; ``batch = apply_fix(model, batch)``.
    - ``to-device``: ``device`` (default: the model's device); ``batch = apply_fix(model, batch)``.
    - ``autocast``: ``dtype`` (float16), ``device_type`` (default: the model's device type);
      ``with apply_fix(model, batch): ...``.
    - ``half-model``: ``dtype`` (float16); ``model = apply_fix(model, batch)``.
    - ``fp32-trainable``: ``model = apply_fix(model, batch)``.
    - ``keep-fp32``: ``modules`` (dotted names kept float32), ``dtype`` (float16);
      ``model = keep_fp32(model)``, or ``apply_fix(model, batch)``.

    Every strategy takes ``findings``: lines naming what the doctor found, for the docstring.
    """

    DESCRIPTION = "Write a small dtype_doctor_fix.py with apply_fix(model, batch) when there is no user code to patch."

    FILENAME = "dtype_doctor_fix.py"
    _INDEX_KEYS = ("input_ids", "token_type_ids", "position_ids", "decoder_input_ids", "labels", "label", "label_ids")

    def __init__(self, strategy: str, params: Mapping[str, Any] | None = None):
        self.strategy = strategy
        self.params = dict(params or {})

    def render(self) -> str:
        """The module's text; raises _Skip for an unknown strategy or bad params."""
        strategy, p = self.strategy, self.params
        if strategy not in _BODIES:
            known = ", ".join(sorted(_BODIES))
            raise _Skip(f"no fix module for strategy {strategy!r} (known: {known})")
        findings = [" ".join(str(f).split()) for f in p.get("findings", ())]
        found = "\n".join(textwrap.fill(f, 88, initial_indent="  - ", subsequent_indent="    ") for f in findings)
        doc = [
            f"Fix written by dtype-doctor (strategy: {strategy}).",
            "",
            "What the doctor found:",
            found or "  - (no findings were passed to the fix)",
            "",
            "Why this fix:",
            textwrap.indent(_WHY[strategy], "  "),
            "",
            "How to use it:",
            "",
            textwrap.indent(_USAGE[strategy], "    "),
        ]
        docstring = '"""' + "\n".join(doc).replace('"""', "'''").replace("\\", "\\\\") + '\n"""\n'
        fields: dict[str, Any] = {}
        if strategy == "cast-inputs":
            dtype = normalize_dtype(p["dtype"]) if p.get("dtype") else None
            keys = [str(k) for k in p.get("keys") or ()]
            index_keys = [str(k) for k in p.get("index_keys") or self._INDEX_KEYS]
            if not all(re.fullmatch(r"[A-Za-z_]\w*", k) for k in [*keys, *index_keys]):
                raise _Skip(f"batch keys must be identifiers: {keys + index_keys}")
            fields = {
                "index_keys": _set_literal(index_keys),
                "cast_keys": _set_literal(keys) if keys else "None",
                "dtype_doc": f"torch.{dtype}" if dtype else "the model's dtype",
                "dtype_expr": f"torch.{dtype}" if dtype else "_model_dtype_and_device(model)[0]",
            }
        elif strategy == "to-device":
            device = p.get("device")
            if device is not None and not re.fullmatch(r"[a-z]+(:\d+)?", str(device)):
                raise _Skip(f"bad device {device!r}")
            fields = {
                "device_doc": f'"{device}"' if device else "the model's device",
                "device_expr": f'torch.device("{device}")' if device else "_model_dtype_and_device(model)[1]",
            }
        elif strategy == "autocast":
            dtype = normalize_dtype(p.get("dtype") or "float16")
            if dtype not in _HALF:
                raise _Skip(f"autocast runs in float16 or bfloat16, not {dtype}")
            device_type = p.get("device_type")
            if device_type is not None and not re.fullmatch(r"[a-z_]+", str(device_type)):
                raise _Skip(f"bad device_type {device_type!r}")
            fields = {
                "dtype": dtype,
                "device_type_expr": f'"{device_type}"' if device_type else "_model_dtype_and_device(model)[1].type",
            }
        elif strategy == "half-model":
            dtype = normalize_dtype(p.get("dtype") or "float16")
            if dtype not in _HALF:
                raise _Skip(f"half-model converts to float16 or bfloat16, not {dtype}")
            fields = {"dtype": dtype}
        elif strategy == "keep-fp32":
            dtype = normalize_dtype(p.get("dtype") or "float16")
            if dtype not in _HALF:
                raise _Skip(f"keep-fp32 converts to float16 or bfloat16, not {dtype}")
            modules = [str(m) for m in p.get("modules") or ()]
            # "" is the model itself (a bare nn.Linear): named_modules() calls it that.
            if not modules or not all(re.fullmatch(r"([A-Za-z_][\w.]*)?", m) for m in modules):
                raise _Skip(f"keep-fp32 needs module names from named_modules(), got {modules}")
            listed = "".join(f"\n    {m!r}," for m in modules)
            fields = {"dtype": dtype, "modules": "(" + listed.replace("'", '"') + "\n)"}
        body = _BODIES[strategy].format(**fields)
        helpers = _HELPERS if "_model_dtype_and_device" in body else ""
        imports = "\nimport re\n\nimport torch\n" if strategy == "keep-fp32" else "\nimport torch\n"
        return docstring + imports + helpers + body

    def _apply(self, source: str, filename: str, warnings: list[str]) -> tuple[str, str]:
        if source.strip():
            raise _Skip(f"{filename} already exists; not replacing it with a generated fix module")
        text = self.render()
        usage = _USAGE[self.strategy].splitlines()[0]
        return text, f"new {filename}: apply_fix(model, batch) for {self.strategy} — use `{usage}` before the forward"
