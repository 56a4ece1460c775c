"""An op run again after its error with repaired operands, the way the fix would, so that one
pass names every mismatch (trace/recovery.py builds the repairs).

`RepairedRuns` holds these methods of the Recorder (trace/recorder.py), which inherits them; the
state they read (`predict`, the suspension count) is the Recorder's own.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from dtype_doctor.trace.dispatch import NoTorchFunction

# What a run that found no repair returns: no op's output is this object.
FAILED = object()


class RepairedRuns:
    def _run_repaired(
        self, op_name: str, operand_tensors: list, args: tuple, kwargs: dict, kind: str, run: Callable[[tuple, dict], Any]
    ) -> Any:
        from dtype_doctor.trace.recovery import repair

        attempts = repair(op_name, operand_tensors, args, kwargs, kind)
        while True:
            self._suspended += 1  # the repair's own casts are not the model's ops
            try:
                attempt = next(attempts)
            except StopIteration:
                return FAILED
            except Exception:  # noqa: BLE001 - a repair that cannot be built (e.g. out of meta) is skipped
                continue
            finally:
                self._suspended -= 1
            try:
                return run(*attempt)
            except Exception:  # noqa: BLE001 - try the next repair
                continue

    def _run_as_accepted(self, args: tuple, kwargs: dict, run: Callable[[tuple, dict], Any]) -> Any:
        """An op the real kernel just ran (the probe) whose fake kernel wants other dtypes than any
        repair gives (_grouped_mm's meta kernel takes bfloat16 only; the CPU kernel and CUDA's
        fallback take any float): its output shapes do not depend on the dtype, so it runs with
        the floating operands in a dtype it takes, and its outputs get the real kernel's dtypes."""
        real = getattr(self.predict, "last_output_dtypes", None)
        if not real:
            return FAILED
        from dtype_doctor.trace.recovery import _rebuild

        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            self._suspended += 1
            try:
                with NoTorchFunction():
                    a, k = _rebuild(args, kwargs, lambda t, d=dtype: t.to(d) if t.is_floating_point() and t.dtype != d else t)
            finally:
                self._suspended -= 1
            try:
                out = run(a, k)
            except Exception:  # noqa: BLE001 - not a dtype this fake kernel takes
                continue
            outs = out if isinstance(out, tuple) else (out,)
            if len([o for o in outs if isinstance(o, torch.Tensor)]) != len(real):
                return FAILED
            wanted = iter(real)
            self._suspended += 1
            try:
                with NoTorchFunction():
                    made = tuple(as_dtype(o, next(wanted)) if isinstance(o, torch.Tensor) else o for o in outs)
            finally:
                self._suspended -= 1
            return made if isinstance(out, tuple) else made[0]
        return FAILED


def as_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t if t.dtype == dtype else t.to(dtype)
