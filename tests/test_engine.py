"""The engine's promises: diagnose() leaves the model as it was, train=True traces a backward,
watch() traces the user's own code, select/ignore filter by code or prefix, and the JSON
report has SPEC.md's keys."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dtype_doctor
from dtype_doctor.records.errors import UsageError
from helpers_models import FIXTURE_MODELS, assert_same, codes, found, load_fixture, snapshot, token_batch


class Net(nn.Module):
    """Linear → BatchNorm → Linear with an optional loss; `half_head` plants a DD101 + DD102."""

    def __init__(self, half_head: bool = False):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU())
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(8, 3)
        if half_head:
            self.head.half()

    def forward(self, x, labels=None):
        logits = self.head(self.drop(self.body(x)))
        if labels is None:
            return logits
        return {"loss": F.cross_entropy(logits.float(), labels), "logits": logits}


def batch(n: int = 8):
    gen = torch.Generator().manual_seed(1)
    return {"x": torch.randn(n, 6, generator=gen), "labels": torch.randint(0, 3, (n,), generator=gen)}


def used_model(half_head: bool = False) -> Net:
    """A model in the middle of training: some grads set, some frozen, mixed train/eval flags."""
    torch.manual_seed(0)
    model = Net(half_head)
    model.train()
    model.body(torch.randn(16, 6))  # move the BatchNorm running stats off their init values
    model.body[0].weight.grad = torch.full_like(model.body[0].weight, 0.25)
    model.body[0].bias.requires_grad_(False)
    model.drop.eval()
    return model


# ------------------------------------------------------------------ model untouched


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"train": True},
        {"train": True, "autocast": "bfloat16"},
        {"simulate": True, "device": "cpu"},
        {"simulate": True, "device": "cuda", "train": True},
        {"device": "cpu"},
    ],
    ids=["eval", "train", "train-autocast", "simulate", "simulate-cuda-train", "device-cpu"],
)
@pytest.mark.parametrize("half_head", [False, True], ids=["clean", "mismatched"])
def test_diagnose_leaves_the_model_as_it_was(kwargs, half_head):
    model = used_model(half_head)
    before = snapshot(model)
    report = dtype_doctor.diagnose(model, batch(), **kwargs)
    assert_same(before, snapshot(model))
    assert any(op.module == "head" for op in report.trace.ops)  # the trace did run through the model
    # autocast casts per op, so the fp16 head is only a mismatch without it
    assert ("DD101" in codes(report)) == (half_head and "autocast" not in kwargs)


def test_batchnorm_running_stats_survive_a_training_trace():
    model = used_model()
    stats = {k: v.clone() for k, v in model.body[1].state_dict().items()}
    # A plain training forward does move them ...
    probe = used_model()
    probe(**batch())
    assert not torch.equal(probe.body[1].running_mean, stats["running_mean"])
    # ... a training trace does not.
    report = dtype_doctor.diagnose(model, batch(), train=True)
    assert report.trace.train
    for k, v in model.body[1].state_dict().items():
        assert torch.equal(v, stats[k]), k


def test_failed_trace_leaves_the_model_as_it_was():
    class Broken(Net):
        def forward(self, x, labels=None):
            h = self.body(x)
            return self.head(h[:, :5])  # shape error after the BatchNorm ran

    model = Broken()
    model.train()
    before = snapshot(model)
    report = dtype_doctor.diagnose(model, batch(), train=True)
    assert found(report, "DD001")
    assert_same(before, snapshot(model))


def test_hf_model_with_pre_existing_grads():
    model = load_fixture("bert-tiny")
    model.classifier.weight.grad = torch.ones_like(model.classifier.weight)
    model.bert.embeddings.requires_grad_(False)
    before = snapshot(model)
    inputs = {**token_batch(), "labels": torch.tensor([0, 1])}
    report = dtype_doctor.diagnose(model, inputs, train=True)
    assert report.findings == ()
    assert any(op.phase == "backward" for op in report.trace.ops)
    assert_same(before, snapshot(model))


def test_buffer_updated_in_forward_is_restored():
    class Counts(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x):
            self.calls += 1
            return self.lin(x)

    model = Counts()
    dtype_doctor.diagnose(model, {"x": torch.randn(1, 2)})
    assert model.calls.item() == 0


# ---------------------------------------------------------------------- train=True


def test_train_records_the_backward_pass():
    report = dtype_doctor.diagnose(used_model(), batch(), train=True)
    phases = [op.phase for op in report.trace.ops]
    assert "forward" in phases and "backward" in phases
    first_backward = phases.index("backward")
    assert all(p == "backward" for p in phases[first_backward:])  # backward after forward
    backward_ops = {op.op for op in report.trace.ops if op.phase == "backward"}
    assert any("nll_loss_backward" in op for op in backward_ops)  # from the output's .loss
    assert any(op.startswith("aten.mm") for op in backward_ops)  # the Linear layers' gradients
    assert report.target.train and report.to_dict()["target"]["train"] is True


def test_train_without_a_loss_backpropagates_the_output():
    x = batch()["x"]
    report = dtype_doctor.diagnose(used_model(), {"x": x}, train=True)
    assert any(op.phase == "backward" for op in report.trace.ops)


def test_eval_trace_has_no_backward():
    report = dtype_doctor.diagnose(used_model(), batch())
    assert {op.phase for op in report.trace.ops} == {"forward"}
    assert not report.trace.train


# --------------------------------------------------------------------------- watch


def test_watch_records_forward_and_backward():
    model = Net()
    with dtype_doctor.watch(model) as w:
        out = model(**batch())
        out["loss"].backward()
    assert w.report is not None
    assert {op.phase for op in w.report.trace.ops} == {"forward", "backward"}
    assert {m.name for m in w.report.trace.modules} >= {"body.0", "body.1", "head"}
    assert w.report.findings == ()
    assert model.head.weight.grad is not None  # the user's backward really ran


def test_watch_lets_the_users_error_propagate_and_still_reports():
    model = Net(half_head=True)
    with pytest.raises(RuntimeError, match="must have the same dtype") as raised:
        with dtype_doctor.watch(model) as w:
            model(**batch())
    assert w.report is not None
    mismatch = found(w.report, "DD101")
    assert [f.module for f in mismatch] == ["head"]
    assert mismatch[0].pytorch_error == str(raised.value).splitlines()[0]
    assert w.report.trace.failure is not None and w.report.trace.failure.module == "head"


def test_watch_lets_a_non_torch_error_propagate():
    model = Net()

    class Stop(Exception):
        pass

    with pytest.raises(Stop):
        with dtype_doctor.watch(model) as w:
            model(**batch())
            raise Stop
    assert w.report is not None
    assert any(op.phase == "forward" for op in w.report.trace.ops)


def test_watch_detaches_its_hooks():
    model = Net()
    with dtype_doctor.watch(model):
        model(**batch())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


# ------------------------------------------------------------------ select / ignore


@pytest.fixture(scope="module")
def mixed_report_inputs():
    return batch()


@pytest.mark.parametrize(
    "select,ignore,expected",
    [
        (None, None, {"DD101", "DD102"}),
        ("DD101", None, {"DD101"}),
        (["DD102"], None, {"DD102"}),
        ("DD1", None, {"DD101", "DD102"}),
        ("dd10", None, {"DD101", "DD102"}),
        ("DD2", None, set()),
        (None, "DD101", {"DD102"}),
        (None, "DD1", set()),
        ("DD1", "DD102", {"DD101"}),
        ("DD101,DD102", "", {"DD101", "DD102"}),
    ],
)
def test_select_and_ignore(mixed_report_inputs, select, ignore, expected):
    report = dtype_doctor.diagnose(Net(half_head=True), mixed_report_inputs, select=select, ignore=ignore)
    assert codes(report) == expected


@pytest.mark.parametrize("kwargs", [{"select": "DD999"}, {"ignore": "DD9"}, {"select": ["DD101", "XX1"]}])
def test_unknown_code_is_a_usage_error(kwargs):
    with pytest.raises(UsageError, match="unknown rule"):
        dtype_doctor.diagnose(Net(), batch(), **kwargs)


def test_unknown_autocast_is_a_usage_error():
    with pytest.raises(UsageError, match="autocast"):
        dtype_doctor.diagnose(Net(), batch(), autocast="float8")


# ------------------------------------------------------------------------ the JSON

TOP = {"schema_version", "tool", "target", "environment", "findings", "lineage", "summary"}
TARGET = {"model", "dataset", "split", "device", "simulated", "model_dtype", "autocast", "train", "gpu"}
ENVIRONMENT = {"python", "torch", "transformers", "datasets", "cuda_available"}
FINDING = {"code", "name", "severity", "message", "module", "module_type", "op", "stage", "tensors", "source", "fixes"}
TENSOR = {"role", "name", "dtype", "device", "shape"}
SUMMARY = {"error", "warning", "info", "modules_traced", "ops_traced"}
STAGES = {"dataset", "preprocess", "processor", "formatter", "collator", "transfer", "model-loading", "model-code", "loss", "optimizer"}


def test_json_report_has_the_spec_keys():
    report = dtype_doctor.diagnose(Net(half_head=True), batch())
    d = json.loads(json.dumps(report.to_dict()))  # serialisable as it is
    assert TOP <= d.keys()
    assert d["schema_version"] == 1
    assert d["tool"] == {"name": "dtype-doctor", "version": dtype_doctor.__version__}
    assert d["target"].keys() == TARGET
    assert d["target"]["device"] == "cpu" and d["target"]["simulated"] is False
    assert d["target"]["model_dtype"] == "float32" and d["target"]["autocast"] is None
    assert ENVIRONMENT <= d["environment"].keys()
    assert d["environment"]["torch"] == torch.__version__
    assert d["findings"], "the mismatched head must produce findings"
    for f in d["findings"]:
        assert FINDING <= f.keys()
        assert f["severity"] in ("error", "warning", "info") and f["stage"] in STAGES
        assert f["code"].startswith("DD") and f["name"]
        for t in f["tensors"]:
            assert t.keys() == TENSOR and isinstance(t["shape"], list)
        for fx in f["fixes"]:
            assert fx.keys() == {"strategy", "applicability", "description"}
            assert fx["strategy"] in {"cast-inputs", "half-model", "autocast", "to-device", "fp32-trainable"}
    assert d["summary"].keys() == SUMMARY
    assert d["summary"]["error"] == sum(f["severity"] == "error" for f in d["findings"])
    assert d["summary"]["warning"] == sum(f["severity"] == "warning" for f in d["findings"])
    assert d["summary"]["ops_traced"] == len(report.trace.ops) > 0
    assert d["summary"]["modules_traced"] == len({m.name for m in report.trace.modules}) > 0
    # errors first
    severities = [f["severity"] for f in d["findings"]]
    assert severities == sorted(severities, key=("error", "warning", "info").index)


def test_json_report_of_a_failed_trace():
    report = dtype_doctor.diagnose(Net(), {"x": torch.randn(2, 5)})  # 5 features, needs 6
    d = report.to_dict()
    assert d["trace_failure"]["kind"] == "other" and d["trace_failure"]["module"] == "body.0"
    assert [f["code"] for f in d["findings"]] == ["DD001"]


def test_simulated_target_in_json():
    d = dtype_doctor.diagnose(Net(), batch(), simulate=True, device="cuda").to_dict()
    assert d["target"]["simulated"] is True and d["target"]["device"] == "cuda:0"


def test_batch_encoding_inputs():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(FIXTURE_MODELS / "bert-tiny")
    enc = tok(["a good film", "bad"], padding=True, return_tensors="pt")
    assert type(enc).__name__ == "BatchEncoding"
    report = dtype_doctor.diagnose(load_fixture("bert-tiny"), enc)
    assert report.findings == ()
    assert {t.name for t in report.trace.inputs} >= {"input_ids", "attention_mask"}


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.head.weight.data[0, 0].mul_(-1.0 if m.head.weight[0, 0] != 0 else 1.0).add_(1e-7),
        lambda m: m.body[1].running_var.add_(1.0),
        lambda m: setattr(m.body[0].weight, "grad", torch.zeros_like(m.body[0].weight)),
        lambda m: setattr(m.head.weight, "grad", torch.zeros_like(m.head.weight)),
        lambda m: m.body[0].bias.requires_grad_(True),
        lambda m: m.drop.train(),
        lambda m: m.head.half(),
    ],
    ids=["param-value", "buffer", "grad-replaced", "grad-added", "requires-grad", "training-flag", "dtype"],
)
def test_snapshot_notices_each_kind_of_change(change):
    """The check above can fail: every promise it covers is noticed when broken."""
    model = used_model()
    before = snapshot(model)
    change(model)
    with pytest.raises(AssertionError):
        assert_same(before, snapshot(model))


@pytest.mark.slow
def test_minilm_training_trace_leaves_it_as_it_was():
    from helpers_models import load_minilm

    model, enc = load_minilm()
    model.encoder.layer[0].requires_grad_(False)
    model.pooler.dense.weight.grad = torch.full_like(model.pooler.dense.weight, 0.5)
    before = snapshot(model)
    report = dtype_doctor.diagnose(model, enc, train=True)
    assert report.findings == ()
    assert sum(op.phase == "backward" for op in report.trace.ops) > 50
    assert_same(before, snapshot(model))
