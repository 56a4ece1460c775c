"""dtype-doctor: every dtype and device mismatch in a PyTorch / Hugging Face pipeline, in one pass.

    import dtype_doctor
    report = dtype_doctor.diagnose(model, inputs)
    with dtype_doctor.watch(model) as w:
        model(**batch).loss.backward()
    w.report
    table = dtype_doctor.compare(model, inputs)   # fp32 vs autocast vs half, measured

Importing the package does not import torch; the engine loads on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["diagnose", "watch", "compare", "fake_world", "Report", "Finding", "Trace", "__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from dtype_doctor.compare import compare
    from dtype_doctor.records import Finding, Report, Trace
    from dtype_doctor.diagnosis import diagnose, watch
    from dtype_doctor.trace.world import fake_world

_LAZY = {
    "diagnose": ("dtype_doctor.diagnosis", "diagnose"),
    "watch": ("dtype_doctor.diagnosis", "watch"),
    "fake_world": ("dtype_doctor.trace.world", "fake_world"),  # rank 0 of N on torch's fake process group
    # The package itself: it is callable, so dtype_doctor.compare(model, inputs) works before
    # and after anything imports dtype_doctor.compare.<module> (which sets this attribute).
    "compare": ("dtype_doctor.compare", None),
    "Report": ("dtype_doctor.records", "Report"),
    "Finding": ("dtype_doctor.records", "Finding"),
    "Trace": ("dtype_doctor.records", "Trace"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        imported = importlib.import_module(module)
        return imported if attr is None else getattr(imported, attr)
    raise AttributeError(f"module 'dtype_doctor' has no attribute {name!r}")
