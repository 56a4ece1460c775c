"""The old home of `Placement` and `decide`, kept for code that imports it: see dtype_doctor.machine."""

from dtype_doctor.machine.placement import DEVICE_MAPS, DEVICES_HELP, Placement, decide, parse_device, parse_max_memory, require_cuda

__all__ = ["DEVICE_MAPS", "DEVICES_HELP", "Placement", "decide", "parse_device", "parse_max_memory", "require_cuda"]
