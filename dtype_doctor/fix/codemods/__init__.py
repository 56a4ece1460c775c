"""Source patches: the fix strategies of docs/commands/fix.md as LibCST codemods on the user's own code.

One class per transformation, each with a one-line DESCRIPTION, constructed with its
parameters and applied with ``apply(source, filename) -> EditResult``. A codemod never
raises and never guesses: when its target is missing, or found more than once where one
is meant, it returns ``skipped`` with the reason; an internal error is ``failed``. Only
the nodes a codemod rewrites change, so every other byte of the file (formatting,
comments, blank lines) comes back exactly as it was and the diff stays minimal.

The modules are split by what they edit:
    casts       the user's preprocessing function: RetargetCast, CastLabelsToLong, CastReturnedValue
    model       a script's model load and conversions: SetLoadDtype, DropLoadDtype, RemoveModelConversion,
                ReplaceModelConversion, KeepTrainableFloat32
    devices     where a tensor is made or last handled: AddDevice, MoveWhereHandled, CastWhereMade
    placement   a model left on the CPU while its batch went to the GPU: MoveModelToBatchDevice,
                one of several models left behind: MoveModelWherePlaced
    precision   a training library's mixed precision: SetMixedPrecision
    tf32        the TF32 switches in one API: Tf32ToNewApi
    scaler      float16 loss scaling: EnableGradScaler (a script's disabled GradScaler switched on), AddGradScaler (one added)
    amp_dtype   the script's autocast in another half dtype: RetargetAutocast
    forward     a script's forward call site: WrapForwardInAutocast, MoveBatchToDevice,
                CastBatch, LabelsToLong
    quant       a script's BitsAndBytesConfig(...): SetConfigKeyword
    fp8         a script's fp8 conversion call: ExcludeFromConversion (its module_filter_fn)
    pipeline    a script's diffusers pipeline set-up: SetUpPipeline (lines before its first call)
    fix_module  no user code to patch: NewFixModule (a new ``dtype_doctor_fix.py``)
    base, context  the contract (EditResult, Codemod, run_codemods) and the LibCST editing context,
                built on dtype_doctor.source.analysis, the one analysis the lineage reads too

No torch import here: the codemods read source text only.
"""

from dtype_doctor.fix.codemods.base import AllOf, Attempt, Codemod, EditResult, normalize_dtype, run_codemods
from dtype_doctor.fix.codemods.casts import CastLabelsToLong, CastReturnedValue, RetargetCast
from dtype_doctor.fix.codemods.fix_module import NewFixModule
from dtype_doctor.fix.codemods.fp8 import ExcludeFromConversion
from dtype_doctor.fix.codemods.forward import CastBatch, LabelsToLong, MoveBatchToDevice, WrapForwardInAutocast
from dtype_doctor.fix.codemods.devices import AddDevice, CastWhereMade, MoveWhereHandled
from dtype_doctor.fix.codemods.model import (
    DropLoadDtype, KeepTrainableFloat32, RegisterBuffer, RemoveModelConversion, ReplaceModelConversion, SetLoadDtype,
)
from dtype_doctor.fix.codemods.pipeline import SetUpPipeline
from dtype_doctor.fix.codemods.placement import MoveModelToBatchDevice, MoveModelWherePlaced
from dtype_doctor.fix.codemods.precision import SetMixedPrecision
from dtype_doctor.fix.codemods.quant import SetConfigKeyword
from dtype_doctor.fix.codemods.amp_dtype import RetargetAutocast
from dtype_doctor.fix.codemods.scaler import AddGradScaler, EnableGradScaler
from dtype_doctor.fix.codemods.tf32 import Tf32ToNewApi

__all__ = [
    "EditResult",
    "AddGradScaler",
    "EnableGradScaler",
    "RetargetAutocast",
    "Codemod",
    "RetargetCast",
    "SetUpPipeline",
    "CastLabelsToLong",
    "CastReturnedValue",
    "AllOf",
    "Attempt",
    "SetLoadDtype",
    "DropLoadDtype",
    "KeepTrainableFloat32",
    "AddDevice",
    "RegisterBuffer",
    "MoveWhereHandled",
    "MoveModelToBatchDevice",
    "MoveModelWherePlaced",
    "CastWhereMade",
    "SetMixedPrecision",
    "Tf32ToNewApi",
    "SetConfigKeyword",
    "ExcludeFromConversion",
    "RemoveModelConversion",
    "ReplaceModelConversion",
    "WrapForwardInAutocast",
    "MoveBatchToDevice",
    "CastBatch",
    "LabelsToLong",
    "NewFixModule",
    "run_codemods",
    "normalize_dtype",
]
