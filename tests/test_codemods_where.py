"""The codemods `fix --run` writes where the bug is: device= on a factory in model code, the move a
script dropped, and the ways out of half weights under a GradScaler. Before/after strings."""

from __future__ import annotations

import pytest

from dtype_doctor.fix.codemods import (
    MoveModelWherePlaced,
    AddDevice,
    CastWhereMade,
    DropLoadDtype,
    KeepTrainableFloat32,
    MoveWhereHandled,
    RemoveModelConversion,
    SetMixedPrecision,
)
from test_codemods import applied, skipped, src

FORWARD = src(
    """
    import torch
    from torch import nn


    class Rotary(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dim, 2) / dim)))

        def cos_sin(self, t):
            steps = torch.arange(t)
            return steps


    class Net(nn.Module):
        def forward(self, idx, targets=None):
            pos = torch.arange(0, idx.size(1), dtype=torch.long)
            return pos
    """
)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (17, "pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)"),  # the forward's input
        (11, "steps = torch.arange(t, device=self.inv_freq.device)"),  # a buffer of self
    ],
    ids=["forward-input", "buffer-of-self"],
)
def test_add_device_takes_what_is_in_scope(line: int, expected: str) -> None:
    assert expected in applied(AddDevice(line, "arange"), FORWARD)


def test_add_device_prefers_the_functions_own_device_then_the_scripts() -> None:
    own = FORWARD.replace("        pos = torch", "        device = idx.device\n        pos = torch")
    assert "dtype=torch.long, device=device)" in applied(AddDevice(18, "arange"), own)
    script = "import torch\ndevice = 'cuda'\nmask = torch.ones(4, 4)\n"
    assert applied(AddDevice(3, "ones"), script).endswith("mask = torch.ones(4, 4, device=device)\n")
    assert "no torch.zeros(...) without device= on that line" in skipped(AddDevice(3, "zeros"), script)
    assert "nothing in scope names a device" in skipped(AddDevice(1, "ones"), "x = torch.ones(2)\n")


PINNED = src(
    """
    def get_batch():
        x = torch.stack([a for a in rows])
        y = torch.stack([b for b in rows])
        if device_type == "cuda":
            x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory()
        return x, y
    """
)


def test_the_dropped_move_goes_back_where_the_tensor_was_last_handled() -> None:
    after = applied(MoveWhereHandled(5, ".pin_memory()"), PINNED)
    assert "x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)" in after
    # the only value on its line: moved to the device in scope there
    assert "    y = torch.stack([b for b in rows]).to(device)\n" in applied(MoveWhereHandled(4, "torch.stack"), "device = 'cuda'\n" + PINNED)
    moved = PINNED.replace("y.pin_memory()", "y.pin_memory().cuda()")
    assert "every value on that line already moves to a device" in skipped(MoveWhereHandled(5), moved)


def test_a_dtype_held_by_a_variable_is_cast_on_the_line_that_made_the_tensor() -> None:
    made = src(
        """
        import numpy as np
        import torch
        target_type = np.int32 if small else np.int64
        y = torch.stack([torch.from_numpy(row.astype(target_type)) for row in rows])
        """
    )
    after = applied(CastWhereMade(4, "int64", "torch.stack"), made)
    assert after.endswith("y = torch.stack([torch.from_numpy(row.astype(target_type)) for row in rows]).to(torch.int64)\n")
    assert "already cast to torch.int64" in skipped(CastWhereMade(4, "int64"), after)


HALF = src(
    """
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float16)
    model = model.to(device)
    model.half()  # fp16 weights to save memory
    optimizer = AdamW(model.parameters())
    """
)


def test_half_weights_under_a_grad_scaler_each_way_out() -> None:
    # the conversion the run saw, by its line
    assert "model.half()" not in applied(RemoveModelConversion(lines=[3]), HALF)
    # from_pretrained's half dtype=
    assert "from_pretrained(path)\n" in applied(DropLoadDtype(), HALF)
    # the trainable parameters back in float32, right after the line that made them half
    kept = applied(KeepTrainableFloat32(3), HALF)
    assert kept.splitlines()[3:6] == [
        "for param in model.parameters():  # trainable weights stay float32 for fp16 mixed precision",
        "    if param.requires_grad:",
        "        param.data = param.data.float()",
    ]
    # a dtype held by a variable: what it holds is not known here
    assert "not a half dtype written out" in skipped(DropLoadDtype(), HALF.replace("torch.float16", "load_dtype"))


def test_mixed_precision_in_bfloat16() -> None:
    assert 'Accelerator(mixed_precision="bf16")' in applied(SetMixedPrecision(), 'accelerator = Accelerator(mixed_precision="fp16")\n')
    args = "args = TrainingArguments(output_dir='o', fp16=torch.cuda.is_available())\n"
    assert "bf16=torch.cuda.is_available()" in applied(SetMixedPrecision(), args)
    assert "is not the literal" in skipped(SetMixedPrecision(), "accelerator = Accelerator(mixed_precision=mp)\n")


# diffusers' train_text_to_image.py places its models side by side, each in the mode's dtype.
PLACED = src(
    """
    weight_dtype = torch.float16 if args.mixed_precision == "fp16" else torch.float32
    text_encoder.to(dtype=weight_dtype)
    vae.to(accelerator.device, dtype=weight_dtype)
    unet.to(accelerator.device, dtype=weight_dtype)
    """
)


def test_one_of_several_models_placed_side_by_side() -> None:
    # The trained UNet cast to the mode's dtype by name, on the line the run saw: the cast goes, the move stays.
    assert applied(RemoveModelConversion(lines=[4]), PLACED).endswith("\nunet.to(accelerator.device)\n")
    # Without the run's line a dtype held by a name is not known to be half here.
    assert "no float16 conversion" in skipped(RemoveModelConversion(from_dtype="float16", variable="unet"), PLACED)
    # The text encoder left on the CPU: the device its siblings went to, in its own .to(...).
    assert "text_encoder.to(accelerator.device, dtype=weight_dtype)\n" in applied(MoveModelWherePlaced(2), PLACED)
    assert "no .to(...) without a device" in skipped(MoveModelWherePlaced(3), PLACED)
