"""The trace-cost mechanisms (issue 17) keep their meaning: identity lookups that forget dead
tensors, and the statistics table that NumPy computes on the CPU equal to torch's."""

from __future__ import annotations

import gc
import math

import torch

from dtype_doctor.trace.values import ValueProbe, _table
from dtype_doctor.trace.weakid import WeakIdMap


def test_weak_id_map_is_by_identity_and_forgets_dead_tensors() -> None:
    m: WeakIdMap[str] = WeakIdMap()
    a, b = torch.zeros(3), torch.zeros(3)  # equal values, different tensors
    m[a] = "a"
    assert m.get(a) == "a" and a in m
    assert m.get(b) is None and b not in m
    m[a] = "again"
    assert m.get(a) == "again" and len(m) == 1
    del a
    gc.collect()
    assert len(m) == 0  # the dead tensor's entry is gone, so a new tensor reusing its id finds nothing
    assert m.pop(b, "none") == "none"


def _table_rows(values: list[torch.Tensor], xp: object) -> list[list[float]]:
    """Each tensor's row of the statistics table, computed by `xp` (numpy, or torch as on a GPU)."""
    import numpy

    probe = ValueProbe()
    handles = [probe.observe(v) for v in values]
    samples = [probe.sample(h) for h in handles]
    wide = any(s.dtype == torch.float64 for s in samples)
    padded = torch.nn.utils.rnn.pad_sequence([s.double() if wide else s for s in samples], batch_first=True)
    if xp is torch:
        table = torch.stack([c.double() for c in _table(padded, torch)], dim=1).tolist()
    else:
        with numpy.errstate(all="ignore"):
            table = _table(padded.numpy(), numpy)
    return table


def test_numpy_statistics_table_equals_torchs_on_edge_values() -> None:
    tiny = 2.0**-20  # below float16's smallest normal
    values = [
        torch.tensor([0.0, 1.0, -3.0, float("inf"), float("nan"), tiny, 2.0**-40, 3e38], dtype=torch.float32),
        torch.tensor([0.0, 0.0, 5.0], dtype=torch.float16),
        torch.tensor([1e-300, -2.0, 0.0], dtype=torch.float64),
        torch.randn(10_000, dtype=torch.bfloat16),
    ]
    import numpy

    by_numpy, by_torch = _table_rows(values, numpy), _table_rows(values, torch)
    for n_row, t_row in zip(by_numpy, by_torch):
        assert len(n_row) == len(t_row) == 6
        for x, y in zip(n_row, t_row):
            assert (math.isnan(x) and math.isnan(y)) or x == y
    first = by_numpy[0]  # min non-zero, non-finite, below, below scaled, non-zero, largest
    assert first[1] == 2 and first[2] == 2 and first[3] == 1 and first[4] == 6 and math.isnan(first[5])


def test_both_ways_to_the_extremes_give_torchs_answer() -> None:
    # values._Extremes picks torch.aminmax or NumPy's min/max by their recent cost; the exact
    # extremes (and so every statistic) must not depend on which one ran.
    from dtype_doctor.trace import values

    big = values._Extremes.LARGE
    cases = [torch.randn(big), torch.randn(big, dtype=torch.float64) * 1e300]
    for special in (float("nan"), float("inf"), float("-inf"), -0.0, 3e38):
        t = torch.randn(big)
        t[big // 3] = special
        cases.append(t)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the choice is only made where torch's pass is a parallel region
    try:
        for way in ("torch", "numpy"):
            probe = values._Extremes()
            probe.cost = {"torch": 0.0 if way == "torch" else 1.0, "numpy": 0.0 if way == "numpy" else 1.0}
            for t in cases:
                lo, hi = probe.of(t, True)
                want_lo, want_hi = torch.aminmax(t)
                for got, want in ((lo.item(), want_lo.item()), (hi.item(), want_hi.item())):
                    assert (math.isnan(got) and math.isnan(want)) or got == want, (way, got, want)
            assert probe.cost[way] < 1.0 and probe.cost[{"torch": "numpy", "numpy": "torch"}[way]] == 1.0  # it ran, timed
    finally:
        torch.set_num_threads(threads)


def test_constants_are_read_from_numbers_only_but_every_kind_of_number() -> None:
    # Recorder._attrs skips operand types that are never numbers before _big_number's tests; a
    # number of a NumPy type (a float subclass) beyond float16's range is still a constant DD301 reads.
    import numpy

    from dtype_doctor.trace.recorder import Recorder

    args = (torch.zeros(2), [1, 2], None, True, numpy.float64(1e10), 70000, 2.0, float("inf"), torch.float16)
    attrs = Recorder._attrs("aten.fill.Scalar", args, {"value": -1e9, "alpha": 3})
    assert attrs == (("constants", (1e10, 70000, -1e9)),)
    assert torch.full((1,), numpy.float64(1e10), dtype=torch.float16).isinf().all()  # what the rule warns of
