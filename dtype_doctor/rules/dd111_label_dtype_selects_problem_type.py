"""DD111: the labels' dtype made a transformers classification head pick the wrong loss.

`*ForSequenceClassification` (and the image / audio heads written the same way) decide
`config.problem_type` the first time they see labels, when it is None:

    num_labels == 1                       → "regression"                 (MSELoss)
    labels int64 or int32                 → "single_label_classification" (CrossEntropyLoss)
    anything else (float, uint8, bool, …) → "multi_label_classification"  (BCEWithLogitsLoss)

So class indices that a pandas `fillna` or a numpy pipeline turned into float64 make the model
compute a multi-label BCE against `[batch]` targets, and the step dies with a shape error
("Target size (torch.Size([2])) must be the same as input size (torch.Size([2, 3]))") that
says nothing of dtypes. Integer labels with `num_labels == 1` go to regression without an
error; DD104 reports those where they reach the loss.
"""

from __future__ import annotations

import re
from typing import Iterator

from dtype_doctor.records import LABEL_KEYS, Finding, TensorMeta, Trace
from dtype_doctor.rules._common import cast_remedies, describe, source_of, stage_of
from dtype_doctor.rules.base import Rule

# The dtypes transformers takes for class indices (`labels.dtype in (torch.long, torch.int)`).
CLASS_INDEX_DTYPES = ("int64", "int32")
# BCE's own check of target against input shape (torch/nn/functional.py), in either wording.
_BCE_SHAPES = re.compile(r"Target size \(.*\) must be the same as input size")


def chosen_problem_type(num_labels: int, labels_dtype: str) -> str:
    """What transformers sets config.problem_type to on first seeing labels of `labels_dtype`."""
    if num_labels == 1:
        return "regression"
    return "single_label_classification" if labels_dtype in CLASS_INDEX_DTYPES else "multi_label_classification"


def misrouted_labels(trace: Trace) -> TensorMeta | None:
    """The labels whose dtype sent class indices to the multi-label loss, if that is what happened:
    the model left the choice to the labels, they are not int64/int32 and hold one class per row,
    and BCE refused them for their shape."""
    model = trace.model
    if model.problem_type is not None or not model.num_labels or model.num_labels < 2:
        return None
    labels = next((t for key in LABEL_KEYS if (t := trace.input(key)) is not None), None)
    if labels is None or chosen_problem_type(model.num_labels, labels.dtype) != "multi_label_classification":
        return None
    one_per_row = len(labels.shape) <= 1 or labels.shape[-1] != model.num_labels
    failure = trace.failure
    if not one_per_row or failure is None or not _BCE_SHAPES.search(failure.message):
        return None
    return labels


def check(trace: Trace) -> Iterator[Finding]:
    labels = misrouted_labels(trace)
    if labels is None:
        return
    failure = trace.failure
    assert failure is not None  # misrouted_labels found it
    model = trace.model
    yield RULE.finding(
        f"{describe(labels)} is {labels.dtype}, so {model.class_name} chose problem_type="
        f"'multi_label_classification' (BCEWithLogitsLoss) for {model.num_labels} classes; class indices "
        "must be int64 for 'single_label_classification' (CrossEntropyLoss)",
        module=failure.module,
        module_type=failure.module_type or model.class_name,
        op=failure.op,
        stage=stage_of(trace, labels, rejected=lambda d: d not in CLASS_INDEX_DTYPES),
        tensors=(labels,),
        source=source_of(trace, labels),
        pytorch_error=failure.message,
        remedies=cast_remedies(trace, (labels,), "int64", rejected=lambda d: d not in CLASS_INDEX_DTYPES),
        hints=("or set problem_type='single_label_classification' in the model's config",),
    )


RULE = Rule(
    code="DD111",
    name="label-dtype-selects-problem-type",
    severity="error",
    summary=(
        "Labels whose dtype makes a transformers classification head choose the multi-label loss for "
        "class indices (float labels → problem_type='multi_label_classification')."
    ),
    why=(
        "When config.problem_type is None, *ForSequenceClassification picks the loss from the first labels it "
        "sees: int64/int32 labels give cross entropy, any other dtype gives BCE-with-logits, which wants one "
        "float per class. A label column turned float (pandas fillna, numpy) therefore fails with a shape error "
        "that never mentions dtypes, and the choice is stored in the config for every later step."
    ),
    example=(
        "batch['labels'] = torch.tensor([0.0, 2.0])   # class indices as float\n"
        "BertForSequenceClassification(config)(**batch)  # num_labels=3, problem_type=None\n"
        "ValueError: Target size (torch.Size([2])) must be the same as input size (torch.Size([2, 3]))"
    ),
    fix=(
        "Cast the labels to int64 where they are built (.long(), or the dataset column's dtype), or set "
        "problem_type='single_label_classification' in the config so the dtype no longer decides."
    ),
    fix_safety="cast-inputs is safe: the re-run trace shows the cross entropy taking the int64 labels.",
    check=check,
    explains=lambda trace: misrouted_labels(trace) is not None,
    references=("https://github.com/huggingface/transformers/blob/main/src/transformers/loss/loss_utils.py",),
)
