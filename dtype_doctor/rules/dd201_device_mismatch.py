"""DD201: tensors on different devices meet in one op."""

from __future__ import annotations

from typing import Iterator

from dtype_doctor.records import Finding, OpCall, Remedy, SourceLoc, TensorMeta, Trace
from dtype_doctor.rules._common import base_op, describe, device_remedies, input_name, refused, source_of, stage_of
from dtype_doctor.rules.base import Rule
from dtype_doctor.trace.verdicts import classify_error


# Ops whose job is to move data between devices.
CROSS_DEVICE_OPS = frozenset({"aten.copy_", "aten.copy", "aten._to_copy", "aten.to", "aten._copy_from", "aten._copy_from_and_resize"})


# Advanced indexing takes CPU index tensors on any device; embedding, index_select and gather
# do not (on an H100: "index is on cpu, different from other tensors on cuda:0").
_CPU_INDEX_OK = frozenset({"aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_"})


def _placed(op: OpCall) -> list[TensorMeta]:
    """The operands whose device matters: 0-dim CPU tensors act as scalars on any device,
    and advanced indexing accepts CPU index tensors on any device."""
    cpu_index_ok = base_op(op.op) in _CPU_INDEX_OK
    return [
        t for t in op.operands
        if not (t.is_scalar and t.device == "cpu") and not (cpu_index_ok and t.role == "index" and t.device == "cpu")
    ]


def mixes_devices(op: OpCall) -> bool:
    return base_op(op.op) not in CROSS_DEVICE_OPS and len({t.device for t in _placed(op)}) > 1


def _module_homes(trace: Trace) -> dict[str, str]:
    """Module → the device its own weights are on (a model spread by a device map has one per block)."""
    homes: dict[str, str] = {}
    for p in trace.model.parameters:
        module = p.name.rpartition(".")[0]
        while module and module not in homes:  # a block's home: its first weight's device
            homes[module] = p.device
            module = module.rpartition(".")[0]
    return homes


def _home_of(module: str, homes: dict[str, str], default: str) -> str:
    while True:
        if module in homes:
            return homes[module]
        if not module:
            return default
        module = module.rpartition(".")[0]


def _majority(devices: list[str], default: str) -> str:
    return max(set(devices), key=devices.count) if devices else default


def _component_homes(trace: Trace, default: str) -> dict[str, str]:
    """A step of several models (a pipeline's text encoder, UNet and VAE): each model's own device.
    A text encoder left on the CPU beside a UNet on the GPU is that model's placement, not the step's."""
    devices: dict[str, list[str]] = {name: [] for name, _ in trace.model.components}
    for p in trace.model.parameters:
        component = trace.model.component_of(p.name)
        if component is not None:
            devices[component].append(p.device)
    return {name: _majority(found, default) for name, found in devices.items()}


def check(trace: Trace) -> Iterator[Finding]:
    model_home = _majority([p.device for p in trace.model.parameters], trace.device)
    homes = _module_homes(trace) if trace.devices is not None else {}
    components = _component_homes(trace, model_home) if not homes else {}
    seen: set[tuple] = set()
    for op in trace.ops:
        if base_op(op.op) in CROSS_DEVICE_OPS or not refused(op):
            continue
        operands = _placed(op)
        devices = {t.device for t in operands}
        if len(devices) < 2:
            continue
        component = trace.model.component_of(op.module) if components else None
        home = _home_of(op.module, homes, model_home) if homes else components.get(component or "", model_home)
        where = f"{op.module or 'the model'} runs on {home}" if homes else f"{component or 'the model'} is on {home}"
        strays = [t for t in operands if t.device != home] or operands[1:]
        stray = strays[0]
        source = source_of(trace, stray)
        # One finding per decision: the batch the script moved on one line meets every layer of a
        # model left behind; each layer is that one placement, not another finding. The backward
        # of an op that mixed devices mixes the same two: the forward's finding, not another. A
        # model attribute (a RoPE table every layer reads) is one problem, however many modules meet it.
        if (stray.origin or "").startswith("attribute:"):
            key = ("", stray.origin, stray.device)
        else:
            key = (home, stray.device, source) if source is not None else (home, op.module, stray.origin or stray.name, stray.device)
        # An activation the model computed (from its own weights, or of no known origin) on the stray device
        # is where the trace's repair of an earlier refusal put it: that refusal's finding, not another
        # (PyTorch stops at the first).
        computed = stray.name is None and (stray.origin is None or stray.origin.startswith(("param:", "buffer:")))
        consequence = computed and (home, stray.device) in seen
        placement = ("model", component, home, stray.device)  # one of several models left behind: one decision
        if key in seen or consequence or placement in seen or (op.phase not in ("forward", "loss") and (home, stray.device) in seen):
            continue
        seen.update((key, (home, stray.device)))
        stage = stage_of(trace, stray, what="device")
        if stage == "collator":
            stage = "transfer"
        moved = _moved_to_gpu(trace, strays, home, homes)
        if moved and component:
            seen.add(placement)
        yield RULE.finding(
            f"{op.module_type or base_op(op.op)}: {describe(stray)} is on {stray.device} but {where}",
            module=op.module,
            module_type=op.module_type,
            op=op.op,
            stage=stage,
            tensors=tuple(operands[:4]),
            source=source,
            # PyTorch's words only when they are about devices: an op refused for its dtypes
            # (DD100/DD101 report that) carries no device message.
            pytorch_error=op.error if op.error and classify_error(op.error, op.operands) == "device" else None,
            remedies=(Remedy("to-device", "model", moved[0].device, "model-loading", moved[1]),) if moved
            else device_remedies(trace, operands, home),
        )


def _moved_at(trace: Trace, t: TensorMeta) -> SourceLoc | None:
    """The user's line that moved `t` to the device it is on (`data.to(device)`): where the script said
    which device; for a tensor the lineage has no name for (a loss target the step made), where the
    script moved its inputs there."""
    name = input_name(t)
    chains = [trace.lineage.get(name, ())] if name else list(trace.lineage.values())
    moved = next((s.source for steps in chains for s in reversed(steps) if s.stage == "transfer" and s.device == t.device and s.source), None)
    # Made there (`torch.tensor(ids, device=device)`, nanoGPT's sample.py): the script said the device where it made it.
    return moved or next((steps[0].source for steps in chains if steps and steps[0].device == t.device and steps[0].source
                          and steps[0].detail.startswith("created by")), None)


def _moved_to_gpu(trace: Trace, strays: list[TensorMeta], home: str, homes: dict[str, str]) -> tuple[TensorMeta, SourceLoc] | None:
    """A model on the CPU meeting data the script moved to a GPU: that tensor, and the line that moved it.
    The model then moves to the data's device; moving the data to the CPU would take the job off the
    GPU the script asked for. (A device map's CPU blocks are placed there on purpose: not this.)"""
    if homes or home != "cpu":
        return None
    return next(((t, at) for t in strays if t.device not in ("cpu", "meta") and (at := _moved_at(trace, t)) is not None), None)


RULE = Rule(
    code="DD201",
    name="device-mismatch",
    severity="error",
    summary="Tensors on different devices meet in one op (inputs left on CPU, labels on another GPU, tensors created in forward without device=).",
    why=(
        "Every operand of a CUDA op must live on that GPU (0-dim CPU scalars excepted). A batch not moved "
        "with the model, or a torch.arange(...) created in forward without device=, fails at the first op "
        "that mixes them."
    ),
    example="model.cuda(); model(**batch)  # batch still on CPU\nRuntimeError: Expected all tensors to be on the same device",
    fix="Move the batch to the model's device, or create tensors with device=x.device (to-device).",
    fix_safety="to-device is safe.",
    check=check,
    rejects=mixes_devices,
    device_note="Judged for the traced device; on a CPU-only machine use --simulate --device cuda to check a CUDA target.",
)
