"""The floors under bench_simulated_generate: user_generate.py run under one layer, the loop's own time.

    python benchmarks/floor_generate.py LAYER [NEW [HIDDEN [LAYERS]]]

LAYER is one of
- `dispatch`: one no-op TorchDispatchMode on the real CPU (the least any dispatch-level tool pays an op);
- `function+dispatch`: a no-op TorchFunctionMode and a no-op TorchDispatchMode on the real CPU;
- `cuda-view`: the doctor's simulated machine alone (machine/simulate.py's CudaSimulation: the script
  sees CUDA, its tensors live on meta, a read of values gets a stand-in), no recorder, no probe: the
  least a simulated call can run with, its ops on PyTorch's meta kernels;
- `cuda-view+table`: that, with one dispatch mode answering each op from the meta-output table
  (trace/meta_outputs.py) instead of PyTorch's Python meta kernels.

The script prints its loop as the user script does (`generated (1, 28) cuda:0 0.41s`).
"""

from __future__ import annotations

import contextlib
import runpy
import sys
from pathlib import Path
from typing import Any, Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

SCRIPT = Path(__file__).resolve().parent / "user_generate.py"
LAYERS = ("dispatch", "function+dispatch", "cuda-view", "cuda-view+table")


class _NoOpDispatch(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        return func(*args, **(kwargs or {}))


class _NoOpFunction(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        return func(*args, **(kwargs or {}))


class _TableDispatch(TorchDispatchMode):
    def __init__(self) -> None:
        from dtype_doctor.trace.meta_outputs import MetaOutputs

        super().__init__()
        self.table = MetaOutputs()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        return self.table.run(func, args, kwargs or {})


@contextlib.contextmanager
def layer(name: str) -> Iterator[Any]:
    if name not in LAYERS:
        sys.exit(f"floor_generate: LAYER is one of {', '.join(LAYERS)}, not {name!r}")
    with contextlib.ExitStack() as stack:
        if name.startswith("cuda-view"):
            from dtype_doctor.machine.gpus import gpu_profile
            from dtype_doctor.machine.simulate import CudaSimulation

            stack.enter_context(CudaSimulation(torch.device("cuda", 0), gpu_profile("a100")))
        if name == "function+dispatch":
            stack.enter_context(_NoOpFunction())
        if name in ("dispatch", "function+dispatch"):
            stack.enter_context(_NoOpDispatch())
        if name == "cuda-view+table":
            stack.enter_context(_TableDispatch())
        yield


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit(__doc__)
    with layer(argv[0]):
        sys.argv = [str(SCRIPT), *argv[1:]]
        runpy.run_path(str(SCRIPT), run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
