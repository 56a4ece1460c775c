"""What a step runs on: the one place that knows it.

`placement.decide` turns what the user asked (`--device/--simulate/--gpu/--gpus/--device-map`,
or the API's keywords) into one `Placement`, once, at each entry (the CLI, the Python API,
`run`); every stage below reads it off that record. The simulated CUDA machine lives here
too: the GPU profiles (`gpus`), the fake device and its modes (`simulate`, `modes`), the
stand-in values a simulated step reads (`stand_ins`), the `torch.cuda` surface a script sees
(`cuda_surface`), the libraries that decide by device type (`libraries`), accelerate's device
maps over simulated GPUs (`device_map`), and CUDA's wording of what happened (`wording`).

Importing this package does not import torch.
"""

from dtype_doctor.machine.placement import Placement, decide

__all__ = ["Placement", "decide"]
