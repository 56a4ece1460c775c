"""machine.imports.when_imported: a patch made when a module is first imported, and undone."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True).stdout


def test_a_module_not_yet_imported_is_patched_when_it_is_and_undone() -> None:
    out = _run("""
        import sys
        from dtype_doctor.machine.imports import when_imported
        seen = []
        undo = when_imported("json.decoder", lambda m: (seen.append(m.__name__), lambda: seen.append("undone"))[1])
        print("json.decoder" in sys.modules, seen)
        import json
        print(seen)
        undo()
        print(seen)
    """)
    assert out.splitlines() == ["False []", "['json.decoder']", "['json.decoder', 'undone']"]


def test_an_imported_module_is_patched_at_once_and_an_unused_hook_leaves() -> None:
    out = _run("""
        import sys, json
        from dtype_doctor.machine.imports import when_imported
        seen = []
        when_imported("json", lambda m: (seen.append(m.__name__), lambda: None)[1])
        n = len(sys.meta_path)
        undo = when_imported("no_such_module_here", lambda m: lambda: None)
        undo()
        print(seen, len(sys.meta_path) == n)
    """)
    assert out.strip() == "['json'] True"
