"""Keep the smallest set of modules in float32 that makes a float16 model finite and close to fp32.

`apply_keep_fp32` converts a model to float16 except some modules, and makes that mix run.
Converting weights alone is not enough: a kept float32 Linear fed the float16 activations of
the module before it raises ("mat1 and mat2 must have the same dtype"), and so does a float16
Linear fed the kept module's float32 output. So every module that holds floating parameters
itself casts its floating inputs to its own parameter dtype on entry (a forward pre-hook):
kept modules compute in float32, their float32 outputs flow on (a residual add with a float16
tensor promotes to float32), and the first float16 module downstream casts back.

`minimal_fp32_set` finds which modules to keep, as TensorRT's precision debugger and delta
debugging do: rank the candidates (largest |value| in the float32 reference first, the ones
closest to or beyond float16's 65504), find the shortest passing prefix (galloping up from one,
then bisecting), then drop each member whose removal still passes, until every member is
needed (1-minimal). "Passes": the model's primary output is finite, its cosine to the float32
reference is at least `cosine_min`, and no op turned finite inputs into inf or NaN on the way.
Siblings are searched as one unit first (q, k and v must share a dtype), then split. The model
given is never changed: the search runs on one deep copy whose weights are re-rounded from
their float32 values for each check.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dtype_doctor.records.errors import is_out_of_memory
from dtype_doctor.records import COSINE_MIN, FP16_MAX
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from dtype_doctor.numerics import fp32_inputs, module_peaks, output_diff, primary_output

MAX_GROUP = 8  # siblings searched as one unit at most (q, k, v, o and a bias fit)

__all__ = ["KeepFp32Result", "apply_keep_fp32", "minimal_fp32_set", "owns_floating_parameters"]


@dataclass(frozen=True)
class KeepFp32Result:
    """What the search found: the modules to keep float32 and how the model does with them."""

    modules: tuple[str, ...]  # dotted names, in the order they were ranked
    needed: bool  # False: converting (keeping only the declared fp32 modules) already passes
    verified: bool  # the final set gives a finite primary output with cosine >= cosine_min
    max_abs_diff: float  # of the final set's primary output against the float32 reference
    cosine: float
    checks: int  # forwards run, the reference's included
    reason: str



# ---------------------------------------------------------------- conversion


def owns_floating_parameters(module: torch.nn.Module) -> bool:
    return any(p.is_floating_point() for p in module.parameters(recurse=False))


def _declared(model: torch.nn.Module, dtype: torch.dtype) -> list[re.Pattern[str]]:
    """The model's own fp32 declarations, as transformers' dtype plan reads them:
    `_keep_in_fp32_modules` when converting to float16, `_strict` for any half dtype,
    each a regex searched in the state-dict key."""
    names = list(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    if dtype == torch.float16:
        names += list(getattr(model, "_keep_in_fp32_modules", None) or ())
    return [re.compile(n) for n in names]


def _is_kept(name: str, kept: Iterable[str]) -> bool:
    """Whether module `name` lies in a kept one ("" is the model itself: everything)."""
    return any(k == "" or name == k or name.startswith(k + ".") for k in kept)


def _plan(model: torch.nn.Module, kept: frozenset[str], dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.dtype]]:
    """Each persistent floating parameter and buffer with the dtype it gets: float32 in a kept
    or declared module, else `dtype`. A tensor shared by two modules (tied weights) stays float32
    when either keeps it. Non-persistent buffers (computed at init, e.g. rotary inv_freq) stay."""
    declared = _declared(model, dtype)
    plan: dict[int, tuple[torch.Tensor, torch.dtype]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        keep_module = _is_kept(name, kept)
        skip = getattr(module, "_non_persistent_buffers_set", set())
        for tname, t in [*module._parameters.items(), *((n, b) for n, b in module._buffers.items() if n not in skip)]:
            if t is None or not t.is_floating_point():
                continue
            key = f"{name}.{tname}" if name else tname
            keep = keep_module or any(p.search(key) for p in declared)
            prior = plan.get(id(t))
            if prior is None or keep:
                plan[id(t)] = (t, torch.float32 if keep else dtype)
    return list(plan.values())


def _cast_to_own_dtype(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Forward pre-hook: the module's floating tensor inputs in the dtype of its own parameters."""
    dtype = next((p.dtype for p in module.parameters(recurse=False) if p.is_floating_point()), None)
    if dtype is None:
        return args, kwargs

    def cast(v: Any) -> Any:
        return v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dtype != dtype else v

    return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}


def _install_hooks(model: torch.nn.Module) -> None:
    for module in model.modules():
        if owns_floating_parameters(module) and _cast_to_own_dtype not in module._forward_pre_hooks.values():
            module.register_forward_pre_hook(_cast_to_own_dtype, with_kwargs=True)


def _declare(model: torch.nn.Module, kept: Iterable[str]) -> None:
    """Declare the kept modules the way transformers models declare theirs (strict: for every
    half dtype), so what honours the declaration (DD102, transformers' dtype plan, a later
    half-model) treats them as meant. Set on the instance; the class is left alone."""
    kept = [k for k in kept if k]
    if not kept:
        return
    current = getattr(model, "_keep_in_fp32_modules_strict", None) or ()
    merged = [*current, *(k for k in kept if k not in current)]
    model._keep_in_fp32_modules_strict = set(merged) if isinstance(current, set) else merged


def apply_keep_fp32(model: torch.nn.Module, modules: Iterable[str], dtype: torch.dtype = torch.float16) -> torch.nn.Module:
    """Convert `model` in place to `dtype`, keeping `modules` (dotted names from named_modules(),
    a parent keeps its children) and the modules the model declares fp32 in float32; install the
    input-casting hooks that let the two dtypes meet. Returns the model."""
    kept = frozenset(modules)
    names = {n for n, _ in model.named_modules()}
    unknown = sorted(k for k in kept if k not in names)
    if unknown:
        raise ValueError(f"no module named {', '.join(map(repr, unknown))} in {type(model).__name__}")
    with torch.no_grad():
        for t, want in _plan(model, kept, dtype):
            if t.dtype != want:
                t.data = t.data.to(want)
    _declare(model, sorted(kept))
    _install_hooks(model)
    return model


# ---------------------------------------------------------------- search


@dataclass(frozen=True)
class _Outcome:
    passes: bool
    cosine: float  # nan when the output is not finite or the forward failed
    max_abs_diff: float
    failure: str | None = None  # why it does not pass

    @property
    def verdict(self) -> str:
        return self.failure or f"finite, cosine {self.cosine:.6f}"


class _Overflow(Exception):
    """Stops a check at the first overflow: the rest of the forward cannot change the verdict."""


class _OverflowWatch(TorchDispatchMode):
    """Notes each op that turns finite floating inputs into inf or NaN: an overflow that a
    tanh or a clamp hides on this batch need not stay hidden on the next. Ops that do so in
    the float32 reference too (a mask filled with -inf) are not overflows.

    With `stop`, the first overflow raises _Overflow (a host read per op: for CPU, where the
    NaN-filled rest of a float16 forward is slow). Otherwise the flags stay on the device
    until `overflowed()` reads them all back at once."""

    def __init__(self, ignore: frozenset[str] = frozenset(), *, stop: bool = False) -> None:
        super().__init__()
        self.ignore = ignore
        self.stop = stop
        self.flags: list[tuple[str, torch.Tensor]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = str(func.overloadpacket)
        if name in self.ignore:
            return out
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()]
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()]
        if not (ins and outs):
            return out
        if self.stop:
            # Read on the host: the output first, the inputs only when it is not finite.
            if not all(torch.isfinite(t).all() for t in outs) and all(torch.isfinite(t).all() for t in ins):
                raise _Overflow(name)
            return out
        finite_in = torch.stack([torch.isfinite(t).all() for t in ins]).all()
        bad_out = torch.stack([~torch.isfinite(t).all() for t in outs]).any()
        self.flags.append((name, finite_in & bad_out))
        return out

    def overflowed(self) -> list[str]:
        if not self.flags:
            return []
        hit = torch.stack([f.cpu() for _, f in self.flags]).tolist()
        return list(dict.fromkeys(name for (name, _), h in zip(self.flags, hit) if h))


class _Trials:
    """One working copy of the model; each check re-rounds its weights from their float32
    values to the dtypes a kept set gives them and runs the forward. A check passes when no op
    overflows and the primary output is finite with cosine >= cosine_min to the reference."""

    def __init__(self, model: torch.nn.Module, inputs: Mapping[str, Any], dtype: torch.dtype, cosine_min: float):
        self.work = copy.deepcopy(model).float()
        self.work.eval()
        self.inputs = dict(inputs)
        self.dtype = dtype
        self.cosine_min = cosine_min
        self.master = {id(t): t.data for t in [*self.work.parameters(), *self.work.buffers()]}
        self.on_cpu = all(t.device.type == "cpu" for t in self.master.values())
        self.checks = 0
        self._seen: dict[frozenset[str], _Outcome] = {}
        self.reference, self.peaks, self.legit = self._reference()
        _install_hooks(self.work)

    def _forward(self, inputs: Mapping[str, Any], watch: _OverflowWatch) -> torch.Tensor:
        self.checks += 1
        with torch.no_grad(), watch:
            out = self.work(**inputs)
        return primary_output(out)[1].detach().float().flatten()

    def _reference(self) -> tuple[torch.Tensor, dict[str, float], frozenset[str]]:
        """The float32 output, each parameter-owning module's largest |input| or |output|, and
        the ops that make inf or NaN from finite inputs in float32 already."""
        watch = _OverflowWatch()
        with module_peaks(self.work, select=owns_floating_parameters, with_inputs=True) as peaks:
            ref = self._forward(fp32_inputs(self.inputs), watch)
        return ref, dict(peaks), frozenset(watch.overflowed())

    def run(self, kept: Iterable[str]) -> _Outcome:
        """How the model does with `kept` (and the declared modules) in float32."""
        key = frozenset(kept)
        if key not in self._seen:
            self._seen[key] = self._check(key)
        return self._seen[key]

    def _check(self, kept: frozenset[str]) -> _Outcome:
        with torch.no_grad():
            for t, want in _plan(self.work, kept, self.dtype):
                t.data = self.master[id(t)].to(want)
        watch = _OverflowWatch(self.legit, stop=self.on_cpu)
        try:
            got = self._forward(self.inputs, watch)
        except _Overflow as exc:
            return _Outcome(False, float("nan"), float("inf"), f"overflowing ({exc} turned finite inputs into inf or NaN)")
        except Exception as exc:  # noqa: BLE001 - a mix that cannot run is a failing check
            if is_out_of_memory(exc):
                raise  # the machine's limit, not the mix's: the search would blame the wrong modules
            # Siblings whose outputs meet in one op (q, k, v in attention) must share a dtype;
            # a set that splits them raises, and the search moves on to one that does not.
            first = str(exc).splitlines()[0] if str(exc) else ""
            return _Outcome(False, float("nan"), float("inf"), f"failing ({type(exc).__name__}: {first})")
        if not torch.isfinite(got).all():
            return _Outcome(False, float("nan"), float("inf"), "non-finite")
        measured = output_diff(self.reference, got)
        cosine, diff = measured.cosine, measured.max_abs_diff
        overflowed = watch.overflowed()
        if overflowed:
            return _Outcome(False, cosine, diff, f"finite but overflowing ({', '.join(overflowed)} turned finite inputs into inf or NaN)")
        if cosine < self.cosine_min:
            return _Outcome(False, cosine, diff, f"finite but cosine {cosine:.6f} < {self.cosine_min}")
        return _Outcome(True, cosine, diff)


def _rank(trials: _Trials, candidates: Sequence[str] | None) -> list[str]:
    """Candidates in the order they are tried: as given, else largest peak first."""
    if candidates is not None:
        return list(dict.fromkeys(candidates))
    declared = _declared(trials.work, trials.dtype)
    owners = [
        n for n, m in trials.work.named_modules()
        if owns_floating_parameters(m)
        # Modules the model declares fp32 are kept already: no check needs to try them.
        and not all(any(p.search(f"{n}.{pn}") for p in declared) for pn, _ in m.named_parameters(recurse=False))
    ]
    position = {n: i for i, n in enumerate(owners)}
    return sorted(owners, key=lambda n: (-trials.peaks.get(n, 0.0), position[n]))


def _units(ranked: Sequence[str]) -> list[tuple[str, ...]]:
    """The ranked candidates grouped with their siblings (same parent module), in rank order.

    Siblings' outputs often meet in one op that wants one dtype (q, k and v in attention), so
    a set keeping k but not q raises; searching sibling groups first keeps the bisection
    monotone, and the member-level pass afterwards splits the groups that need not be whole.
    """
    groups: dict[str, list[str]] = {}
    for name in ranked:
        groups.setdefault(name.rpartition(".")[0], []).append(name)
    # A long flat container (an nn.Sequential of layers) is a stack, not a group of siblings.
    return [u for g in groups.values() for u in ([tuple(g)] if len(g) <= MAX_GROUP else [(n,) for n in g])]


def _one_minimal(items: list[Any], passes: Any) -> list[Any]:
    """Drop each item whose removal still passes, least ranked first, until a full pass drops
    nothing: every item left was checked against the final list."""
    dropped = True
    while dropped and len(items) > 1:
        dropped = False
        for item in reversed(list(items)):
            trial = [i for i in items if i != item]
            if passes(trial):
                items, dropped = trial, True
    return items


def minimal_fp32_set(
    model: torch.nn.Module,
    inputs: Mapping[str, Any],
    *,
    dtype: torch.dtype = torch.float16,
    candidates: Sequence[str] | None = None,
    cosine_min: float = COSINE_MIN,
) -> KeepFp32Result:
    """The smallest set of modules to keep float32 when `model` runs in `dtype` (module docstring).

    `candidates` restricts the search to these modules, tried in the order given; by default
    every module that holds floating parameters (less the declared fp32 ones), largest
    |input| or |output| in the float32 reference first. `model` is left as it was.
    """
    trials = _Trials(model, inputs, dtype, cosine_min)
    kind = str(dtype).removeprefix("torch.")
    ranked = _rank(trials, candidates)
    unknown = sorted(set(ranked) - {n for n, _ in trials.work.named_modules()})
    if unknown:
        raise ValueError(f"no module named {', '.join(map(repr, unknown))} in {type(model).__name__}")
    peak = max(trials.peaks.values(), default=0.0)
    where = max(trials.peaks, key=trials.peaks.get) if trials.peaks else ""
    evidence = f"largest |x| in the float32 reference {peak:.4g} ({where or 'the model'})"
    if peak > FP16_MAX and dtype == torch.float16:
        evidence += f" > {FP16_MAX:.0f}"

    def verdict(kept: Sequence[str]) -> str:
        return trials.run(kept).verdict

    def result(modules: Sequence[str], needed: bool, reason: str) -> KeepFp32Result:
        o = trials.run(modules)
        return KeepFp32Result(tuple(modules), needed, o.passes, o.max_abs_diff, o.cosine, trials.checks, reason)

    if trials.run(()).passes:
        return result((), False, f"plain {kind} conversion is already {verdict(())}; {evidence}")
    units = _units(ranked)

    def flat(us: Sequence[tuple[str, ...]]) -> list[str]:
        return [n for u in us for n in u]

    # The shortest passing prefix of the ranked units. The sets that matter are small and
    # ranked first, so gallop up from one unit (1, 2, 4, ... ending at all of them), then
    # bisect between the last failing length and the first passing one.
    lo, hi = 0, 1
    while not trials.run(flat(units[:hi])).passes:
        if hi == len(units):
            return result(
                ranked, True,
                f"plain {kind} conversion is {verdict(())}, and keeping all {len(ranked)} candidate modules float32 "
                f"is still {verdict(ranked)}; {evidence}",
            )
        lo, hi = hi, min(2 * hi, len(units))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if trials.run(flat(units[:mid])).passes:
            hi = mid
        else:
            lo = mid
    kept_units = _one_minimal(units[:hi], lambda us: trials.run(flat(us)).passes)
    kept = _one_minimal(flat(kept_units), lambda names: trials.run(names).passes)
    return result(
        kept, True,
        f"plain {kind} conversion is {verdict(())}; keeping {len(kept)} of {len(ranked)} candidate modules "
        f"float32 makes it {verdict(kept)}; {evidence}",
    )
