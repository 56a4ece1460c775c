"""Where each tensor the script feeds its model came from, in the user's own lines.

While the script runs (before and between traced steps), a TorchFunctionMode watches every
torch call. A tensor made or changed at a call site in the user's files (a `.to(torch.float16)`,
a `.cuda()`, a `torch.tensor(labels, dtype=torch.int32)`) gets a LineageStep with that file
and line; any other op passes its first operand's chain on to its output (indexing, stack,
collate), so the chain survives the DataLoader. Datasets stores `map` results in Arrow,
which makes new tensors: the chain of each column the user's map / transform function
returned is kept by name and joined back on when `Dataset.__getitem__` hands the column out.
Nothing here ever raises into the user's script.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, NamedTuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from dtype_doctor.records import LineageStep, SourceLoc
from dtype_doctor.machine.libraries import after_import
from dtype_doctor.machine.modes import push_function_mode, remove_function_mode, tensors_in
from dtype_doctor.machine.user_code import display_path, first_outside_tool, first_user_frame, frames_above, is_user_file
from dtype_doctor.numerics import device_name, dtype_name
from dtype_doctor.trace.provenance import boundary_tensors

Chain = tuple[LineageStep, ...]
MAX_STEPS = 12

# Library call sites that make a batch tensor out of Python / numpy values: the stage they stand for.
_LIBRARY_STAGES = (
    (os.sep + "transformers" + os.sep, "processor"),
    (os.sep + "datasets" + os.sep, "formatter"),
    (os.sep + "torch" + os.sep + "utils" + os.sep + "data" + os.sep, "collator"),
)
_CREATORS = frozenset({torch.tensor, torch.as_tensor, torch.from_numpy, torch.stack, torch.cat})


class Handled(NamedTuple):
    """The last line of the user's that made a tensor from another (or made it): where a move
    the script dropped belongs (`y.pin_memory()` that never went on to `.to(device)`)."""

    source: SourceLoc
    call: str  # what that line called: ".pin_memory()", "torch.stack"
    # A slice of a tensor another function of the user's built and handed back as it was (batchify's
    # `return data`, whose `.to(device)` was dropped): that `return`, where the device was decided.
    origin: SourceLoc | None = None


class Raised(NamedTuple):
    """The last torch call of the script's that raised outside any model: what it was given. A
    script that stops there (`x.mm(w)` on float64 data) is judged from it (run/before_model.py)."""

    error: BaseException
    op: str  # the torch function's name: "mm", "linear", "__matmul__"
    operands: tuple[torch.Tensor, ...]


class LineageBook:
    """Tensor → the chain of steps that made it; column name → the chain a map function gave it."""

    def __init__(self, is_paused: Callable[[], bool], device_alias: dict[str, str] | None = None) -> None:
        self.chains: WeakIdKeyDictionary = WeakIdKeyDictionary()
        # Tensor → the last user line that handled it, whether or not its dtype or device changed there.
        self.handled: WeakIdKeyDictionary = WeakIdKeyDictionary()
        # Tensor → what `handled` held for the tensor it was made from, where that was another line
        # (get_batch's slice of the corpus tensor batchify made): where a stored tensor was last handled.
        self.handled_from: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.columns: dict[str, Chain] = {}
        self.values: dict[str, LineageStep] = {}  # column of plain values → the user's line that made it
        self.is_paused = is_paused
        # Tensors of the traced step (the model's outputs, the loss): what derives from them is not pipeline.
        self.is_step_tensor: Callable[[torch.Tensor], bool] = lambda t: False
        # A simulated run's stand-in device is named as the device it stands for ("meta" → "cuda:0").
        self.device_alias = device_alias or {}
        # The last torch call of the script's own that raised before any model call (run.before_model),
        # and whether a step has started: from then on nothing is kept (its operands and traceback would be held).
        self.raised: Raised | None = None
        self.stepping = False

    def forget(self, *tensors: torch.Tensor) -> None:
        """Let go of these tensors (torch.utils.swap_tensors is about to exchange them)."""
        for table in (self.chains, self.handled, self.handled_from):
            for t in tensors:
                table.pop(t, None)

    def step_started(self) -> None:
        self.raised, self.stepping = None, True

    def device(self, d: torch.device) -> str:
        name = device_name(d)
        return self.device_alias.get(name, name)

    def chain(self, t: torch.Tensor) -> Chain:
        return self.chains.get(t, ())

    # ---------------------------------------------------------------- ops

    def observe(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, torch.Tensor)]
        if not outs:
            return
        first = next(iter(tensors_in(args, kwargs)), None)
        inherited = self.chain(first) if first is not None else ()
        if first is not None and not inherited and self.is_step_tensor(first):
            return
        site = _call_site()
        step = None
        if site is not None and is_user_file(site[0]):
            step = self._user_step(func, first, outs[0], site, inherited)
            for o in outs:
                # An op that hands back its operand (pin_memory on a CPU-only machine) handled it too, when
                # it is a pipeline tensor already: a weak reference on a parameter (an in-place init in a
                # module's __init__) would change how a simulated move keeps parameters one object.
                if o is not first or inherited:
                    self.handled[o] = (site, func)  # made into a Handled at the model boundary: one tuple an op here
                    if first is not None and (before := self.handled.get(first)) is not None and before[0] != site:
                        self.handled_from[o] = before
        elif not inherited and func in _CREATORS and site is not None:
            step = _library_step(func, outs[0], site, self.device)
        elif inherited and site is not None and first is not None and self.device(outs[0].device) != self.device(first.device):
            # A library moved it (BatchEncoding.to(model.device)): the user line that asked for it.
            user = _nearest_user_frame()
            step = LineageStep("transfer", dtype_name(outs[0].dtype), self.device(outs[0].device), tuple(outs[0].shape),
                               f"moved to {self.device(outs[0].device)} by {_func_name(func)} in {_package(site[0])}",
                               SourceLoc(display_path(user[0]), user[1]) if user else None)
        chain = inherited + (step,) if step is not None else inherited
        if not chain:
            return
        for o in outs:
            if o is not first:  # in-place ops return their operand: keep what it was
                self.chains[o] = chain[-MAX_STEPS:]

    def _user_step(self, func: Any, first: torch.Tensor | None, out: torch.Tensor, site: tuple[str, int], inherited: Chain) -> LineageStep | None:
        name = _func_name(func)
        decided = True
        if first is None:
            what, stage = f"created by {name}", _caller_stage()
        elif self.device(out.device) != self.device(first.device):
            what, stage = f"moved to {self.device(out.device)} by {name}", "transfer"
        elif out.dtype != first.dtype:
            what, stage = f"cast to {dtype_name(out.dtype)} by {name}", _caller_stage()
        elif not inherited:
            what, stage, decided = f"first seen at {name}", _caller_stage(), False
        else:
            return None
        return LineageStep(stage, dtype_name(out.dtype), self.device(out.device), tuple(out.shape), what,
                           SourceLoc(display_path(site[0]), site[1]), decided)

    # ------------------------------------------------------------- columns

    def remember_columns(self, result: Any, function: Any = None) -> None:
        """A map / transform function returned `result`: keep each tensor column's chain by name, and
        of each column of plain values (Python floats, a numpy array) the line of `function` that
        made it: the tensor a formatter or collator makes of it later has its dtype decided there."""
        from collections.abc import Mapping

        if not isinstance(result, Mapping):  # a dict, or datasets' LazyBatch
            return
        for key, value in result.items():
            t = next(iter(tensors_in((value,), {})), None)
            if t is not None and self.chain(t):
                self.columns[str(key)] = self.chain(t)
            elif t is None and function is not None and (step := value_step(function, str(key), value)) is not None:
                self.values[str(key)] = step

    def remember_samples(self, dataset: Any, samples: Any) -> None:
        """A DataLoader hands `samples` to its collate_fn: a torch Dataset of the user's made them in its
        `__getitem__`; a column of plain values there decides the dtype of the tensor collate makes."""
        getitem = getattr(type(dataset), "__getitem__", None)
        code = getattr(getitem, "__code__", None)
        if code is None or not is_user_file(code.co_filename):
            return
        first = samples[0] if isinstance(samples, list) and samples else samples
        self.remember_columns(first, getitem)

    def join_values(self, batch: Any) -> None:
        """A library's collate_fn made `batch`: each tensor it made of a column of plain values (its
        chain begins there) takes that column's step."""
        from collections.abc import Mapping

        if not isinstance(batch, Mapping):
            return
        for key, value in batch.items():
            if isinstance(value, torch.Tensor) and len(chain := self.chain(value)) == 1:
                joined = self.made_of_columns(str(key), self.made_of_values(str(key), chain, made_here=True))
                if joined is not chain:
                    self.chains[value] = joined

    def made_of_columns(self, name: str, chain: Chain) -> Chain:
        """`chain` (a tensor a collator made) after the chain of the tensor a map function returned in column
        `name` (`return_tensors="pt"`), which the dataset stored as values: where that tensor's dtype was
        decided is the map function's line. Only a tensor of the same kind (floating, integer)."""
        column = self.columns.get(name)
        if column is None or len(chain) != 1 or column[-1].dtype is None or chain[0].dtype is None:
            return chain
        if _kind(column[-1].dtype) != _kind(chain[0].dtype):
            return chain
        return (column + chain)[-MAX_STEPS:]

    def made_of_values(self, name: str, chain: Chain, *, made_here: bool = False) -> Chain:
        """`chain` with the step of the user's line that made column `name` of plain values in front,
        where a library made the tensor of them (no line of the user's handled it before) and the
        values were of its kind (a float column made a float tensor)."""
        step = next((self.values[k] for k in (name, *_RENAMED.get(name, ())) if k in self.values), None)
        if step is None or not chain or not (made_here or _library_made(chain[0])) or chain[0].dtype is None or step.dtype is None:
            return chain
        if _kind(chain[0].dtype) != _kind(step.dtype):
            return chain
        return ((dataclasses.replace(step, dtype=chain[0].dtype, shape=chain[0].shape),) + chain)[-MAX_STEPS:]

    def join_columns(self, rows: Any) -> None:
        """Dataset.__getitem__ handed out `rows`: tensors the formatter made take their column's chain."""
        for row in rows if isinstance(rows, list) else [rows]:
            if not isinstance(row, dict):
                continue
            for key, value in row.items():
                column = self.columns.get(str(key))
                if column is None:
                    continue
                for t in tensors_in((value,), {}):
                    if self.chain(t)[: len(column)] == column:
                        continue  # a transform's own tensor, its chain already complete
                    user = _nearest_user_frame()
                    step = LineageStep(
                        "formatter", dtype_name(t.dtype), self.device(t.device), tuple(t.shape),
                        f"datasets returns column {key!r} as {dtype_name(t.dtype)}",
                        SourceLoc(display_path(user[0]), user[1]) if user else None,
                    )
                    self.chains[t] = (column + (step,) if column[-1].dtype != step.dtype else column)[-MAX_STEPS:]

    def wrap_function(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        book = self

        def remembering(*args: Any, **kwargs: Any) -> Any:
            result = fn(*args, **kwargs)
            try:
                book.remember_columns(result, fn)
            except Exception:  # noqa: BLE001 - lineage must never break the script
                pass
            return result

        remembering.__wrapped__ = fn  # type: ignore[attr-defined]
        return remembering


class LineageMode(TorchFunctionMode):
    def __init__(self, book: LineageBook) -> None:
        super().__init__()
        self.book = book
        self._from_numpy: Any = None
        self._swap_tensors: Any = None

    def __enter__(self) -> "LineageMode":
        # torch.from_numpy is not overridable: the mode never sees it, so it is wrapped instead.
        original = self._from_numpy = torch.from_numpy
        mode = self

        def from_numpy(array: Any) -> torch.Tensor:
            out = original(array)
            if not mode.book.is_paused():
                try:
                    mode.book.observe(original, (), {}, out)
                except Exception:  # noqa: BLE001 - lineage must never break the script
                    pass
            return out

        torch.from_numpy = from_numpy
        # torch.utils.swap_tensors refuses a tensor anything holds a weak reference to, and the book's
        # are weak references: Module._apply swaps each parameter where parameters swap on conversion
        # (FSDP2's DTensors: `model.to_empty(device=...)` after fully_shard). The book lets go of the two.
        swap = self._swap_tensors = torch.utils.swap_tensors

        def swap_tensors(t1: torch.Tensor, t2: torch.Tensor) -> None:
            mode.book.forget(t1, t2)
            return swap(t1, t2)

        torch.utils.swap_tensors = swap_tensors
        push_function_mode(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        """Off the mode stack wherever it is: the script's own modes above it stay (machine/modes.py)."""
        if self._from_numpy is not None:
            torch.from_numpy = self._from_numpy
            self._from_numpy = None
        if self._swap_tensors is not None:
            torch.utils.swap_tensors = self._swap_tensors
            self._swap_tensors = None
        remove_function_mode(self)

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        try:
            out = func(*args, **kwargs)
        except Exception as error:
            if not self.book.is_paused() and not self.book.stepping:
                self.book.raised = Raised(error, getattr(func, "__name__", ""), tuple(tensors_in(args, kwargs)))
            raise
        if not self.book.is_paused() and not _is_property(func):
            try:
                self.book.observe(func, args, kwargs, out)
            except Exception:  # noqa: BLE001 - lineage must never break the script
                pass
        return out


def _is_property(func: Any) -> bool:
    # Tensor.shape / .dtype / .device reads come through the mode too; they make no tensor.
    return getattr(func, "__name__", "") == "__get__"


def _func_name(func: Any) -> str:
    name = getattr(func, "__name__", str(func))
    qual = getattr(func, "__qualname__", "")
    if qual.startswith(("TensorBase.", "Tensor.")) or name in ("to", "half", "float", "cuda", "cpu", "double", "bfloat16", "long", "int", "type"):
        return f".{name}()"
    return f"torch.{name}"


def _call_site() -> tuple[str, int] | None:
    """The first frame outside torch and the doctor: where the user (or a library) called torch."""
    frame = first_outside_tool(frames_above(2))
    return (frame.f_code.co_filename, frame.f_lineno) if frame else None


def _caller_stage() -> str:
    """A user function run by datasets (map, transform) is preprocessing, by a DataLoader a collator."""
    for frame in frames_above(3):
        filename = frame.f_code.co_filename
        if os.sep + "datasets" + os.sep in filename:
            return "preprocess"
        if os.sep + os.path.join("torch", "utils", "data") + os.sep in filename:
            return "collator"
    return "preprocess"


def _library_step(func: Any, out: torch.Tensor, site: tuple[str, int], device: Callable[[torch.device], str]) -> LineageStep | None:
    stage = next((s for marker, s in _LIBRARY_STAGES if marker in site[0]), None)
    if stage is None:
        return None
    user = _nearest_user_frame()
    return LineageStep(
        stage, dtype_name(out.dtype), device(out.device), tuple(out.shape),
        f"{_func_name(func)} in {_package(site[0])}", SourceLoc(display_path(user[0]), user[1]) if user else None,
    )


def _nearest_user_frame() -> tuple[str, int] | None:
    frame = first_user_frame(frames_above(1))
    return (frame.f_code.co_filename, frame.f_lineno) if frame else None


def _package(filename: str) -> str:
    for marker, _ in _LIBRARY_STAGES:
        if marker in filename:
            return marker.strip(os.sep).replace(os.sep, ".")
    return os.path.basename(filename)


# ------------------------------------------------------------------ the model boundary


def named_inputs(model: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    """`model(*args, **kwargs)`'s inputs by the forward's parameter names (`arg0`… where they cannot be bound)."""
    import inspect

    named: dict[str, Any] = {}
    if args:
        try:
            named.update(inspect.signature(model.forward).bind_partial(*args).arguments)
        except (TypeError, ValueError):
            named.update({f"arg{i}": a for i, a in enumerate(args)})
    named.update(kwargs)
    return named


def boundary_lineage(book: LineageBook, model: torch.nn.Module, args: tuple, kwargs: dict,
                     site: SourceLoc | None = None) -> dict[str, Chain]:
    """Each tensor input of `model(*args, **kwargs)` by parameter name → its chain, ending at the boundary
    (`site`: the user's line that made the call)."""
    named = boundary_tensors(named_inputs(model, args, kwargs))
    lineage: dict[str, Chain] = {}
    for name, value in named.items():
        if book.chain(value):
            boundary = LineageStep("model-boundary", dtype_name(value.dtype), book.device(value.device), tuple(value.shape),
                                   source=site)
            lineage[name] = book.made_of_values(name, book.chain(value)) + (boundary,)
    return lineage


def handled_at_boundary(book: LineageBook, model: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, Handled]:
    """Each tensor input of `model(*args, **kwargs)` by parameter name → the last user line that handled it."""
    found = {}
    for name, value in boundary_tensors(named_inputs(model, args, kwargs)).items():
        if (handled := book.handled.get(value)) is not None:
            found[name] = as_handled(handled, book.handled_from.get(value))
    return found


def as_handled(noted: tuple[tuple[str, int], Any], before: tuple[tuple[str, int], Any] | None = None) -> Handled:
    """What LineageBook.handled holds for a tensor ((file, line), the function called), as a Handled;
    `before`, what it held for the tensor this one was made from (its `origin`, when another function
    of the user's returned that one)."""
    from dtype_doctor.source.bindings import returned_at, same_function

    (file, line), func = noted
    origin = None
    if before is not None:
        (was, at), _ = before
        returned = returned_at(was, at) if was != file or not same_function(file, at, line) else None
        origin = SourceLoc(display_path(was), returned) if returned is not None else None
    return Handled(SourceLoc(display_path(file), line), _func_name(func), origin)


def joined_inputs(book: LineageBook, model: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, torch.Tensor]:
    """The pipeline tensors a model joining the step takes by parameter name (a GAN generator's noise
    made by the script's loop): those with a chain, none computed by the step (the first model's outputs)."""
    named = boundary_tensors(named_inputs(model, args, kwargs))
    return {name: t for name, t in named.items() if book.chain(t) and not (t.grad_fn is not None and book.is_step_tensor(t))}


def step_input_lineage(book: LineageBook, t: torch.Tensor, consumer: str, name: str = "", *, boundary: bool = False) -> Chain:
    """The chain of a pipeline tensor the step uses outside the model, ending where the step takes it (a
    loss), or at the boundary of a model joining the step (`boundary`)."""
    said = f"taken by {consumer}" if boundary else f"used by {consumer} outside the model"
    last = LineageStep("model-boundary" if boundary else "loss", dtype_name(t.dtype), book.device(t.device), tuple(t.shape), said)
    return book.made_of_values(name, book.chain(t)) + (last,)


def sources_of(lineage: dict[str, Chain]) -> dict[str, SourceLoc]:
    """Input name → the user line that gave the input its dtype; where no user line chose it (a library's
    tensor the user's code only passed on), the call that handed it to the model without a cast; else the
    last user line it passed."""
    sources: dict[str, SourceLoc] = {}
    for name, chain in lineage.items():
        final = chain[-1].dtype
        deciding = None
        previous = None
        for step in chain:
            if step.dtype != previous and step.dtype == final:
                deciding = step
            previous = step.dtype
        passed = [s for s in chain if s.source is not None]
        if deciding is not None and not deciding.decided and passed and passed[-1].stage == "model-boundary":
            sources[name] = passed[-1].source
        elif deciding is not None and deciding.source is not None:
            sources[name] = deciding.source
        elif (last := next((s for s in reversed(passed) if s.stage != "model-boundary"), None)) is not None:
            sources[name] = last.source
    return sources


# ------------------------------------------------------------------ datasets


def patch_datasets(book: LineageBook) -> Callable[[], None]:
    """Remember what the user's map / transform functions return; join it back as rows come out.
    Made when the script imports datasets (now, if it has), so a script without it never pays
    for the import. Returns the function that undoes the patch."""
    import sys

    undo: list[Callable[[], None]] = [_patch_fetcher(book)]
    hook = after_import("datasets.arrow_dataset", lambda arrow_dataset: undo.append(_patch_dataset(book, arrow_dataset.Dataset)))

    def undone() -> None:
        if hook is not None and hook in sys.meta_path:
            sys.meta_path.remove(hook)
        for u in undo:
            u()

    return undone


def _patch_fetcher(book: LineageBook) -> Callable[[], None]:
    """The samples a DataLoader's fetcher hands its collate_fn (in this process), seen by the book."""
    from torch.utils.data._utils import fetch as fetching

    cls = fetching._MapDatasetFetcher
    original = cls.__dict__["fetch"]

    def fetch(self: Any, index: Any) -> Any:
        collate = self.collate_fn

        def seeing(data: Any) -> Any:
            try:
                book.remember_samples(self.dataset, data)
            except Exception:  # noqa: BLE001 - lineage must never break the script
                pass
            batch = collate(data)
            try:
                code = getattr(collate, "__code__", None)
                if code is None or not is_user_file(code.co_filename):  # a collate_fn of the user's decides itself
                    book.join_values(batch)
            except Exception:  # noqa: BLE001 - lineage must never break the script
                pass
            return batch

        self.collate_fn = seeing
        try:
            return original(self, index)
        finally:
            self.collate_fn = collate

    cls.fetch = fetch

    def undo() -> None:
        cls.fetch = original

    return undo


def _patch_dataset(book: LineageBook, cls: Any) -> Callable[[], None]:
    saved = {name: cls.__dict__[name] for name in ("map", "set_transform", "with_transform", "__getitem__", "__getitems__") if name in cls.__dict__}

    def map(self: Any, function: Any = None, *args: Any, **kwargs: Any) -> Any:  # noqa: A001 - the method's name
        if function is not None and (kwargs.get("num_proc") or 1) <= 1:
            function = book.wrap_function(function)
            kwargs["load_from_cache_file"] = False  # a cached result would not run the function
            # datasets >= 4 runs num_proc=1 in a pool of one, which pickles the wrapped function: the same work here
            kwargs.pop("num_proc", None)
        return saved["map"](self, function, *args, **kwargs)

    def transform_setter(name: str) -> Callable[..., Any]:
        def setter(self: Any, transform: Any = None, *args: Any, **kwargs: Any) -> Any:
            if transform is not None:
                transform = book.wrap_function(transform)
            return saved[name](self, transform, *args, **kwargs)

        return setter

    def getter(name: str) -> Callable[..., Any]:
        def get(self: Any, key: Any) -> Any:
            rows = saved[name](self, key)
            try:
                book.join_columns(rows)
            except Exception:  # noqa: BLE001 - lineage must never break the script
                pass
            return rows

        return get

    patched = {"map": map, "set_transform": transform_setter("set_transform"), "with_transform": transform_setter("with_transform"),
               "__getitem__": getter("__getitem__"), "__getitems__": getter("__getitems__")}
    for name in saved:
        setattr(cls, name, patched[name])

    def undo() -> None:
        for name, original in saved.items():
            setattr(cls, name, original)

    return undo


# ------------------------------------------------------------------ plain values

# A collator renames what it collates: transformers' DataCollatorWithPadding hands "label" / "label_ids" on as "labels".
_RENAMED = {"labels": ("label", "label_ids")}


def value_step(function: Any, key: str, value: Any) -> LineageStep | None:
    """The user's line in `function` that made column `key` of plain values (Python numbers, numpy
    arrays): the dtype the tensor made of them will have, and where that was decided."""
    dtype = _value_dtype(value)
    code = getattr(function, "__code__", None)
    if dtype is None or code is None or not is_user_file(code.co_filename):
        return None
    line = _key_line(code.co_filename, code.co_firstlineno, key) or code.co_firstlineno
    name = getattr(function, "__qualname__", getattr(function, "__name__", "function"))
    return LineageStep("preprocess", dtype, "cpu", None, f"made {_kind(dtype)} values in {name}",
                       SourceLoc(display_path(code.co_filename), line))


def _value_dtype(value: Any) -> str | None:
    """The dtype torch.tensor gives `value` (a number, a list of them, a numpy array); None for anything else."""
    import numbers

    first = value
    while isinstance(first, (list, tuple)) and first:
        first = first[0]
    if hasattr(first, "dtype") and not isinstance(first, torch.Tensor):
        return str(getattr(first.dtype, "name", first.dtype))  # numpy: an array or a scalar
    if isinstance(first, bool):
        return "bool"
    if isinstance(first, numbers.Integral):
        return "int64"
    if isinstance(first, numbers.Real):
        return dtype_name(torch.get_default_dtype())
    return None


def _kind(dtype: str) -> str:
    return "bool" if dtype == "bool" else "float" if "float" in dtype or "bfloat" in dtype else "int"


def _library_made(step: LineageStep) -> bool:
    """A step where a library (a formatter, a collator, a processor) made the tensor of plain values."""
    return step.stage in ("processor", "formatter", "collator") and step.detail.startswith("torch.") and " in " in step.detail


def _key_line(filename: str, first_line: int, key: str) -> int | None:
    """The last line of the function starting at `first_line` that sets `key`: `out["key"] = …`,
    `{"key": …}`, `dict(key=…)`; where it sets none, of a function of the same file it calls that does
    (a map function that returns `tokenize(prompt)`, peft's and alpaca-lora's shape), two calls deep."""
    import ast

    try:
        with open(filename, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    level = [n for n in functions if min([n.lineno, *(d.lineno for d in n.decorator_list)]) == first_line][:1]
    seen: list[Any] = []
    for _ in range(3):
        if lines := [line for fn in level for line in _key_lines(fn, key)]:
            return max(lines)
        seen += level
        called = {n.func.id for fn in level for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        level = [n for n in functions if n.name in called and all(n is not f for f in seen)]
    return None


def _key_lines(fn: Any, key: str) -> list[int]:
    import ast

    lines = []
    for node in ast.walk(fn):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant) and t.slice.value == key for t in targets):
                lines.append(node.lineno)
        elif isinstance(node, ast.Dict):
            lines += [v.lineno for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant) and k.value == key]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
            lines += [kw.value.lineno for kw in node.keywords if kw.arg == key]
    return lines
