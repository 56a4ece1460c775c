"""Launcher command lines: `accelerate launch [...] train.py` and `torchrun [...] train.py`.

The launcher's own argument parser reads the line (accelerate's `launch_command_parser`,
torch's `torch.distributed.run.get_args_parser`), and accelerate's own config reader
(`load_config_from_file`) reads its YAML; a DeepSpeed JSON it names is read for its
fp16/bf16 blocks, ZeRO stage and offload. What accelerate and DeepSpeed refuse at launch for
that configuration is asked of accelerate itself (`DeepSpeedPlugin.set_mixed_precision`) and,
DeepSpeed not being a dependency, of DeepSpeed's condition as its source states it
(deepspeed/runtime/config.py asserts "bfloat16 and fp16 modes cannot be simultaneously enabled").
The script is then run as rank 0 of the launcher's world on torch's fake process group
(trace/world.py `fake_launch`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from dtype_doctor.records.errors import InputError, UsageError
from dtype_doctor.records import LaunchConfig

DEEPSPEED_BOTH = "bfloat16 and fp16 modes cannot be simultaneously enabled"


def split_launcher(words: list[str], gpus: int = 1) -> tuple[list[str], LaunchConfig | None]:
    """(the script's words, the launch) for a launcher line; (words, None) for a plain python line."""
    rest = words[1:] if words and words[0] == "--" else list(words)
    if not rest:
        return list(words), None
    head = Path(rest[0]).name
    if head == "accelerate" and rest[1:2] == ["launch"]:
        from dtype_doctor.machine.device_map import require_accelerate

        require_accelerate("accelerate launch")
        return _accelerate(rest[2:], gpus)
    if head == "torchrun":
        return _torchrun(rest[1:], gpus)
    if head.startswith("python") and rest[1:3] == ["-m", "torch.distributed.run"]:
        return _torchrun(rest[3:], gpus)
    return list(words), None


def _parse(parser: Any, words: list[str], what: str) -> Any:
    try:
        return parser.parse_args(words)
    except SystemExit:
        raise UsageError(f"{what}: cannot read this command line (see '{what} --help')") from None


def _script(module: bool, script: str, args: list[str]) -> list[str]:
    return ["python", "-m", script, *args] if module else ["python", script, *args]


def _torchrun(words: list[str], gpus: int) -> tuple[list[str], LaunchConfig]:
    from torch.distributed.run import get_args_parser

    args = _parse(get_args_parser(), words, "torchrun")
    nproc = str(args.nproc_per_node)
    per_node = int(nproc) if nproc.isdigit() else gpus  # "gpu"/"auto": the GPUs the machine has
    nodes = int(str(args.nnodes).split(":")[-1])
    launch = LaunchConfig("torchrun", per_node * nodes)
    return _script(args.module, args.training_script, list(args.training_script_args)), launch


def _accelerate(words: list[str], gpus: int) -> tuple[list[str], LaunchConfig]:
    from accelerate.commands.launch import launch_command_parser

    args = _parse(launch_command_parser(), words, "accelerate launch")
    config: Any = None
    if args.config_file:
        from accelerate.commands.config.config_args import load_config_from_file

        try:
            config = load_config_from_file(args.config_file)
        except (OSError, ValueError, TypeError) as exc:
            raise InputError(f"{args.config_file}: accelerate cannot read it ({type(exc).__name__}: {exc})") from None
    mixed = args.mixed_precision or (str(_value(config, "mixed_precision")) if _value(config, "mixed_precision") else None)
    processes = args.num_processes or _value(config, "num_processes") or gpus
    distributed_type = str(_value(config, "distributed_type") or "").lower()
    ds_settings = dict(_value(config, "deepspeed_config") or {})
    use_deepspeed = bool(args.use_deepspeed) or "deepspeed" in distributed_type
    use_fsdp = bool(args.use_fsdp) or "fsdp" in distributed_type
    ds_file = args.deepspeed_config_file or ds_settings.get("deepspeed_config_file")
    launch = LaunchConfig(
        "accelerate", int(processes), mixed,
        "deepspeed" if use_deepspeed else "fsdp" if use_fsdp else ("multi_gpu" if int(processes) > 1 else None),
        args.config_file, ds_file, zero_stage=ds_settings.get("zero_stage"),
        offload=tuple(f"{what}:{dev}" for what in ("optimizer", "param")
                      if (dev := ds_settings.get(f"offload_{what}_device")) not in (None, "none")),
    )
    if use_deepspeed and ds_file:
        launch = with_deepspeed(launch, read_deepspeed(ds_file, args.config_file))
    return _script(args.module, args.training_script, list(args.training_script_args)), launch


def _value(config: Any, name: str) -> Any:
    return getattr(config, name, None) if config is not None else None


def read_deepspeed(path: str, relative_to: str | None) -> dict[str, Any]:
    """A DeepSpeed JSON, found as given or beside the accelerate config `relative_to` names."""
    file = Path(path)
    if not file.is_file() and relative_to:
        file = Path(relative_to).parent / path
    from dtype_doctor.records.files import read_json_object

    return read_json_object(file, str(path), "the DeepSpeed config")


def _enabled(block: Any) -> str | None:
    if not isinstance(block, dict) or "enabled" not in block:
        return None
    return str(block["enabled"]).lower()


def with_deepspeed(launch: LaunchConfig, ds: dict[str, Any]) -> LaunchConfig:
    """The launch with a DeepSpeed JSON's precision, ZeRO stage and offload, and what is refused for them."""
    import dataclasses

    fp16, bf16 = _enabled(ds.get("fp16")), _enabled(ds.get("bf16", ds.get("bfloat16")))
    zero = ds.get("zero_optimization") if isinstance(ds.get("zero_optimization"), dict) else {}
    offload = tuple(f"{what}:{block.get('device')}" for what in ("optimizer", "param")
                    if isinstance(block := zero.get(f"offload_{what}"), dict) and block.get("device") not in (None, "none"))
    refused: list[tuple[str, str]] = []
    if launch.mixed_precision and launch.mixed_precision != "no":
        from accelerate.utils import DeepSpeedPlugin

        try:
            plugin = DeepSpeedPlugin(hf_ds_config=json.loads(json.dumps(ds)))
        except Exception:  # noqa: BLE001 - a config accelerate refuses for another reason (no ZeRO block): not a precision verdict
            plugin = None
        if plugin is not None:
            try:
                plugin.set_mixed_precision(launch.mixed_precision)
            except ValueError as exc:
                refused.append(("accelerate", str(exc).splitlines()[0]))
    if fp16 == "true" and bf16 == "true":
        refused.append(("deepspeed", DEEPSPEED_BOTH))
    return dataclasses.replace(
        launch, ds_fp16=fp16, ds_bf16=bf16, zero_stage=zero.get("stage", launch.zero_stage),
        offload=offload or launch.offload, refused=tuple(refused),
    )


def launch_env(launch: LaunchConfig) -> dict[str, str]:
    """What the launcher puts in rank 0's environment (torchrun's RANK/WORLD_SIZE..., accelerate's ACCELERATE_*)."""
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(launch.processes), "LOCAL_WORLD_SIZE": str(launch.processes),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": os.environ.get("MASTER_PORT", "29500")}
    if launch.launcher == "accelerate":
        if launch.mixed_precision:
            env["ACCELERATE_MIXED_PRECISION"] = launch.mixed_precision
        if launch.distributed == "deepspeed":
            env["ACCELERATE_USE_DEEPSPEED"] = "true"
            if launch.deepspeed_config:
                env["ACCELERATE_DEEPSPEED_CONFIG_FILE"] = launch.deepspeed_config
        elif launch.distributed == "fsdp":
            env["ACCELERATE_USE_FSDP"] = "true"
    return env
