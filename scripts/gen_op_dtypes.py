"""Write dtype_doctor/data/op_dtypes.json: per op, the dtypes its CPU and CUDA kernels support.

Read from PyTorch's own op database (torch.testing._internal.common_methods_invocations.op_db,
the `dtypes` / `dtypesIfCUDA` each OpInfo declares and PyTorch's tests check), so dtype-doctor
never imports torch's internal test modules at run time. Only ops whose CPU and CUDA lists
differ are kept: they are the ones where a CPU probe's verdict does not carry over to CUDA.

    python scripts/gen_op_dtypes.py          # needs expecttest (pip install -e .[test])
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "dtype_doctor" / "data" / "op_dtypes.json"


def main() -> None:
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    def names(dtypes: set) -> list[str]:
        return sorted(str(d).removeprefix("torch.") for d in dtypes)

    ops: dict[str, dict[str, list[str]]] = {}
    for o in op_db:
        cpu, cuda = o.supported_dtypes("cpu"), o.supported_dtypes("cuda")
        if cpu == cuda or o.variant_test_name:
            continue
        key = o.aten_name.removeprefix("nn.functional.")
        ops[key] = {"cpu": names(cpu), "cuda": names(cuda)}
    data = {"torch": torch.__version__.split("+")[0], "source": "torch op_db dtypes / dtypesIfCUDA", "ops": dict(sorted(ops.items()))}
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{len(ops)} ops whose CPU and CUDA dtype lists differ → {OUT}")


if __name__ == "__main__":
    main()
