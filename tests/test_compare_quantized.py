"""compare's bitsandbytes rows on the tiny Llama: the same columns as every row, measured for real on the CPU."""

import pytest
import torch

from dtype_doctor.compare.records import VARIANT_NAMES, variant
from dtype_doctor.records.errors import UsageError

bnb = pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed (pip install 'dtype-doctor[quant]')")

from helpers_models import load_fixture, token_batch  # noqa: E402

import dtype_doctor  # noqa: E402


def test_quantized_rows_are_measured_like_the_others() -> None:
    model = load_fixture("llama-tiny")
    inputs = {**token_batch(vocab=600), "labels": token_batch(vocab=600)["input_ids"]}
    table = dtype_doctor.compare(model, inputs, variants=["bnb-int8", "bnb-nf4", "bnb-fp4"], repeat=1, warmup=0)
    fp32, int8, nf4, fp4 = (table.row(n) for n in ("fp32", "bnb-int8", "bnb-nf4", "bnb-fp4"))
    for row in (int8, nf4, fp4):
        assert row.failure is None and row.output.finite and row.time_s is not None and row.peak_bytes
        assert row.weight_bytes < fp32.weight_bytes and "lm_head kept float32" in row.note
        assert row.verdict in ("ok", "inaccurate", "training step fails")
    assert nf4.weight_bytes < int8.weight_bytes  # half a byte a weight against one
    assert int8.output.max_rel < nf4.output.max_rel  # 8 bits lose less than 4
    assert model.model.layers[0].self_attn.q_proj.weight.dtype == torch.float32  # the user's model is left as it was
    rows = {r["name"]: r for r in table.to_dict()["compare"]["rows"]}
    assert {"bnb-int8", "bnb-nf4", "bnb-fp4"} <= set(rows)
    # the recommendation weighs them: never the model to train (frozen weights), for inference when accurate
    assert table.recommendation.row is None  # no unquantized half row was asked for
    inference = table.recommendation.inference_row
    assert inference is None or (table.row(inference).accurate and table.row(inference).variant.quantize)


def test_quantized_rows_need_bitsandbytes(monkeypatch) -> None:
    assert {"bnb-int8", "bnb-nf4", "bnb-fp4"} <= set(VARIANT_NAMES)
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    with pytest.raises(UsageError, match="needs bitsandbytes"):
        variant("bnb-nf4")
