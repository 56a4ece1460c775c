"""DD112: a loss or a statistic computed in float16/bfloat16, outside autocast's float32 list.

What each op loses was measured against float32 on the same half-precision inputs (torch 2.13,
CPU; the kernels accumulate in float32 on CPU and CUDA alike, so the loss is the result's own
rounding, except where a range ends):

- cross_entropy (log_softmax + nll_loss) on 512 x 32000 bf16 logits: each token's loss off by up
  to 0.072, the mean loss (~15) by 0.021, and it moves in bf16 steps of 0.0625 (fp16: 0.009);
- log_softmax alone: log-probabilities off by up to 0.073 (bf16), 0.009 (fp16);
- softmax over 32000 entries in fp16: probabilities below 2**-24 become 0 (relative error 1.0);
- var / std / vector norm of 4096 values: one rounding of the result, 0.2-0.3% (bf16), 0.03% (fp16);
- quantile: refused outright, on every device ("quantile() input tensor must be either float
  or double dtype").

Losses, log-probabilities and quantiles are what training and evaluation read, so they are
warnings (quantile an error); a statistic that only carries one rounding is an info. The precision
findings are bfloat16's: float16 keeps 11 significant bits, 8 times finer (per-token cross-entropy
on 4096 x 3 logits: up to 0.0044 off in fp16, 0.034 in bf16; relative to the loss, 2**-11 against
2**-8), and fp16's risk is its range, which DD301/DD302 judge, and which DD112 reports where a
reduction meets it: softmax over a long axis, and quantile, refused in both.
"""

from __future__ import annotations

import math
from typing import Iterator

from dtype_doctor.ops.families import CLASS_LOSS, VALUE_LOSS, base_op, op_name
from dtype_doctor.records import HALF, Finding, OpCall, Remedy, SourceLoc, TensorMeta, Trace
from dtype_doctor.rules._common import autocast_remedy
from dtype_doctor.rules.base import Rule

LOSS = CLASS_LOSS | VALUE_LOSS | {"aten.kl_div"}
LOG_SOFTMAX = "aten._log_softmax"
SOFTMAX = "aten._softmax"
QUANTILE = frozenset({"torch.quantile", "torch.nanquantile"})
STATISTICS = frozenset(
    {"aten.var", "aten.std", "aten.var_mean", "aten.std_mean", "aten.linalg_vector_norm", "aten.norm"}
)
# A softmax over at least this many entries is "over a long axis": a vocabulary, not a head's
# few keys. fp16 flushes probabilities below 2**-24 to zero; over 1024 entries a logit spread of
# 17 (e**17 = 2.4e7) is enough, and vocabulary logits spread wider.
LONG_AXIS = 1024
# Mantissa bits: a value v is rounded to a step of 2**(floor(log2 v) - bits).
_MANTISSA = {"bfloat16": 7, "float16": 10}
_NAMES = {"nll_loss_forward": "cross_entropy", "nll_loss2d_forward": "cross_entropy", "_log_softmax": "log_softmax",
          "_softmax": "softmax", "linalg_vector_norm": "norm"}


def step(value: float, dtype: str) -> float:
    """The spacing of `dtype`'s numbers at `value`: how far a rounded result can move."""
    if not math.isfinite(value) or value == 0:
        return 0.0
    return 2.0 ** (math.floor(math.log2(abs(value))) - _MANTISSA[dtype])


def _half_input(op: OpCall) -> TensorMeta | None:
    return next((t for t in op.operands if t.role == "input" and t.dtype in HALF), None)


def _site(op: OpCall) -> SourceLoc | None:
    site = op.attr("site")
    return SourceLoc(*site) if site else None


def _feeds_loss(trace: Trace, op: OpCall) -> bool:
    """A log_softmax that a class loss of the same module takes next: one cross_entropy, one finding."""
    later = [o for o in trace.ops if o.index > op.index and o.phase == "forward" and o.module == op.module]
    nxt = next((o for o in later if base_op(o.op) in LOSS or base_op(o.op) == LOG_SOFTMAX), None)
    return nxt is not None and base_op(nxt.op) in CLASS_LOSS and nxt.operands[0].shape == op.operands[0].shape


def _axis(op: OpCall, t: TensorMeta) -> int | None:
    dim = op.attr("dim")
    if dim is None or not t.shape:
        return None
    return t.shape[dim] if -len(t.shape) <= dim < len(t.shape) else None


def _named(op: OpCall) -> str:
    name = op_name(op.op)
    return _NAMES.get(name, name)


def check(trace: Trace) -> Iterator[Finding]:
    from dtype_doctor.trace.cuda_autocast import FP32

    seen: set[tuple[str, str]] = set()
    if trace.shards:  # a loss on a fully_shard unit's half output is DD605's, which names the policy
        from dtype_doctor.rules.dd605_fsdp_half_precision_loss import check as fsdp_loss

        seen |= {(f.module, "cross_entropy") for f in fsdp_loss(trace)}
    for op in trace.ops:
        base = base_op(op.op)
        if op.phase != "forward" or (t := _half_input(op)) is None:
            continue
        if base in QUANTILE:
            if op.error is None or op.level != "function":
                continue
            kind, severity = "quantile", "error"
        elif base in LOSS:
            kind, severity = "loss", "warning"
        elif base == LOG_SOFTMAX:
            if _feeds_loss(trace, op):
                continue
            kind, severity = "log-probabilities", "warning"
        elif base == SOFTMAX:
            # transformers' attention modules decide their own softmax dtype (eager attention upcasts)
            if "Attention" in op.module_type or "Attn" in op.module_type:
                continue
            kind, severity = "probabilities", "warning"
        elif base in STATISTICS:
            kind, severity = "statistic", "info"
        else:
            continue
        axis = _axis(op, t)
        if kind in ("loss", "log-probabilities", "statistic") and t.dtype == "float16":
            continue  # 11 bits: within 2**-11 of float32; fp16's risk is its range (DD301, DD302)
        if kind == "probabilities":
            if axis is None or axis < LONG_AXIS:
                continue
            if t.dtype == "bfloat16":
                severity = "info"  # bf16 keeps fp32's range: each probability carries one rounding
        name = _named(op)
        if (op.module, name) in seen:
            continue
        seen.add((op.module, name))
        yield RULE.finding(
            _message(op, kind, name, t, axis),
            module=op.module,
            module_type=op.module_type,
            op=op.op,
            stage="loss" if kind in ("loss", "log-probabilities") else "model-code",
            tensors=(t,),
            source=_site(op),
            severity=severity,
            pytorch_error=op.error if kind == "quantile" else None,
            remedies=_remedies(trace, op, t, FP32),
            hints=(f"or call .float() on the {t.role} of {name} (the tensor you pass it), so it computes in float32",),
        )


def _remedies(trace: Trace, op: OpCall, t: TensorMeta, fp32: frozenset[str]) -> tuple[Remedy, ...]:
    """autocast runs the ops on its float32 list in float32 whatever their inputs: a fix where the op
    runs inside the model's forward (a loss the script computes after it is not in that block)."""
    if trace.autocast or op_name(op.op).lstrip("_").removesuffix("_forward") not in fp32 or op.attr("outside_forward"):
        return ()
    return (autocast_remedy(t.dtype),)


def _message(op: OpCall, kind: str, name: str, t: TensorMeta, axis: int | None) -> str:
    bits = _MANTISSA[t.dtype] + 1
    where = f"{name} runs on {t.dtype} {t.role}"
    if kind == "quantile":
        return f"{name} refuses {t.dtype} input on every device; it takes float32 or float64 only"
    if kind == "loss":
        value = op.stats.absmax if op.stats is not None and math.isfinite(op.stats.absmax) else None
        at = (f"the loss ({value:.4g}) moves in steps of {step(value, t.dtype):.2g}" if value
              else f"a loss near 10 moves in steps of {step(10.0, t.dtype):.2g}")
        return f"{where}: the loss is computed and returned in {t.dtype} ({bits} significant bits); {at}, and its gradient carries the same rounding"
    if kind == "log-probabilities":
        n = f" over {axis} entries" if axis else ""
        return (f"{where}{n}: log-probabilities near -10 are rounded to steps of {step(10.0, t.dtype):.2g} "
                "(measured: up to 0.07 off in bf16, 0.009 in fp16, over a 32000-token vocabulary)")
    if kind == "probabilities":
        if t.dtype == "float16":
            return f"{where} over {axis} entries: probabilities below 2**-24 (6e-8) become 0 in float16"
        return f"{where} over {axis} entries: each probability is rounded to {bits} significant bits"
    return f"{where}: the result carries one {t.dtype} rounding (about {2.0 ** -bits:.1g} relative); the kernel accumulates in float32"


RULE = Rule(
    code="DD112",
    name="half-precision-reduction",
    severity="warning",
    summary="A loss or a statistic (cross_entropy, log_softmax, mse, var/std, norm) computed in bfloat16, a softmax over a long axis in float16/bfloat16, a quantile of a half tensor.",
    why=(
        "A loss computed on half-precision logits is returned in half precision: a cross-entropy near 15 moves in "
        "bf16 steps of 0.0625, each token's log-probability is up to 0.07 off, and the gradient carries the same "
        "rounding. autocast runs losses, log_softmax, softmax and norms in float32 whatever their inputs, but only "
        "inside its block; a half model's own forward, or a loss taken after the block, runs in half. var, std and "
        "quantile are on no autocast list: torch.quantile refuses half input outright."
    ),
    example=(
        "logits = model(**batch).logits            # bfloat16 model\n"
        "loss = F.cross_entropy(logits.view(-1, V), labels.view(-1))   # loss.dtype == torch.bfloat16\n"
        "torch.quantile(embeddings, 0.5)  # RuntimeError: quantile() input tensor must be either float or double dtype"
    ),
    fix=(
        "Compute the loss or statistic in float32: .float() on its input (logits.float()), or run the forward and the "
        "loss under torch.autocast with float32 weights, which puts losses, log_softmax, softmax and norms in float32."
    ),
    fix_safety="autocast is safe; .float() on the loss input is safe and costs one float32 copy of that tensor.",
    check=check,
    rejects=lambda op: base_op(op.op) in QUANTILE and any(t.dtype in HALF for t in op.operands),
    references=(
        "https://github.com/huggingface/sentence-transformers/issues/3800",
        "https://github.com/huggingface/trl/issues/3666",
        "aten/src/ATen/autocast_mode.h (AT_FORALL_FP32, AT_FORALL_FP32_SET_OPT_DTYPE)",
    ),
    device_note="The same on CPU and CUDA: both accumulate in float32 and return the input's dtype; quantile refuses half on both.",
)
