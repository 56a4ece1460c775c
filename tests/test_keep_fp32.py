"""keep-fp32: the smallest float32 set for a float16 model, on a T5 that really overflows.

fixtures/models/t5-overflow is a gated-GELU T5 whose last decoder FFN overflows float16 the
way T5 v1.1 checkpoints do. Every claim is checked with real forwards in plain PyTorch: the
fixture's `.half()` gives NaN, the set found makes it finite and close, and dropping any
member of the set breaks it again.
"""

from __future__ import annotations

import copy
import os
import runpy
import subprocess
from pathlib import Path

import pytest
import torch

from dtype_doctor.fix.keep_fp32 import apply_keep_fp32, minimal_fp32_set, owns_floating_parameters

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import AutoTokenizer, T5ForConditionalGeneration  # noqa: E402

FIX = Path(__file__).resolve().parent.parent / "fixtures"
OVERFLOW = FIX / "models/t5-overflow"
PAIRS = FIX / "data/t5-pairs"
FP16_MAX = 65504.0


@pytest.fixture(scope="module")
def batch() -> dict[str, torch.Tensor]:
    from datasets import load_from_disk

    rows = load_from_disk(str(PAIRS))[:2]
    tok = AutoTokenizer.from_pretrained(OVERFLOW)
    enc = tok(rows["source"], text_target=rows["target"], padding=True, return_tensors="pt")
    return dict(enc)


def load(**kw) -> torch.nn.Module:
    return T5ForConditionalGeneration.from_pretrained(OVERFLOW, **kw).eval()


@pytest.fixture(scope="module")
def fp32() -> torch.nn.Module:
    return load()


@pytest.fixture(scope="module")
def found(fp32, batch):
    return minimal_fp32_set(fp32, batch)


def logits(model: torch.nn.Module, batch) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch).logits.float()


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()


def close_to_fp32(model, batch, reference) -> bool:
    out = logits(model, batch)
    return bool(torch.isfinite(out).all()) and cosine(out, reference) >= 0.999


# ---------------------------------------------------------------- the fixture


def test_fixture_overflows_float16_and_not_float32(fp32, batch):
    peaks = {}
    wo = fp32.decoder.block[-1].layer[-1].DenseReluDense.wo
    handle = wo.register_forward_hook(lambda m, a, out: peaks.update(wo=out.abs().max().item()))
    try:
        reference = logits(fp32, batch)
    finally:
        handle.remove()
    assert torch.isfinite(reference).all()
    assert peaks["wo"] > FP16_MAX  # ~2.1e5 in float32
    # Plain conversion of everything: NaN.
    assert not torch.isfinite(logits(copy.deepcopy(fp32).half(), batch)).all()
    # from_pretrained(dtype=float16) keeps the declared `wo` float32, and that is not enough.
    loaded = load(dtype=torch.float16)
    assert loaded.decoder.block[-1].layer[-1].DenseReluDense.wo.weight.dtype == torch.float32
    assert loaded.decoder.block[-1].layer[-1].DenseReluDense.wi_0.weight.dtype == torch.float16
    assert not torch.isfinite(logits(loaded, batch)).all()


# ---------------------------------------------------------------- apply_keep_fp32


def test_hooks_let_a_kept_module_sit_between_half_ones():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    x = torch.randn(3, 4)
    half_only = copy.deepcopy(net).half()
    half_only[2].float()
    with pytest.raises(RuntimeError):  # what the hooks are for
        half_only(x.half())
    apply_keep_fp32(net, ["2"])
    assert [net[i].weight.dtype for i in (0, 2, 3)] == [torch.float16, torch.float32, torch.float16]
    seen = {}
    net[2].register_forward_hook(lambda m, a, out: seen.update(kept=(a[0].dtype, out.dtype)))
    out = net(x)  # fp32 input into an fp16 first layer: cast on entry too
    assert seen["kept"] == (torch.float32, torch.float32) and out.dtype == torch.float16
    assert net._keep_in_fp32_modules_strict == ["2"]
    with pytest.raises(ValueError, match="no module named 'nope'"):
        apply_keep_fp32(copy.deepcopy(net), ["nope"])


class Tied(torch.nn.Module):
    """Tied embedding and head, a persistent and a computed buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.mid = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.ones(4))
        self.register_buffer("inv_freq", torch.ones(4), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.mid(self.emb(ids)) * self.scale)


@pytest.mark.parametrize("kept", [["head"], ["mid"], []])
def test_the_written_keep_fp32_does_what_apply_keep_fp32_does(kept):
    from dtype_doctor.fix.codemods import NewFixModule

    if not kept:
        assert NewFixModule("keep-fp32", {"modules": []}).apply("", "f.py").status == "skipped"
        return
    source = NewFixModule("keep-fp32", {"dtype": "float16", "modules": kept}).apply("", "f.py").new_source
    written: dict = {}
    exec(compile(source, "dtype_doctor_fix.py", "exec"), written)
    ids = torch.tensor([[1, 2, 3]])
    ours, theirs = apply_keep_fp32(Tied(), kept), written["keep_fp32"](Tied())
    state = lambda m: {n: t.dtype for n, t in [*m.named_parameters(), *m.named_buffers()]}  # noqa: E731
    assert state(ours) == state(theirs)
    assert state(ours)["inv_freq"] == torch.float32  # computed at init: never converted
    # A tied weight stays float32 when either side keeps it.
    assert state(ours)["emb.weight"] == (torch.float32 if kept == ["head"] else torch.float16)
    assert ours._keep_in_fp32_modules_strict == theirs._keep_in_fp32_modules_strict == kept
    # The head computes in its own dtype: float32 when kept, else float16 after the kept `mid`.
    expected = torch.float32 if kept == ["head"] else torch.float16
    assert ours(ids).dtype == theirs(ids).dtype == expected


def test_apply_keep_fp32_makes_the_fixture_finite_and_close(fp32, batch, found):
    reference = logits(fp32, batch)
    model = apply_keep_fp32(copy.deepcopy(fp32), found.modules)
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    kept = {n for n in dtypes if any(n.startswith(m + ".") for m in found.modules) or ".wo." in n}
    assert {dtypes[n] for n in kept} == {torch.float32}
    assert {d for n, d in dtypes.items() if n not in kept} == {torch.float16}
    out = logits(model, batch)
    assert torch.isfinite(out).all() and cosine(out, reference) > 0.999


# ---------------------------------------------------------------- minimal_fp32_set


def test_minimal_set_is_verified_small_and_one_minimal(fp32, batch, found):
    reference = logits(fp32, batch)
    candidates = [n for n, m in fp32.named_modules() if owns_floating_parameters(m)]
    assert found.needed and found.verified, found.reason
    assert 0 < len(found.modules) < len(candidates)
    assert found.cosine >= 0.999 and found.max_abs_diff < 1.0
    assert found.checks < 20, found  # a bisection, not a sweep
    # 1-minimal, with real forwards: without any one member, the fp16 model breaks again.
    for member in found.modules:
        rest = [m for m in found.modules if m != member]
        assert not close_to_fp32(apply_keep_fp32(copy.deepcopy(fp32), rest), batch, reference), member
    assert "decoder.final_layer_norm" in found.modules  # fed the fp32 residual stream of ~2e5


def test_minimal_set_leaves_the_model_as_it_was(fp32, batch, found):
    assert {p.dtype for p in fp32.parameters()} == {torch.float32}
    assert not any(m._forward_pre_hooks for m in fp32.modules())
    assert not getattr(fp32, "_keep_in_fp32_modules_strict", None)


def test_no_set_needed_when_plain_conversion_is_fine(batch):
    tiny = T5ForConditionalGeneration.from_pretrained(FIX / "models/t5-tiny").eval()
    result = minimal_fp32_set(tiny, batch)
    assert result.modules == () and not result.needed and result.verified
    assert result.checks == 2  # the reference and the plain conversion


def test_candidates_restrict_the_search(fp32, batch):
    result = minimal_fp32_set(fp32, batch, candidates=["decoder.final_layer_norm", "lm_head"])
    assert not result.verified and result.needed  # the FFN is not among them
    assert "keeping all 2 candidate modules" in result.reason


# ---------------------------------------------------------------- the strategy


def test_fix_model_keep_fp32_on_an_fp32_model_converts_and_verifies(fp32, batch, found):
    from dtype_doctor.fix.engine import fix_model

    result = fix_model(fp32, batch, strategy="keep-fp32", device="cpu", measure=False)
    assert result.verified, result.detail
    (step,) = result.applied
    assert step.strategy == "keep-fp32"
    model_change, *kept = step.changes
    assert (model_change.target, model_change.before, model_change.to) == ("model", "float32", "float16")
    assert tuple(c.target for c in kept) == found.modules and {c.to for c in kept} == {"float32"}
    fixed = result.pipeline.model
    assert fixed is not fp32 and {p.dtype for p in fp32.parameters()} == {torch.float32}
    assert close_to_fp32(fixed, batch, logits(fp32, batch))


def test_auto_on_the_fp16_model_keeps_the_set_its_findings_ask_for(fp32, batch, found):
    from dtype_doctor.fix.engine import fix_model

    half = load(dtype=torch.float16)
    result = fix_model(half, batch, strategy="auto", device="cpu", measure=False)
    asking = [f for f in result.before.at_or_above("error") if any(r.strategy == "keep-fp32" for r in f.remedies)]
    assert asking, [f.code for f in result.before.findings]  # the rules' remedies are what triggers it
    assert result.verified, result.detail
    assert [s.strategy for s in result.applied] == ["keep-fp32"]
    model_change, *kept = result.applied[0].changes
    assert (model_change.before, model_change.to) == ("float16", "float16")
    assert tuple(c.target for c in kept) == found.modules
    assert close_to_fp32(result.pipeline.model, batch, logits(fp32, batch))


def test_auto_does_not_convert_an_fp32_model(fp32, batch):
    from dtype_doctor.fix.engine import fix_model

    result = fix_model(fp32, batch, strategy="auto", device="cpu", measure=False)
    assert not any(s.strategy == "keep-fp32" and s.status == "applied" for s in result.steps)
    assert result.pipeline.model is fp32


# ---------------------------------------------------------------- the patch, through the CLI


def test_cli_writes_a_fix_module_that_runs_without_dtype_doctor(tmp_path, monkeypatch, capsys, fp32, batch, found):
    import json

    from dtype_doctor.cli.main import run

    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    monkeypatch.chdir(tmp_path)
    argv = ["fix", str(OVERFLOW), str(PAIRS), "--strategy", "keep-fp32", "--write-patch", "fix.patch", "--format", "json"]
    with pytest.raises(SystemExit) as exit_info:
        run(argv)
    fix = json.loads(capsys.readouterr().out)["fix"]
    assert exit_info.value.code == 0 and fix["verified"], fix["detail"]
    assert fix["patch"]["files"] == ["dtype_doctor_fix.py"]
    assert fix["parity"]["cosine"] >= 0.999
    subprocess.run(["git", "apply", "--check", "fix.patch"], cwd=tmp_path, check=True)
    subprocess.run(["git", "apply", "fix.patch"], cwd=tmp_path, check=True)
    source = (tmp_path / "dtype_doctor_fix.py").read_text()
    assert "dtype_doctor" not in source.replace("dtype_doctor_fix", "").replace("dtype-doctor", "")
    module = runpy.run_path(str(tmp_path / "dtype_doctor_fix.py"))
    assert module["KEEP_FP32"] == found.modules
    # A fresh model with the written fix: finite, close, and exactly what apply_keep_fp32 gives.
    fixed = module["keep_fp32"](load())
    ours = apply_keep_fp32(copy.deepcopy(fp32), found.modules)
    assert {n: p.dtype for n, p in fixed.named_parameters()} == {n: p.dtype for n, p in ours.named_parameters()}
    assert torch.equal(logits(fixed, batch), logits(ours, batch))
    assert close_to_fp32(fixed, batch, logits(fp32, batch))
