"""DD610 launch-mixed-precision-conflict, asked of accelerate's own DeepSpeedPlugin."""

import pytest
from accelerate.utils import DeepSpeedPlugin

from dtype_doctor.records import LaunchConfig
from helpers_launch import judged

ZERO = {"zero_optimization": {"stage": 2}}


@pytest.mark.parametrize("mixed,ds,refused", [
    ("bf16", {"fp16": {"enabled": True}}, True),
    ("fp16", {"bf16": {"enabled": True}}, True),
    ("bf16", {"bf16": {"enabled": "auto"}}, False),
    ("fp16", {"fp16": {"enabled": "auto"}}, False),
])
def test_accelerate_and_dd610_agree(mixed, ds, refused):
    config = {**ds, **ZERO}
    plugin = DeepSpeedPlugin(hf_ds_config=dict(config))
    if refused:
        with pytest.raises(ValueError, match="arg cannot be set to"):
            plugin.set_mixed_precision(mixed)
    else:
        plugin.set_mixed_precision(mixed)
    launch = LaunchConfig("accelerate", 8, mixed, "deepspeed", "cfg.yaml", "ds.json")
    assert ("DD610" in judged(launch, config)) == refused
