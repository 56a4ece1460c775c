"""Build the model's inputs from dataset rows the way a Hugging Face training pipeline does.

Order, as ``Trainer`` runs it: the user's preprocess function (``Dataset.map`` or
``Dataset.with_transform``), the tokenizer / image processor / feature extractor for raw
columns (as a ``map``), the datasets formatter (``with_format("torch")``), the collator
``Trainer`` would pick, then ``.to(device)``. Every input's dtype is recorded at every stage it
passes (its *lineage*), so a report can say where a wrong dtype came from: the formatter that
casts float16 columns to float32 and int32 to int64, the collator that makes labels int64, the
user's ``.half()`` that survives a ``with_transform``.

Only real ``datasets`` / ``transformers`` objects are used: the batch is what the pipeline
would hand the model.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from dtype_doctor.errors import InputError, UsageError, first_line as _first_line
from dtype_doctor.records import LineageStep, SourceLoc

__all__ = ["Batch", "PreprocessFn", "build_batch", "load_preprocess", "PREPROCESS_MODES", "DATASET_FORMATS"]

PREPROCESS_MODES = ("map", "transform")
DATASET_FORMATS = ("torch", "numpy", "python")
COLLATORS = ("auto", "none")

TEXT_COLUMNS = ("text", "sentence", "content", "source", "document", "prompt", "question", "input", "review")
TEXT_PAIRS = (("sentence1", "sentence2"), ("premise", "hypothesis"), ("question1", "question2"), ("question", "sentence"))
TARGET_TEXT_COLUMNS = ("target", "summary", "labels", "label", "translation", "output", "answer")
LABEL_COLUMNS = ("label", "labels", "target", "score", "label_ids")
AUDIO_COLUMNS = ("audio", "speech", "input_values")
IMAGE_COLUMNS = ("image", "img", "pixel_values", "picture", "photo")
BATCHED_PARAM_NAMES = ("batch", "examples", "batched", "samples", "example_batch", "batch_examples")
_SIDE_KWARGS = ("tokenizer", "image_processor", "feature_extractor", "processor", "config")


@dataclass(frozen=True)
class Batch:
    """Inputs ready for ``model(**inputs)`` and where each one's dtype came from."""

    inputs: dict[str, Any]
    lineage: dict[str, tuple[LineageStep, ...]]
    sources: dict[str, SourceLoc] = field(default_factory=dict)
    dropped_columns: tuple[str, ...] = ()
    collator: str = ""
    formatter: str = ""
    # extras beyond the brief
    preprocess: str | None = None  # "FILE.py:FUNC" as given
    preprocess_mode: str = "map"
    device: str = "cpu"
    notes: tuple[str, ...] = ()  # one-line remarks (pad token set, column renamed …)


@dataclass(frozen=True)
class PreprocessFn:
    """The user's preprocess function, loaded from its file."""

    fn: Callable[..., Any]
    file: str  # as the user wrote it
    path: Path  # resolved
    name: str
    batched: bool
    accepts: tuple[str, ...]  # which of tokenizer/image_processor/… it takes by keyword

    @property
    def label(self) -> str:
        return f"{self.file}:{self.name}"


# --------------------------------------------------------------------------- preprocess file


def load_preprocess(spec: str) -> PreprocessFn:
    """Import FILE.py and return FUNC. Writes nothing into the user's directory (no __pycache__).

    A function whose first parameter is named ``batch`` / ``examples`` (or that has an attribute
    ``batched = True``) is mapped with ``batched=True``; one that takes ``tokenizer``,
    ``image_processor``, ``feature_extractor``, ``processor`` or ``config`` by keyword gets the
    model's.
    """
    file, sep, func = spec.rpartition(":")
    if not sep or not file or not func or not func.isidentifier():
        raise UsageError(f"--preprocess must be FILE.py:FUNC, got {spec!r}")
    path = Path(file).expanduser()
    if not path.is_file():
        raise InputError(f"preprocess file {file} does not exist; pass --preprocess FILE.py:FUNC with an existing file")
    path = path.resolve()
    mod_name = f"_dtype_doctor_preprocess_{abs(hash(str(path))):x}"
    mspec = importlib.util.spec_from_file_location(mod_name, path)
    if mspec is None or mspec.loader is None:
        raise InputError(f"preprocess file {file} cannot be imported as Python; pass a .py file")
    module = importlib.util.module_from_spec(mspec)
    old_bytecode, old_path = sys.dont_write_bytecode, list(sys.path)
    sys.dont_write_bytecode = True  # no __pycache__ in the user's directory
    sys.path.insert(0, str(path.parent))  # so the file can import its neighbours
    sys.modules[mod_name] = module
    try:
        mspec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(mod_name, None)
        raise InputError(f"preprocess file {file} has a syntax error at line {e.lineno}: {e.msg}") from None
    except (Exception, SystemExit) as e:
        sys.modules.pop(mod_name, None)
        raise InputError(f"preprocess file {file} failed to import: {type(e).__name__}: {_first_line(e)}") from None
    finally:
        sys.dont_write_bytecode = old_bytecode
        sys.path[:] = old_path
    fn = getattr(module, func, None)
    if fn is None:
        funcs = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and v.__module__ == mod_name)
        hint = f"functions there: {', '.join(funcs)}" if funcs else "it defines no function"
        raise InputError(f"preprocess file {file} has no function {func!r} ({hint})")
    if not callable(fn):
        raise InputError(f"{file}:{func} is a {type(fn).__name__}, not a function; pass --preprocess FILE.py:FUNC")
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    names = list(params)
    batched = bool(getattr(fn, "batched", False)) or bool(names and names[0] in BATCHED_PARAM_NAMES)
    accepts = tuple(n for n in _SIDE_KWARGS if n in params)
    return PreprocessFn(fn=fn, file=file, path=path, name=func, batched=batched, accepts=accepts)


_CAST_ATTRS = {"half", "bfloat16", "float", "double", "to", "astype", "type", "long", "int", "short"}
_DTYPE_NAMES = {
    "float16", "half", "bfloat16", "float32", "float64", "double", "int8", "int16", "int32", "int64",
    "uint8", "long", "int", "short",
}


def _is_cast(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr in _CAST_ATTRS:
            if sub.func.attr in ("to", "type", "astype"):
                # .to("cuda") is a transfer, not a cast: need a dtype somewhere in the args
                if any(
                    isinstance(a, ast.Attribute) and a.attr in _DTYPE_NAMES
                    or isinstance(a, ast.Constant) and a.value in _DTYPE_NAMES
                    or isinstance(a, ast.Name) and a.id in _DTYPE_NAMES
                    for arg in list(sub.args) + [k.value for k in sub.keywords]
                    for a in ast.walk(arg)
                ):
                    return True
            else:
                return True
        if isinstance(sub, ast.keyword) and sub.arg == "dtype":
            return True
    return False


def source_lines(pre: PreprocessFn) -> tuple[dict[str, int], int | None]:
    """(output key → the line that gives it its dtype, fallback: the first cast or the return).

    Best effort, from the function's AST: a key's candidates are ``out["k"] = …``,
    ``out["k"].append(…)`` / ``.extend(…)``, ``{"k": …}`` and ``dict(k=…)``; the last candidate
    that casts (directly, or through a local name assigned with a cast before it) wins, else the
    last candidate.
    """
    try:
        tree = ast.parse(pre.path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return {}, None
    fdef = next(
        (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == pre.name),
        None,
    )
    if fdef is None:
        return {}, None
    cands: dict[str, list[ast.expr]] = {}  # output key → expressions that give it
    assigns: dict[str, list[ast.stmt]] = {}  # local name → its assignments
    casts: list[int] = []
    returns: list[int] = []

    def const_key(node: ast.AST) -> str | None:
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            return node.slice.value
        return None

    for node in ast.walk(fdef):
        if isinstance(node, ast.Return):
            returns.append(node.lineno)
            if node.value is not None and _is_cast(node.value):
                casts.append(node.lineno)
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                key = const_key(t)
                if key is not None:
                    cands.setdefault(key, []).append(node.value)
                if isinstance(t, ast.Name):
                    assigns.setdefault(t.id, []).append(node)
            if _is_cast(node.value):
                casts.append(node.lineno)
        if isinstance(node, ast.Expr) and _is_cast(node.value):
            casts.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("append", "extend"):
            key = const_key(node.func.value)
            if key is not None and node.args:
                cands.setdefault(key, []).append(node.args[0])
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and isinstance(k.value, str):
                    cands.setdefault(k.value, []).append(v)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
            for kw in node.keywords:
                if kw.arg:
                    cands.setdefault(kw.arg, []).append(kw.value)

    def cast_line(expr: ast.expr) -> int | None:
        if _is_cast(expr):
            return expr.lineno
        # {"pixel_values": tensor} where `tensor = tensor.to(torch.float16)` came before
        names = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}
        lines = [
            a.lineno for n in names for a in assigns.get(n, [])
            if a.lineno <= expr.lineno and getattr(a, "value", None) is not None and _is_cast(a.value)  # type: ignore[arg-type]
        ]
        return max(lines) if lines else None

    keys: dict[str, int] = {}
    for key, exprs in cands.items():
        exprs = sorted(exprs, key=lambda e: e.lineno)
        cast_lines = [ln for ln in (cast_line(e) for e in exprs) if ln is not None]
        keys[key] = cast_lines[-1] if cast_lines else exprs[-1].lineno
    fallback = min(casts) if casts else (max(returns) if returns else fdef.lineno)
    return keys, fallback


# --------------------------------------------------------------------------- describing values


def _dtype_str(dt: Any) -> str | None:
    if dt is None:
        return None
    s = str(dt)
    return s.replace("torch.", "")


def _feature_dtype(feat: Any) -> tuple[str | None, str]:
    """(dtype, detail) of a datasets feature as stored."""
    import datasets

    if isinstance(feat, datasets.ClassLabel):
        return "int64", f"ClassLabel with {feat.num_classes} names"
    if isinstance(feat, datasets.Value):
        dt = feat.dtype
        if dt in ("string", "large_string"):
            return None, "string"
        if dt in ("float", "double"):
            return {"float": "float32", "double": "float64"}[dt], f"Value('{dt}')"
        return dt, f"Value('{dt}')"
    if isinstance(feat, datasets.Image):
        return "uint8", "image (decoded to a PIL image with uint8 pixels)"
    if isinstance(feat, datasets.Audio):
        return None, "audio (decoded to a float array)"
    inner = getattr(feat, "feature", None)
    if inner is not None and type(feat).__name__ in ("List", "Sequence", "LargeList"):
        dt, det = _feature_dtype(inner)
        return dt, f"list of {det if dt is None else dt}"
    dt = getattr(feat, "dtype", None)
    if isinstance(dt, str) and type(feat).__name__.startswith("Array"):
        return dt, f"{type(feat).__name__}({dt})"
    return None, type(feat).__name__


def _feature_repr(feat: Any) -> str:
    return repr(feat).replace("\n", " ")


def _describe_value(v: Any) -> tuple[str | None, tuple[int, ...] | None, str | None, str]:
    """(dtype, shape, device, words) of one value a function returned or a formatter gave."""
    mod = type(v).__module__
    if mod.startswith("torch") and hasattr(v, "dtype") and hasattr(v, "shape"):
        dt = _dtype_str(v.dtype)
        return dt, tuple(v.shape), str(v.device), f"torch.{dt} tensor"
    if mod.startswith("numpy") and hasattr(v, "dtype"):
        dt = str(v.dtype)
        return dt, tuple(getattr(v, "shape", ())), None, f"numpy {dt} {'array' if getattr(v, 'ndim', 0) else 'scalar'}"
    if isinstance(v, bool):
        return "bool", (), None, "python bool"
    if isinstance(v, int):
        return None, (), None, "python int"
    if isinstance(v, float):
        return None, (), None, "python float"
    if isinstance(v, str):
        return None, None, None, "string"
    if isinstance(v, (list, tuple)):
        if v:
            dt, shape, dev, words = _describe_value(v[0])
            return dt, (len(v), *shape) if shape is not None else None, dev, f"list of {words}"
        return None, (0,), None, "empty list"
    if type(v).__module__.startswith("PIL"):
        return "uint8", None, None, f"PIL image ({getattr(v, 'mode', '?')})"
    return None, None, None, type(v).__name__


# --------------------------------------------------------------------------- column roles


def _is_string_feature(feat: Any) -> bool:
    import datasets

    return isinstance(feat, datasets.Value) and feat.dtype in ("string", "large_string")


def _is_float_list(feat: Any) -> bool:
    import datasets

    inner = getattr(feat, "feature", None)
    return (
        inner is not None
        and isinstance(inner, datasets.Value)
        and inner.dtype in ("float16", "float32", "float64", "float", "double")
    )


def _pick_text_columns(features: Any, exclude: set[str]) -> tuple[str | None, str | None]:
    strings = [c for c, f in features.items() if _is_string_feature(f) and c not in exclude]
    for a, b in TEXT_PAIRS:
        if a in strings and b in strings:
            return a, b
    for c in TEXT_COLUMNS:
        if c in strings:
            return c, None
    return (strings[0], None) if strings else (None, None)


def _pick_image_column(ds: Any) -> str | None:
    import datasets

    for c, f in ds.features.items():
        if isinstance(f, datasets.Image):
            return c
    if len(ds):
        row = ds[0]
        for c in ds.column_names:
            if type(row.get(c)).__module__.startswith("PIL"):
                return c
    return None


def _pick_audio_column(ds: Any, forward: set[str]) -> str | None:
    import datasets

    for c, f in ds.features.items():
        if isinstance(f, datasets.Audio):
            return c
    for c in AUDIO_COLUMNS:
        if c in ds.features and (_is_float_list(ds.features[c]) or isinstance(ds.features[c], dict)):
            if c == "input_values" and "input_values" in forward and "sampling_rate" not in ds.column_names:
                continue  # already model input, stored as such
            return c
    return None


def _label_column(features: Any, causal_lm: bool) -> str | None:
    import datasets

    for c in LABEL_COLUMNS:
        if c not in features:
            continue
        f = features[c]
        if _is_string_feature(f):
            continue
        is_seq = getattr(f, "feature", None) is not None and not isinstance(f, datasets.ClassLabel)
        if causal_lm and not is_seq:
            continue  # a class label cannot be a causal LM's token labels
        return c
    return None


# --------------------------------------------------------------------------- the pipeline


class _Lineage:
    """Per current column name, the steps it went through; follows renames."""

    def __init__(self) -> None:
        self.steps: dict[str, list[LineageStep]] = {}

    def add(self, name: str, step: LineageStep) -> None:
        self.steps.setdefault(name, []).append(step)

    def copy_from(self, src: str, dst: str) -> None:
        self.steps[dst] = list(self.steps.get(src, []))

    def rename(self, src: str, dst: str) -> None:
        self.steps[dst] = self.steps.pop(src, [])

    def last(self, name: str) -> LineageStep | None:
        s = self.steps.get(name)
        return s[-1] if s else None


def _tokenizer_of(loaded: Any) -> Any:
    return loaded.tokenizer or getattr(loaded.processor, "tokenizer", None)


def _image_processor_of(loaded: Any) -> Any:
    return loaded.image_processor or getattr(loaded.processor, "image_processor", None)


def _feature_extractor_of(loaded: Any) -> Any:
    return loaded.feature_extractor or getattr(loaded.processor, "feature_extractor", None)


def _map_processor(ds: Any, fn: Callable[..., Any], tag: str, what: str) -> Any:
    """A processor applied as a batched map; its failure is one InputError naming `what`."""
    try:
        return _map(ds, fn, batched=True, tag=tag)
    except Exception as e:  # noqa: BLE001 - the processor's own error, in one line
        raise InputError(f"{what}: {type(e).__name__}: {_first_line(e)}") from None


def _map(ds: Any, fn: Callable[..., Any], *, batched: bool, fn_kwargs: dict[str, Any] | None = None, tag: str) -> Any:
    import datasets

    was = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        return ds.map(
            fn,
            batched=batched,
            fn_kwargs=fn_kwargs or {},
            keep_in_memory=True,
            load_from_cache_file=False,
            new_fingerprint=f"dtype-doctor-{tag}-{ds._fingerprint}",
            desc=None,
        )
    finally:
        if was:
            datasets.enable_progress_bars()


def _run_user_map(ds: Any, pre: PreprocessFn, side: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Dataset.map(FUNC); returns (new dataset, first output of FUNC by key)."""
    seen: dict[str, Any] = {}
    raised: list[BaseException] = []

    def wrapper(example: Any, **kw: Any) -> Any:
        try:
            out = pre.fn(example, **kw)
        except Exception as e:
            raised.append(e)
            raise
        if isinstance(out, dict) and not seen:
            for k, v in out.items():
                seen[k] = v[0] if pre.batched and isinstance(v, (list, tuple)) and v else v
                if pre.batched and not isinstance(v, (list, tuple)) and hasattr(v, "shape") and len(v.shape):
                    seen[k] = v[0]
        return out

    fn_kwargs = {k: side[k] for k in pre.accepts}
    old = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        out = _map(ds, wrapper, batched=pre.batched, fn_kwargs=fn_kwargs, tag="preprocess")
    except Exception as e:
        if raised:
            err = raised[0]
            raise InputError(
                f"preprocess function {pre.label} raised {type(err).__name__}: {_first_line(err)}"
            ) from None
        raise InputError(
            f"datasets.map could not store what {pre.label} returned: {type(e).__name__}: {_first_line(e)}; "
            "return a dict of columns (lists, arrays or tensors)"
        ) from None
    finally:
        sys.dont_write_bytecode = old
    return out, seen


def _run_user_transform(ds: Any, pre: PreprocessFn, side: dict[str, Any]) -> list[dict[str, Any]]:
    """Dataset.with_transform(FUNC) and read every row as a DataLoader would (__getitems__)."""
    raised: list[BaseException] = []
    fn_kwargs = {k: side[k] for k in pre.accepts}

    def wrapper(batch: Any) -> Any:
        try:
            if pre.batched:
                return pre.fn(batch, **fn_kwargs)
            # a per-example function: call it row by row, as a torch Dataset's __getitem__ would
            size = len(next(iter(batch.values()))) if batch else 0
            outs = [pre.fn({k: v[i] for k, v in batch.items()}, **fn_kwargs) for i in range(size)]
        except Exception as e:
            raised.append(e)
            raise
        if not outs or not all(isinstance(o, dict) for o in outs):
            return {}
        return {k: [o.get(k) for o in outs] for k in outs[0]}

    tds = ds.with_transform(wrapper)
    idx = list(range(len(ds)))
    old = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        rows = tds.__getitems__(idx) if hasattr(tds, "__getitems__") else [tds[i] for i in idx]
    except Exception as e:
        if raised:
            err = raised[0]
            raise InputError(
                f"preprocess function {pre.label} raised {type(err).__name__}: {_first_line(err)}"
            ) from None
        raise InputError(
            f"with_transform({pre.label}) gave rows datasets cannot split: {type(e).__name__}: {_first_line(e)}; "
            "return a dict of per-row lists"
        ) from None
    finally:
        sys.dont_write_bytecode = old
    if not rows or not isinstance(rows[0], dict):
        raise InputError(f"preprocess function {pre.label} returned no columns; return a dict of per-row lists")
    return [dict(r) for r in rows]


def _fmt_name(dataset_format: str) -> str:
    return {"torch": "TorchFormatter", "numpy": "NumpyFormatter"}.get(dataset_format, "PythonFormatter")


def _short(names: list[str] | tuple[str, ...], limit: int = 8) -> str:
    names = list(names)
    return ", ".join(names[:limit]) + (", …" if len(names) > limit else "")


def build_batch(
    loaded: Any,
    rows: Any,
    *,
    preprocess: str | None = None,
    preprocess_mode: str = "map",
    dataset_format: str = "torch",
    device: str = "cpu",
    max_length: int = 128,
    collator: str = "auto",
) -> Batch:
    """Turn `rows` into ``model(**inputs)`` keyword inputs for `loaded`, recording each input's lineage.

    `collator` "auto" batches the rows with the collator Trainer uses by default; "none" stacks
    them as slicing the dataset (``dataset[:n]``) would, keeping every dtype as it is.

    `preprocess` is "FILE.py:FUNC" (the user's map function); `preprocess_mode` "map" runs it
    through ``Dataset.map`` (outputs stored in Arrow, then the formatter), "transform" through
    ``Dataset.with_transform`` (outputs reach the collator as returned). `dataset_format` is the
    ``with_format`` type ("torch", "numpy", or "python" for none). Raises ``InputError`` when the
    rows give nothing the model's forward accepts, or the preprocess function fails.
    """
    if preprocess_mode not in PREPROCESS_MODES:
        raise UsageError(f"preprocess mode {preprocess_mode!r} is not one of {', '.join(PREPROCESS_MODES)}")
    if dataset_format not in DATASET_FORMATS:
        raise UsageError(f"dataset format {dataset_format!r} is not one of {', '.join(DATASET_FORMATS)}")
    if collator not in COLLATORS:
        raise UsageError(f"unknown --collator {collator!r}; choose one of: {', '.join(COLLATORS)}")

    forward = set(loaded.forward_params)
    cls_name = loaded.class_name
    causal_lm = cls_name.endswith("ForCausalLM")
    enc_dec = bool(getattr(loaded, "is_encoder_decoder", False) or getattr(loaded.config, "is_encoder_decoder", False))
    tokenizer = _tokenizer_of(loaded)
    side = {
        "tokenizer": tokenizer,
        "image_processor": _image_processor_of(loaded),
        "feature_extractor": _feature_extractor_of(loaded),
        "processor": loaded.processor,
        "config": loaded.config,
    }
    notes: list[str] = []
    lin = _Lineage()
    sources: dict[str, SourceLoc] = {}
    ds = rows.dataset
    original_columns = list(ds.column_names)

    # ---- dataset
    for col, feat in ds.features.items():
        dt, det = _feature_dtype(feat)
        lin.add(col, LineageStep("dataset", dt, None, None, f"column '{col}': {det}"))

    # ---- preprocess
    pre: PreprocessFn | None = load_preprocess(preprocess) if preprocess else None
    transformed: list[dict[str, Any]] | None = None
    if pre is not None:
        key_lines, fallback_line = source_lines(pre)

        def loc(key: str) -> SourceLoc | None:
            line = key_lines.get(key, fallback_line)
            return SourceLoc(pre.file, line) if line else None

        def add_preprocess_step(key: str, dt: Any, dev: Any, shape: Any, detail: str) -> None:
            src = loc(key)
            lin.add(key, LineageStep("preprocess", dt, dev, shape, detail, src))
            if src:
                sources[key] = src

        if preprocess_mode == "map":
            before = dict(ds.features)
            ds, seen = _run_user_map(ds, pre, side)
            for key in ds.column_names:
                if key not in seen and key in before and ds.features[key] == before[key]:
                    continue
                if key not in seen and key in before:
                    seen_words = "changed"
                else:
                    seen_words = _describe_value(seen.get(key))[3] if key in seen else "a new column"
                dt, _ = _feature_dtype(ds.features[key])
                add_preprocess_step(
                    key, dt, None, None,
                    f"{pre.name} returned {seen_words}; datasets.map stored it as {_feature_repr(ds.features[key])}",
                )
            for key in before:
                if key not in ds.column_names:
                    lin.steps.pop(key, None)
        else:
            transformed = _run_user_transform(ds, pre, side)
            first = transformed[0]
            for key in list(lin.steps):
                if key not in first:
                    lin.steps.pop(key, None)
            for key, v in first.items():
                dt, shape, dev, words = _describe_value(v)
                add_preprocess_step(
                    key, dt, dev, shape, f"{pre.name} returned {words} (with_transform: not stored in Arrow, no formatter)"
                )

    # ---- processor for raw columns (map path only: a transform is the user's whole pipeline)
    if transformed is None:
        ds = _apply_processors(ds, loaded, side, lin, forward, causal_lm, enc_dec, max_length, notes)

    # ---- labels under the names the collators know
    label_col: str | None = None
    if transformed is None:
        feats = ds.features
        label_col = _label_column(feats, causal_lm) if "labels" in forward else None
        if label_col in ("target", "score") and "labels" not in feats:
            ds = ds.rename_column(label_col, "labels")
            lin.rename(label_col, "labels")
            notes.append(f"column '{label_col}' passed as labels (Trainer would drop it: forward has no '{label_col}')")
    else:
        first = transformed[0]
        for col in ("target", "score"):
            if "labels" in forward and col in first and "labels" not in first and "label" not in first \
                    and not isinstance(first[col], str):
                for r in transformed:
                    r["labels"] = r.pop(col)
                lin.rename(col, "labels")
                notes.append(f"column '{col}' passed as labels")
                break

    # ---- Trainer's remove_unused_columns
    keep = forward | {"label", "label_ids"}
    if "labels" not in forward:
        keep -= {"label", "label_ids"}
    if causal_lm and transformed is None:
        # only token labels fit a causal LM; without them the LM collator copies input_ids
        keep -= {c for c in ("label", "labels", "label_ids") if c != label_col}
    present = list(ds.column_names) if transformed is None else list(transformed[0].keys())
    dropped = [c for c in present if c not in keep]
    if transformed is None:
        if dropped:
            ds = ds.remove_columns(dropped)
    else:
        transformed = [{k: v for k, v in r.items() if k in keep} for r in transformed]
    for c in dropped:
        lin.steps.pop(c, None)
    remaining = [c for c in present if c in keep]
    model_inputs = [c for c in remaining if c not in ("label", "labels", "label_ids")]
    if not model_inputs:
        shown = original_columns if pre is None else present
        accepted = [p for p in loaded.forward_params if p not in ("labels", "return_dict", "use_cache", "output_attentions", "output_hidden_states")]
        raise InputError(
            f"dataset columns [{_short(shown)}] give no input that {cls_name}.forward accepts "
            f"({_short(accepted, 6)}); pass --preprocess FILE.py:FUNC"
        )
    dropped_user = tuple(c for c in dropped if c in original_columns or (pre is not None and c not in _processor_made))

    # ---- formatter
    if transformed is None:
        k = len(ds)
        if dataset_format == "python":
            formatter = "python"
            row_list = [ds[i] for i in range(k)]
        else:
            formatter = dataset_format
            fds = ds.with_format(dataset_format)
            row_list = fds.__getitems__(list(range(k))) if hasattr(fds, "__getitems__") else [fds[i] for i in range(k)]
            row_list = [dict(r) for r in row_list]
            for key in remaining:
                before = lin.last(key)
                dt, shape, dev, words = _describe_value(row_list[0].get(key))
                if before is not None and before.dtype and dt and before.dtype != dt:
                    kind = "floating" if before.dtype.startswith(("float", "bfloat")) else "integer"
                    det = f"datasets {_fmt_name(dataset_format)} turns {kind} columns into {dt} ({before.dtype} → {dt})"
                else:
                    det = f"datasets {_fmt_name(dataset_format)} gave a {words}"
                lin.add(key, LineageStep("formatter", dt, dev, shape, det))
    else:
        formatter = "custom (with_transform)"
        row_list = transformed

    # ---- collator
    batch, collator = _collate(row_list, loaded, tokenizer, causal_lm, enc_dec, lin, notes, collator)

    # ---- transfer and model boundary
    inputs = _transfer(batch, loaded, device, lin)
    for key, t in inputs.items():
        dt, shape, dev, _ = _describe_value(t)
        lin.add(key, LineageStep("model-boundary", dt, dev, shape, f"{cls_name}.forward({key}=…)"))

    lineage = {k: tuple(lin.steps.get(k, ())) for k in inputs}
    if "labels" in inputs and "labels" not in sources:
        for alias in ("label", "label_ids", "target", "score"):
            if alias in sources:
                sources["labels"] = sources[alias]
                break
    sources = {k: v for k, v in sources.items() if k in inputs}
    return Batch(
        inputs=inputs,
        lineage=lineage,
        sources=sources,
        dropped_columns=dropped_user,
        collator=collator,
        formatter=formatter,
        preprocess=preprocess,
        preprocess_mode=preprocess_mode,
        device=next((str(t.device) for t in inputs.values() if hasattr(t, "device")), device),
        notes=tuple(notes),
    )


# columns that our processor step makes (dropped silently when the model does not take them)
_processor_made = {"input_ids", "attention_mask", "token_type_ids", "special_tokens_mask", "pixel_values",
                   "pixel_mask", "input_values", "input_features", "labels", "decoder_attention_mask"}


def _ensure_pad_token(tokenizer: Any, notes: list[str]) -> None:
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is not None:
            tokenizer.pad_token = tokenizer.eos_token
            notes.append("tokenizer has no pad token: using its eos token, as the HF examples do")
        else:
            raise InputError(
                "the tokenizer of this model has neither a pad token nor an eos token, so rows cannot be padded; "
                "pass --batch-size 1 or --preprocess FILE.py:FUNC"
            )


def _apply_processors(
    ds: Any, loaded: Any, side: dict[str, Any], lin: _Lineage, forward: set[str], causal_lm: bool,
    enc_dec: bool, max_length: int, notes: list[str],
) -> Any:
    cols = set(ds.column_names)
    tokenizer = side["tokenizer"]

    # text → tokenizer
    if "input_ids" in forward and not ({"input_ids", "inputs_embeds"} & cols):
        target_col = None
        if enc_dec and "labels" in forward:
            for c in TARGET_TEXT_COLUMNS:
                if c in ds.features and _is_string_feature(ds.features[c]):
                    target_col = c
                    break
        text_col, pair_col = _pick_text_columns(ds.features, {target_col} if target_col else set())
        if text_col is not None:
            if tokenizer is None:
                raise InputError(
                    f"dataset column '{text_col}' is raw text but {loaded.path} has no tokenizer "
                    "(tokenizer.json / tokenizer_config.json); add one or pass --preprocess FILE.py:FUNC"
                )
            _ensure_pad_token(tokenizer, notes)
            tok_name = type(tokenizer).__name__

            def tokenize(batch: dict[str, list[Any]]) -> dict[str, Any]:
                args = [batch[text_col]] + ([batch[pair_col]] if pair_col else [])
                enc = dict(tokenizer(*args, padding=True, truncation=True, max_length=max_length))
                if target_col is not None:
                    tgt = tokenizer(text_target=batch[target_col], padding=True, truncation=True, max_length=max_length)
                    pad = tokenizer.pad_token_id
                    enc["labels"] = [[(t if t != pad else -100) for t in seq] for seq in tgt["input_ids"]]
                return enc

            new = _map_processor(ds, tokenize, "tokenize", f"{tok_name} could not tokenize column '{text_col}'")
            made = [c for c in new.column_names if c not in cols or (c == "labels" and target_col)]
            for c in made:
                src_col = target_col if (c == "labels" and target_col) else text_col
                lin.copy_from(src_col, c)
                dt, _ = _feature_dtype(new.features[c])
                call = f"text_target=<{target_col}>" if (c == "labels" and target_col) else "padding=True, truncation=True"
                lin.add(c, LineageStep(
                    "processor", dt, None, None,
                    f"{tok_name}({call}, max_length={max_length}) → stored by datasets.map as {_feature_repr(new.features[c])}",
                ))
            if target_col and target_col != "labels":
                new = new.remove_columns([target_col])
                lin.steps.pop(target_col, None)
            ds = new
            cols = set(ds.column_names)

    # image → image processor
    if "pixel_values" in forward and "pixel_values" not in cols:
        img_col = _pick_image_column(ds)
        if img_col is not None:
            ip = side["image_processor"]
            if ip is None:
                raise InputError(
                    f"dataset column '{img_col}' holds images but {loaded.path} has no image processor "
                    "(preprocessor_config.json); add one or pass --preprocess FILE.py:FUNC"
                )
            channels = getattr(loaded.config, "num_channels", 3)
            seen: dict[str, Any] = {}

            def process(batch: dict[str, list[Any]]) -> dict[str, Any]:
                images = [im.convert("RGB") if channels == 3 and hasattr(im, "convert") else im for im in batch[img_col]]
                out = dict(ip(images, return_tensors="pt"))
                if not seen:
                    seen.update({k: v for k, v in out.items()})
                return out

            new = _map_processor(ds, process, "image", f"{type(ip).__name__} could not process column '{img_col}'")
            for c in new.column_names:
                if c in cols:
                    continue
                lin.copy_from(img_col, c)
                dt, _ = _feature_dtype(new.features[c])
                got = seen.get(c)
                words = f"returned {_describe_value(got)[3]} {tuple(got.shape) if hasattr(got, 'shape') else ''}".rstrip()
                lin.add(c, LineageStep(
                    "processor", dt, None, None,
                    f"{type(ip).__name__} {words}; stored by datasets.map as {dt}",
                ))
            ds = new
            cols = set(ds.column_names)

    # audio → feature extractor
    audio_keys = [k for k in ("input_values", "input_features") if k in forward]
    if audio_keys:
        audio_col = _pick_audio_column(ds, forward)
        if audio_col is not None and not ((set(audio_keys) & cols) - {audio_col}):
            fe = side["feature_extractor"]
            if fe is None:
                raise InputError(
                    f"dataset column '{audio_col}' holds audio but {loaded.path} has no feature extractor "
                    "(preprocessor_config.json); add one or pass --preprocess FILE.py:FUNC"
                )
            import numpy as np

            default_sr = getattr(fe, "sampling_rate", None)
            seen_fe: dict[str, Any] = {}

            def extract(batch: dict[str, list[Any]]) -> dict[str, Any]:
                arrays, rates = [], []
                for i, a in enumerate(batch[audio_col]):
                    if isinstance(a, dict):  # datasets Audio cell
                        arrays.append(np.asarray(a["array"]))
                        rates.append(a.get("sampling_rate"))
                    else:
                        arrays.append(np.asarray(a))
                        rates.append(batch["sampling_rate"][i] if "sampling_rate" in batch else None)
                sr = next((r for r in rates if r), default_sr)
                out = dict(fe(arrays, sampling_rate=sr, padding=True))
                if not seen_fe:
                    seen_fe.update(out)
                    seen_fe["_in"] = arrays[0]
                    seen_fe["_sr"] = sr
                return out

            new = _map_processor(ds, extract, "audio", f"{type(fe).__name__} could not process column '{audio_col}'")
            for c in new.column_names:
                if c in cols and c != audio_col:
                    continue
                if c == audio_col and c not in seen_fe:
                    continue
                if c != audio_col:
                    lin.copy_from(audio_col, c)
                dt, _ = _feature_dtype(new.features[c])
                got = seen_fe.get(c)
                inner = _describe_value(got[0] if isinstance(got, list) and got else got)[3]
                lin.add(c, LineageStep(
                    "processor", dt, None, None,
                    f"{type(fe).__name__}(sampling_rate={seen_fe.get('_sr')}) returned {inner} per row; "
                    f"stored by datasets.map as {dt}",
                ))
            ds = new
    return ds


def _stack_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What `dataset[:n]` hands a script: each column stacked, dtypes as they are."""
    import torch

    out: dict[str, Any] = {}
    for key in rows[0]:
        values = [r[key] for r in rows]
        out[key] = torch.stack(values) if isinstance(values[0], torch.Tensor) else torch.tensor(values)
    return out


def _collate(
    row_list: list[dict[str, Any]], loaded: Any, tokenizer: Any, causal_lm: bool, enc_dec: bool, lin: _Lineage,
    notes: list[str], choice: str = "auto",
) -> tuple[dict[str, Any], str]:
    import transformers

    keys = list(row_list[0].keys())
    has_labels = any(k in keys for k in ("label", "labels", "label_ids"))
    lm_labels = causal_lm and not has_labels and "input_ids" in keys and "labels" in loaded.forward_params
    if choice == "none":
        collator, name = _stack_rows, "no collator (rows stacked as dataset[:n])"
        lm_labels = False
    elif tokenizer is not None and "input_ids" in keys:
        _ensure_pad_token(tokenizer, notes)
        if lm_labels:
            collator = transformers.DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm=False)
            name = "DataCollatorForLanguageModeling"
        elif enc_dec and "labels" in keys:
            # the seq2seq examples' collator: pads labels (with -100) as well as the inputs
            collator = transformers.DataCollatorForSeq2Seq(tokenizer)
            name = "DataCollatorForSeq2Seq"
        else:
            collator = transformers.DataCollatorWithPadding(tokenizer)
            name = "DataCollatorWithPadding"
    else:
        collator = transformers.default_data_collator
        name = "default_data_collator"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "Creating a tensor from a list of numpy.ndarrays is slow"
            out = collator(row_list)
    except Exception as e:
        raise InputError(
            f"{name} could not batch the rows: {type(e).__name__}: {_first_line(e)}; "
            "pass --preprocess FILE.py:FUNC to give the columns one shape per row"
        ) from None
    batch = dict(out)
    if lm_labels and "labels" not in batch and "input_ids" in batch:
        # no tokenizer to run DataCollatorForLanguageModeling: do what it does
        batch["labels"] = batch["input_ids"].clone()
        notes.append("no tokenizer: labels copied from input_ids as DataCollatorForLanguageModeling(mlm=False) does")
    if "labels" in batch and "labels" not in lin.steps:
        if "label" in lin.steps:
            lin.rename("label", "labels")
        elif "label_ids" in lin.steps:
            lin.rename("label_ids", "labels")
        elif lm_labels:
            lin.copy_from("input_ids", "labels")
    for key, t in batch.items():
        before = lin.last(key)
        dt, shape, dev, _ = _describe_value(t)
        if key == "labels" and lm_labels:
            det = f"{name}(mlm=False) copies input_ids as labels (padding → -100)"
        elif before is None:
            det = f"{name} created it" + (" (tokenizer.pad)" if tokenizer is not None and key == "attention_mask" else "")
        elif before is not None and before.dtype != dt and before.dtype is not None:
            det = f"{name} made it {dt} (was {before.dtype})"
        elif before is not None and before.dtype is None and dt is not None:
            det = f"{name} made {'an' if dt.startswith('int') else 'a'} {dt} tensor from python values"
        else:
            det = f"{name} {'stacked' if name == 'default_data_collator' else 'padded and stacked'} the rows"
        lin.add(key, LineageStep("collator", dt, dev, shape, det))
    return batch, name


def _transfer(batch: dict[str, Any], loaded: Any, device: str, lin: _Lineage) -> dict[str, Any]:
    import torch

    fake_mode = getattr(loaded, "fake_mode", None)
    if device == "auto":
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise UsageError(f"device {device!r} is not a torch device ({_first_line(e)}); use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda:0")
    if fake_mode is None and dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(
            f"device {dev} is not available here (torch.cuda.is_available() is False); "
            "pass --simulate to trace for it with fake tensors"
        )
    out: dict[str, Any] = {}
    for key, t in batch.items():
        if not isinstance(t, torch.Tensor):
            out[key] = t
            continue
        if fake_mode is not None:
            from torch._subclasses.fake_tensor import FakeTensor

            with fake_mode:
                ft = t if isinstance(t, FakeTensor) else fake_mode.from_tensor(t)
                moved = ft.to(dev)
            det = f".to({dev}) as a fake tensor (--simulate: no data copied)"
        else:
            moved = t.to(dev)
            det = f".to({dev})" if t.device != dev else f"already on {dev}"
        out[key] = moved
        dt, shape, d, _ = _describe_value(moved)
        lin.add(key, LineageStep("transfer", dt, d, shape, det))
    return out
