"""run patches datasets (the lineage of map / set_transform) when the script imports it, not before."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """\
import sys
import torch
print("datasets before:", "datasets" in sys.modules)
m = torch.nn.Linear(2, 2)
m(torch.ones(1, 2))
import datasets
print("patched:", "dtype_doctor" in (datasets.Dataset.map.__module__ or ""))
m(torch.ones(1, 2))
"""


def test_a_script_without_datasets_does_not_import_it_and_one_with_it_is_patched(tmp_path: Path) -> None:
    (tmp_path / "s.py").write_text(SCRIPT)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-m", "dtype_doctor", "run", "-q", "--keep-running", "--", "s.py"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    said = r.stdout + r.stderr  # the script's prints go to stderr: stdout is the report's
    assert "datasets before: False" in said and "patched: True" in said, said
