"""Simulated scans share the work of identical layers (trace/layer_share.py, docs/report.md
`coverage.shared_layers`): the trace with sharing is the trace without it, and a layer that
differs is traced."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import dtype_doctor

transformers = pytest.importorskip("transformers")


def _llama(layers: int = 4) -> torch.nn.Module:
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()


def _gemma2(layers: int = 4) -> torch.nn.Module:
    config = transformers.Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                                       sliding_window=4)
    torch.manual_seed(0)
    return transformers.Gemma2ForCausalLM(config).to(torch.bfloat16).eval()


def _ids() -> dict[str, torch.Tensor]:
    return {"input_ids": torch.arange(16).reshape(2, 8) % 64}


def _both(model: torch.nn.Module) -> tuple[object, object]:
    shared = dtype_doctor.diagnose(model, _ids(), simulate=True, device="cuda", gpu="a100")
    whole = dtype_doctor.diagnose(model, _ids(), simulate=True, device="cuda", gpu="a100", share_layers=False)
    return shared, whole


def _found(report: object) -> set[tuple[str, str | None]]:
    return {(f.code, f.module) for f in report.findings}  # type: ignore[attr-defined]


def _shared(report: object) -> dict[str, str]:
    return {d["layer"]: d["same_as"] for d in report.to_dict()["coverage"].get("shared_layers", [])}  # type: ignore[attr-defined]


def test_identical_layers_are_shared_and_the_trace_is_the_one_without_sharing() -> None:
    shared, whole = _both(_llama())
    assert _shared(shared) == {f"model.layers.{i}": "model.layers.0" for i in (1, 2, 3)}
    assert _shared(whole) == {}
    assert shared.trace.ops == whole.trace.ops and shared.trace.modules == whole.trace.modules
    assert _found(shared) == _found(whole)


def test_a_middle_layer_in_half_precision_is_traced_and_found() -> None:
    model = _llama()
    model.model.layers[2].half()
    hidden = torch.ones(1, 32, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError):  # what the layer's first projection does on a real device
        torch.nn.functional.linear(hidden, model.model.layers[2].self_attn.q_proj.weight)
    shared, whole = _both(model)
    assert "model.layers.2" not in _shared(shared)
    assert any(m and m.startswith("model.layers.2.") for _, m in _found(shared)), _found(shared)
    assert _found(shared) == _found(whole)
    assert [op for op in shared.trace.ops if op.error] == [op for op in whole.trace.ops if op.error]


def test_alternating_sliding_window_layers_are_shared_only_within_their_type() -> None:
    model = _gemma2()
    types = model.config.layer_types
    assert len(set(types)) == 2  # sliding and full attention alternate
    shared, whole = _both(model)
    pairs = _shared(shared)
    assert pairs, "the layers of one type are identical: shared"
    for layer, same_as in pairs.items():
        assert types[int(layer.rsplit(".", 1)[1])] == types[int(same_as.rsplit(".", 1)[1])], (layer, same_as)
    assert shared.trace.ops == whole.trace.ops and _found(shared) == _found(whole)


class _Block(torch.nn.Module):
    def __init__(self, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return y.to(torch.float16) if self.layer_idx == 2 else y  # decided by its index: not the same call


class _Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_Block(i) for i in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_layer_whose_forward_reads_its_index_is_never_shared() -> None:
    model = _Stack()
    x = {"x": torch.ones(2, 8)}
    with pytest.raises(RuntimeError):  # layer 3's matmul on layer 2's half output, as PyTorch refuses it
        model(**x)
    shared = dtype_doctor.diagnose(model, x, simulate=True, device="cuda", gpu="a100")
    whole = dtype_doctor.diagnose(model, x, simulate=True, device="cuda", gpu="a100", share_layers=False)
    assert _shared(shared) == {}
    assert shared.trace.ops == whole.trace.ops
    assert any(m == "layers.3.lin" for _, m in _found(shared)), _found(shared)


def test_the_cli_says_which_layers_it_shared_and_no_share_layers_traces_them_all(capsys: pytest.CaptureFixture[str],
                                                                                   tmp_path: Path) -> None:
    import json
    import shutil

    from dtype_doctor.cli.main import run

    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    data = tmp_path / "text-cls"  # a copy: datasets.map writes its cache files beside the data
    shutil.copytree(fixtures / "data" / "text-cls", data, ignore=shutil.ignore_patterns("cache-*"))
    coverage = {}
    for flag in ("--share-layers", "--no-share-layers"):
        capsys.readouterr()
        with pytest.raises(SystemExit):
            run(["scan", str(fixtures / "models" / "llama-tiny"), str(data), "--simulate",
                 "--dtype", "bfloat16", "-f", "json", flag])
        coverage[flag] = json.loads(capsys.readouterr().out)["coverage"]
    assert coverage["--share-layers"]["shared_layers"] == [{"layer": "model.layers.1", "same_as": "model.layers.0"}]
    assert "shared_layers" not in coverage["--no-share-layers"]
    assert coverage["--share-layers"]["ops"] == coverage["--no-share-layers"]["ops"]


class _Counted(torch.nn.Module):
    """Identical layers whose forward reads what no signature sees (a class attribute naming one of them):
    that one reshapes its input to a size it does not have, which fake tensors refuse as real ones do."""

    odd: torch.nn.Module | None = None

    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(8, 8, dtype=torch.bfloat16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if _Counted.odd is self:
                return x.reshape(3, 7)
            return self.proj(x)

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(self.Layer() for _ in range(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_shared_layer_that_raises_stops_the_step_and_copies_nothing() -> None:
    x = torch.ones(2, 8, dtype=torch.bfloat16)
    model = _Counted()
    _Counted.odd = model.layers[3]
    try:
        with pytest.raises(RuntimeError):
            model(x)  # what the step does on a real device
        report = dtype_doctor.diagnose(model, {"x": x}, simulate=True, device="cuda", gpu="a100")
    finally:
        _Counted.odd = None
    shared = _shared(report)
    assert "layers.3" not in shared and "layers.4" not in shared, shared  # layers.3 raised, layers.4 never ran
    assert shared.get("layers.2") == "layers.1", shared
    assert report.trace.failure is not None and report.trace.failure.module == "layers.3", report.trace.failure
    assert not any(op.module.startswith(("layers.3", "layers.4")) for op in report.trace.ops)
    assert report.findings, "a step that fails is never a clean report"
