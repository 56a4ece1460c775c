"""Probe torch._scaled_mm's CUDA constraints on the GPU this runs on; prints one line a case.

The fp8 rules (DD506, DD107's capability check) hold these facts; docs/quantized.md's fp8 table is
this script's output on an H100 (compute capability 9.0, torch 2.11.0+cu130). Run it on any
GPU to check them against the real kernel: `python scripts/fp8_cuda_facts.py`.
"""

from __future__ import annotations

import torch

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2


def probe(name: str, fn) -> None:  # noqa: ANN001
    try:
        out = fn()
        print(f"{name}: ok {getattr(out, 'dtype', '')}")
    except Exception as e:  # noqa: BLE001 - the refusal is the result
        print(f"{name}: {type(e).__name__}: {str(e).splitlines()[0]}")


def scaled_mm(m: int, k: int, n: int, a=E4, b=E4, column_major: bool = True, out=torch.bfloat16, device="cuda"):  # noqa: ANN001
    """mat1 [m, k] row-major; mat2 [k, n], column-major (a [n, k] tensor's .t()) or row-major."""
    one = torch.tensor(1.0, device=device)
    mat1 = torch.randn(m, k, device=device).to(a)
    mat2 = torch.randn(n, k, device=device).to(b).t() if column_major else torch.randn(k, n, device=device).to(b)
    return lambda: torch._scaled_mm(mat1, mat2, scale_a=one, scale_b=one, out_dtype=out)


def main() -> None:
    cc = torch.cuda.get_device_capability()
    print(f"{torch.cuda.get_device_name()} capability {cc[0]}.{cc[1]} torch {torch.__version__}")
    probe("e4m3 x e4m3 16x32x48 col-major", scaled_mm(16, 32, 48))
    probe("e4m3 x e5m2", scaled_mm(16, 32, 48, E4, E5))
    probe("e5m2 x e4m3", scaled_mm(16, 32, 48, E5, E4))
    probe("e5m2 x e5m2", scaled_mm(16, 32, 48, E5, E5))
    probe("mat2 row-major", scaled_mm(16, 32, 48, column_major=False))
    probe("K=40", scaled_mm(16, 40, 48))
    probe("N=40", scaled_mm(16, 32, 40))
    probe("M=8", scaled_mm(8, 32, 48))
    probe("M=13", scaled_mm(13, 32, 48))
    for out in (torch.float32, torch.float16, E4):
        probe(f"out {out}", scaled_mm(16, 32, 48, out=out))
    a8 = torch.randn(4, device="cuda").to(E4)
    probe("float8 + float32", lambda: a8 + torch.randn(4, device="cuda"))
    probe("float8 @ float8", lambda: a8.view(2, 2) @ a8.view(2, 2))
    probe("float8 linear", lambda: torch.nn.functional.linear(a8.view(2, 2), a8.view(2, 2)))
    # the CPU accepts what CUDA refuses
    probe("cpu e5m2 x e5m2 K=40 row-major", scaled_mm(16, 40, 48, E5, E5, column_major=False, device="cpu"))
    probe("cpu float8 + float32", lambda: torch.randn(4).to(E4) + torch.randn(4))


if __name__ == "__main__":
    main()
