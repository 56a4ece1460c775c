"""The Trainer callback and the pytest fixture, each on a real failing and a real clean step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers_errors import raises_dtype_error

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
BERT = ROOT / "fixtures/models/bert-tiny"


def _trainer(tmp_path: Path, label_dtype: torch.dtype, callbacks: list) -> "object":
    from datasets import load_from_disk
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments

    tokenizer = AutoTokenizer.from_pretrained(BERT)
    rows = load_from_disk(str(ROOT / "fixtures/data/text-cls"))["train"]

    def collate(examples):  # the user's own collate_fn
        batch = tokenizer([e["text"] for e in examples], padding=True, return_tensors="pt")
        batch["labels"] = torch.tensor([e["label"] for e in examples], dtype=label_dtype)
        return batch

    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, report_to=[],
                             save_strategy="no", use_cpu=True, remove_unused_columns=False, disable_tqdm=True)
    model = AutoModelForSequenceClassification.from_pretrained(BERT)
    return Trainer(model=model, args=args, train_dataset=rows, data_collator=collate, callbacks=callbacks)


def test_trainer_callback_stops_before_the_step_pytorch_would_fail(tmp_path: Path) -> None:
    from dtype_doctor.integrations.transformers import DtypeDoctorCallback, DtypeDoctorStop

    # The oracle: the same Trainer without the callback dies of the int32 labels.
    with raises_dtype_error("int32"):
        _trainer(tmp_path, torch.int32, []).train()

    callback = DtypeDoctorCallback()
    trainer = _trainer(tmp_path, torch.int32, [callback])
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with pytest.raises(DtypeDoctorStop) as stop:
        trainer.train()
    assert [f.code for f in stop.value.report.at_or_above("error")] == ["DD104"]
    assert "DD104" in str(stop.value) and stop.value.report is callback.report
    # Stopped before the step: no weight changed.
    assert all(torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())


def test_trainer_callback_lets_a_clean_run_train(tmp_path: Path) -> None:
    from dtype_doctor.integrations.transformers import DtypeDoctorCallback

    callback = DtypeDoctorCallback()
    trainer = _trainer(tmp_path, torch.int64, [callback])
    trainer.train()
    assert trainer.state.global_step == 2
    assert callback.report is not None and callback.report.target.train
    assert not callback.report.at_or_above("error")


FIXTURE_TESTS = f'''
import pytest, torch
from transformers import AutoModelForSequenceClassification

MODEL = AutoModelForSequenceClassification.from_pretrained({str(BERT)!r})
IDS = torch.randint(0, 100, (2, 8))


def test_half_ids_fail(dtype_doctor):
    dtype_doctor.check(MODEL, {{"input_ids": IDS.half()}})


def test_int32_labels_in_the_tests_own_step_fail(dtype_doctor):
    with dtype_doctor.watch(MODEL):
        MODEL(input_ids=IDS, labels=torch.tensor([0, 1], dtype=torch.int32)).loss.backward()


def test_clean_step_passes(dtype_doctor):
    with dtype_doctor.watch(MODEL):
        MODEL(input_ids=IDS, labels=torch.tensor([0, 1])).loss.backward()


@pytest.mark.dtype_doctor(fail_on="never")
def test_fail_on_never_passes(dtype_doctor):
    dtype_doctor.check(MODEL, {{"input_ids": IDS.half()}})
'''


def test_pytest_fixture_fails_a_test_whose_step_has_findings(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_model=FIXTURE_TESTS)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["*test_half_ids_fail*", "*DD103 error*"])
    result.stdout.fnmatch_lines(["*test_int32_labels_in_the_tests_own_step_fail*", "*DD104 error*"])
