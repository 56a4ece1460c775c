"""Probe torch._scaled_mm's CUDA constraints on the GPU this runs on; prints one line a fact.

The fp8 rules (DD506) hold these facts as a table (README "Quantized models"); run this on a
GPU to check them against the real kernel: `python scripts/fp8_cuda_facts.py`.
"""

from __future__ import annotations

import torch


def probe(name: str, fn) -> None:  # noqa: ANN001
    try:
        out = fn()
        print(f"{name}: ok {getattr(out, 'dtype', '')}")
    except Exception as e:  # noqa: BLE001 - the refusal is the result
        print(f"{name}: {type(e).__name__}: {str(e).splitlines()[0]}")


def main() -> None:
    dev = "cuda"
    cc = torch.cuda.get_device_capability()
    print(f"device: {torch.cuda.get_device_name()} capability {cc[0]}.{cc[1]} torch {torch.__version__}")
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    one = torch.tensor(1.0, device=dev)

    def mm(m: int, k: int, n: int, a_dt=e4, b_dt=e4, col_major: bool = True, out_dtype=torch.bfloat16):  # noqa: ANN001
        a = torch.randn(m, k, device=dev).to(a_dt)
        b = torch.randn(n, k, device=dev).to(b_dt).t() if col_major else torch.randn(k, n, device=dev).to(b_dt)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=out_dtype)

    probe("e4m3 x e4m3 16x32x48 col-major", mm(16, 32, 48))
    probe("e4m3 x e5m2", mm(16, 32, 48, e4, e5))
    probe("e5m2 x e4m3", mm(16, 32, 48, e5, e4))
    probe("e5m2 x e5m2", mm(16, 32, 48, e5, e5))
    probe("mat2 row-major", mm(16, 32, 48, col_major=False))
    probe("K=40 (not /16)", mm(16, 40, 48))
    probe("N=40 (not /16)", mm(16, 32, 40))
    probe("M=8 (rows of mat1 free)", mm(8, 32, 48))
    probe("out_dtype float32", mm(16, 32, 48, out_dtype=torch.float32))
    probe("out_dtype float16", mm(16, 32, 48, out_dtype=torch.float16))
    a8 = torch.randn(4, device=dev).to(e4)
    probe("float8 + float32 (promotion)", lambda: a8 + torch.randn(4, device=dev))
    probe("float8 @ float8 (plain matmul)", lambda: a8.view(2, 2) @ a8.view(2, 2))
    # the same calls on CPU: accepted (the CUDA facts do not show there)
    one_c = torch.tensor(1.0)
    probe("cpu e5m2 x e5m2 K=40 row-major", lambda: torch._scaled_mm(torch.randn(16, 40).to(e5), torch.randn(40, 48).to(e5),
                                                                      scale_a=one_c, scale_b=one_c, out_dtype=torch.bfloat16))


if __name__ == "__main__":
    main()
