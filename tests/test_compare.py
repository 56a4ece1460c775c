"""`dtype_doctor.compare` and `dtype-doctor compare`: real models, real measurements.

The API on bert-tiny and the real MiniLM (slow); the CLI's JSON on every fixture model with
its dataset; the CPU peak-memory tracker on tensors of known size; verdicts and the
recommendation as pure functions of rows.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from helpers_models import assert_same, load_fixture, snapshot

import dtype_doctor
from helpers_errors import names_dtypes
from dtype_doctor.cli.main import run
from dtype_doctor.compare.records import (
    COSINE_MIN,
    DEFAULT_ROWS,
    VARIANT_NAMES,
    OutputError,
    Row,
    TrainStep,
    variant,
)
from dtype_doctor.compare.verdicts import recommend, verdict

pytestmark = pytest.mark.filterwarnings("ignore")

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "fixtures" / "models"
DATA = REPO / "fixtures" / "data"
MATMUL_CONV = ("addmm", "mm", "bmm", "baddbmm", "convolution", "linear", "scaled_dot_product")


def pytorch_fp16_unscale_error() -> str:
    """What PyTorch itself raises when a GradScaler unscales float16 gradients."""
    layer = torch.nn.Linear(2, 2).half()
    scaler = torch.amp.GradScaler("cpu")
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    scaler.scale(layer(torch.ones(1, 2, dtype=torch.float16)).float().sum()).backward()
    with pytest.raises(ValueError) as raised:
        scaler.step(optimizer)
    return f"{type(raised.value).__name__}: {raised.value}"


def floating_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()] if t.is_floating_point())


# --------------------------------------------------------------------------- API


@pytest.fixture(scope="module")
def bert():
    from transformers import AutoTokenizer

    model = load_fixture("bert-tiny")
    tok = AutoTokenizer.from_pretrained(MODELS / "bert-tiny")
    batch = tok(["the film was good", "a bad plot"], padding=True, return_tensors="pt")
    batch["labels"] = torch.tensor([0, 2])
    return model, batch


@pytest.fixture(scope="module")
def bert_table(bert):
    model, batch = bert
    before = snapshot(model)
    table = dtype_doctor.compare(model, batch, variants=["half", "autocast-bf16"], repeat=2, warmup=0)
    return table, before


def test_api_rows_fp32_reference_and_half(bert, bert_table):
    model, _ = bert
    table, _ = bert_table
    assert [r.variant.name for r in table.rows] == ["fp32", "autocast-bf16", "half"]  # table order, fp32 always
    assert table.output == "logits" and table.target.device == "cpu" and table.peak_method == "tracked tensor bytes"
    ref, half = table.row("fp32"), table.row("half")
    assert ref.output == OutputError(0.0, 0.0, 1.0, True) and ref.worst_op is None and ref.verdict == "reference"
    assert half.output.max_abs > 0 and half.output.max_rel > 0 and COSINE_MIN <= half.output.cosine < 1.0 + 1e-9
    # .half() halves every floating parameter and buffer; integer buffers (position ids) stay.
    assert ref.weight_bytes - half.weight_bytes == floating_bytes(model) // 2
    assert half.peak_bytes < ref.peak_bytes
    for row in table.rows:
        assert row.peak_bytes > row.weight_bytes and len(row.times) == 2 and row.time_s > 0


def test_api_half_training_step_is_pytorchs_own_failure(bert_table):
    table, _ = bert_table
    half = table.row("half")
    assert half.train_step.ok is False
    assert half.train_step.error == pytorch_fp16_unscale_error() == "ValueError: Attempting to unscale FP16 gradients."
    assert half.verdict == "training step fails"
    assert table.row("fp32").train_step.ok and table.row("autocast-bf16").train_step.ok
    # autocast bf16 keeps float32 weights, so float32 gradients: what CUDA does is the same.
    assert table.row("autocast-bf16").train_step.cuda_ok is True


def test_api_worst_op_is_a_real_matmul_of_the_model(bert, bert_table):
    model, _ = bert
    table, _ = bert_table
    names = {n for n, _ in model.named_modules()}
    for name in ("half", "autocast-bf16"):
        op = table.row(name).worst_op
        assert op is not None and op.op.startswith("aten.") and any(k in op.op for k in MATMUL_CONV), op
        assert op.module in names and op.rel_error > 0
        assert op.own_rel_error is not None and 0 < op.own_rel_error <= op.rel_error * 10
        assert table.row(name).ops_compared >= 8  # 2 layers × q, k, v, o, ffn in, ffn out + classifier


def test_api_leaves_the_model_as_it_was(bert, bert_table):
    model, batch = bert
    _, before = bert_table
    assert_same(before, snapshot(model))
    # --train times forward + backward on the user's own fp32 model for the autocast rows
    table = dtype_doctor.compare(model, batch, variants=["autocast-bf16"], repeat=1, warmup=0, train=True)
    assert table.measures == "forward + backward" and table.target.train
    assert_same(before, snapshot(model))


def test_api_recommendation_and_json(bert_table):
    table, _ = bert_table
    rec = table.recommendation
    assert rec.question == "autocast or .half()?"
    # .half() cannot take a GradScaler step, so it is the inference-only pick.
    assert rec.row == "autocast-bf16" and rec.inference_row == "half"
    d = json.loads(json.dumps(table.to_dict(), allow_nan=False))
    assert d["schema_version"] == 1 and d["tool"]["name"] == "dtype-doctor"
    assert {"target", "environment", "compare"} <= set(d)
    assert [r["name"] for r in d["compare"]["rows"]] == ["fp32", "autocast-bf16", "half"]


def test_dtype_doctor_compare_is_callable_as_package_and_function(bert):
    import dtype_doctor.compare.records  # noqa: F401 - sets the package attribute

    model, batch = bert
    assert callable(dtype_doctor.compare) and "compare" in dtype_doctor.__all__
    from dtype_doctor.compare import compare

    table = compare(model, batch, variants=["fp32"], repeat=1, warmup=0)
    assert [r.variant.name for r in table.rows] == ["fp32"]


def test_unknown_variant_and_repeat_are_usage_errors(bert):
    from dtype_doctor.records.errors import UsageError

    model, batch = bert
    with pytest.raises(UsageError, match="unknown variant 'fp8'"):
        dtype_doctor.compare(model, batch, variants=["fp8"])
    with pytest.raises(UsageError, match="--repeat must be at least 1"):
        dtype_doctor.compare(model, batch, repeat=0)


def test_a_failing_fp32_forward_is_an_input_error() -> None:
    from dtype_doctor.records.errors import InputError

    class Broken(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x.double())

    with pytest.raises(InputError, match=r"the fp32 forward fails.*RuntimeError") as err:
        dtype_doctor.compare(Broken(), {"x": torch.ones(2, 4)})
    assert names_dtypes(str(err.value), "float64", "float32")


@pytest.mark.slow
def test_minilm_every_row():
    from helpers_models import load_minilm

    model, batch = load_minilm()
    table = dtype_doctor.compare(model, batch, repeat=1, warmup=0)
    assert [r.variant.name for r in table.rows] == list(DEFAULT_ROWS)
    assert table.output == "last_hidden_state"
    ref = table.row("fp32")
    assert ref.output.max_abs == 0 and ref.weight_bytes > 80 * 2**20  # 22.7 M float32 parameters
    for name in ("half", "bfloat16"):
        row = table.row(name)
        assert row.output.max_abs > 0 and row.finite and row.worst_op is not None
        assert abs(row.weight_bytes * 2 - ref.weight_bytes) < 0.01 * ref.weight_bytes
    assert table.row("half").train_step.error == "ValueError: Attempting to unscale FP16 gradients."
    keep = table.row("fp16-keep-fp32")
    assert keep.fp32_modules == () and "needs no fp32 modules" in keep.note
    assert table.row("autocast-fp16").train_step.ok  # BertModel has no loss: the output's mean trains
    assert table.recommendation.row in ("autocast-fp16", "autocast-bf16")


# --------------------------------------------------------------------------- CLI, every fixture

FIXTURE_PAIRS = [
    ("bert-tiny", "text-cls"),
    ("bert-tiny-regression", "text-regression-int"),
    ("llama-tiny", "lm-text"),
    ("t5-tiny", "t5-pairs"),
    ("resnet-tiny", "images"),
    ("vit-tiny", "images"),
    ("wav2vec2-tiny", "audio"),
    ("t5-overflow", "t5-pairs"),
]


def cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        run([str(a) for a in argv])
    out, err = capsys.readouterr()
    return exited.value.code, out, err


@pytest.mark.parametrize("model,data", FIXTURE_PAIRS, ids=[m for m, _ in FIXTURE_PAIRS])
def test_cli_json_on_every_fixture(capsys: pytest.CaptureFixture[str], model: str, data: str) -> None:
    if not (MODELS / model).is_dir():
        pytest.skip(f"fixtures/models/{model} is not there yet")
    # The fp32-set search runs forwards of its own: all six rows where it has something to show.
    every = model in ("bert-tiny", "t5-overflow")
    # the six dtype rows (bitsandbytes' rows have their own test: tests/test_compare_quantized.py)
    classic = tuple(n for n in DEFAULT_ROWS if not n.startswith("bnb-"))
    variants = ",".join(classic if every else classic[:-1])
    code, out, err = cli(
        capsys, "compare", MODELS / model, DATA / data, "--format", "json", "--repeat", "1", "--warmup", "0", "--variants", variants
    )
    assert code == 0
    said = [re.match(r"^dtype-doctor: \[\d+\.\d s\] (.+)$", line) for line in err.splitlines()]
    assert all(said), err  # stderr: the stages, nothing from the libraries; a line per row measured
    rows_said = [m.group(1) for m in said if "(row " in m.group(1)]
    assert len(rows_said) == len(variants.split(",")) and rows_said[-1].endswith(f"(row {len(rows_said)} of {len(rows_said)})")
    d = json.loads(out)
    assert d["schema_version"] == 1 and d["tool"]["name"] == "dtype-doctor"
    assert d["target"]["model"].endswith(model) and d["target"]["split"] == "train" and d["target"]["device"] == "cpu"
    assert d["environment"]["torch"] == torch.__version__
    c = d["compare"]
    rows = {r["name"]: r for r in c["rows"]}
    assert list(rows) == list(classic if every else classic[:-1]) and c["peak_memory"] == "tracked tensor bytes"
    ref, half, bf16 = rows["fp32"], rows["half"], rows["bfloat16"]
    assert (ref["max_abs_error"], ref["max_rel_error"], ref["cosine"], ref["verdict"]) == (0.0, 0.0, 1.0, "reference")
    for row in (half, bf16, rows["autocast-fp16"], rows["autocast-bf16"]):
        assert row["failure"] is None
        # a half row differs from fp32, or overflowed (null error: JSON has no inf)
        assert (row["max_abs_error"] or 0) > 0 or row["output_finite"] is False, row
        assert row["worst_op"] is not None and row["worst_op"]["module"] is not None
    assert half["weight_bytes"] == bf16["weight_bytes"] and 0.45 < half["weight_bytes"] / ref["weight_bytes"] < 0.52  # int buffers stay
    assert bf16["train_step"]["ok"] and bf16["train_step"]["cuda_ok"] is False and names_dtypes(bf16["train_step"]["cuda"], "bfloat16")
    assert all(r["peak_bytes"] >= r["weight_bytes"] and r["time_s"] > 0 for r in c["rows"])
    assert c["recommendation"]["row"] in ("autocast-fp16", "autocast-bf16")
    if model == "t5-overflow":
        assert half["overflowing_modules"] and half["verdict"].startswith("overflows: needs keep-fp32")
        # the overflow reaches the loss before any gradient exists
        assert half["train_step"]["ok"] is False and half["train_step"]["detail"].startswith("the loss is nan")
        keep = rows["fp16-keep-fp32"]
        assert keep["fp32_modules"] and keep["output_finite"] and keep["cosine"] >= COSINE_MIN and not keep["overflowing_modules"]
        assert keep["train_step"]["error"] == "ValueError: Attempting to unscale FP16 gradients."
    else:
        assert not half["overflowing_modules"] and half["output_finite"]
        assert half["train_step"]["error"] == "ValueError: Attempting to unscale FP16 gradients."


def test_cli_rich_table_at_100_columns(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    code, out, err = cli(capsys, "compare", MODELS / "bert-tiny", DATA / "text-cls", "--rows", "half", "--repeat", "1", "-q")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 100
    head = next(line for line in lines if line.startswith("row "))
    assert head.split() == ["row", "weights", "peak", "time", "max", "abs", "max", "rel", "cosine", "verdict"]
    assert any(line.startswith("fp32 ") and "reference" in line for line in lines)
    assert any(line.startswith(".half() ") and "training step" in line for line in lines)
    assert "ValueError: Attempting to unscale FP16 gradients." in out
    assert "autocast or .half()? fp32: no other row" in out  # .half() alone does not train


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--format", "sarif"], "unknown format 'sarif' for compare"),
        (["--variants", "fp8"], "unknown variant 'fp8'"),
        (["--repeat", "0"], "--repeat must be at least 1"),
        (["--device", "tpu"], "unknown device 'tpu'"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    code, out, err = cli(capsys, "compare", MODELS / "bert-tiny", DATA / "text-cls", *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("dtype-doctor: error: ") and needle in err, err


def test_compare_help_does_not_import_torch() -> None:
    import os
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "dtype_doctor", "compare", "--help"],
        capture_output=True, text=True, cwd=REPO, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0 and "--variants" in proc.stdout and "--repeat" in proc.stdout
    imported = {line.rsplit("|", 1)[1].strip().split(".")[0] for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert not imported & {"torch", "transformers", "datasets", "numpy"}


def test_cli_missing_model_is_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = cli(capsys, "compare", tmp_path / "nope", DATA / "text-cls")
    assert code == 2 and out == "" and err.count("\n") == 1


# --------------------------------------------------------------------------- measurement units


def test_live_bytes_tracks_new_storage_not_views_of_old() -> None:
    from dtype_doctor.compare.measure import LiveBytes

    weight = torch.ones(256, 256)  # from before: its views cost nothing
    tracker = LiveBytes()
    with tracker:
        a = torch.ones(1000)  # 4000 bytes
        view = weight.t()
        b = a * 2  # 4000 more: peak 8000
        del a
        c = b.view(10, 100)  # same storage as b
        del b
        assert tracker.live == 4000  # c keeps b's storage alive
        del c, view
        d = torch.zeros(500)  # 2000 bytes, below the peak
    assert tracker.peak == 8000 and tracker.live == 2000
    del d
    assert tracker.live == 0


# --------------------------------------------------------------------------- verdicts


def row(name: str, *, cosine: float = 1.0, finite: bool = True, overflowing: tuple[str, ...] = (),
        step: TrainStep | None = TrainStep(True, "one GradScaler step taken"), peak: int = 100, failure: str | None = None) -> Row:
    return Row(variant(name), weight_bytes=peak // 2, peak_bytes=peak, output=OutputError(0.1, 0.01, cosine, finite),
               overflowing=overflowing, train_step=step, failure=failure)


def test_verdicts() -> None:
    assert verdict(row("fp32")) == "reference"
    assert verdict(row("autocast-fp16")) == "ok"
    assert verdict(row("bfloat16", cosine=0.99)) == "inaccurate"
    assert verdict(row("half", overflowing=("wo",), finite=False, step=TrainStep(False, "x", "ValueError: y"))) == (
        "overflows: needs keep-fp32; training step fails"
    )
    assert verdict(row("fp16-keep-fp32", overflowing=("wo",))) == "overflows"
    assert verdict(row("bfloat16", step=TrainStep(True, "taken", cuda="no bf16", cuda_ok=False))) == "training step fails on CUDA"
    assert verdict(row("half", failure="RuntimeError: no kernel")) == "fails"


def test_recommendation_least_peak_that_is_finite_accurate_and_trains() -> None:
    rows = [
        row("fp32", peak=400),
        row("autocast-fp16", peak=300),
        row("autocast-bf16", peak=250, cosine=0.99),  # inaccurate
        row("half", peak=100, step=TrainStep(False, "x", "ValueError: y")),  # does not train
        row("bfloat16", peak=90, overflowing=("a",)),  # not finite
    ]
    rec = recommend(rows)
    assert (rec.row, rec.inference_row) == ("autocast-fp16", "half")
    assert rec.line.startswith("autocast fp16: the least peak memory (300 B)") and "for inference alone: .half() (100 B peak)" in rec.line
    assert recommend(rows[:1]).row is None and recommend(rows[:1]).line.startswith("fp32: no other row")
