"""PyTorch's messages about simulated tensors, in the words the simulated device would use.

On a CPU-only build simulated CUDA tensors live on `meta` (machine/home.py).
Users never read "meta": a device mismatch reads as CUDA words it ("Expected all tensors to be
on the same device, but found at least two devices, cuda:0 and cpu!"), an op without a fake
implementation is named as a limit of the simulation, and any other "meta" is the device it
stands for.
"""

from __future__ import annotations

import re

_EXPECTED_DEVICE = re.compile(r"Tensor on device (\S+) is not on the expected device (\S+?)!")
_TWO_DEVICES = re.compile(r"found at least two devices, (\S+) and (\S+?)!")
_NO_FAKE = re.compile(r"(\S+?):? attempted to run this operator with Meta tensors, but there was no fake impl or Meta kernel registered.*",
                      re.DOTALL)
_NO_BACKEND = re.compile(r"Could not run '([^']+)' with arguments from the 'Meta' backend.*", re.DOTALL)
_WORD = re.compile(r"(?<![\w-])meta(?![\w-])", re.IGNORECASE)


def as_device(text: str | None, label: str) -> str | None:
    """`text` with the stand-in device `meta` named as `label` ("cuda:0"), in CUDA's wording."""
    if not text or not _WORD.search(text):
        return text

    def name(d: str) -> str:
        return label if d.lower() == "meta" else d

    def two(a: str, b: str) -> str:
        a, b = name(a), name(b)
        first, second = (a, b) if a.startswith("cuda") or not b.startswith("cuda") else (b, a)
        return f"Expected all tensors to be on the same device, but found at least two devices, {first} and {second}!"

    text = _EXPECTED_DEVICE.sub(lambda m: two(m.group(2), m.group(1)), text)
    text = _TWO_DEVICES.sub(lambda m: f"found at least two devices, {two(m.group(1), m.group(2)).split('devices, ', 1)[1]}", text)
    text = _NO_FAKE.sub(lambda m: no_fake_impl(m.group(1)), text)
    text = _NO_BACKEND.sub(lambda m: no_fake_impl(m.group(1)), text)
    return _WORD.sub(label, text)


def no_fake_impl(op: str) -> str:
    return (f"{op} has no fake implementation (torch.library.register_fake), so the simulation cannot run it: "
            "a limit of --simulate, not of the script")


def not_simulated(name: str) -> str:
    return (f"{name} is not simulated (docs/simulation.md lists the CUDA API the simulated GPU cannot answer): "
            "a limit of --simulate, not of the script")
