"""The last resort when no user code can be patched: NewFixModule writes one documented
``dtype_doctor_fix.py`` holding every strategy the fix needs, with ``apply_fix(model, batch)``
and, for the casts, ``preprocess``: a datasets transform that ``scan`` can check.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dtype_doctor.fix.codemods.base import _Skip, Codemod


# ---------------------------------------------------------------------------------------
# A new module when there is no user code to patch

_HELPERS = '''

def _model_dtype_and_device(model):
    """The dtype and device of the model's first floating parameter."""
    for param in model.parameters():
        if param.is_floating_point():
            return param.dtype, param.device
    raise ValueError("the model has no floating parameters")
'''

_PREPROCESS = '''

def preprocess(batch{params}):
    """A datasets transform{usage}.

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


def _literal(text: str) -> str:
    """`text` as a double-quoted Python string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class NewFixModule(Codemod):
    """The text of a new ``dtype_doctor_fix.py``: one function per strategy and a documented
    ``apply_fix(model, batch)``; with a ``transform``, also ``preprocess``, a datasets transform
    that builds the batch and makes its casts (what ``scan --preprocess ... --preprocess-mode
    transform`` checks).

    ``NewFixModule(strategy, params)`` holds one strategy; ``NewFixModule(parts=[(strategy,
    params), ...])`` every strategy one fix needs, in one module. ``apply`` takes the current
    text of the target file ("" when it does not exist) and skips when the file already has
    content, unless ``replace`` (``--force``). Each strategy writes its own part (its
    ``fix_module``, a ``ModulePart``, filled from ``module_fields(params)``: see the strategy
    modules in dtype_doctor/fix/strategies/ for the params each takes); this class only
    assembles them, the shared helper and ``apply_fix``.

    With one strategy ``apply_fix`` is that strategy's function; with several it converts the
    model in place and returns the batch. ``findings`` (or ``params["findings"]``): lines naming
    what the doctor found, for the docstring; ``check``: the command that checks the fix.
    ``transform``, how ``preprocess`` builds the batch: ``{"kind": "user", "path", "function",
    "batched", "accepts"}`` (the user's function, by its path relative to the module) or
    ``{"kind": "image" | "audio" | "text", "column", "rgb", "max_length"}`` (the model's processor).
    """

    DESCRIPTION = "Write a small dtype_doctor_fix.py with apply_fix(model, batch) when there is no user code to patch."

    FILENAME = "dtype_doctor_fix.py"

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
        # apply_fix runs the parts in their order: the model first (converted in place), then
        # the batch; an unknown strategy sorts last (render says so).
        self.parts = sorted(given, key=lambda part: _order(part[0]))
        self.strategy = ", ".join(s for s, _ in self.parts)
        self.findings = list(findings) or [f for _, p in self.parts for f in p.get("findings", ())]
        self.transform = dict(transform) if transform else None
        self.check = check
        self.replace = replace

    def render(self) -> str:
        """The module's text; raises _Skip for an unknown strategy or bad params."""
        strategies = _strategies()
        unknown = [s for s, _ in self.parts if s not in strategies]
        if unknown or not self.parts:
            known = ", ".join(sorted(strategies))
            raise _Skip(f"no fix module for strategy {unknown[0] if unknown else None!r} (known: {known})")
        parts = self.parts
        body = "".join(_part(s).source.format(**_fields(s, p)) for s, p in parts)
        casts = next((c for s, p in parts if (c := _strategy(s).module_casts(p))), None)
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
        module = self.FILENAME.removesuffix(".py")
        findings = [" ".join(str(f).split()) for f in self.findings]
        found = "\n".join(textwrap.fill(f, 88, initial_indent="  - ", subsequent_indent="    ") for f in findings)
        if len(parts) == 1:
            usage = f"from {module} import apply_fix\n" + _part(names[0]).usage
        else:
            usage = "batch = apply_fix(model, batch)  # converts the model in place, returns the batch"
            context = next((_part(s) for s in names if _part(s).role == "context"), None)
            if context is not None:
                usage = f"from {module} import apply_fix, {context.function}\n" + usage
                usage += f"\nwith {context.function}(model, batch):\n    outputs = model(**batch)"
            else:
                usage = f"from {module} import apply_fix\n" + usage + "\noutputs = model(**batch)"
        doc = [
            f"Fix written by dtype-doctor (strategy: {', '.join(names)}).",
            "",
            "What the doctor found:",
            found or "  - (no findings were passed to the fix)",
            "",
            "Why this fix:",
            "\n\n".join(textwrap.indent(_part(s).why, "  ") for s in names),
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
                *(f"    {line}" for line in self._transform_usage(module)),
            ]
        if self.check:
            doc += ["", "Check the fixed pipeline:", "", textwrap.indent(self.check, "    ")]
        return '"""' + "\n".join(doc).replace('"""', "'''").replace("\\", "\\\\") + '\n"""\n'

    def _apply_fix(self, parts: list[tuple[str, dict[str, Any]]]) -> str:
        if len(parts) == 1:
            call = _part(parts[0][0]).call_text
            return (
                "\n\ndef apply_fix(model, batch):\n"
                f'    """The same as {call}, in the signature every dtype-doctor fix module has."""\n'
                f"    return {call}\n"
            )
        lines = []
        for strategy, _ in parts:
            part = _part(strategy)
            if part.role == "batch":
                lines.append(f"    batch = {part.call_text}")
            elif part.role == "model":
                lines.append(f"    {part.call_text}")
        context = next((_part(s) for s, _ in parts if _part(s).role == "context"), None)
        around = f"; run the forward in {context.function}(model, batch)" if context is not None else ""
        return (
            "\n\ndef apply_fix(model, batch):\n"
            f'    """Apply every fix above: convert `model` in place, return the batch to run it on{around}."""\n'
            + "".join(line + "\n" for line in lines)
            + "    return batch\n"
        )

    def _side(self) -> list[str]:
        """What `preprocess` takes besides the batch: the model's processor, or what the user's function accepts."""
        t = self.transform or {}
        if t.get("kind") == "user":
            return [_key(str(a)) for a in t.get("accepts", ())]
        return [_SIDE[t["kind"]]] if t.get("kind") in _SIDE else []

    def _transform_usage(self, module: str) -> list[str]:
        """The lines that set `preprocess` as a dataset's transform, exactly as they run: with what it
        takes besides the batch bound first (datasets calls a transform with the batch alone)."""
        side = self._side()
        if not side:
            return [f"from {module} import preprocess", "dataset = dataset.with_transform(preprocess)"]
        bound = ", ".join(f"{a}={a}" for a in side)
        return ["import functools", f"from {module} import preprocess",
                f"dataset = dataset.with_transform(functools.partial(preprocess, {bound}))"]

    def _preprocess(self) -> str:
        t = self.transform or {}
        kind = t.get("kind")
        if kind == "user":
            function = str(t["function"])
            if not function.isidentifier():
                raise _Skip(f"bad function name {function!r}")
            accepts = [_key(str(a)) for a in t.get("accepts", ())]
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
        side = self._side()
        usage = f", given {' and '.join(side)} first: the module's docstring shows how to set it" if side else ": `dataset = dataset.with_transform(preprocess)`"
        return _PREPROCESS.format(params=params, about=about, build=build, usage=usage)

    def _apply(self, source: str, filename: str, warnings: list[str]) -> tuple[str, str]:
        if source.strip() and not self.replace:
            raise _Skip(f"{filename} already exists; pass --force to replace it with the generated fix module")
        text = self.render()
        funcs = ", ".join(f"{_part(s).function}()" for s, _ in self.parts)
        extra = " and preprocess() for datasets.with_transform" if "\ndef preprocess(" in text else ""
        verb = "replaced" if source.strip() else "new"
        return text, f"{verb} {filename}: apply_fix(model, batch) ({funcs}){extra} for {self.strategy}"


# ---------------------------------------------------------------------------------------
# The strategy table, read when a module is rendered (the strategies own their parts)


def _strategies() -> dict[str, Any]:
    """The strategies that have a part in the fix module, by name."""
    from dtype_doctor.fix.strategies import STRATEGIES

    return {name: s for name, s in STRATEGIES.items() if s.fix_module is not None}


def _strategy(name: str) -> Any:
    return _strategies()[name]


def _part(name: str) -> Any:
    return _strategy(name).fix_module


def _order(name: str) -> int:
    strategies = _strategies()
    return strategies[name].fix_module.order if name in strategies else 1 << 30


def _fields(name: str, params: Mapping[str, Any]) -> dict[str, str]:
    """The fields of strategy `name`'s part for `params`, its Skip a codemod skip."""
    from dtype_doctor.fix.strategies import Skip

    try:
        return _strategy(name).module_fields(params)
    except Skip as why:
        raise _Skip(str(why)) from None


def _key(key: str) -> str:
    from dtype_doctor.fix.strategies.base import Skip, identifier

    try:
        return identifier(key)
    except Skip as why:
        raise _Skip(str(why)) from None
