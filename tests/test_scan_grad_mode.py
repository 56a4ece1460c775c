"""A simulated scan without --train traces an inference forward, without gradients (pipeline.py);
with --train the forward and backward run with them; a real scan keeps the caller's grad mode."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from dtype_doctor.pipeline import ScanOptions, scan

pytest.importorskip("transformers")
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _grad_modes(tmp_path: Path, **options: object) -> set[bool]:
    """torch.is_grad_enabled() at every module call of a scan of llama-tiny."""
    data = tmp_path / "text-cls"  # a copy: datasets.map writes its cache files beside the data
    if not data.exists():
        shutil.copytree(FIXTURES / "data" / "text-cls", data, ignore=shutil.ignore_patterns("cache-*"))
    seen: set[bool] = set()
    hook = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: seen.add(torch.is_grad_enabled()))
    try:
        report = scan(str(FIXTURES / "models" / "llama-tiny"), str(data), ScanOptions(batch_size=2, **options))  # type: ignore[arg-type]
    finally:
        hook.remove()
    assert report.trace is not None and report.trace.ops
    return seen


def test_a_simulated_forward_runs_without_gradients_and_a_training_step_with_them(tmp_path: Path) -> None:
    assert torch.is_grad_enabled()
    assert _grad_modes(tmp_path, simulate=True, dtype="bfloat16") == {False}
    assert _grad_modes(tmp_path, simulate=True, dtype="bfloat16", train=True) == {True}
    assert torch.is_grad_enabled()  # the caller's mode is back


def test_a_real_scan_keeps_the_callers_grad_mode(tmp_path: Path) -> None:
    assert _grad_modes(tmp_path) == {True}
    with torch.no_grad():
        assert _grad_modes(tmp_path) == {False}
