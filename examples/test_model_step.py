"""The `dtype_doctor` pytest fixture, as docs/api.md shows it: `pytest examples/test_model_step.py`.

The first test's step is broken (half-precision token ids), so it fails with the findings
named; the second is clean and passes.
"""

import torch
from transformers import AutoModelForSequenceClassification

MODEL = AutoModelForSequenceClassification.from_pretrained("fixtures/models/bert-tiny")
IDS = torch.randint(0, 100, (2, 8))


def test_half_ids(dtype_doctor):
    dtype_doctor.check(MODEL, {"input_ids": IDS.half()})  # fails: DD103


def test_training_step(dtype_doctor):
    with dtype_doctor.watch(MODEL):  # the test's own step, traced
        MODEL(input_ids=IDS, labels=torch.tensor([0, 1])).loss.backward()
