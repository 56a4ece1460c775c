"""Source patches: before/after strings for each codemod, their skip reasons, and real `git apply`."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from dtype_doctor.records.errors import UsageError
from dtype_doctor.fix.codemods import (
    CastBatch,
    CastLabelsToLong,
    Codemod,
    EditResult,
    LabelsToLong,
    MoveBatchToDevice,
    NewFixModule,
    RemoveModelConversion,
    ReplaceModelConversion,
    RetargetCast,
    SetLoadDtype,
    WrapForwardInAutocast,
    normalize_dtype,
    run_codemods,
)
from dtype_doctor.fix.patch import (
    Patch,
    file_diff,
    make_patch,
    path_in_patch,
    read_source,
    repo_root,
    unified_diff,
    write_patch,
)


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def applied(codemod: Codemod, before: str, filename: str = "train.py") -> str:
    result = codemod.apply(before, filename)
    assert result.status == "applied", result
    assert result.codemod == type(codemod).__name__
    assert result.new_source is not None
    compile(result.new_source, filename, "exec")  # the rewritten file is still Python
    return result.new_source


def skipped(codemod: Codemod, before: str, filename: str = "train.py") -> str:
    result = codemod.apply(before, filename)
    assert result.status == "skipped", result
    assert result.new_source is None
    return result.detail


ALL_CODEMODS = [
    RetargetCast,
    CastLabelsToLong,
    SetLoadDtype,
    RemoveModelConversion,
    ReplaceModelConversion,
    WrapForwardInAutocast,
    MoveBatchToDevice,
    CastBatch,
    LabelsToLong,
    NewFixModule,
]


@pytest.mark.parametrize("cls", ALL_CODEMODS)
def test_every_codemod_has_a_one_line_description(cls):
    assert cls.DESCRIPTION and "\n" not in cls.DESCRIPTION and cls.DESCRIPTION.endswith(".")


def test_edit_result_is_frozen_and_serializable():
    result = EditResult("skipped", "SetLoadDtype", "no from_pretrained(...) call found in train.py")
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.status = "applied"  # type: ignore[misc]
    assert result.to_dict() == {
        "codemod": "SetLoadDtype",
        "status": "skipped",
        "detail": "no from_pretrained(...) call found in train.py",
        "warnings": [],
    }


def test_normalize_dtype():
    assert normalize_dtype("torch.half") == "float16"
    assert normalize_dtype("fp32") == "float32"
    assert normalize_dtype("bf16") == "bfloat16"
    with pytest.raises(ValueError):
        normalize_dtype("float12")


def test_unparsable_source_fails_without_raising():
    result = SetLoadDtype("float16").apply("def broken(:\n", "train.py")
    assert result.status == "failed"
    assert result.detail.startswith("cannot parse train.py")


# ---------------------------------------------------------------------------------------
# RetargetCast

PREP = src(
    '''
    import numpy as np
    import torch


    def preprocess(examples):
        # images as half, like the old fp16 model wanted
        pixel_values = torch.tensor(examples["image"]).half()
        input_ids = torch.tensor(examples["ids"]).long()  # stays int64
        audio = examples["audio"].to(torch.float16)
        return {"pixel_values": pixel_values, "input_ids": input_ids, "audio": audio}


    def other(x):
        return x.half()
    '''
)


def test_retarget_cast_keeps_each_calls_style():
    assert applied(RetargetCast("preprocess", "float32"), PREP, "prep.py") == src(
        '''
        import numpy as np
        import torch


        def preprocess(examples):
            # images as half, like the old fp16 model wanted
            pixel_values = torch.tensor(examples["image"]).float()
            input_ids = torch.tensor(examples["ids"]).long()  # stays int64
            audio = examples["audio"].to(torch.float32)
            return {"pixel_values": pixel_values, "input_ids": input_ids, "audio": audio}


        def other(x):
            return x.half()
        '''
    )


def test_retarget_cast_detail_names_lines():
    result = RetargetCast("preprocess", "float32").apply(PREP, "prep.py")
    assert result.detail == (
        "prep.py:preprocess: cast to float32 — line 7: .half() → .float(); line 9: torch.float16 → torch.float32"
    )


@pytest.mark.parametrize(
    ("cast", "expected"),
    [
        ("x.to(dtype=torch.float16)", "x.to(dtype=torch.float32)"),
        ("x.to('cuda', torch.half)", "x.to('cuda', torch.float32)"),
        ("x.to(device, dtype=torch.float16, non_blocking=True)", "x.to(device, dtype=torch.float32, non_blocking=True)"),
        ("x.type(torch.float16)", "x.type(torch.float32)"),
        ("x.bfloat16()", "x.float()"),
        ("x.double()", "x.float()"),
        ("torch.tensor(v, dtype=torch.float64)", "torch.tensor(v, dtype=torch.float32)"),
        ("np.asarray(v, dtype=np.float16)", "np.asarray(v, dtype=np.float32)"),
        ("v.astype(np.float16)", "v.astype(np.float32)"),
        ("v.astype('float16')", "v.astype('float32')"),
        ('v.astype("float64")', 'v.astype("float32")'),
        ("np.float16(v)", "np.float32(v)"),
        ("np.asarray(v, np.float16)", "np.asarray(v, np.float32)"),
    ],
)
def test_retarget_cast_forms(cast, expected):
    before = f"import numpy as np\nimport torch\n\ndef prep(x, v, device):\n    return {cast}  # cast\n"
    after = applied(RetargetCast("prep", "float32"), before, "prep.py")
    assert after == before.replace(cast, expected)


def test_retarget_cast_to_bfloat16_and_from_import():
    before = src(
        """
        from torch import float16

        def prep(x):
            y = x.half()
            return y.to(float16)
        """
    )
    assert applied(RetargetCast("prep", "bfloat16"), before, "prep.py") == src(
        """
        from torch import float16
        import torch

        def prep(x):
            y = x.bfloat16()
            return y.to(torch.bfloat16)
        """
    )


def test_retarget_cast_method_of_a_class_and_lines_filter():
    before = src(
        """
        import torch

        class Prep:
            def __call__(self, ex):
                a = ex["a"].half()
                b = ex["b"].half()
                return a, b
        """
    )
    after = applied(RetargetCast("Prep.__call__", "float32", lines=[6]), before, "prep.py")
    assert after == before.replace('ex["b"].half()', 'ex["b"].float()')


def test_retarget_cast_lines_match_the_whole_statement():
    before = src(
        """
        import torch

        def prep(ex):
            pixel_values = torch.tensor(
                ex["image"], dtype=torch.float16
            )
            audio = torch.tensor(ex["audio"], dtype=torch.float16)
            return pixel_values, audio
        """
    )
    after = applied(RetargetCast("prep", "float32", lines=[4]), before, "prep.py")
    assert after == before.replace('ex["image"], dtype=torch.float16', 'ex["image"], dtype=torch.float32')


def test_retarget_cast_from_dtype_narrows_and_ambiguity_is_skipped():
    before = src(
        """
        import torch

        def prep(ex):
            a = ex["a"].half()
            b = torch.tensor(ex["b"], dtype=torch.float64)
            return a, b
        """
    )
    reason = skipped(RetargetCast("prep", "float32"), before, "prep.py")
    assert reason == (
        "ambiguous: casts to float16 (line 4); float64 (line 5) in prep.py:prep; pass from_dtype or lines to choose"
    )
    after = applied(RetargetCast("prep", "float32", from_dtype="float64"), before, "prep.py")
    assert after == before.replace("torch.float64", "torch.float32")


def test_retarget_cast_skips():
    assert skipped(RetargetCast("missing", "float32"), PREP, "prep.py") == "no function missing() in prep.py"
    no_cast = "def prep(ex):\n    return ex\n"
    assert skipped(RetargetCast("prep", "float32"), no_cast, "prep.py") == "no floating cast found in prep.py:prep"
    done = "def prep(ex):\n    return ex.float()\n"
    assert skipped(RetargetCast("prep", "float32"), done, "prep.py") == "the casts in prep.py:prep already cast to float32"
    twice = "def prep(x):\n    return x.half()\n\ndef prep(x):\n    return x.half()\n"
    assert skipped(RetargetCast("prep", "float32"), twice, "prep.py") == (
        "2 functions named prep in prep.py (lines 1, 4); ambiguous"
    )


def test_retarget_cast_numpy_has_no_bfloat16():
    before = "import numpy as np\n\ndef prep(v):\n    return v.astype(np.float32)\n"
    result = RetargetCast("prep", "bfloat16").apply(before, "prep.py")
    assert result.status == "skipped"
    assert result.warnings == ("prep.py:4: cannot express bfloat16 in the style of np.float32; left as is",)


# ---------------------------------------------------------------------------------------
# CastLabelsToLong


def test_cast_labels_to_long_in_returned_dict_and_followed_names():
    before = src(
        """
        import numpy as np
        import torch

        def preprocess(batch):
            y = np.array(batch["label"]).astype(np.int32)
            mask = torch.tensor(batch["mask"], dtype=torch.int32)  # not a label: stays int32
            batch["label_ids"] = torch.tensor(batch["ids"]).int()
            return {"labels": y, "mask": mask, "scores": torch.tensor(batch["s"], dtype=torch.int32)}
        """
    )
    assert applied(CastLabelsToLong("preprocess"), before, "prep.py") == src(
        """
        import numpy as np
        import torch

        def preprocess(batch):
            y = np.array(batch["label"]).astype(np.int64)
            mask = torch.tensor(batch["mask"], dtype=torch.int32)  # not a label: stays int32
            batch["label_ids"] = torch.tensor(batch["ids"]).long()
            return {"labels": y, "mask": mask, "scores": torch.tensor(batch["s"], dtype=torch.int32)}
        """
    )


def test_cast_labels_to_long_dict_call_and_skip():
    before = "import torch\n\ndef prep(ex):\n    return dict(labels=torch.tensor(ex['y'], dtype=torch.int32))\n"
    after = applied(CastLabelsToLong("prep"), before, "prep.py")
    assert after == before.replace("torch.int32", "torch.int64")
    fine = "import torch\n\ndef prep(ex):\n    return dict(labels=torch.tensor(ex['y']))\n"
    assert skipped(CastLabelsToLong("prep"), fine, "prep.py") == "no int32 cast on labels found in prep.py:prep"


# ---------------------------------------------------------------------------------------
# Pipeline script

SCRIPT = src(
    '''
    """Fine-tune a classifier."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    device = "cuda"
    tokenizer = AutoTokenizer.from_pretrained("bert-base-uncased")
    model = AutoModelForSequenceClassification.from_pretrained(
        "bert-base-uncased",
        num_labels=2,  # binary task
    )

    # fp16 to save memory
    model.half()
    model.to(device)

    for batch in loader:
        optimizer.zero_grad()

        # forward pass
        outputs = model(**batch)  # logits and loss
        logits = outputs.logits
        loss = loss_fn(logits, batch["labels"])
        loss.backward()
        optimizer.step()
    '''
)


def test_set_load_dtype_adds_keyword_in_the_calls_layout():
    after = applied(SetLoadDtype("float16"), SCRIPT)
    assert after == SCRIPT.replace(
        "    num_labels=2,  # binary task\n)",
        "    num_labels=2,  # binary task\n    dtype=torch.float16,\n)",
    )


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ("AutoModel.from_pretrained(name)", "AutoModel.from_pretrained(name, dtype=torch.bfloat16)"),
        ("AutoModel.from_pretrained(name,)", "AutoModel.from_pretrained(name, dtype=torch.bfloat16,)"),
        ("AutoModel.from_pretrained(name, num_labels = 2)", "AutoModel.from_pretrained(name, num_labels = 2, dtype = torch.bfloat16)"),
        ("AutoModel.from_pretrained(\n    name\n)", "AutoModel.from_pretrained(\n    name,\n    dtype=torch.bfloat16\n)"),
        ("AutoModel.from_pretrained(name,\n                          num_labels=2)", "AutoModel.from_pretrained(name,\n                          num_labels=2,\n                          dtype=torch.bfloat16)"),
        ("AutoModel.from_pretrained(name, dtype=torch.float16)", "AutoModel.from_pretrained(name, dtype=torch.bfloat16)"),
        ("AutoModel.from_pretrained(name, torch_dtype=torch.float16)", "AutoModel.from_pretrained(name, dtype=torch.bfloat16)"),
        ("AutoModel.from_pretrained(name, torch_dtype=torch.float16, dtype=torch.float16)", "AutoModel.from_pretrained(name, dtype=torch.bfloat16)"),
        ("AutoModel.from_pretrained(name).to(device)", "AutoModel.from_pretrained(name, dtype=torch.bfloat16).to(device)"),
    ],
)  # fmt: skip
def test_set_load_dtype_call_forms(call, expected):
    before = f"import torch\nfrom transformers import AutoModel\n\nmodel = {call}\n"
    assert applied(SetLoadDtype("bfloat16"), before) == before.replace(call, expected)


def test_set_load_dtype_adds_import_torch_after_the_imports():
    before = src(
        '''
        """Load."""
        from transformers import AutoModelForCausalLM

        lm = AutoModelForCausalLM.from_pretrained("gpt2")
        '''
    )
    assert applied(SetLoadDtype("float16"), before) == src(
        '''
        """Load."""
        from transformers import AutoModelForCausalLM
        import torch

        lm = AutoModelForCausalLM.from_pretrained("gpt2", dtype=torch.float16)
        '''
    )


def test_set_load_dtype_adds_import_torch_after_a_docstring():
    before = '"""Load."""\nmodel = transformers.AutoModel.from_pretrained("x")\n'
    assert applied(SetLoadDtype("float16"), before) == (
        '"""Load."""\n\nimport torch\nmodel = transformers.AutoModel.from_pretrained("x", dtype=torch.float16)\n'
    )


def test_set_load_dtype_auto_needs_no_torch_and_renames_legacy_keyword():
    before = 'from transformers import AutoModel\nmodel = AutoModel.from_pretrained("x", torch_dtype="float16")\n'
    result = SetLoadDtype("auto").apply(before, "train.py")
    assert result.status == "applied"
    assert result.new_source == before.replace('torch_dtype="float16"', 'dtype="auto"')
    assert result.warnings == ("train.py:2: rewrote the legacy torch_dtype= keyword to dtype=",)
    assert result.detail == 'train.py:2: AutoModel.from_pretrained(...) now loads with dtype="auto" (was torch_dtype="float16")'


def test_set_load_dtype_uses_the_torch_alias():
    before = "import torch as T\nmodel = AutoModel.from_pretrained('x')\n"
    assert applied(SetLoadDtype("float16"), before) == (
        "import torch as T\nmodel = AutoModel.from_pretrained('x', dtype=T.float16)\n"
    )


def test_set_load_dtype_skips():
    tokenizer_only = "from transformers import AutoTokenizer, AutoConfig\ntok = AutoTokenizer.from_pretrained('x')\ncfg = AutoConfig.from_pretrained('x')\n"
    assert skipped(SetLoadDtype("float16"), tokenizer_only) == (
        "no from_pretrained(...) call that loads a model found in train.py (only AutoConfig, AutoTokenizer loads)"
    )
    assert skipped(SetLoadDtype("float16"), "import torch\nx = 1\n") == (
        "no from_pretrained(...) call that loads a model found in train.py"
    )
    already = "import torch\nmodel = AutoModel.from_pretrained('x', dtype=torch.float16)\n"
    assert skipped(SetLoadDtype("float16"), already) == "train.py:2: the model already loads with dtype=torch.float16"
    two = "import torch\nstudent = AutoModel.from_pretrained('s')\nteacher = AutoModel.from_pretrained('t')\n"
    assert skipped(SetLoadDtype("float16"), two) == (
        "ambiguous: 2 model from_pretrained(...) calls in train.py (lines 2, 3); pass line= to choose"
    )
    assert applied(SetLoadDtype("float16", line=3), two) == two.replace("('t')", "('t', dtype=torch.float16)")


def test_set_load_dtype_changes_alternative_loads_of_the_same_variable():
    before = src(
        """
        import torch.nn as nn
        import torch.utils.data

        if args.large:
            model = AutoModelForCausalLM.from_pretrained("big")
        else:
            model = AutoModelForCausalLM.from_pretrained("small", dtype=torch.float32)
        """
    )
    result = SetLoadDtype("bfloat16").apply(before, "train.py")
    assert result.new_source == before.replace('"big")', '"big", dtype=torch.bfloat16)').replace(
        "torch.float32", "torch.bfloat16"
    )
    assert result.detail == (
        "train.py:5: AutoModelForCausalLM.from_pretrained(...) now loads with dtype=torch.bfloat16; "
        "train.py:7: AutoModelForCausalLM.from_pretrained(...) now loads with dtype=torch.bfloat16 (was dtype=torch.float32)"
    )


def test_set_load_dtype_takes_the_one_unknown_load_with_a_warning():
    before = "import torch\npipe = StableDiffusionPipeline.from_pretrained('x')\n"
    result = SetLoadDtype("float16").apply(before, "gen.py")
    assert result.status == "applied"
    assert result.warnings == ("took StableDiffusionPipeline.from_pretrained(...) on line 2 as the model load",)


def test_remove_model_conversion_keeps_comments_around_it():
    result = RemoveModelConversion().apply(SCRIPT, "train.py")
    assert result.status == "applied"
    assert result.new_source == SCRIPT.replace("# fp16 to save memory\nmodel.half()\n", "")
    assert result.detail == "train.py: model conversion removed — line 13: removed `model.half()`"
    assert result.warnings == ("train.py:13: removed the comment above the removed line too: # fp16 to save memory",)


CONVERSIONS = src(
    """
    import torch
    from transformers import AutoModel

    model = (
        AutoModel.from_pretrained("x")
        .half()
        .to("cuda")
    )
    if args.fp16:
        model.half()
    model = model.to(device, dtype=torch.float16)
    model.to(device=device, dtype=torch.bfloat16)
    x = 1; model.bfloat16(); y = 2
    model = model.cuda().half()

    model = model.half()
    model.float()  # fp32 stays
    out = model(**batch)
    """
)


def test_remove_model_conversion_forms():
    assert applied(RemoveModelConversion(), CONVERSIONS) == src(
        """
        import torch
        from transformers import AutoModel

        model = (
            AutoModel.from_pretrained("x")
            .to("cuda")
        )
        if args.fp16:
            pass
        model = model.to(device)
        model.to(device=device)
        x = 1; y = 2
        model = model.cuda()

        model.float()  # fp32 stays
        out = model(**batch)
        """
    )


def test_remove_model_conversion_from_dtype_and_chained_load():
    before = "import torch\nmodel = AutoModelForCausalLM.from_pretrained('x').half().to(device)\nmodel.bfloat16()\n"
    assert applied(RemoveModelConversion(from_dtype="bfloat16"), before) == (
        "import torch\nmodel = AutoModelForCausalLM.from_pretrained('x').half().to(device)\n"
    )
    assert applied(RemoveModelConversion(from_dtype="float16"), before) == (
        "import torch\nmodel = AutoModelForCausalLM.from_pretrained('x').to(device)\nmodel.bfloat16()\n"
    )


def test_remove_model_conversion_skips():
    assert skipped(RemoveModelConversion(), "x = torch.zeros(3).half()\n") == (
        "no from_pretrained(...) call found in train.py"
    )
    no_conv = "model = AutoModel.from_pretrained('x')\nmodel.to('cuda')\nother.half()\n"
    assert skipped(RemoveModelConversion(), no_conv) == "no half/float64 conversion of the model found in train.py"


def test_replace_model_conversion_keeps_style():
    assert applied(ReplaceModelConversion("bfloat16"), CONVERSIONS) == src(
        """
        import torch
        from transformers import AutoModel

        model = (
            AutoModel.from_pretrained("x")
            .bfloat16()
            .to("cuda")
        )
        if args.fp16:
            model.bfloat16()
        model = model.to(device, dtype=torch.bfloat16)
        model.to(device=device, dtype=torch.bfloat16)
        x = 1; model.bfloat16(); y = 2
        model = model.cuda().bfloat16()

        model = model.bfloat16()
        model.bfloat16()  # fp32 stays
        out = model(**batch)
        """
    )
    only_half = applied(ReplaceModelConversion("float32", from_dtype="float16"), CONVERSIONS)
    assert "model.to(device=device, dtype=torch.bfloat16)" in only_half
    assert "model = model.to(device, dtype=torch.float32)" in only_half
    assert "model.half()" not in only_half


def test_wrap_forward_in_autocast_through_the_loss():
    result = WrapForwardInAutocast("cuda", "float16").apply(SCRIPT, "train.py")
    assert result.status == "applied"
    assert result.new_source == SCRIPT.replace(
        "    # forward pass\n"
        "    outputs = model(**batch)  # logits and loss\n"
        "    logits = outputs.logits\n"
        '    loss = loss_fn(logits, batch["labels"])\n',
        "    # forward pass\n"
        '    with torch.autocast(device_type="cuda", dtype=torch.float16):\n'
        "        outputs = model(**batch)  # logits and loss\n"
        "        logits = outputs.logits\n"
        '        loss = loss_fn(logits, batch["labels"])\n',
    )
    assert result.detail == 'train.py: lines 20-22 now run under torch.autocast(device_type="cuda", dtype=torch.float16)'


def test_wrap_forward_only_the_forward_when_it_is_the_loss_and_adds_import():
    before = src(
        """
        def train_step(model, inputs, scaler):
          loss = model(**inputs).loss
          scaler.scale(loss).backward()
          return loss
        """
    )
    result = WrapForwardInAutocast("cuda", "bfloat16").apply(before, "step.py")
    assert result.status == "applied"
    assert result.new_source == src(
        """
        import torch


        def train_step(model, inputs, scaler):
          with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = model(**inputs).loss
          scaler.scale(loss).backward()
          return loss
        """
    )
    assert result.warnings == ("no from_pretrained(...) call binds the model in step.py; took `model` as the model",)


def test_wrap_forward_keyword_call_in_a_method():
    before = src(
        """
        import torch

        class Runner:
            def __init__(self):
                self.model = AutoModelForCausalLM.from_pretrained("gpt2")

            def step(self, ids, mask):
                out = self.model(input_ids=ids, attention_mask=mask)
                # loss by hand
                loss = out.logits.float().mean()
                return loss
        """
    )
    assert applied(WrapForwardInAutocast(), before) == src(
        """
        import torch

        class Runner:
            def __init__(self):
                self.model = AutoModelForCausalLM.from_pretrained("gpt2")

            def step(self, ids, mask):
                with torch.autocast(device_type="cuda", dtype=torch.float16):
                    out = self.model(input_ids=ids, attention_mask=mask)
                    # loss by hand
                    loss = out.logits.float().mean()
                return loss
        """
    )


def test_wrap_forward_skips():
    under = "import torch\nmodel = AutoModel.from_pretrained('x')\nwith torch.autocast('cuda'):\n    out = model(**b)\n"
    assert skipped(WrapForwardInAutocast(), under) == "train.py:4: the forward is already under torch.autocast (line 3)"
    decorated = "import torch\n@torch.autocast('cuda')\ndef f(model, b):\n    return model(**b)\n"
    assert "already under torch.autocast" in skipped(WrapForwardInAutocast(), decorated)
    disabled = "import torch\nwith torch.cuda.amp.autocast(enabled=False):\n    out = model(**b)\n"
    assert skipped(WrapForwardInAutocast(), disabled) == (
        "train.py:3: the forward runs under autocast(enabled=False) (line 2); left as the script chose"
    )
    two = src(
        """
        model = AutoModel.from_pretrained("x")
        for b in train:
            loss = model(**b).loss
        for b in val:
            out = model(**b)
        """
    )
    assert skipped(WrapForwardInAutocast(), two) == (
        "ambiguous: 2 forward calls of `model` in train.py (lines 3, 5); pass line= to choose"
    )
    picked = applied(WrapForwardInAutocast(line=5), two)
    assert picked.endswith(
        'for b in val:\n    with torch.autocast(device_type="cuda", dtype=torch.float16):\n        out = model(**b)\n'
    )
    one_line = "model = AutoModel.from_pretrained('x')\nfor b in dl: out = model(**b)\n"
    assert "shares its line with a for/if/with header" in skipped(WrapForwardInAutocast(), one_line)
    header = "model = AutoModel.from_pretrained('x')\nif model(**b).loss > 0:\n    pass\n"
    assert "part of a for/if/while/with header" in skipped(WrapForwardInAutocast(), header)
    none = "model = AutoModel.from_pretrained('x')\ntrainer = Trainer(model=model)\ntrainer.train()\n"
    assert skipped(WrapForwardInAutocast(), none) == "no forward call of `model` found in train.py"


def test_move_batch_to_device_reuses_the_device_variable():
    assert applied(MoveBatchToDevice(), SCRIPT) == SCRIPT.replace(
        "    optimizer.zero_grad()\n\n    # forward pass\n",
        "    optimizer.zero_grad()\n\n    batch = {k: v.to(device) for k, v in batch.items()}\n    # forward pass\n",
    )


def test_move_batch_to_device_keywords_with_model_device():
    before = src(
        """
        model = AutoModel.from_pretrained("x")

        def run(ids, mask):
            return model(input_ids=ids, attention_mask=mask, return_dict=True, labels=y.to("cuda"), w=w.to(torch.half))
        """
    )
    assert applied(MoveBatchToDevice(), before) == src(
        """
        model = AutoModel.from_pretrained("x")

        def run(ids, mask):
            return model(input_ids=ids.to(next(model.parameters()).device), attention_mask=mask.to(next(model.parameters()).device), return_dict=True, labels=y.to("cuda"), w=w.to(torch.half).to(next(model.parameters()).device))
        """
    )


def test_move_batch_to_device_device_of_another_function_is_not_visible():
    before = src(
        """
        def setup():
            device = "cuda"

        def step(model, batch):
            return model(**batch)
        """
    )
    assert applied(MoveBatchToDevice(), before) == before.replace(
        "    return model(**batch)", "    batch = {k: v.to(next(model.parameters()).device) for k, v in batch.items()}\n    return model(**batch)"
    )
    assert "batch.items()}\n    return" in applied(MoveBatchToDevice("torch.device('cuda:1')"), before)


def test_move_batch_to_device_skips():
    expr = "model = AutoModel.from_pretrained('x')\nout = model(**tokenizer(text, return_tensors='pt'))\n"
    assert skipped(MoveBatchToDevice(), expr) == (
        "train.py:2: the forward unpacks `tokenizer(text, return_tensors='pt')`, not a variable; "
        "cannot move it without restructuring the call"
    )
    moved = "model = AutoModel.from_pretrained('x')\nout = model(x.to(device))\n"
    assert skipped(MoveBatchToDevice(), moved) == "train.py:2: no input of the forward left to move to a device"


def test_cast_batch_inserts_for_unpacked_batch():
    assert applied(CastBatch(["pixel_values", "input_values"]), SCRIPT) == SCRIPT.replace(
        "    # forward pass\n",
        '    batch["pixel_values"] = batch["pixel_values"].to(next(model.parameters()).dtype)\n'
        '    batch["input_values"] = batch["input_values"].to(next(model.parameters()).dtype)\n'
        "    # forward pass\n",
    )


def test_cast_batch_wraps_keywords_with_a_given_dtype():
    before = "model = AutoModel.from_pretrained('x')\nout = model(pixel_values=images / 255, labels=labels)\n"
    assert applied(CastBatch(["pixel_values"], "float16"), before) == (
        "import torch\nmodel = AutoModel.from_pretrained('x')\n"
        "out = model(pixel_values=(images / 255).to(torch.float16), labels=labels)\n"
    )
    assert skipped(CastBatch(["input_values"]), before) == (
        "train.py:2: the forward passes none of input_values in a form that can be cast"
    )


def test_cast_batch_at_a_vaes_encode():
    # diffusers' train_text_to_image.py runs its VAE through encode(), not a forward call
    before = src(
        """
        vae = AutoencoderKL.from_pretrained(path, subfolder="vae")
        latents = vae.encode(batch["pixel_values"]).latent_dist.sample()
        """
    )
    assert applied(CastBatch(["sample"], line=2, positions={"sample": 0}), before) == before.replace(
        'vae.encode(batch["pixel_values"])', 'vae.encode(batch["pixel_values"].to(next(vae.parameters()).dtype))')
    assert "no forward call" in skipped(CastBatch(["sample"], line=2, positions={"sample": 0}),
                                        before.replace("vae.encode(", "vae.to("))


def test_labels_to_long_where_they_are_built():
    before = src(
        """
        import torch
        model = AutoModel.from_pretrained("x")
        labels = torch.tensor(df["label"].values, dtype=torch.int32)
        out = model(input_ids=ids, labels=labels)
        """
    )
    assert applied(LabelsToLong(), before) == before.replace("torch.int32", "torch.int64")


def test_labels_to_long_before_the_forward():
    assert applied(LabelsToLong(), SCRIPT) == SCRIPT.replace(
        "    # forward pass\n", '    batch["labels"] = batch["labels"].long()\n    # forward pass\n'
    )
    keyword = "model = AutoModel.from_pretrained('x')\nout = model(input_ids=ids, labels=y)\n"
    assert applied(LabelsToLong(), keyword) == keyword.replace("labels=y", "labels=y.long()")
    done = "model = AutoModel.from_pretrained('x')\nout = model(input_ids=ids, labels=y.long())\n"
    assert skipped(LabelsToLong(), done) == "train.py:2: labels are already made int64 with .long()"
    none = "model = AutoModel.from_pretrained('x')\nout = model(input_ids=ids)\n"
    assert skipped(LabelsToLong(), none) == "train.py: no int32 labels built and the forward on line 2 passes no labels"


def test_crlf_script_keeps_its_line_endings():
    before = SCRIPT.replace("\n", "\r\n")
    after = applied(MoveBatchToDevice(), before)
    assert "\r\n    batch = {k: v.to(device) for k, v in batch.items()}\r\n" in after
    assert after.count("\n") == after.count("\r\n")


def test_run_codemods_chains_and_reports_each():
    final, results = run_codemods(
        SCRIPT,
        "train.py",
        [RemoveModelConversion(), WrapForwardInAutocast(), SetLoadDtype("float16", line=99)],
    )
    assert [r.status for r in results] == ["applied", "applied", "skipped"]
    assert results[2].detail == "no from_pretrained(...) call that loads a model found in train.py on line 99"
    assert "model.half()" not in final and "with torch.autocast(" in final
    compile(final, "train.py", "exec")


# ---------------------------------------------------------------------------------------
# NewFixModule: the generated module runs


def load_fix_module(strategy: str, **params) -> dict:
    result = NewFixModule(strategy, params).apply("", "dtype_doctor_fix.py")
    assert result.status == "applied", result
    namespace: dict = {}
    exec(compile(result.new_source, "dtype_doctor_fix.py", "exec"), namespace)
    assert namespace["__doc__"].startswith(f"Fix written by dtype-doctor (strategy: {strategy}).")
    assert namespace["apply_fix"].__doc__
    return namespace


def tiny_model():
    import torch

    class Tiny(torch.nn.Module):
        _keep_in_fp32_modules = ["head"]

        def __init__(self):
            super().__init__()
            self.body = torch.nn.Linear(4, 4)
            self.head = torch.nn.Linear(4, 3)

        def forward(self, pixel_values, labels=None, note=None):
            logits = self.head(self.body(pixel_values).to(self.head.weight.dtype))
            loss = torch.nn.functional.cross_entropy(logits.float(), labels) if labels is not None else None
            return logits, loss

    torch.manual_seed(0)
    return Tiny()


def test_new_fix_module_cast_inputs_runs():
    import torch

    ns = load_fix_module("cast-inputs", findings=["DD101 Linear received float32 input but its weight is float16"])
    assert "DD101 Linear received float32 input but its weight is float16" in ns["__doc__"]
    model = tiny_model().half()
    batch = {"pixel_values": torch.randn(2, 4), "labels": torch.tensor([0, 2], dtype=torch.int32), "note": "keep"}
    with pytest.raises(RuntimeError):
        model(**batch)
    fixed = ns["apply_fix"](model, batch)
    assert fixed["pixel_values"].dtype == torch.float16
    assert fixed["labels"].dtype == torch.int64
    assert fixed["note"] == "keep"
    assert batch["pixel_values"].dtype == torch.float32  # the caller's batch is not changed
    _, loss = model(**fixed)
    assert torch.isfinite(loss)


def test_new_fix_module_cast_inputs_given_dtype_and_keys():
    import torch

    ns = load_fix_module("cast-inputs", dtype="bfloat16", keys=["pixel_values"])
    batch = {"pixel_values": torch.randn(2, 4), "other": torch.randn(2)}
    fixed = ns["apply_fix"](tiny_model(), batch)
    assert fixed["pixel_values"].dtype == torch.bfloat16
    assert fixed["other"].dtype == torch.float32


def test_new_fix_module_to_device_runs():
    import torch

    ns = load_fix_module("to-device")
    model = tiny_model()
    fixed = ns["apply_fix"](model, {"pixel_values": torch.randn(2, 4), "note": "keep"})
    assert fixed["pixel_values"].device == next(model.parameters()).device
    assert fixed["note"] == "keep"
    ns = load_fix_module("to-device", device="cpu")
    assert ns["apply_fix"](model, {"x": torch.ones(1)})["x"].device.type == "cpu"


def test_new_fix_module_autocast_runs():
    import torch

    ns = load_fix_module("autocast", dtype="bfloat16")
    model = tiny_model()
    batch = {"pixel_values": torch.randn(2, 4)}
    with ns["apply_fix"](model, batch):
        logits, _ = model(**batch)
    assert logits.dtype == torch.bfloat16
    assert next(model.parameters()).dtype == torch.float32


def test_new_fix_module_half_model_keeps_fp32_modules():
    import torch

    ns = load_fix_module("half-model", dtype="float16")
    model = ns["apply_fix"](tiny_model(), {})
    assert model.body.weight.dtype == torch.float16
    assert model.head.weight.dtype == torch.float32
    logits, _ = model(pixel_values=torch.randn(2, 4, dtype=torch.float16))
    assert logits.dtype == torch.float32


def test_new_fix_module_fp32_trainable_runs():
    import torch

    ns = load_fix_module("fp32-trainable")
    model = tiny_model().half()
    model.body.requires_grad_(False)
    model = ns["apply_fix"](model, {})
    assert model.head.weight.dtype == torch.float32
    assert model.body.weight.dtype == torch.float16


def test_one_fix_module_holds_every_strategy_the_fix_needs():
    import torch

    parts = [
        ("autocast", {"dtype": "bfloat16", "device_type": "cpu"}),
        ("cast-inputs", {"casts": {"labels": "int64", "pixel_values": "float16"}}),
        ("fp32-trainable", {}),
    ]
    result = NewFixModule(parts=parts, findings=["DD401 x", "DD104 y"]).apply("", "dtype_doctor_fix.py")
    assert result.applied and "fp32_trainable(), cast_inputs(), autocast_context()" in result.detail
    ns: dict = {}
    exec(compile(result.new_source, "dtype_doctor_fix.py", "exec"), ns)
    assert ns["__doc__"].startswith("Fix written by dtype-doctor (strategy: fp32-trainable, cast-inputs, autocast).")
    assert "with autocast_context(model, batch):" in ns["__doc__"] and "- DD104 y" in ns["__doc__"]
    model = tiny_model().half()
    model.body.requires_grad_(False)
    batch = ns["apply_fix"](model, {"pixel_values": torch.randn(2, 4), "labels": torch.tensor([0, 2], dtype=torch.int32)})
    assert model.head.weight.dtype == torch.float32 and model.body.weight.dtype == torch.float16  # converted in place
    assert batch["pixel_values"].dtype == torch.float16 and batch["labels"].dtype == torch.int64
    with ns["autocast_context"](model, batch):
        logits, loss = model(**batch)
    assert torch.isfinite(loss)


def test_a_fix_module_s_preprocess_casts_what_the_user_s_function_returns(tmp_path):
    import runpy

    import torch

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "prep.py").write_text("def prep(example, tokenizer=None):\n    return {'x': [float(example['v'])], 'n': tokenizer}\n")
    transform = {"kind": "user", "path": "sub/prep.py", "function": "prep", "batched": False, "accepts": ["tokenizer"]}
    text = NewFixModule("cast-inputs", {"casts": {"x": "float16"}}, transform=transform).apply("", "f.py").new_source
    (tmp_path / "dtype_doctor_fix.py").write_text(text)
    ns = runpy.run_path(str(tmp_path / "dtype_doctor_fix.py"))
    out = ns["preprocess"]({"v": [1, 2], "other": ["a", "b"]}, tokenizer="tok")
    assert [t.dtype for t in out["x"]] == [torch.float16, torch.float16] and out["n"] == ["tok", "tok"]
    assert out["other"] == ["a", "b"]  # what the function leaves alone stays, as with Dataset.map


def test_an_existing_fix_module_is_replaced_only_when_asked():
    assert NewFixModule("autocast", replace=True).apply("x = 1\n", "dtype_doctor_fix.py").detail.startswith(
        "replaced dtype_doctor_fix.py"
    )


def test_new_fix_module_skips():
    assert skipped(NewFixModule("nope"), "", "dtype_doctor_fix.py").startswith("no fix module for strategy 'nope'")
    assert skipped(NewFixModule("autocast"), "x = 1\n", "dtype_doctor_fix.py") == (
        "dtype_doctor_fix.py already exists; pass --force to replace it with the generated fix module"
    )


# ---------------------------------------------------------------------------------------
# patch.py

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path / "project"
    root.mkdir()
    assert git(root, "init", "-q").returncode == 0
    return root


@needs_git
def test_patch_applies_with_git(repo: Path):
    script = repo / "scripts" / "train.py"
    script.parent.mkdir()
    script.write_text(SCRIPT, encoding="utf-8")
    before = read_source(script)
    after, results = run_codemods(before, "train.py", [SetLoadDtype("float16"), WrapForwardInAutocast()])
    assert all(r.applied for r in results)
    diff = file_diff(script, before, after, root=repo_root(script))
    assert diff.startswith("diff --git a/scripts/train.py b/scripts/train.py\n--- a/scripts/train.py\n+++ b/scripts/train.py\n@@ ")
    patch_path = repo / "fix.patch"
    write_patch(patch_path, [diff], force=False)
    assert sorted(p.name for p in repo.iterdir()) == [".git", "fix.patch", "scripts"]
    check = git(repo, "apply", "--check", "fix.patch")
    assert check.returncode == 0, check.stderr
    assert script.read_text(encoding="utf-8") == SCRIPT  # --check changed nothing
    assert git(repo, "apply", "fix.patch").returncode == 0
    assert script.read_bytes() == after.encode("utf-8")


@needs_git
def test_patch_without_final_newline_and_crlf(repo: Path):
    a = repo / "a.py"
    a.write_bytes(b"import torch\nmodel = AutoModel.from_pretrained('x')")
    b = repo / "b.py"
    b.write_bytes(SCRIPT.replace("\n", "\r\n").encode())
    edits = []
    for file, codemod in ((a, SetLoadDtype("float16")), (b, MoveBatchToDevice())):
        before = read_source(file)
        edits.append((file, before, applied(codemod, before)))
    patch = make_patch(repo / "fix.patch", edits, root=repo, force=False)
    assert patch == Patch(repo / "fix.patch", ("a.py", "b.py"))
    assert patch.to_dict() == {"path": str(repo / "fix.patch"), "files": ["a.py", "b.py"]}
    assert "\\ No newline at end of file\n" in (repo / "fix.patch").read_text()
    check = git(repo, "apply", "--check", "fix.patch")
    assert check.returncode == 0, check.stderr
    assert git(repo, "apply", "fix.patch").returncode == 0
    for file, _, after in edits:
        assert file.read_bytes() == after.encode()


@needs_git
def test_patch_creates_the_new_fix_module(repo: Path):
    text = NewFixModule("cast-inputs").apply("", "dtype_doctor_fix.py").new_source
    target = repo / "dtype_doctor_fix.py"
    patch = make_patch(repo / "fix.patch", [(target, "", text)], root=repo, force=False)
    assert patch.files == ("dtype_doctor_fix.py",)
    content = (repo / "fix.patch").read_text()
    assert content.startswith(
        "diff --git a/dtype_doctor_fix.py b/dtype_doctor_fix.py\nnew file mode 100644\n--- /dev/null\n+++ b/dtype_doctor_fix.py\n@@ -0,0 +1,"
    )
    assert not target.exists()
    assert git(repo, "apply", "--check", "fix.patch").returncode == 0
    assert git(repo, "apply", "fix.patch").returncode == 0
    assert target.read_text() == text


def test_unified_diff_is_minimal_and_empty_when_unchanged():
    before = "a\nb\nc\nd\ne\nf\ng\nh\n"
    after = before.replace("e\n", "E\n")
    assert unified_diff("x.py", before, after) == (
        "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -2,7 +2,7 @@\n b\n c\n d\n-e\n+E\n f\n g\n h\n"
    )
    assert unified_diff("x.py", before, before) == ""


def test_write_patch_refuses_to_overwrite(tmp_path: Path):
    target = tmp_path / "fix.patch"
    target.write_text("old")
    with pytest.raises(UsageError) as info:
        write_patch(target, ["diff\n"], force=False)
    assert str(info.value) == f"patch file {target} already exists; refusing to overwrite it"
    assert "\n" not in str(info.value)
    assert target.read_text() == "old"
    write_patch(target, ["new\n"], force=True)
    assert target.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fix.patch"]
    with pytest.raises(UsageError, match="does not exist"):
        write_patch(tmp_path / "missing" / "fix.patch", [], force=False)
    with pytest.raises(UsageError, match="is a directory"):
        write_patch(tmp_path, [], force=True)


def test_paths_in_patch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    (tmp_path / "repo" / "src").mkdir()
    file = tmp_path / "repo" / "src" / "train.py"
    file.write_text("x = 1\n")
    assert repo_root(file) == (tmp_path / "repo").resolve()
    assert path_in_patch(file, repo_root(file)) == "src/train.py"
    outside = tmp_path / "elsewhere.py"
    outside.write_text("")
    monkeypatch.chdir(tmp_path)
    assert repo_root(outside) == tmp_path.resolve()
    with pytest.raises(UsageError, match="is not under"):
        path_in_patch(outside, tmp_path / "repo")
