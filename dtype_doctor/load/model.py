"""Load a Hugging Face model the way a training script would, or simulate it with fake tensors.

Every check that can fail on bad input runs *before* anything from the model directory is
imported or any weight byte is read: the path, config.json, the class, remote code, the weight
files and their safetensors headers. Errors are one sentence (``InputError`` and subclasses)
naming the file and what to do.

``simulate=True`` reads no weight data at all: the model is built on the meta device and every
parameter and buffer becomes a ``FakeTensor`` (``torch._subclasses.fake_tensor``) on the target
device, in the dtype a real ``from_pretrained`` would have given it (checkpoint dtype for
``"auto"``, ``_keep_in_fp32_modules`` kept in float32 when loading float16, buffers computed at
init in their init dtype). Fake CUDA tensors work on a machine without a GPU.
"""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dtype_doctor.records.errors import InputError, PickleRefusedError, RemoteCodeError, UsageError, first_line as _first_line
from dtype_doctor.machine.placement import ON_CPU, Placement
from dtype_doctor.load.fake_model import _simulate
from dtype_doctor.load.quantize import Quantize, checkpoint_quantization
from dtype_doctor.load.side_objects import _load_side, _module_file
from dtype_doctor.load.lowbit import lowbit_of, target_capability
from dtype_doctor.records import LoadFacts, Loading
from dtype_doctor.records.choices import MODEL_DTYPES

__all__ = ["LoadedModel", "load_model", "MODEL_DTYPES", "resolve_model_dir"]


_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
_SAFETENSORS_DTYPES = {
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to trace, with the objects that prepare its inputs.

    ``model`` is in eval mode. For a simulated load every parameter and buffer is a
    ``FakeTensor`` created under ``fake_mode``; tensors handed to such a model must come from
    the same mode (``fake_mode.from_tensor``).
    """

    model: Any
    config: Any
    path: str  # the resolved model directory
    class_name: str  # the architecture as config.json names it
    tokenizer: Any = None
    image_processor: Any = None
    feature_extractor: Any = None
    processor: Any = None
    dtype: str = "float32"  # the dtype most floating parameter elements have
    simulated: bool = False
    fake_mode: Any = None
    forward_params: tuple[str, ...] = ()
    # extras beyond the brief: what was asked for and what was read
    spec: str = ""  # the MODEL argument as given
    device: str = "cpu"  # where the parameters are (fake ones included)
    requested_dtype: str = "auto"
    weight_files: tuple[str, ...] = ()  # names of the weight files in `path`
    is_encoder_decoder: bool = False
    loading: Loading | None = None  # weights the checkpoint lacked or had extra (a real load only)
    load_facts: LoadFacts | None = None  # the dtype's origin and the attention asked for (target.loaded_dtype)

    @property
    def is_causal_lm(self) -> bool:
        return self.class_name.endswith("ForCausalLM")


def resolve_model_dir(spec: str) -> Path:
    """A local model directory, or the snapshot of a hub id in the local Hugging Face cache."""
    p = Path(spec).expanduser()
    if p.exists():
        if not p.is_dir():
            raise InputError(
                f"{spec} is a file; pass the model directory that holds config.json and the weights"
            )
        return p.resolve()
    if _HUB_ID.match(spec) and not spec.startswith("."):
        try:
            from huggingface_hub import snapshot_download

            snap = snapshot_download(spec, local_files_only=True)
        except Exception:
            snap = None
        if snap and Path(snap).is_dir():
            return Path(snap)
    raise InputError(
        f"{spec} is not a local directory and is not in the Hugging Face cache (no network is used)"
    )


_MAX_CONFIG_BYTES = 16 * 2**20
MAX_MISSING_SHARE = 0.5  # more of the model's weights missing than this: refused, not traced at random


def _read_config(model_dir: Path) -> dict[str, Any]:
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise InputError(
            f"{model_dir} has no config.json; pass a Hugging Face model directory (config.json + model.safetensors)"
        )
    try:
        if cfg_path.stat().st_size > _MAX_CONFIG_BYTES:
            raise InputError(f"{cfg_path} is {cfg_path.stat().st_size:,} bytes; a config.json is a few kB (limit "
                             f"{_MAX_CONFIG_BYTES // 2**20} MiB), so this is not one")
        raw = json.loads(cfg_path.read_text(encoding="utf-8"))
    except RecursionError:
        raise InputError(f"{cfg_path} is nested too deeply to be a model config") from None
    except json.JSONDecodeError as e:
        raise InputError(
            f"{cfg_path} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}; fix or regenerate it"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{cfg_path} cannot be read: {_first_line(e)}") from None
    if not isinstance(raw, dict):
        raise InputError(f"{cfg_path} must hold a JSON object, not {type(raw).__name__}")
    archs = raw.get("architectures")
    if not archs or not isinstance(archs, list) or not isinstance(archs[0], str):
        raise InputError(
            f'{cfg_path} has no "architectures" entry, so the model class is unknown; '
            f'add one, e.g. "architectures": ["BertForSequenceClassification"]'
        )
    return raw


def _auto_map_ref(auto_map: dict[str, Any], arch: str) -> tuple[str, str] | None:
    """(Auto class name, 'module.Class') of the entry that builds `arch`, else the first AutoModel*."""

    def ref_of(v: Any) -> str | None:
        if isinstance(v, (list, tuple)):
            v = next((x for x in v if x), None)
        return v if isinstance(v, str) else None

    entries = [(k, ref_of(v)) for k, v in auto_map.items()]
    entries = [(k, v) for k, v in entries if v]
    for k, v in entries:
        if k.startswith("AutoModel") and v.rsplit(".", 1)[-1] == arch:
            return k, v
    for k, v in entries:
        if k.startswith("AutoModel"):
            return k, v
    return None


def _refuse_remote_code(model_dir: Path, ref: str, what: str = "") -> None:
    raise RemoteCodeError(
        f"{model_dir} needs code from the model repository{what} (auto_map → {_module_file(ref)}); "
        "pass --trust-remote-code to allow it"
    )


def _weight_files(model_dir: Path) -> tuple[list[Path], list[Path]]:
    """(safetensors files, pickled weight files) of the model itself (adapters left out)."""
    safes: list[Path] = []
    pickles: list[Path] = []
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        except (json.JSONDecodeError, OSError, AttributeError) as e:
            raise InputError(f"{index} is not a valid safetensors index: {_first_line(e)}") from None
        for name in sorted(set(weight_map.values())):
            shard = model_dir / name
            if not shard.is_file():
                raise InputError(f"{index} lists {name}, which is missing from {model_dir}; download the full checkpoint")
            safes.append(shard)
    for f in sorted(model_dir.iterdir()):
        if not f.is_file() or f.name.startswith(("adapter_", "training_args", "optimizer", "scheduler")):
            continue
        if f.suffix == ".safetensors" and f not in safes:
            safes.append(f)
        elif f.suffix in _PICKLE_SUFFIXES or f.name == "pytorch_model.bin.index.json":
            if f.suffix == ".bin" and not f.name.startswith("pytorch_model"):
                continue  # e.g. rng states, not weights
            pickles.append(f)
    return safes, pickles


def _check_safetensors(files: list[Path]) -> str | None:
    """Open each header (cheap, no tensor data); the first floating dtype seen, for dtype="auto"."""
    from safetensors import safe_open

    first_float: str | None = None
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                keys = list(st.keys())
                if first_float is None:
                    for k in keys:
                        dt = _SAFETENSORS_DTYPES.get(st.get_slice(k).get_dtype())
                        if dt is not None:
                            first_float = dt
                            break
        except Exception as e:  # SafetensorError, OSError
            raise InputError(
                f"{f} is truncated or not a safetensors file: {_first_line(e)}; download or save it again"
            ) from None
    return first_float


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def _main_dtype(model: Any) -> str:
    from dtype_doctor.numerics import main_dtype

    return main_dtype(model)


def forward_params_of(model: Any) -> tuple[str, ...]:
    """Names model.forward accepts by keyword (not *args / **kwargs)."""
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return ()
    return tuple(
        n
        for n, p in sig.parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n != "self"
    )


# --------------------------------------------------------------------------- main entry


@dataclass(frozen=True)
class _ModelClass:
    """The class config.json names: a transformers class, or (auto_ref set) a custom one of the
    model directory's own code, which is imported only for a simulated load."""

    cls: Any
    auto_ref: tuple[str, str] | None


@dataclass(frozen=True)
class _Weights:
    """The weight files, validated before any is read; `header_dtype` is the safetensors headers' dtype."""

    safes: list[Path]
    pickles: list[Path]
    header_dtype: str | None
    quantized: bool


@dataclass(frozen=True)
class _Attention:
    """The attention implementation config.json asks for and the one traced in its place (None: the one asked)."""

    asked: str | None
    traced: str | None


@dataclass(frozen=True)
class _Built:
    """The model as built: fake (with its mode, no weight files, no loading report) or loaded from its weights."""

    model: Any
    fake_mode: Any
    weight_files: tuple[str, ...]
    loading: Loading | None


def _model_class(model_dir: Path, raw: dict[str, Any], trust_remote_code: bool) -> _ModelClass:
    """The class of `raw`'s architecture, refusing remote code (the model's or its config's)
    before anything is imported."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    arch: str = raw["architectures"][0]
    auto_map = raw.get("auto_map") if isinstance(raw.get("auto_map"), dict) else None
    cls: Any = None
    if arch.isidentifier():
        cand = getattr(transformers, arch, None)
        if isinstance(cand, type) and issubclass(cand, transformers.PreTrainedModel):
            cls = cand
    config_needs_code = bool(raw.get("model_type") not in CONFIG_MAPPING and auto_map and "AutoConfig" in auto_map)
    auto_ref: tuple[str, str] | None = None
    if cls is None:
        if not auto_map:
            raise InputError(
                f"{model_dir / 'config.json'}: architecture {arch!r} is not a class in transformers "
                f"{transformers.__version__} and config.json has no auto_map; fix \"architectures\" or upgrade transformers"
            )
        auto_ref = _auto_map_ref(auto_map, arch)
        if auto_ref is None:
            raise InputError(
                f"{model_dir / 'config.json'}: auto_map has no AutoModel entry for {arch!r}; add one or fix \"architectures\""
            )
        if not trust_remote_code:
            _refuse_remote_code(model_dir, auto_ref[1])
    if config_needs_code and not trust_remote_code:
        _refuse_remote_code(model_dir, auto_map["AutoConfig"], " for its config")  # type: ignore[index]
    return _ModelClass(cls, auto_ref)


def _checked_weights(model_dir: Path, raw: dict[str, Any], *, simulate: bool, quantize: Quantize | None,
                     allow_pickle: bool, dequantized: bool = False) -> _Weights:
    """The weight files, refused before any is read: none (unless simulated), only pickles
    (unless allowed), a quantized model simulated — save one the target dequantizes on load
    (`dequantized`: an MXFP4 checkpoint is a bf16 model there, which the simulation builds)."""
    method = checkpoint_quantization(raw, model_dir)
    quantized = quantize is not None or method is not None
    if quantized and simulate and not dequantized:
        kind = method if quantize is None and method else "bitsandbytes"
        kept = " that keeps its kernels on this target" if method == "mxfp4" else ""
        raise UsageError(f"{model_dir} is quantized ({kind}){kept}; a quantized model is traced with real weights, without --simulate")
    safes, pickles = _weight_files(model_dir)
    header_dtype = _check_safetensors(safes) if safes else None
    if not simulate:
        if not safes and not pickles:
            raise InputError(
                f"{model_dir} has config.json but no weights (model.safetensors); "
                "pass --simulate to trace with fake tensors"
            )
        if not safes and pickles and not allow_pickle:
            names = ", ".join(p.name for p in pickles[:3]) + (", …" if len(pickles) > 3 else "")
            raise PickleRefusedError(
                f"{model_dir} has only pickled weights ({names}), which can run code when loaded; "
                "convert them to model.safetensors, or pass --allow-pickle to load them with torch.load(weights_only=True)"
            )
    return _Weights(safes, pickles, header_dtype, quantized)


def _config(model_dir: Path, arch: str, trust_remote_code: bool) -> Any:
    import transformers

    try:
        return transformers.AutoConfig.from_pretrained(
            str(model_dir), trust_remote_code=trust_remote_code, local_files_only=True
        )
    except Exception as e:
        raise InputError(
            f"{model_dir / 'config.json'} is not a valid {arch} config: {type(e).__name__}: {_first_line(e)}"
        ) from None


def _attention(raw: dict[str, Any], cls: Any, config: Any, dev: str) -> _Attention:
    """flash-attn runs on CUDA GPUs with its package installed: where this machine cannot run it, the
    model is traced with SDPA in its place (set on `config`), and DD701/DD702 judge the implementation asked for."""
    asked = raw.get("attn_implementation") or raw.get("_attn_implementation")
    asked = asked if isinstance(asked, str) else None
    traced = _attention_in_place_of(asked, cls, dev=dev)
    if traced is not None:
        config._attn_implementation = traced
    return _Attention(asked, traced)


def _built_fake(model_dir: Path, found: _ModelClass, config: Any, dtype: str, header_dtype: str | None,
                dev: str) -> _Built:
    """The model on fake tensors, in the dtype from_pretrained would give it; a custom class imported now."""
    import torch

    cls = found.cls
    if found.auto_ref is not None:
        from transformers.dynamic_module_utils import get_class_from_dynamic_module

        try:
            cls = get_class_from_dynamic_module(found.auto_ref[1], str(model_dir), local_files_only=True)
        except Exception as e:
            raise InputError(f"{model_dir}: the custom class {found.auto_ref[1]} could not be imported: {_first_line(e)}") from None
    if dtype == "auto":
        cfg_dtype = getattr(config, "dtype", None)
        if isinstance(cfg_dtype, str):
            cfg_dtype = getattr(torch, cfg_dtype, None)
        torch_dtype = cfg_dtype or (_torch_dtype(header_dtype) if header_dtype else torch.get_default_dtype())
    else:
        torch_dtype = _torch_dtype(dtype)
    model, fake_mode = _simulate(cls, config, torch_dtype, dev, model_dir)
    return _Built(model, fake_mode, (), None)


def _built_real(model_dir: Path, found: _ModelClass, config: Any, dtype: str, weights: _Weights, *,
                trust_remote_code: bool, quantize: Quantize | None, dev: str, attention: str | None) -> _Built:
    """The model loaded from its weights (after checking they fit `dev`), in eval mode, on `dev`."""
    from dtype_doctor.load.memory import check_fits, estimate

    check_fits(model_dir, estimate(weights.safes, found.cls, config, dtype, weights.header_dtype), dev)
    model, info = _real_load(model_dir, found.cls, found.auto_ref, config, dtype, weights.safes, weights.pickles,
                             trust_remote_code, quantize=quantize, device=dev if weights.quantized else None,
                             attention=attention)
    weight_files = tuple(p.name for p in (weights.safes or weights.pickles))
    loading = loading_report(model_dir, weight_files, model, info)
    model.eval()
    if dev != "cpu" and not weights.quantized:  # a quantized model was dispatched by device_map
        model.to(dev)
    return _Built(model, None, weight_files, loading)


def load_model(
    spec: str,
    *,
    dtype: str = "auto",
    trust_remote_code: bool = False,
    placement: Placement = ON_CPU,
    allow_pickle: bool = False,
    quantize: Quantize | None = None,
    target: Placement | None = None,
) -> LoadedModel:
    """Load the model at `spec` (a directory or a cached hub id) and what sits beside it.

    Raises ``InputError`` (or ``RemoteCodeError`` / ``PickleRefusedError``) for input that
    cannot be loaded and ``UsageError`` for a bad ``dtype``; nothing from the model directory is
    imported before the checks pass. `placement` is the entry's decision: the model is loaded onto
    its device, as fake tensors when simulated; `target` the machine the step is for, when a
    simulated model is built elsewhere (scan builds it on the CPU for a CUDA target).
    """
    simulate = placement.simulated
    if dtype not in MODEL_DTYPES:
        raise UsageError(f"dtype {dtype!r} is not one of {', '.join(MODEL_DTYPES)}")
    model_dir = resolve_model_dir(spec)
    raw = _read_config(model_dir)
    arch: str = raw["architectures"][0]
    found = _model_class(model_dir, raw, trust_remote_code)
    lowbit = lowbit_of(raw, model_dir, target_capability(target or placement))
    weights = _checked_weights(model_dir, raw, simulate=simulate, quantize=quantize, allow_pickle=allow_pickle,
                               dequantized=lowbit is not None and lowbit.dequantized)
    side = _load_side(model_dir, trust_remote_code)  # remote code refused there too
    config = _config(model_dir, arch, trust_remote_code)
    dev = placement.device or "cpu"
    attention = _attention(raw, found.cls, config, dev)
    if simulate:
        built = _built_fake(model_dir, found, config, dtype, weights.header_dtype, dev)
    else:
        built = _built_real(model_dir, found, config, dtype, weights, trust_remote_code=trust_remote_code,
                            quantize=quantize, dev=dev, attention=attention.traced)
    model = built.model
    return LoadedModel(
        model=model,
        config=model.config if hasattr(model, "config") else config,
        path=str(model_dir),
        class_name=arch if found.auto_ref is not None else type(model).__name__,
        tokenizer=side["tokenizer"],
        image_processor=side["image_processor"],
        feature_extractor=side["feature_extractor"],
        processor=side["processor"],
        dtype=_main_dtype(model),
        simulated=simulate,
        fake_mode=built.fake_mode,
        forward_params=forward_params_of(model),
        spec=spec,
        device=dev,
        requested_dtype=dtype,
        weight_files=built.weight_files,
        is_encoder_decoder=bool(getattr(config, "is_encoder_decoder", False)),
        loading=built.loading,
        load_facts=replace(load_facts(_main_dtype(model), dtype, raw, weights.header_dtype, attention.asked, attention.traced),
                           lowbit=lowbit),
    )


def load_facts(loaded: str, asked: str, raw: dict[str, Any], header_dtype: str | None, attn: str | None,
               traced_attn: str | None) -> LoadFacts:
    """Where the loaded dtype came from (scan's --dtype auto is from_pretrained's default: nothing asked),
    and what transformers 4, whose default was torch's float32, would have loaded for the same call."""
    import transformers

    config_dtype = raw.get("dtype") or raw.get("torch_dtype")
    config_dtype = config_dtype if isinstance(config_dtype, str) else None
    named = None if asked == "auto" else asked
    if named is not None:
        origin, v4 = "argument", named
    elif config_dtype is not None:
        origin, v4 = "config", "float32"
    elif header_dtype is not None:
        origin, v4 = "checkpoint", "float32"
    else:
        origin, v4 = "default", "float32"
    return LoadFacts(loaded, origin, named, config_dtype, header_dtype, f"transformers {transformers.__version__}", v4,
                     attn, "config" if attn else None, traced_attn)


def _attention_in_place_of(asked: str | None, cls: Any, *, dev: str) -> str | None:
    """The implementation to trace with when `asked` is flash-attn's and this machine cannot run it, else None."""
    if asked is None or not asked.startswith("flash_attention"):
        return None
    import importlib.util

    package = "flash_attn" if asked == "flash_attention_2" else "flash_attn_interface"
    if dev.startswith("cuda") and importlib.util.find_spec(package) is not None:
        return None  # a real GPU with the package: traced as asked
    return "sdpa" if cls is None or getattr(cls, "_supports_sdpa", False) else "eager"


def loading_report(model_dir: Path, weight_files: tuple[str, ...], model: Any, info: Any) -> Loading | None:
    """transformers' load report as a record; InputError when most of the model's weights are missing
    (the checkpoint belongs to another architecture), so a random model is never traced as the user's."""
    info = info if isinstance(info, dict) else {}
    missing = tuple(sorted(str(k) for k in info.get("missing_keys") or ()))
    unexpected = tuple(sorted(str(k) for k in info.get("unexpected_keys") or ()))
    if not missing and not unexpected:
        return None
    expected = len(model.state_dict())
    files = ", ".join(str(model_dir / f) for f in weight_files) or f"{model_dir}'s checkpoint"
    loading = Loading(files, expected, missing, unexpected)
    if loading.missing_share > MAX_MISSING_SHARE:
        arch = type(model).__name__
        raise InputError(
            f"{model_dir}/{weight_files[0] if len(weight_files) == 1 else ''}".rstrip("/")
            + f" holds {expected - len(missing)} of the {expected} weights {arch} needs; the rest would be random, "
            "so a trace would describe a model you do not have (check \"architectures\" in config.json)"
        )
    return loading


def _real_load(
    model_dir: Path,
    cls: Any,
    auto_ref: tuple[str, str] | None,
    config: Any,
    dtype: str,
    safes: list[Path],
    pickles: list[Path],
    trust_remote_code: bool,
    *,
    quantize: Quantize | None = None,
    device: str | None = None,
    attention: str | None = None,
) -> Any:
    import torch
    import transformers

    loader = getattr(transformers, auto_ref[0]) if auto_ref is not None else cls
    kwargs: dict[str, Any] = {"dtype": dtype, "local_files_only": True}
    if attention is not None:
        kwargs["attn_implementation"] = attention
    if quantize is not None:
        kwargs["quantization_config"] = quantize.config()
    if device is not None:  # bitsandbytes quantizes as the weights land on their device
        kwargs["device_map"] = {"": device}
    if trust_remote_code:
        kwargs["trust_remote_code"] = True
    try:
        if safes:
            return loader.from_pretrained(str(model_dir), use_safetensors=True, output_loading_info=True, **kwargs)
        if any(p.name.startswith("pytorch_model") for p in pickles):
            return loader.from_pretrained(str(model_dir), use_safetensors=False, output_loading_info=True, **kwargs)
        # a bare *.pt / *.pth state dict next to config.json
        if len(pickles) > 1:
            raise InputError(
                f"{model_dir} has several pickled weight files ({', '.join(p.name for p in pickles)}); keep one or convert to model.safetensors"
            )
        try:
            sd = torch.load(str(pickles[0]), map_location="cpu", weights_only=True)
        except Exception as e:
            raise InputError(
                f"{pickles[0]} is not a state dict torch.load(weights_only=True) can read: {_first_line(e)}"
            ) from None
        for key in ("state_dict", "model_state_dict", "model"):
            if isinstance(sd, dict) and isinstance(sd.get(key), dict):
                sd = sd[key]
        if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
            raise InputError(f"{pickles[0]} does not hold a state dict of tensors; save model.state_dict() or model.safetensors")
        return loader.from_pretrained(None, config=config, state_dict=sd, output_loading_info=True, **kwargs)
    except InputError:
        raise
    except Exception as e:
        name = auto_ref[1] if auto_ref else cls.__name__
        mismatch = _size_mismatch(e)
        if mismatch:
            raise InputError(f"{model_dir} could not be loaded as {name}: {mismatch}") from None
        raise InputError(f"{model_dir} could not be loaded as {name}: {type(e).__name__}: {_first_line(e)}") from None


def _size_mismatch(exc: BaseException) -> str | None:
    """The weights whose shapes do not match config.json, from transformers' load report.

    transformers 5 logs a report table (silenced by the CLI) and raises "You set
    `ignore_mismatched_sizes` to `False` ... look at the above report!", which alone names
    nothing; the mismatched keys are still in the raising frame's `loading_info`."""
    tb = exc.__traceback__
    keys = None
    while tb is not None:
        info = tb.tb_frame.f_locals.get("loading_info")
        keys = getattr(info, "mismatched_keys", None) or keys
        tb = tb.tb_next
    if not keys:
        return None
    try:
        rows = sorted(keys)
        key, ckpt, model = rows[0]
        more = f" (and {len(rows) - 1} more)" if len(rows) > 1 else ""
        return (
            f"the weights do not match config.json: {key} has shape {list(ckpt)} in the checkpoint "
            f"but {list(model)} in the model config.json describes{more}"
        )
    except (TypeError, ValueError):
        return None
