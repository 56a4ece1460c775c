"""The TF32 switches moved to one API: Tf32ToNewApi rewrites a file's legacy TF32 lines
(``allow_tf32 = X``, ``set_float32_matmul_precision("high")``, reads of ``allow_tf32``) into the
``fp32_precision`` API PyTorch recommends (DD114: PyTorch refuses to read a switch through one
API once the other set it)."""

from __future__ import annotations

from typing import ClassVar

import libcst as cst
from libcst.helpers import get_full_name_for_node

from dtype_doctor.fix.codemods.base import Codemod, _Skip

MATMUL_LEGACY = "torch.backends.cuda.matmul.allow_tf32"
CUDNN_LEGACY = "torch.backends.cudnn.allow_tf32"
MATMUL_NEW = "torch.backends.cuda.matmul.fp32_precision"
# The legacy cuDNN switch is conv's and rnn's together; the new API has one a kind.
CUDNN_NEW = ("torch.backends.cudnn.conv.fp32_precision", "torch.backends.cudnn.rnn.fp32_precision")
# torch.set_float32_matmul_precision's values that say one fp32_precision ("medium" lets cuBLAS use bf16: not TF32's).
MATMUL_PRECISION = {"highest": "ieee", "high": "tf32"}


def _precision(value: cst.BaseExpression) -> cst.BaseExpression:
    """The fp32_precision an allow_tf32 value means: "tf32" for True, "ieee" for False, else both by the value."""
    if isinstance(value, cst.Name) and value.value in ("True", "False"):
        return cst.SimpleString('"tf32"' if value.value == "True" else '"ieee"')
    return cst.parse_expression(f'"tf32" if ({cst.Module([]).code_for_node(value)}) else "ieee"')


def _assign(name: str, value: cst.BaseExpression) -> cst.Assign:
    return cst.Assign([cst.AssignTarget(cst.parse_expression(name))], value)


class Tf32ToNewApi(Codemod):
    """Every legacy TF32 line of a file in the fp32_precision API: setters and reads."""

    DESCRIPTION: ClassVar[str] = "Set and read the TF32 switches through fp32_precision, the API PyTorch recommends, not allow_tf32."

    def _apply(self, source: str, filename: str, warnings: list[str]) -> tuple[str, str]:
        from libcst.metadata import MetadataWrapper, PositionProvider

        wrapper = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
        positions = wrapper.resolve(PositionProvider)
        done: list[str] = []

        class Edit(cst.CSTTransformer):
            def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine):  # type: ignore[override]
                if len(updated.body) != 1:
                    return updated
                line = positions[original].start.line
                new = _statements(updated.body[0], f"{filename}:{line}", done, warnings)
                if new is None:
                    return updated
                lines = [updated.with_changes(body=[new[0]])]
                lines += [cst.SimpleStatementLine([s], leading_lines=()) for s in new[1:]]
                return cst.FlattenSentinel(lines)

            def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
                return False  # a setter's target is the statement's to rewrite, not a read

            def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute):  # type: ignore[override]
                name = get_full_name_for_node(original)
                if name == MATMUL_LEGACY:
                    new = MATMUL_NEW
                elif name == CUDNN_LEGACY:
                    new = CUDNN_NEW[0]
                else:
                    return updated
                done.append(f"{filename}:{positions[original].start.line}: read {new} == \"tf32\" for {name}")
                return cst.parse_expression(f'({new} == "tf32")')

        new_module = wrapper.module.visit(Edit())
        if not done:
            raise _Skip(f"no legacy TF32 line (allow_tf32, set_float32_matmul_precision) in {filename}"
                        + (f": {'; '.join(warnings)}" if warnings else ""))
        return new_module.code, "; ".join(done)


def _statements(stmt: cst.BaseSmallStatement, where: str, done: list[str], warnings: list[str]) -> list[cst.BaseSmallStatement] | None:
    """The new-API statements for a legacy setter, None for any other statement."""
    if isinstance(stmt, cst.Assign) and len(stmt.targets) == 1:
        name = get_full_name_for_node(stmt.targets[0].target)
        value = _precision(stmt.value)
        if name == MATMUL_LEGACY:
            done.append(f"{where}: {MATMUL_NEW} in place of allow_tf32")
            return [_assign(MATMUL_NEW, value)]
        if name == CUDNN_LEGACY:
            done.append(f"{where}: {' and '.join(CUDNN_NEW)} in place of cudnn.allow_tf32")
            return [_assign(n, value) for n in CUDNN_NEW]
        return None
    if isinstance(stmt, cst.Expr) and isinstance(stmt.value, cst.Call):
        call = stmt.value
        if get_full_name_for_node(call.func) != "torch.set_float32_matmul_precision" or len(call.args) != 1:
            return None
        arg = call.args[0].value
        precision = MATMUL_PRECISION.get(arg.evaluated_value) if isinstance(arg, cst.SimpleString) else None  # type: ignore[arg-type]
        if precision is None:
            warnings.append(f"{where}: set_float32_matmul_precision({cst.Module([]).code_for_node(arg)}) has no one fp32_precision; left")
            return None
        done.append(f"{where}: {MATMUL_NEW} = \"{precision}\" in place of set_float32_matmul_precision")
        return [_assign(MATMUL_NEW, cst.SimpleString(f'"{precision}"'))]
    return None
