"""trace/meta_outputs.py: an op on data-less tensors makes, from the table, what PyTorch makes; only fresh
outputs are taken from it, and a simulated trace records the same ops with it as without it."""

from __future__ import annotations

import gc

import pytest
import torch

from dtype_doctor.trace.meta_outputs import MetaOutputs
from dtype_doctor.trace.session import TraceSession

aten = torch.ops.aten


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def _like(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype, a.shape, a.stride(), a.device, a.storage_offset()) == (b.dtype, b.shape, b.stride(), b.device, b.storage_offset())


@pytest.mark.parametrize(
    ("func", "args", "kwargs"),
    [
        (aten.mul.Tensor, (_meta(2, 3), _meta(3, dtype=torch.float16)), {}),
        (aten.add.Tensor, (_meta(2, 3, dtype=torch.bfloat16), 1.5), {}),
        (aten.cat.default, ([_meta(1, 4, 8), _meta(1, 2, 8)], 1), {}),
        (aten.mean.dim, (_meta(2, 3, 5), [-1], True), {}),
        (aten._to_copy.default, (_meta(4, 6).t(),), {"dtype": torch.float16}),  # keeps the operand's strides
        (aten.max.dim, (_meta(4, 6), 1), {}),  # two outputs
        (aten.mm.default, (_meta(4, 6), _meta(6, 2)), {}),
        (aten.mul.Tensor, (torch.nn.Parameter(_meta(3)), _meta(1, 1, 3)), {}),  # a norm's weight: a Parameter operand
    ],
)
def test_outputs_from_the_table_are_pytorchs(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> None:
    table = MetaOutputs()
    first = table.run(func, args, kwargs)
    again = table.run(func, args, kwargs)
    assert table.hits == 1 and table.misses == 1
    plain = func(*args, **kwargs)
    if isinstance(plain, tuple):
        assert type(again) is type(plain) and len(again) == len(plain)
        assert all(_like(a, p) for a, p in zip(again, plain))
    else:
        assert _like(again, plain) and _like(first, plain)
        assert again is not first  # a fresh tensor each call, as PyTorch makes


def test_a_call_that_reads_the_default_dtype_follows_it() -> None:
    table = MetaOutputs()
    calls = [(aten.arange.default, (4.0,), {"device": torch.device("meta")}),  # a factory: no operand
             (aten.add.Tensor, (_meta(3, dtype=torch.int64), 1.5), {})]  # an int tensor and a Python float
    before = torch.get_default_dtype()
    try:
        for dtype in (torch.float32, torch.float64, torch.float32):
            torch.set_default_dtype(dtype)
            for func, args, kwargs in calls:
                assert table.run(func, args, kwargs).dtype == func(*args, **kwargs).dtype == dtype
    finally:
        torch.set_default_dtype(before)
    assert table.hits == 2 and table.misses == 4  # each call kept per default dtype, and taken from the table again


def test_views_inplace_and_other_devices_always_run() -> None:
    table = MetaOutputs()
    x = _meta(2, 3)
    for _ in range(2):
        view = table.run(aten.transpose.int, (x, 0, 1), {})
        assert view._base is x  # a view of its operand, never a fresh tensor
        assert table.run(aten.add_.Tensor, (x, x), {}) is x  # written in place: the operand itself
        cpu = torch.zeros(2, 3)
        assert torch.equal(table.run(aten.add.Tensor, (cpu, 1.0), {}), torch.ones(2, 3))  # values: PyTorch's own
    assert table.hits == 0 and table.misses == 0


def test_a_call_that_raised_is_not_kept() -> None:
    a, b = _meta(4, 6), _meta(5, 2)
    with pytest.raises(RuntimeError):
        aten.mm.default(a, b)  # PyTorch refuses the shapes on meta tensors too
    table = MetaOutputs()
    for _ in range(2):
        with pytest.raises(RuntimeError):
            table.run(aten.mm.default, (a, b), {})
    assert table.hits == 0


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 8).half()  # a float16 layer fed float32: refused on CUDA

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):  # the same calls again, as a decode loop makes them
            x = x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        return x


def _simulated_ops(table: bool) -> list[tuple]:
    model = _Block().to("meta")
    session = TraceSession(model, simulated=True, probe_gpu="a100")
    if not table:
        session.recorder.meta_outputs = None
    with session.recording():
        try:
            model(_meta(2, 5, 8))
        except RuntimeError:
            pass
    ops = session.recorder.ops
    if table:
        assert session.recorder.meta_outputs.hits > 0
    return [(op.op, op.module, op.operands, op.outputs, op.error, op.recovered) for op in ops]


def test_a_simulated_trace_records_the_same_ops_with_the_table() -> None:
    with_table = _simulated_ops(True)
    assert any(op[4] for op in with_table)  # the float16 layer's refusal is found
    assert with_table == _simulated_ops(False)
    gc.collect()


def test_a_trace_session_leaves_the_collector_as_it_found_it() -> None:
    before = gc.get_threshold()
    session = TraceSession(torch.nn.Linear(2, 2))
    with session.recording():
        assert gc.get_freeze_count() > 0  # no full pass over the records while the step runs (trace/heap.py)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
