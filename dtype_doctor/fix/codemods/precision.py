"""The mixed precision a training library runs in: SetMixedPrecision turns fp16 mixed precision
(which needs a GradScaler) into bf16 (which needs none) on the script's own call that asks for it:
``Accelerator(mixed_precision="fp16")`` or ``TrainingArguments(..., fp16=...)``."""

from __future__ import annotations

from typing import ClassVar

import libcst as cst

from dtype_doctor.fix.codemods.base import Codemod, _Skip
from dtype_doctor.fix.codemods.quant import _callee


class SetMixedPrecision(Codemod):
    """``Accelerator(mixed_precision="fp16")`` → ``"bf16"``; ``TrainingArguments(fp16=X)`` → ``bf16=X``.
    Only what the call itself says is changed: a precision passed through a variable is left."""

    DESCRIPTION: ClassVar[str] = "Run mixed precision in bfloat16 instead of float16 (no GradScaler) on the Accelerator or TrainingArguments call."

    def _apply(self, source: str, filename: str, warnings: list[str]) -> tuple[str, str]:
        from libcst.metadata import MetadataWrapper, PositionProvider

        wrapper = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
        positions = wrapper.resolve(PositionProvider)
        done: list[str] = []
        seen: list[str] = []

        class Edit(cst.CSTTransformer):
            def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
                callee = _callee(original)
                if callee not in ("Accelerator", "TrainingArguments", "Seq2SeqTrainingArguments"):
                    return updated
                line = positions[original].start.line
                args = list(updated.args)
                for i, a in enumerate(args):
                    word = a.keyword.value if a.keyword is not None else None
                    if callee == "Accelerator" and word == "mixed_precision":
                        if isinstance(a.value, cst.SimpleString) and a.value.evaluated_value == "fp16":
                            args[i] = a.with_changes(value=cst.SimpleString(f'{a.value.prefix}{a.value.quote}bf16{a.value.quote}'))
                            done.append(f"{filename}:{line}: Accelerator(mixed_precision=\"bf16\")")
                        else:
                            seen.append(f"{filename}:{line}: mixed_precision={cst.Module([]).code_for_node(a.value)} is not the literal \"fp16\"")
                    elif callee != "Accelerator" and word == "fp16":
                        args[i] = a.with_changes(keyword=cst.Name("bf16"))
                        done.append(f"{filename}:{line}: {callee}(bf16=...) in place of fp16=")
                return updated.with_changes(args=args)

        new = wrapper.module.visit(Edit())
        if not done:
            raise _Skip("; ".join(seen) or f"no Accelerator(mixed_precision=\"fp16\") or TrainingArguments(fp16=...) in {filename}")
        return new.code, "; ".join(done)
