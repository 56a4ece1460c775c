"""A simulated model: built on the meta device, every parameter and buffer a fake tensor on the
target device, in the dtype a real ``from_pretrained`` would give it (``dtype_plan``). No weight
is read."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

from dtype_doctor.records.errors import InputError, first_line as _first_line


def _simulate(cls: Any, config: Any, torch_dtype: Any, device: str, model_dir: Path) -> tuple[Any, Any]:
    """Build `cls` on meta, then give every parameter and buffer a fake tensor on `device`."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    contexts: list[Any] = [torch.device("meta")]
    try:
        from transformers import initialization as hf_init

        if hasattr(hf_init, "meta_device_safe_creation_ops"):
            contexts.append(hf_init.meta_device_safe_creation_ops())
    except ImportError:  # pragma: no cover - older transformers
        pass
    from contextlib import ExitStack

    try:
        with ExitStack() as stack:
            for c in contexts:
                stack.enter_context(c)
            model = cls._from_config(config, dtype=torch_dtype)
    except Exception as e:
        raise InputError(
            f"{model_dir}: {cls.__name__} could not be built from config.json: {type(e).__name__}: {_first_line(e)}"
        ) from None

    override = dtype_plan(model, torch_dtype)
    persistent_keys = set(model.state_dict().keys())

    def target_dtype(full_name: str, t: Any) -> Any:
        if t.is_floating_point() and full_name in persistent_keys:
            return override(full_name) or t.dtype
        return t.dtype

    def fake_of(t: Any, dtype: Any) -> Any:
        # A dense tensor's empty_like copies its strides: empty_strided gives the same fake tensor
        # from a factory call that the fake mode's cache answers (empty_like of a meta tensor, a
        # non-fake input, bypasses it: five times the cost over a 70B model's 700 parameters).
        if t.is_contiguous():
            return torch.empty_strided(tuple(t.shape), tuple(t.stride()), device=device, dtype=dtype)
        return torch.empty_like(t, device=device, dtype=dtype)

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    memo: dict[int, Any] = {}
    with fake_mode:
        for mod_name, module in model.named_modules(remove_duplicate=False):
            prefix = f"{mod_name}." if mod_name else ""
            for name, p in list(module._parameters.items()):
                if p is None:
                    continue
                if id(p) not in memo:  # tied weights stay one Parameter
                    fake = fake_of(p, target_dtype(prefix + name, p))
                    memo[id(p)] = torch.nn.Parameter(fake, requires_grad=p.requires_grad)
                module._parameters[name] = memo[id(p)]
            for name, b in list(module._buffers.items()):
                if b is None:
                    continue
                if id(b) not in memo:
                    memo[id(b)] = fake_of(b, target_dtype(prefix + name, b))
                module._buffers[name] = memo[id(b)]
    model.eval()
    return model, fake_mode


def dtype_plan(model: Any, dtype: Any) -> Callable[[str], Any]:
    """name → the dtype from_pretrained(dtype=dtype) gives that state-dict key instead, or None.

    transformers' own plan: _keep_in_fp32_modules when loading float16,
    _keep_in_fp32_modules_strict for float16 and bfloat16, matched by a regex *search* on the
    key as transformers.core_model_loading does.
    """
    plan: dict[str, Any] = {}
    if hasattr(model, "_get_dtype_plan"):
        try:
            plan = dict(model._get_dtype_plan(dtype) or {})
        except Exception:  # noqa: BLE001 - no plan means no exceptions to the dtype
            plan = {}
    patterns = [(re.compile(k.replace("*", ".*")), v) for k, v in plan.items()]

    def override(name: str) -> Any:
        return next((dt for pat, dt in patterns if pat.search(name)), None)

    return override
