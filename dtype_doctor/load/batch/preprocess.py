"""The preprocess stage: the user's ``--preprocess FILE.py:FUNC`` applied as ``Dataset.map``
(outputs stored in Arrow, the formatter reads them later) or ``Dataset.with_transform`` (rows
read now, as a DataLoader would, and never stored)."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from dtype_doctor.records.files import split_spec  # noqa: F401 - imported from here too
from dtype_doctor.records.errors import DoctorError, InputError, first_line
from dtype_doctor.load.batch.describe import describe_value, feature_dtype, feature_repr
from dtype_doctor.load.batch.hf_map import quiet_map
from dtype_doctor.load.batch.state import BatchContext, BatchState, PreprocessFn
from dtype_doctor.records import LineageStep, SourceLoc
from dtype_doctor.machine.control import DEFAULT_TIMEOUT, user_code
SIDE_KWARGS = ("tokenizer", "image_processor", "feature_extractor", "processor", "config")


def load_preprocess(spec: str, timeout: float | None = DEFAULT_TIMEOUT) -> PreprocessFn:
    """Import FILE.py and return FUNC. Writes nothing into the user's directory (no __pycache__).

    A function whose first parameter is named ``batch`` / ``examples`` (or that has an attribute
    ``batched = True``) is mapped with ``batched=True``; one that takes ``tokenizer``,
    ``image_processor``, ``feature_extractor``, ``processor`` or ``config`` by keyword gets the
    model's. Importing the file runs under `user_code` (prints to stderr, exits named, `timeout`).
    """
    file, func = split_spec(spec)
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
        with user_code(f"preprocess file {file}", timeout):
            mspec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(mod_name, None)
        raise InputError(f"preprocess file {file} has a syntax error at line {e.lineno}: {e.msg}") from None
    except DoctorError:
        sys.modules.pop(mod_name, None)
        raise
    except Exception as e:
        sys.modules.pop(mod_name, None)
        raise InputError(f"preprocess file {file} failed to import: {type(e).__name__}: {first_line(e)}") from None
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
    # source.analysis (libcst) is imported only when there is a function to read: a scan without
    # --preprocess never pays for it.
    from dtype_doctor.source.analysis import batched_by_params

    batched = bool(getattr(fn, "batched", False)) or batched_by_params(names)
    accepts = tuple(n for n in SIDE_KWARGS if n in params)
    return PreprocessFn(fn=fn, file=file, path=path, name=func, batched=batched, accepts=accepts)


def run(state: BatchState, ctx: BatchContext) -> BatchState:
    pre = ctx.preprocess
    if pre is None:
        return state
    # The same analysis of the function the patches edit through: the line named here is the
    # line the first patch attempt rewrites.
    from dtype_doctor.source.analysis import FunctionSource

    source = FunctionSource(pre.path, pre.name)

    def step(key: str, dt: Any, dev: Any, shape: Any, detail: str) -> LineageStep:
        line = source.dtype_line(key, dt)
        return LineageStep("preprocess", dt, dev, shape, detail, SourceLoc(pre.file, line) if line else None)

    fn_kwargs = {k: v for k, v in ctx.side_objects().items() if k in pre.accepts}
    if ctx.preprocess_mode == "map":
        before = dict(state.dataset.features)
        with user_code(f"preprocess function {pre.label}", ctx.timeout):
            ds, seen = _map(state.dataset, pre, fn_kwargs)
        state = state.but(dataset=ds, lineage=state.lineage.keep(c for c in state.lineage.steps if c in ds.column_names))
        for key in ds.column_names:
            if key not in seen and key in before and ds.features[key] == before[key]:
                continue  # a column the function left alone
            if key in seen:
                words = describe_value(seen[key])[3]
            else:
                words = "changed" if key in before else "a new column"
            dt, _ = feature_dtype(ds.features[key])
            stored = feature_repr(ds.features[key])
            state = state.step(key, step(key, dt, None, None, f"{pre.name} returned {words}; datasets.map stored it as {stored}"))
        return state
    with user_code(f"preprocess function {pre.label}", ctx.timeout):
        rows = _transform(state.dataset, pre, fn_kwargs)
    state = state.but(rows=rows, formatter="custom (with_transform)", lineage=state.lineage.keep(rows[0]))
    for key, v in rows[0].items():
        dt, shape, dev, words = describe_value(v)
        detail = f"{pre.name} returned {words} (with_transform: not stored in Arrow, no formatter)"
        state = state.step(key, step(key, dt, dev, shape, detail))
    return state


class _UserCall:
    """Calls the user's function and remembers what it raised, so that a failure inside
    ``datasets`` is reported as the function's own error when the function caused it."""

    def __init__(self, pre: PreprocessFn, fn_kwargs: dict[str, Any]) -> None:
        self.pre, self.fn_kwargs = pre, fn_kwargs
        self.raised: list[BaseException] = []

    def __call__(self, example: Any) -> Any:
        try:
            return self.pre.fn(example, **self.fn_kwargs)
        except Exception as e:
            self.raised.append(e)
            raise

    @contextmanager
    def blamed(self, failed: str, hint: str) -> Iterator[None]:
        old = sys.dont_write_bytecode
        sys.dont_write_bytecode = True  # a function importing its neighbours writes no __pycache__
        try:
            yield
        except Exception as e:
            if self.raised:
                err = self.raised[0]
                raise InputError(
                    f"preprocess function {self.pre.label} raised {type(err).__name__}: {first_line(err)}"
                ) from None
            raise InputError(f"{failed}: {type(e).__name__}: {first_line(e)}; {hint}") from None
        finally:
            sys.dont_write_bytecode = old


def _map(ds: Any, pre: PreprocessFn, fn_kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Dataset.map(FUNC); returns (new dataset, the first row's output of FUNC by key)."""
    seen: dict[str, Any] = {}
    call = _UserCall(pre, fn_kwargs)

    def wrapper(example: Any) -> Any:
        out = call(example)
        if isinstance(out, dict) and not seen:
            for k, v in out.items():
                first = pre.batched and (isinstance(v, (list, tuple)) and v or hasattr(v, "shape") and len(v.shape))
                seen[k] = v[0] if first else v
        return out

    with call.blamed(f"datasets.map could not store what {pre.label} returned",
                     "return a dict of columns (lists, arrays or tensors)"):
        return quiet_map(ds, wrapper, batched=pre.batched, tag="preprocess"), seen


def _transform(ds: Any, pre: PreprocessFn, fn_kwargs: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """Dataset.with_transform(FUNC), every row read as a DataLoader would (__getitems__)."""
    call = _UserCall(pre, fn_kwargs)

    def wrapper(batch: Any) -> Any:
        if pre.batched:
            return call(batch)
        # a per-example function: call it row by row, as a torch Dataset's __getitem__ would
        size = len(next(iter(batch.values()))) if batch else 0
        outs = [call({k: v[i] for k, v in batch.items()}) for i in range(size)]
        if not outs or not all(isinstance(o, dict) for o in outs):
            return {}
        return {k: [o.get(k) for o in outs] for k in outs[0]}

    tds = ds.with_transform(wrapper)
    idx = list(range(len(ds)))
    with call.blamed(f"with_transform({pre.label}) gave rows datasets cannot split", "return a dict of per-row lists"):
        rows = tds.__getitems__(idx) if hasattr(tds, "__getitems__") else [tds[i] for i in idx]
    if not rows or not isinstance(rows[0], dict):
        raise InputError(f"preprocess function {pre.label} returned no columns; return a dict of per-row lists")
    return tuple(dict(r) for r in rows)
