"""A script's `TrainingArguments(fp16=..., bf16=..., fsdp=..., deepspeed=...)`, read as a launch configuration.

While `run` runs the script, `TrainingArguments.__post_init__` (patched when transformers' training_args
module is imported) reads the instance's precision settings before transformers validates them, so a
configuration transformers refuses is known too. What the arguments become at launch is asked of the
libraries themselves, as for a launcher line (run/launchers.py): transformers' own `__post_init__`
("At most one of fp16 and bf16 can be True, but not both"), accelerate's
`DeepSpeedPlugin.set_mixed_precision` for the precision against the DeepSpeed JSON (what Trainer's
Accelerator raises), DeepSpeed's both-modes condition. DeepSpeed is not installed here: where the
script names a DeepSpeed config, its arguments are validated without it (`deepspeed` left None, as
`fake_launch` gives a fake process group), so the script goes on to its step as a DeepSpeed-less
Trainer, and the configuration is judged from the JSON.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Any, Callable

from dtype_doctor.records import LaunchConfig

MODULE = "transformers.training_args"
BOTH = "At most one of fp16 and bf16 can be True"  # transformers' TrainingArguments._validate_args


class TrainerArgsWatch:
    """`with TrainerArgsWatch(launch) as w:` — w.launch is the launch with the script's TrainingArguments folded in
    (None while the script made none); w.refused is what transformers raised for them, if it did."""

    def __init__(self, base: LaunchConfig | None, simulate: bool = False) -> None:
        self.base = base
        self.simulate = simulate  # only a simulated run stands in for a DeepSpeed this machine lacks
        self.launch: LaunchConfig | None = None
        self.refused: str | None = None
        self.refused_error: BaseException | None = None  # the ValueError itself: the script's end only if it ended on it
        self._hook: Any = None
        self._restore: Callable[[], None] = lambda: None

    def __enter__(self) -> "TrainerArgsWatch":
        from dtype_doctor.machine.libraries import after_import

        self._hook = after_import(MODULE, self._patch)
        return self

    def __exit__(self, *exc: Any) -> None:
        import sys

        if self._hook is not None and self._hook in sys.meta_path:
            sys.meta_path.remove(self._hook)
        self._restore()

    def _patch(self, module: Any) -> None:
        cls = getattr(module, "TrainingArguments", None)
        if cls is None:
            return
        original = cls.__dict__.get("__post_init__")
        if original is None:  # another transformers' layout: leave the class as it is
            return
        watch = self

        def __post_init__(args: Any) -> None:
            watch.observe(args, original)

        cls.__post_init__ = __post_init__

        def restore() -> None:
            cls.__post_init__ = original

        self._restore = restore

    def observe(self, args: Any, original: Callable[[Any], None]) -> None:
        """Read `args` as given, then let transformers validate them (without a DeepSpeed it cannot import here)."""
        ds = args.deepspeed
        try:
            self.launch = trainer_launch(self.base, bool(args.fp16), bool(args.bf16), bool(args.fsdp), ds)
            read = True
        except Exception:  # noqa: BLE001 - a JSON the doctor cannot read is transformers' to refuse, in the script's own words
            self.launch = trainer_launch(self.base, bool(args.fp16), bool(args.bf16), bool(args.fsdp), None)
            read = False
        if self.simulate and ds and read and importlib.util.find_spec("deepspeed") is None:
            # Simulating the cluster: transformers would require the package; the JSON is judged above. A real
            # run keeps the script's own arguments, and fails where the script alone fails.
            args.deepspeed = None
        try:
            original(args)
        except ValueError as exc:
            message = str(exc).splitlines()[0]
            if BOTH in message:
                self.refused, self.refused_error = message, exc
                self.launch = dataclasses.replace(self.launch, refused=(*self.launch.refused, ("transformers", message)))
            raise


def trainer_launch(base: LaunchConfig | None, fp16: bool, bf16: bool, fsdp: bool, deepspeed: Any) -> LaunchConfig:
    """The launch a script's TrainingArguments make: their precision over the launcher's, their DeepSpeed JSON read."""
    from dtype_doctor.run.launchers import read_deepspeed, with_deepspeed

    mixed = "fp16" if fp16 else "bf16" if bf16 else None
    launch = base or LaunchConfig("python", 1)
    launch = dataclasses.replace(
        launch, mixed_precision=mixed or launch.mixed_precision,
        distributed="deepspeed" if deepspeed else "fsdp" if fsdp else launch.distributed,
        deepspeed_config=(deepspeed if isinstance(deepspeed, str) and not deepspeed.lstrip().startswith("{")
                          else "TrainingArguments(deepspeed={...})") if deepspeed else launch.deepspeed_config,
        trainer_args=True,
    )
    if deepspeed:
        if isinstance(deepspeed, str) and deepspeed.lstrip().startswith("{"):  # a JSON string, as transformers takes it
            import json

            deepspeed = json.loads(deepspeed)
        launch = with_deepspeed(launch, dict(deepspeed) if isinstance(deepspeed, dict) else read_deepspeed(deepspeed, None))
    return launch


def refused_report(launch: LaunchConfig, label: str, where: str, select: Any = None, ignore: Any = None, simulated: bool = False) -> Any:
    """The report of a script that stopped at TrainingArguments(...), before any model was called: no step
    was traced, and the launch configuration's findings are all there is to say."""
    import torch

    from dtype_doctor.diagnosis import report_from_trace
    from dtype_doctor.machine.placement import CUDA0
    from dtype_doctor.records import Coverage, ModelInfo, Subject, Trace
    from dtype_doctor.trace.request import TraceRequest

    stopped = f"at {where}: transformers refuses the TrainingArguments before a model is called"
    trace = Trace(ops=(), modules=(), model=ModelInfo("TrainingArguments", ()), inputs=(), launch=launch,
                  device=CUDA0 if simulated else "cpu", simulated=simulated,
                  coverage=Coverage(phases=(), expected=("forward",), modules_called=0, modules_total=0, ops=0, steps=0, stopped=stopped))
    request = TraceRequest(select=select, ignore=ignore, subject=Subject(model=label))
    return report_from_trace(trace, torch.nn.Module(), request)
