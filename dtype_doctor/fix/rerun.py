"""Re-run the user's pipeline with a patch before the patch is written.

The patched files are copied into a temporary folder (laid out as under the patch's root),
the batch is built from them as `scan` builds it — the user's preprocess function, or the fix
module's `preprocess` transform — and the fixed model is traced on it. A patch whose pipeline
raises, or still has findings at or above --fail-on, is not the fix.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtype_doctor.records.errors import InputError, UsageError
from dtype_doctor.records.files import write_atomic
from dtype_doctor.fix.outcome import Change
from dtype_doctor.trace.request import TraceRequest


@dataclass(frozen=True)
class PatchedRun:
    """What a re-run needs: the loaded pipeline (`pipeline.Prepared`), the fixed model and how
    the fix traces it, and where the patch's paths are rooted."""

    prepared: Any  # dtype_doctor.pipeline.Prepared
    model: Any  # the fixed pipeline's model (the engine's conversions applied)
    request: TraceRequest
    fail_on: str
    root: Path
    module_file: Path

    def __call__(self, texts: Mapping[Path, str], change: Change | None = None, *, transform: Path | None = None) -> str | None:
        """None when the pipeline with these file texts runs (and, given `change`, brings its
        input to the model in its dtype; without, traces clean); else what goes wrong.
        `transform`: the fix module whose `preprocess` builds the batch, when the patch has one."""
        options = self.prepared.options
        user = self.prepared.batch.preprocess_fn  # the loaded PreprocessFn, None without --preprocess
        user_file = user.path if user is not None else None
        if transform is not None:
            function, mode = (transform, "preprocess"), "transform"
        elif user_file is not None and user_file in texts:
            function, mode = (user_file, user.name), options.preprocess_mode
        else:
            return None  # nothing in the patch changes how the batch is built
        with tempfile.TemporaryDirectory(prefix="dtype-doctor-rerun-") as tmp:
            copies = {file: self._copy(Path(tmp), file, text) for file, text in texts.items()}
            if user_file is not None and user_file not in copies and _under(user_file, self.root):
                # The fix module's transform calls the user's function by its path from the root.
                copies[user_file] = self._copy(Path(tmp), user_file, None)
            spec = f"{copies.get(function[0], function[0])}:{function[1]}"
            return self._run(spec, mode, change)

    def _copy(self, tmp: Path, file: Path, text: str | None) -> Path:
        dest = tmp / (file.resolve().relative_to(self.root) if _under(file, self.root) else file.name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            shutil.copyfile(file, dest)
        else:
            write_atomic(dest, text, what="a patched copy")
        return dest

    def _run(self, spec: str, mode: str, change: Change | None) -> str | None:
        from dtype_doctor.load import build_batch
        from dtype_doctor.load.batch.preprocess import split_spec
        from dtype_doctor.diagnosis import diagnose
        from dtype_doctor.numerics import dtype_name

        p, o = self.prepared, self.prepared.options
        try:
            batch = build_batch(
                p.loaded, p.rows, preprocess=spec, preprocess_mode=mode, dataset_format=o.dataset_format,
                device=p.device, max_length=o.max_length, collator=o.collator, timeout=o.timeout,
            )
        except (InputError, UsageError) as exc:
            return f"does not run: {str(exc).replace(str(Path(split_spec(spec)[0]).parent) + '/', '')}"
        if change is not None:
            value = batch.inputs.get(change.target)
            got = dtype_name(value.dtype) if hasattr(value, "dtype") else None
            if got != change.to:
                return f"{change.target} reaches the model as {got or 'nothing'}, not {change.to}"
            return None
        report = diagnose(self.model, batch.inputs, self.request.with_(lineage=batch.lineage, sources=batch.sources))
        failing = report.at_or_above(self.fail_on)
        if report.trace is not None and report.trace.failure is not None:
            return f"its trace stops: {report.trace.failure.message}"
        if failing:
            first = failing[0]
            return f"still has {len(failing)} finding(s) at or above {self.fail_on}, first {first.code}: {first.message}"
        return None


def _under(file: Path, root: Path) -> bool:
    try:
        file.resolve().relative_to(root)
    except ValueError:
        return False
    return True
