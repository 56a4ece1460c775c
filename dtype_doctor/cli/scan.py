"""`dtype-doctor scan MODEL DATASET`."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from dtype_doctor.cli import options as o

Checkpoint = Annotated[Optional[str], typer.Option(
    "--checkpoint", metavar="PATH", rich_help_panel=o.DATA,
    help="A checkpoint to compare with MODEL's dtypes (DD406): a .safetensors file or folder, a torch checkpoint "
         "(read with weights_only=True onto the meta device), or a DCP folder; its tensors are not loaded.")]

EXAMPLES = """
Examples:

\b
  dtype-doctor scan fixtures/demo/model fixtures/demo/data

\b
  dtype-doctor scan ./my-model ./data.parquet --dtype float16 \\
      -o report.json -o results.sarif

\b
  dtype-doctor scan ./my-model ./images --preprocess prep.py:transform \\
      --simulate --device cuda

\b
  dtype-doctor scan ./my-sd-pipeline --prompt "a cat" --dtype float16

\b
  dtype-doctor scan ./my-model ./data --dtype bfloat16 --checkpoint ckpt.pt
"""


@o.flat()
def scan_command(model: o.Model, dataset: o.MaybeDataset = None, *, prompt: o.Prompt = None, checkpoint: Checkpoint = None,
                 batch: o.Batch,
                 loading: o.Loading, machine: o.Machine, step: o.Step, findings: o.Findings, outputs: o.Outputs,
                 general: o.General) -> None:
    """Trace one batch through MODEL and report every dtype and device mismatch.

    MODEL may be a diffusers pipeline folder (model_index.json): one denoising step is traced
    (text encoder, UNet or transformer, one scheduler step, VAE decode), called with --prompt.
    """
    from dtype_doctor.cli.reporting import Reporting, check_model_and_dataset, check_pipeline_folder, libraries, pipeline_folder

    folder = pipeline_folder(model, dataset, prompt)
    if folder:
        options = check_pipeline_folder(model, dataset, batch, loading, machine, step, findings, general)
    else:
        options = check_model_and_dataset(model, dataset, batch, loading, machine, step, findings, general)
    saved = None
    if checkpoint is not None:  # read (its header, its metadata) before the scan: a bad path fails fast
        from dtype_doctor.load.checkpoint import saved_dtypes

        saved = saved_dtypes(checkpoint)
    reporting = Reporting.prepare(outputs, findings, model=model, dataset=dataset, preprocess=batch.preprocess,
                                  config=general.config)
    with libraries(outputs) as say:
        if folder:
            from dtype_doctor.cli.reporting import quiet_diffusers
            from dtype_doctor.integrations.diffusers_folder import scan_pipeline

            quiet_diffusers(outputs)
            report = scan_pipeline(model, dataset, options, prompt=prompt, progress=say)
        else:
            from dtype_doctor.pipeline import scan

            report = scan(model, dataset, options, progress=say)
    if saved is not None:
        from dtype_doctor.diagnosis import with_checkpoint

        report = with_checkpoint(report, saved, select=findings.select, ignore=findings.ignore)
    report = reporting.finish(report)
    raise typer.Exit(reporting.exit_code(report))
