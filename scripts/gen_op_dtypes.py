"""Write dtype_doctor/data/op_dtypes.json: per op, the dtypes its CPU and CUDA kernels support.

Read from PyTorch's own op database (torch.testing._internal.common_methods_invocations.op_db,
the `dtypes` / `dtypesIfCUDA` each OpInfo declares and PyTorch's tests check), so dtype-doctor
never imports torch's internal test modules at run time. Only ops whose CPU and CUDA lists
differ are kept: they are the ones where a CPU probe's verdict does not carry over to CUDA.

op_db gates some CUDA dtypes on the GPU's compute capability (`SM53OrLater`, `SM80OrLater` in
torch.testing._internal.common_cuda), which it reads from the GPU it runs on; on a build
without CUDA every gate is closed. So the lists are read once per capability at which a gate
opens, each in a fresh interpreter with the gates set as on such a GPU: "cuda" is the list on
the newest GPU, and "cuda_needs" the capability each gated dtype needs (bfloat16 matmul: 5.3;
bfloat16 flash attention: 8.0). The result is the same on a CPU-only build and a CUDA one.

    python scripts/gen_op_dtypes.py          # needs expecttest (pip install -e .[test])
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "dtype_doctor" / "data" / "op_dtypes.json"
# Every capability at which one of common_cuda's SM<NN>OrLater gates opens, and none (a CPU build).
CAPABILITIES = ((0, 0), (5, 3), (6, 0), (7, 0), (7, 5), (8, 0), (8, 9), (9, 0), (10, 0), (12, 0))


def lists_at(capability: tuple[int, int]) -> dict[str, dict[str, list[str]]]:
    """{op: {"cpu": [...], "cuda": [...]}} as op_db declares them on a GPU of `capability`."""
    import torch
    import torch.testing._internal.common_cuda as common_cuda

    for name in dir(common_cuda):
        if name.startswith("SM") and name.endswith("OrLater"):
            digits = name[2:-len("OrLater")]
            setattr(common_cuda, name, capability >= (int(digits[:-1]), int(digits[-1])))
    from torch.testing._internal.common_methods_invocations import op_db

    def names(dtypes: set) -> list[str]:
        return sorted(str(d).removeprefix("torch.") for d in dtypes)

    out: dict[str, dict[str, list[str]]] = {}
    for o in op_db:
        if o.variant_test_name:
            continue
        key = o.aten_name.removeprefix("nn.functional.").removeprefix("torch.ops.aten.")
        out[key] = {"cpu": names(o.supported_dtypes("cpu")), "cuda": names(o.supported_dtypes("cuda"))}
    out["__torch__"] = {"version": [torch.__version__.split("+")[0]]}
    return out


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--capability":
        major, minor = (int(x) for x in sys.argv[2].split("."))
        json.dump(lists_at((major, minor)), sys.stdout)
        return
    by_cap = {}
    for cap in CAPABILITIES:
        done = subprocess.run(
            [sys.executable, __file__, "--capability", f"{cap[0]}.{cap[1]}"], capture_output=True, text=True, check=True
        )
        by_cap[cap] = json.loads(done.stdout)
    version = by_cap[CAPABILITIES[0]].pop("__torch__")["version"][0]
    for lists in by_cap.values():
        lists.pop("__torch__", None)
    newest = by_cap[CAPABILITIES[-1]]
    ops: dict[str, dict] = {}
    for key, lists in sorted(newest.items()):
        needs: dict[str, str] = {}
        for dtype in lists["cuda"]:
            since = [cap for cap in CAPABILITIES if dtype in by_cap[cap].get(key, {}).get("cuda", ())]
            if since and since[0] != CAPABILITIES[0]:
                needs[dtype] = f"{since[0][0]}.{since[0][1]}"
        if lists["cpu"] == lists["cuda"] and not needs:
            continue
        ops[key] = {"cpu": lists["cpu"], "cuda": lists["cuda"], **({"cuda_needs": needs} if needs else {})}
    data = {
        "torch": version,
        "source": "torch op_db dtypes / dtypesIfCUDA, read with common_cuda's SM<NN>OrLater gates set per capability",
        "ops": ops,
    }
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    gated = sum("cuda_needs" in v for v in ops.values())
    print(f"{len(ops)} ops whose CPU and CUDA dtype lists differ ({gated} with dtypes gated on compute capability) → {OUT}")


if __name__ == "__main__":
    main()
