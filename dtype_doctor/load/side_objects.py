"""The objects that sit beside a model and prepare its inputs: tokenizer, image processor, feature
extractor and processor, loaded as a training script loads them. A file that needs code from the
model repository is refused without --trust-remote-code, before anything is imported."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from dtype_doctor.records.errors import InputError, RemoteCodeError, first_line as _first_line


# config files that sit beside a model and the objects they describe
_TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")
_PREPROCESSOR_FILE = "preprocessor_config.json"
_PROCESSOR_FILE = "processor_config.json"


def _module_file(ref: str) -> str:
    """'repo--modeling_x.MyModel' / 'modeling_x.MyModel' → 'modeling_x.py'."""
    ref = ref.split("--")[-1]
    return ref.rsplit(".", 1)[0] + ".py"


def _has_auto_map(path: Path) -> str | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path} is not valid JSON: {_first_line(e)}; fix or remove it") from None
    amap = data.get("auto_map") if isinstance(data, dict) else None
    if not amap:
        return None
    if isinstance(amap, dict):
        for v in amap.values():
            if isinstance(v, (list, tuple)):
                v = next((x for x in v if x), None)
            if isinstance(v, str):
                return v
    return "custom code"


def _preprocessor_kind(path: Path) -> str:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path} is not valid JSON: {_first_line(e)}; fix or remove it") from None
    if not isinstance(data, dict):
        return "image"
    if "image_processor_type" in data or "video_processor_type" in data:
        return "image"
    if "feature_extractor_type" in data:
        return "feature"
    return "image" if any(k in data for k in ("do_resize", "crop_size", "image_mean")) else "feature"


def _check_json(file: Path, what: str) -> None:
    """A JSON file beside the model that is not JSON is named itself, not the file that points to it."""
    if not file.is_file():
        return
    try:
        json.loads(file.read_text(encoding="utf-8"))
    except RecursionError:
        raise InputError(f"{file} is nested too deeply to be a {what} file") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{file} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}; fix or regenerate it") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{file} cannot be read: {_first_line(e)}") from None


def _load_side(model_dir: Path, trust_remote_code: bool) -> dict[str, Any]:
    """Tokenizer, image processor, feature extractor and processor found beside the model."""
    import transformers

    out: dict[str, Any] = {"tokenizer": None, "image_processor": None, "feature_extractor": None, "processor": None}
    d = str(model_dir)

    def guarded(file: Path, what: str) -> None:
        ref = _has_auto_map(file)
        if ref and not trust_remote_code:
            raise RemoteCodeError(
                f"{file} needs code from the model repository for its {what} (auto_map → "
                f"{_module_file(ref) if ref != 'custom code' else ref}); pass --trust-remote-code to allow it"
            )

    def load(file: Path, what: str, fn: Any, **kw: Any) -> Any:
        guarded(file, what)
        try:
            return fn(d, trust_remote_code=trust_remote_code, local_files_only=True, **kw)
        except (RemoteCodeError, InputError):
            raise
        except Exception as e:
            raise InputError(
                f"{file} could not be loaded as a {what}: {type(e).__name__}: {_first_line(e)}"
            ) from None

    if (model_dir / _PROCESSOR_FILE).is_file():
        out["processor"] = load(model_dir / _PROCESSOR_FILE, "processor", transformers.AutoProcessor.from_pretrained)
    tok_file = next((model_dir / f for f in _TOKENIZER_FILES if (model_dir / f).is_file()), None)
    if tok_file is not None:
        _check_json(model_dir / "tokenizer.json", "tokenizer")
        cfg_file = model_dir / "tokenizer_config.json"
        out["tokenizer"] = load(
            cfg_file if cfg_file.is_file() else tok_file, "tokenizer", transformers.AutoTokenizer.from_pretrained
        )
    pre = model_dir / _PREPROCESSOR_FILE
    if pre.is_file():
        if _preprocessor_kind(pre) == "image":
            kw: dict[str, Any] = {}
            if importlib.util.find_spec("torchvision") is None:
                kw["backend"] = "pil"  # v5's default backend needs torchvision
            try:
                out["image_processor"] = load(pre, "image processor", transformers.AutoImageProcessor.from_pretrained, **kw)
            except InputError:
                if not kw:
                    raise
                out["image_processor"] = load(pre, "image processor", transformers.AutoImageProcessor.from_pretrained)
        else:
            out["feature_extractor"] = load(
                pre, "feature extractor", transformers.AutoFeatureExtractor.from_pretrained
            )
    proc = out["processor"]
    if proc is not None:
        for attr in ("tokenizer", "image_processor", "feature_extractor"):
            if out[attr] is None and getattr(proc, attr, None) is not None:
                out[attr] = getattr(proc, attr)
    return out
