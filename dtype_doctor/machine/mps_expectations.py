"""What Apple's MPS backend refuses, read from PyTorch's own expectations shipped with torch.

`torch/testing/_internal/common_mps.py` lists, per OpInfo name, the dtypes MPS does not
implement (UNIMPLEMENTED_XFAILLIST), those that fail only before a macOS version
(MACOS_BEFORE_14_4_XFAILLIST), the ops that take complex (SUPPORTED_COMPLEX_OPS), and fails
float64/complex128 for every op. Its tables are local to a function defined only where MPS is
available, so they are read from its source with `ast`, never imported: this module runs on any
machine. The macOS facts come from the MPS sources (cited where each is defined).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# aten/src/ATen/native/mps/OperationUtils.mm getMPSDataType / Copy.mm: "Cannot convert a MPS Tensor to
# float64 dtype as the MPS framework doesn't support float64. Please use float32 instead."
# common_mps.py fails torch.double and torch.cdouble for every op of op_db.
NEVER = frozenset({"float64", "complex128"})
FLOAT64_ERROR = ("Cannot convert a MPS Tensor to float64 dtype as the MPS framework doesn't support float64. "
                 "Please use float32 instead.")
# aten/src/ATen/mps/MPSDevice.mm / OperationUtils.mm: "MPS BFloat16 is only supported on MacOS 14 or newer".
BF16_SINCE = (14, 0)
# PYTORCH_ENABLE_MPS_FALLBACK=1 runs an op without an MPS kernel on the CPU (a warning, a copy each
# way) instead of raising NotImplementedError; a dtype MPS cannot hold (float64) is refused either way.
FALLBACK_ENV = "PYTORCH_ENABLE_MPS_FALLBACK"

_TABLES = ("UNIMPLEMENTED_XFAILLIST", "MACOS_BEFORE_14_4_XFAILLIST", "SUPPORTED_COMPLEX_OPS")
ALL = None  # an entry of None: every dtype


@dataclass(frozen=True)
class MpsExpectations:
    """common_mps.py's tables, OpInfo name → dtypes (None: every dtype)."""

    unimplemented: dict[str, frozenset[str] | None]
    before_14_4: dict[str, frozenset[str] | None]
    complex_ok: frozenset[str]
    min_macos: tuple[int, int]

    def refused(self, opinfo_name: str, dtype: str, macos: tuple[int, int]) -> str | None:
        """Why MPS refuses this op on this dtype on this macOS, or None where it runs."""
        if dtype in NEVER:
            return FLOAT64_ERROR
        if dtype == "bfloat16" and macos < BF16_SINCE:
            return "MPS BFloat16 is only supported on MacOS 14 or newer"
        if dtype in ("complex64", "complex32") and opinfo_name not in self.complex_ok:
            return f"{opinfo_name} has no MPS kernel for {dtype} (common_mps.py SUPPORTED_COMPLEX_OPS)"
        for table, gate in ((self.unimplemented, True), (self.before_14_4, macos < (14, 4))):
            if gate and opinfo_name in table and (table[opinfo_name] is None or dtype in table[opinfo_name]):
                return f"{opinfo_name} is not implemented on MPS for {dtype} (common_mps.py)"
        return None

    def refused_aten(self, aten_op: str, dtype: str, macos: tuple[int, int]) -> str | None:
        """`refused` for an op as the trace names it ("aten.linalg_eig.default")."""
        name = aten_name_to_opinfo().get(_aten_key(aten_op))
        if name is None:
            return FLOAT64_ERROR if dtype in NEVER else (
                "MPS BFloat16 is only supported on MacOS 14 or newer" if dtype == "bfloat16" and macos < BF16_SINCE else None)
        return self.refused(name, dtype, macos)


def _aten_key(op: str) -> str:
    parts = op.split(".")
    return parts[1] if op.startswith("aten.") and len(parts) > 1 else op


def opinfo_key(name: str) -> str:
    """The aten name an OpInfo name usually dispatches to: 'nn.functional.conv3d' → 'conv3d',
    'linalg.eig' → 'linalg_eig'."""
    return name.removeprefix("nn.functional.").replace(".", "_")


@lru_cache(maxsize=1)
def aten_name_to_opinfo() -> dict[str, str]:
    """aten op name → the common_mps.py entry that names it (only the entries whose name maps)."""
    e = expectations()
    return {opinfo_key(n): n for n in (*e.unimplemented, *e.before_14_4)}


def _dtypes(node: ast.expr) -> frozenset[str] | None:
    if isinstance(node, ast.Constant) and node.value is None:
        return ALL
    names = [el.attr for el in getattr(node, "elts", ()) if isinstance(el, ast.Attribute)]
    return frozenset({"double": "float64", "half": "float16", "float": "float32"}.get(n, n) for n in names)


def _common_mps_source() -> str:
    import torch  # noqa: PLC0415 - the path of the installed torch, only when asked

    return (Path(torch.__file__).parent / "testing" / "_internal" / "common_mps.py").read_text()


def parse(source: str) -> MpsExpectations:
    """common_mps.py's tables from its source."""
    found: dict[str, ast.expr] = {}
    for node in ast.walk(ast.parse(source)):
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id in _TABLES and target.id not in found:
            found[target.id] = node.value
    tables = {k: {ast.literal_eval(key): _dtypes(v) for key, v in zip(node.keys, node.values)}
              for k, node in found.items() if isinstance(node, ast.Dict)}
    complex_ok = found.get("SUPPORTED_COMPLEX_OPS")
    # The only macOS gate left is "before 14.4" (13.x and 14.2 named in its comment). torch's MPS needs 14.0:
    # aten/src/ATen/mps/MPSDevice.mm MPSDevice::MPSDevice() asks MPSGraph for a method "introduced in 14.0"
    # and keeps no device without it (is_available() False), so every macOS it runs on has bfloat16 (BF16_SINCE).
    return MpsExpectations(
        unimplemented=tables.get("UNIMPLEMENTED_XFAILLIST", {}),
        before_14_4=tables.get("MACOS_BEFORE_14_4_XFAILLIST", {}),
        complex_ok=frozenset(ast.literal_eval(complex_ok)) if complex_ok is not None else frozenset(),
        min_macos=(14, 0),
    )


@lru_cache(maxsize=1)
def expectations() -> MpsExpectations:
    """The installed torch's MPS expectations."""
    return parse(_common_mps_source())


def macos_version(text: str | None) -> tuple[int, int]:
    """'14.4' → (14, 4); None → the oldest macOS the installed torch's MPS supports. ValueError
    for text that is no version or a version that torch does not support."""
    oldest = expectations().min_macos
    if text is None:
        return oldest
    parts = text.strip().split(".")
    if not all(p.isdigit() for p in parts[:2]) or not parts[0]:
        raise ValueError(f"--macos expects a version such as 14.4, got {text!r}")
    version = (int(parts[0]), int(parts[1]) if len(parts) > 1 else 0)
    if version < oldest:
        raise ValueError(f"--macos {text}: the installed torch's MPS needs macOS {oldest[0]}.{oldest[1]} or newer")
    return version
