"""`trace_model`: one forward (and backward) of a model on a batch, recorded as a Trace.

Where it runs is decided from the request (`place`): real tensors where the model is or on
copies of its state on another device, or fake tensors for a simulated target. The model is
left as it was (trace/guard.py); simulated traces never touch its tensors at all, they run
`torch.func.functional_call` with fake copies of its state. The recording itself is a
TraceSession (trace/session.py); the Report and the API drivers are dtype_doctor/diagnosis.py.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping

import torch

from dtype_doctor.records.errors import is_out_of_memory
from dtype_doctor.records import (
    ModelInfo,
    StateTensor,
    Trace,
    TraceFailure,
)
from dtype_doctor.numerics import device_name, dtype_name, loss_of
from dtype_doctor.machine.home import simulated_home
from dtype_doctor.machine.placement import CUDA0
from dtype_doctor.quantization import quantization_of
from dtype_doctor.trace.guard import preserved
from dtype_doctor.trace.layer_share import LayerSharing
from dtype_doctor.trace.lowbit import mx_recipe_of
from dtype_doctor.trace.session import TraceSession
from dtype_doctor.trace.request import TraceRequest

AUTOCAST_TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16}  # the torch dtype of each --autocast choice but off


def model_info(
    model: torch.nn.Module,
    state: Mapping[str, torch.Tensor] | None = None,
    device_alias: Mapping[str, str] | None = None,
) -> ModelInfo:
    non_persistent: set[str] = set()
    for mname, mod in model.named_modules():
        for b in getattr(mod, "_non_persistent_buffers_set", ()):
            non_persistent.add(f"{mname}.{b}" if mname else b)
    entries: list[StateTensor] = []
    for kind, named in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
        for name, t in named:
            t = state.get(name, t) if state else t
            entries.append(
                StateTensor(
                    name=name,
                    kind=kind,
                    dtype=dtype_name(t.dtype),
                    device=(device_alias or {}).get(device_name(t.device), device_name(t.device)),
                    shape=tuple(t.shape),
                    requires_grad=bool(t.requires_grad),
                    persistent=name not in non_persistent,
                )
            )
    keep = tuple(getattr(model, "_keep_in_fp32_modules", None) or ()) + tuple(
        getattr(model, "_keep_in_fp32_modules_strict", None) or ()
    )
    config = getattr(model, "config", None)
    num_labels = getattr(config, "num_labels", None)
    problem_type = getattr(config, "problem_type", None)
    attn = getattr(config, "_attn_implementation", None)
    half_buffers = {s.name for s in entries if s.kind == "buffer" and s.dtype in ("bfloat16", "float16")}
    rotary = ()
    if any(n.endswith("inv_freq") for n in half_buffers):
        from dtype_doctor.trace.rope import rotary_facts

        rotary = rotary_facts(model, dict(model.named_buffers()))
    components = getattr(model, "pipeline_components", None)
    return ModelInfo(
        class_name=getattr(model, "pipeline_class", None) or type(model).__name__,
        state=tuple(entries),
        keep_in_fp32_modules=keep,
        module_types=tuple((n, type(m).__name__) for n, m in model.named_modules()),
        num_labels=num_labels if isinstance(num_labels, int) else None,
        problem_type=problem_type if isinstance(problem_type, str) else None,
        quantization=quantization_of(model),
        attn_implementation=attn if isinstance(attn, str) else None,
        rotary=rotary,
        components=components() if callable(components) else (),
        mx_recipe=mx_recipe_of(model),
    )


def _moved_state(model: torch.nn.Module, device: torch.device) -> dict[str, torch.Tensor]:
    """Copies of the model's parameters and buffers on `device`, as leaves that keep requires_grad."""
    state: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        state[name] = p.detach().to(device).requires_grad_(p.requires_grad)
    for name, b in model.named_buffers():
        state[name] = b.detach().to(device)
    return state


def holds_no_data(model: torch.nn.Module, inputs: Mapping[str, Any]) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    tensors = [*model.parameters(), *(v for v in inputs.values() if isinstance(v, torch.Tensor))]
    return any(isinstance(t, FakeTensor) or t.device.type == "meta" for t in tensors)


def _declared_device(model: torch.nn.Module) -> torch.device | None:
    """The device a fake model says it is on (a meta model declares none)."""
    p = next(model.parameters(), None)
    if p is None or p.device.type == "meta":
        return None
    return p.device


def fake_like(fake_mode: Any, t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A fake tensor with t's dtype, shape and requires_grad on `device` (CUDA works without a GPU)."""
    with fake_mode:
        out = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=device)
    return out.requires_grad_(t.requires_grad) if t.is_floating_point() else out


@dataclass(frozen=True)
class Where:
    """How one trace runs the Placement decided at the boundary: real or fake tensors, the device
    the report names, and where the tensors live (the label, or its simulation stand-in)."""

    simulate: bool
    label: torch.device | None  # the device the report names; None: wherever the model is
    run_on: torch.device | None


def place(model: torch.nn.Module, inputs: Mapping[str, Any], request: TraceRequest) -> Where:
    """How this trace runs the request's Placement (decided at the entry): a model holding fake or
    meta tensors can only be simulated; a Placement without a device traces where the model is."""
    placement = request.placement
    simulate = placement.simulated or holds_no_data(model, inputs)
    asked = torch.device(placement.device) if placement.device is not None else None
    if simulate:
        label = asked or _declared_device(model) or torch.device(CUDA0)
        # On meta (a CPU-only build), tensors created in forward without device= still land on the
        # CPU and show up as device mismatches; autocast is then CUDA's policy applied by the
        # recorder (trace/cuda_autocast.py).
        return Where(True, label, simulated_home(label, fakes_cuda=True))
    return Where(False, asked, asked)


def settle(model: torch.nn.Module, inputs: Mapping[str, Any], request: TraceRequest) -> TraceRequest:
    """The request with its Placement made definite for this model (where it is, simulated when it
    holds no data), so re-traces of changed copies (a fix's candidates) run where the first ran."""
    where = place(model, inputs, request)
    device = device_name(where.label) if where.label is not None else request.placement.device
    return request.with_(placement=replace(request.placement, simulated=where.simulate, device=device))


def trace_model(model: torch.nn.Module, inputs: Mapping[str, Any], request: TraceRequest | None = None, *,
                refusal: Callable[[Any], str | None] | None = None) -> Trace:
    """Run one forward (and with request.train one backward) under the recorder.

    With request.move_inputs False the inputs stay on their own devices (a batch the
    pipeline forgot to move), so a model on the device meets them as it would for real.
    `refusal` is what a simulated trace asks where no kernel can say (rules.refusal).
    """
    request = request or TraceRequest()
    inputs = dict(inputs.items())
    autocast = request.autocast
    if autocast is not None and autocast not in AUTOCAST_TORCH:
        from dtype_doctor.records.errors import UsageError

        raise UsageError(f"--autocast must be off, float16 or bfloat16, not {autocast!r}")
    where = place(model, inputs, request)
    with contextlib.ExitStack() as spread:
        return _trace(model, inputs, request, where, spread, refusal)


@dataclass(frozen=True)
class _Staged:
    """A trace ready to run: the model (a spread copy when device-mapped) and inputs as they will be
    called, the state swapped in for the model's own (None: its own), and how the simulation names
    its devices (`alias`: stand-in → label; `plan`: a device map's)."""

    model: torch.nn.Module
    inputs: dict[str, Any]
    where: Where
    state: dict[str, torch.Tensor] | None = None
    fake_mode: Any = None
    alias: dict[str, str] = field(default_factory=dict)
    autocast_device: str | None = None
    plan: Any = None
    target_device: torch.device | None = None


@dataclass(frozen=True)
class _Ran:
    failure: TraceFailure | None
    grads: list[tuple[str, str, int | None]]


def _trace(model: torch.nn.Module, inputs: dict[str, Any], request: TraceRequest, where: Where, spread: contextlib.ExitStack,
           refusal: Callable[[Any], str | None] | None = None) -> Trace:
    # A sharded model's parameters are DTensors, whose storage is FSDP's: writes to them are FSDP's
    # own, and value statistics are not taken of them (a DTensor gradient is one rank's shard).
    sharded = any(type(p).__name__ == "DTensor" for p in model.parameters())
    staged = _staged_fake(model, inputs, request, where, spread, sharded) if where.simulate else _staged_real(model, inputs, request, where)
    model, inputs, where, state, alias = staged.model, staged.inputs, staged.where, staged.state, staged.alias
    session = TraceSession(
        model, stats=request.stats and not sharded, simulated=where.simulate, state=state, alias=alias,
        probe_cuda=where.label is not None and where.label.type == "cuda", placement=request.placement, refusal=refusal,
    )
    rec = session.recorder
    for name, v in inputs.items():
        if isinstance(v, torch.Tensor):
            rec.tag_input(name, v)
    info = model_info(model, state, alias)
    run_device = where.run_on if where.simulate and where.run_on is not None else _run_device(model, state, staged.target_device)
    # A simulated forward shares the work of identical layers (a training step's backward does not: traced whole).
    sharing = LayerSharing(rec, model).attach() if where.simulate and request.share_layers and not request.train else None
    try:
        ran = _run(session, staged, request, run_device, guard_writes=state is None and staged.plan is None and not sharded)
    finally:
        if sharing is not None:
            sharing.detach()
    autocast = request.autocast
    return session.trace(
        info, ran.failure,
        lineage=request.lineage, sources=request.sources, grads=ran.grads, values=values_note(request, where.simulate),
        inputs=tuple(rec.boundary_inputs) or tuple(rec.meta(v, "input", k) for k, v in inputs.items() if isinstance(v, torch.Tensor)),
        device=alias.get(device_name(run_device), device_name(run_device)),
        simulated=where.simulate,
        autocast=autocast,
        train=request.train,
        # scan's fp16 AMP step is checked as a GradScaler would take it (DD401).
        grad_scaler=request.train and autocast == "float16",
        devices=staged.plan,
        loaded=request.loaded,
        shared_layers=tuple(sharing.shared) if sharing is not None else (),
        **_fsdp1_units(model, request),
    )


def _staged_fake(model: torch.nn.Module, inputs: dict[str, Any], request: TraceRequest, where: Where,
                 spread: contextlib.ExitStack, sharded: bool) -> _Staged:
    """Fake copies of the state and inputs on the simulated device's stand-in (or the model spread
    over simulated GPUs by its device map)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from dtype_doctor.machine import device_map

    # A model sharded over fake tensors (fully_shard of a simulated load) runs as FSDP holds it:
    # its DTensors' fake shards keep their mode, and no copy of its state is swapped in.
    fake_mode = _shards_fake_mode(model) if sharded else None
    own_state = fake_mode is not None
    fake_mode = fake_mode or FakeTensorMode(allow_non_fake_inputs=True)
    label, stand_in = where.label, where.run_on
    alias: dict[str, str] = {}
    autocast_device: str | None = None
    plan = None
    state: dict[str, torch.Tensor] | None = None
    if request.placement.mapped:
        # accelerate spreads a fake copy over simulated GPUs; its hooks move what crosses them.
        model, plan, alias = device_map.spread(model, request.placement, fake_mode, spread)
        label = torch.device(CUDA0)
        stand_in = simulated_home(label, indexed=True)
        where = Where(True, label, stand_in)
        autocast_device = stand_in.type
    elif stand_in != label:
        alias[device_name(stand_in)] = device_name(label)
        autocast_device = stand_in.type
    if plan is None and not own_state:
        state = {n: fake_like(fake_mode, t, stand_in) for n, t in [*model.named_parameters(), *model.named_buffers()]}

    def sim_device(v: torch.Tensor) -> torch.device:
        # Simulation the caller did not ask for (a meta input, a fake model) moves nothing:
        # an input left on another device is the mismatch to report.
        keep = not request.move_inputs or not request.simulate
        stays = keep and device_name(v.device) != device_name(label)
        return v.device if stays else stand_in

    inputs = {k: (fake_like(fake_mode, v, sim_device(v)) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    return _Staged(model, inputs, where, state, fake_mode, alias, autocast_device, plan)


def _staged_real(model: torch.nn.Module, inputs: dict[str, Any], request: TraceRequest, where: Where) -> _Staged:
    """Real tensors: copies of the state on the device asked for where the model is elsewhere."""
    target = where.label
    state = None
    if target is not None:
        if any(t.device != target for t in [*model.parameters(), *model.buffers()]):
            state = _moved_state(model, target)
        if request.move_inputs:
            inputs = {k: (v.to(target) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    return _Staged(model, inputs, where, state, target_device=target)


def _run(session: TraceSession, staged: _Staged, request: TraceRequest, run_device: torch.device, *,
         guard_writes: bool) -> _Ran:
    """The forward (and backward) under the recorder, with the model's own state guarded; a failure
    is recorded, not raised (out of memory aside: the caller names the batch size)."""
    model, state, where, autocast = staged.model, staged.state, staged.where, request.autocast
    amp_device = staged.autocast_device or run_device.type
    # No AutocastCUDA kernels on a CPU-only build, and CPU autocast's lists are not CUDA's.
    emulate_cuda_amp = where.simulate and where.label is not None and where.label.type == "cuda" and run_device.type != "cuda"
    failure: TraceFailure | None = None
    grads: list[tuple[str, str, int | None]] = []
    with preserved(model, train=request.train, guard_writes=guard_writes, mode=False) as writes, contextlib.ExitStack() as fake:
        session.recorder.writes = writes  # the recorder's own dispatch mode guards the parameters' writes
        if staged.fake_mode is not None:
            fake.enter_context(_quiet_fake_kernels())
            fake.enter_context(staged.fake_mode)
            session.recorder.meta_outputs = None  # fake tensors: the fake mode keeps its own table of outputs
        try:
            # Without --train the forward runs in the caller's grad mode, as the plain `model(**inputs)` would:
            # libraries choose kernels by it (bitsandbytes packs 4-bit weights for its CPU kernel when the input
            # needs no grad, on CPUs with avx512_bf16), so a no_grad of the trace's own would change the path.
            with session.recording(), (torch.enable_grad() if request.train else contextlib.nullcontext()):
                with contextlib.ExitStack() as amp:
                    if autocast and emulate_cuda_amp:
                        amp.enter_context(session.cuda_autocast(AUTOCAST_TORCH[autocast]))
                    elif autocast:
                        amp.enter_context(torch.autocast(amp_device, dtype=AUTOCAST_TORCH[autocast]))
                    if state is not None:
                        out = torch.func.functional_call(model, state, (), staged.inputs, strict=False)
                    else:
                        out = model(**staged.inputs)
                if request.train:
                    loss = loss_of(out, "sum")
                    if loss is not None and loss.requires_grad:
                        loss.backward()
                        grads = session.observe_grads(state if state is not None else dict(model.named_parameters()))
        except Exception as exc:  # noqa: BLE001 - a failed trace is a finding, not a crash
            if is_out_of_memory(exc):
                raise  # the machine's limit, not the model's: the caller names the batch size
            failure = session.failure(exc)
    return _Ran(failure, grads)


def _shards_fake_mode(model: torch.nn.Module) -> Any:
    """The fake mode of a sharded model's fake local shards, or None (real shards)."""
    for p in model.parameters():
        mode = getattr(getattr(p, "_local_tensor", None), "fake_mode", None)
        if mode is not None:
            return mode
    return None


def _fsdp1_units(model: torch.nn.Module, request: TraceRequest) -> dict[str, Any]:
    """request.fsdp1: the FSDP1 units of the (unwrapped) model, as FlatParameters would flatten them."""
    if not request.fsdp1:
        return {}
    from dtype_doctor.records import World
    from dtype_doctor.trace.world import flat_units, world_of

    world = world_of()
    return {"shards": flat_units(model), "world": World(world.size if world else 1, strategy="fsdp")}


@contextlib.contextmanager
def _quiet_fake_kernels() -> Iterable[None]:
    """Fake tensors log a traceback for every meta kernel that raises; the recorder handles
    those errors (records, repairs), so the user's stderr should not show them."""
    import logging

    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def values_note(request: TraceRequest, simulated: bool) -> str:
    if simulated:
        return "not measured: a simulated trace runs on fake tensors, which hold no values"
    return "measured" if request.stats else "not measured: statistics were turned off"


def _run_device(model: torch.nn.Module, state: Mapping[str, torch.Tensor] | None, target: torch.device | None) -> torch.device:
    if target is not None:
        return target
    tensors = list(state.values()) if state else list(model.parameters())
    return tensors[0].device if tensors else torch.device("cpu")
