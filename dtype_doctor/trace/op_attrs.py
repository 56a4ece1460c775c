"""The facts of one op's call that rules read beyond its operands (trace/recorder.py records them
on each OpCall's `attrs`): a loss's user line, softmax's axis, SDPA's backend arguments, Python
numbers beyond float16's range, an fp8 matmul's layouts."""

from __future__ import annotations

from typing import Any

import torch

from dtype_doctor.trace.dispatch import NEVER_NUMBERS, big_number

# Ops whose rules need a fact of the call beyond its operands, by kind: a loss or a statistic
# (DD112) keeps the user's line that called it, the first frame outside torch and the doctor when
# it is the user's own file (few ops of a step are these: the frame walk is paid only for them);
# softmax keeps the axis it normalises over; SDPA the arguments its CUDA backend choice reads.
_CALL_FACTS: dict[str, str] = {
    **dict.fromkeys(
        ("aten.nll_loss_forward.default", "aten.nll_loss2d_forward.default", "aten.mse_loss.default",
         "aten.l1_loss.default", "aten.smooth_l1_loss.default", "aten.huber_loss.default",
         "aten.binary_cross_entropy_with_logits.default", "aten.binary_cross_entropy.default", "aten.kl_div.default",
         "aten.var.correction", "aten.var.dim", "aten.var.default", "aten.std.correction", "aten.std.dim",
         "aten.std.default", "aten.var_mean.correction", "aten.std_mean.correction", "aten.linalg_vector_norm.default",
         "aten.norm.Scalar", "aten.norm.ScalarOpt_dim", "torch.quantile", "torch.nanquantile"),
        "site",
    ),
    "aten._softmax.default": "dim",
    "aten._log_softmax.default": "dim",
    "torch.nn.functional.scaled_dot_product_attention": "sdpa",
}
_SDPA_ARGS = (("dropout_p", 4, 0.0), ("is_causal", 5, False), ("enable_gqa", 7, False))


def call_attrs(op_name: str, args: tuple, kwargs: dict, in_root: int = 1) -> tuple[tuple[str, Any], ...]:
    attrs: list[tuple[str, Any]] = []
    if "nll_loss" in op_name and len(args) >= 5:
        attrs.append(("ignore_index", args[4]))
    if "_scaled_mm" in op_name and len(args) >= 2:
        # fp8 matmul: CUDA takes mat1 row-major and mat2 column-major only (DD506)
        attrs.append(("layouts", tuple(_layout(t) for t in args[:2])))
    # Python numbers beyond float16's range (-1e10 fills, 2**30 writes): DD301 reads them.
    # Most operands are tensors and lists: one set lookup each before big_number's tests.
    big = [v for v in args if type(v) not in NEVER_NUMBERS and big_number(v)]
    if kwargs:
        big += [v for v in kwargs.values() if type(v) not in NEVER_NUMBERS and big_number(v)]
    if big:
        attrs.append(("constants", tuple(big)))
    kind = _CALL_FACTS.get(op_name)
    if kind == "site":
        if (site := _user_line()) is not None:
            attrs.append(("site", site))
        if not in_root:  # after the model's forward (run: the script's own loss)
            attrs.append(("outside_forward", True))
    elif kind == "dim" and len(args) >= 2 and isinstance(args[1], int):
        attrs.append(("dim", args[1]))
    elif kind == "sdpa":
        attrs.extend((key, kwargs.get(key, args[i] if len(args) > i else default)) for key, i, default in _SDPA_ARGS)
    return tuple(attrs) if attrs else ()


def _layout(t: Any) -> str:
    """'row' | 'column' | 'other': a 2-D tensor's memory order, as torch's _scaled_mm checks it."""
    if not isinstance(t, torch.Tensor) or t.dim() != 2:
        return "other"
    s0, s1 = t.stride()
    if s1 == 1 and s0 > s1:
        return "row"
    return "column" if s0 == 1 and s1 > 1 else "other"


def _user_line() -> tuple[str, int] | None:
    """(file, line) of the user's own code that called the op being recorded: the first frame
    outside torch and the doctor, when it is the user's (a library's loss has no user line)."""
    from dtype_doctor.machine.user_code import display_path, first_outside_tool, frames_above, is_user_file

    frame = first_outside_tool(frames_above(2))
    if frame is None or not is_user_file(frame.f_code.co_filename):
        return None
    return display_path(frame.f_code.co_filename), frame.f_lineno
