"""What benchmarks/sweep_whole_step.py found besides the saved statistics (test_saved_for_backward.py),
each shown in plain PyTorch (or plain transformers) first, then mended.

- diagnose() left transformers' output-capturing hooks on the model: the next call installed them
  again and collected every hidden state twice (segformer's decode head then met the wrong one).
"""

from __future__ import annotations

import pytest
import torch

import dtype_doctor


def errors(report) -> list[str]:  # noqa: ANN001
    return sorted({f.code for f in report.findings if f.severity == "error"})


def tiny_bert():  # noqa: ANN201
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, vocab_size=50,
                        max_position_embeddings=16)
    return BertModel(config).eval()


@pytest.mark.parametrize("simulate", [False, True], ids=["real", "simulated"])
def test_diagnose_leaves_no_hooks_behind(simulate: bool) -> None:
    model = tiny_bert()
    ids = {"input_ids": torch.randint(0, 50, (1, 6))}
    hooks = {name: len(m._forward_hooks) for name, m in model.named_modules()}
    dtype_doctor.diagnose(model, ids, simulate=simulate, device="cuda" if simulate else None)
    assert {name: len(m._forward_hooks) for name, m in model.named_modules()} == hooks
    # transformers installs its hooks on the model's first call: once, so each hidden state once.
    assert len(model(**ids, output_hidden_states=True).hidden_states) == 3
    assert len(model(**ids, output_hidden_states=True).hidden_states) == 3
