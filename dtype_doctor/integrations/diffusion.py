"""A diffusers pipeline, traced as one step (the engine is dtype_doctor.diffusion).

    from dtype_doctor.integrations.diffusion import diagnose_pipeline
    report = diagnose_pipeline(pipe, prompt="a photo of a cat")
    report.target.components      # each component's class, dtype and device
"""

from __future__ import annotations

from dtype_doctor.diffusion import PipelineComponents, diagnose_pipeline, modules_of

__all__ = ["PipelineComponents", "diagnose_pipeline", "modules_of"]
