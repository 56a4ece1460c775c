"""The package's import graph, read with ast from the source (nothing is imported):

- no import cycle among module-level imports. Module level means what runs when a module is
  imported: top-level statements, `if`/`try` blocks included, `if TYPE_CHECKING:` blocks left
  out (they never run). An import inside a function runs when it is called, after every module
  has loaded, so it cannot deadlock an import; it is how torch-free modules stay torch-free,
  and it is allowed;
- no import of a private name (one starting with `_`, or from a module whose path has such a
  part) across packages, counting every import, function-level ones too. A package is
  `dtype_doctor.X` for the first part X (fix, run, trace, ...); a top-level module
  (records.py, numerics.py) is a package of its own.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "dtype_doctor"

# Private names imported across packages: none. 31 at the start of issue 15; the last ones
# (run/session reaching into trace/engine) went with the TraceSession. A new one fails.
ALLOWED_PRIVATE: set[tuple[str, str]] = set()


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(body: list[ast.stmt], *, module_level: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements in `body`: at module level only (not in functions, classes'
    methods or TYPE_CHECKING blocks), or all of them."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node):
            if not module_level:
                yield from _imports(node.body, module_level=False)
            yield from _imports(node.orelse, module_level=module_level)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if not module_level:
                yield from _imports(node.body, module_level=False)
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    yield from _imports([n for n in inner if isinstance(n, ast.AST)], module_level=module_level)


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    is_package = MODULES[module].name == "__init__.py"
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> Iterator[tuple[str, str | None]]:
    """(module imported, name imported from it or None) for each dtype_doctor import."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.startswith("dtype_doctor"):
                yield alias.name, None
        return
    source = _absolute(module, node)
    if not source.startswith("dtype_doctor"):
        return
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        yield (sub, None) if sub in MODULES else (source, alias.name)


def _known(name: str) -> str:
    """The module a dotted name lies in (itself, or its nearest parent the package has)."""
    while name not in MODULES and "." in name:
        name = name.rpartition(".")[0]
    return name


def _tree(module: str) -> ast.Module:
    return ast.parse(MODULES[module].read_text(encoding="utf-8"))


def import_graph(*, module_level: bool) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module in MODULES:
        edges = graph.setdefault(module, set())
        for node in _imports(_tree(module).body, module_level=module_level):
            for target, _name in _targets(module, node):
                known = _known(target)
                if known != module:
                    edges.add(known)
                    # importing a.b.c runs a and a.b first
                    parent = known.rpartition(".")[0]
                    while parent.startswith("dtype_doctor.") and parent != module:
                        if parent in MODULES and not module.startswith(parent + "."):
                            edges.add(parent)
                        parent = parent.rpartition(".")[0]
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def _private(module: str, name: str | None) -> bool:
    parts = module.split(".")[1:]
    private_path = any(p.startswith("_") and not p.startswith("__") for p in parts)
    private_name = name is not None and name.startswith("_") and not name.startswith("__")
    return private_path or private_name


def private_cross_package_imports() -> set[tuple[str, str]]:
    """(importing module, `module:name` imported) for each private import across packages."""
    found = set()
    for module in MODULES:
        for node in _imports(_tree(module).body, module_level=False):
            for target, name in _targets(module, node):
                if _package(target) != _package(module) and _private(target, name):
                    found.add((module, f"{target}:{name}" if name else target))
    return found


def test_the_graph_is_read_from_the_package() -> None:
    graph = import_graph(module_level=True)
    assert "dtype_doctor.fix.engine" in graph and "dtype_doctor.records" in graph["dtype_doctor.fix.engine"]
    # a function-level import is in the whole graph, not the module-level one
    whole = import_graph(module_level=False)
    assert "dtype_doctor.fix.keep_fp32" in whole["dtype_doctor.fix.strategies.keep_fp32"]
    assert "dtype_doctor.fix.keep_fp32" not in graph["dtype_doctor.fix.strategies.keep_fp32"]


def test_cycles_are_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_at_module_level() -> None:
    assert cycles(import_graph(module_level=True)) == []


def test_no_private_import_across_packages_beyond_the_listed_debts() -> None:
    found = private_cross_package_imports()
    assert found - ALLOWED_PRIVATE == set(), "a new private import across packages"
    assert ALLOWED_PRIVATE - found == set(), "a listed debt is paid off: strike it from ALLOWED_PRIVATE"


# ------------------------------------------------------------------ the layers, bottom to top
#
# The package is the stages of a step: records and errors at the bottom, the machine a step runs on,
# the trace, loading, the rules, fixes, reports, `run`, the commands (scan/fix/compare)
# and the CLI on top. No import goes up a layer, at module level or inside a function;
# `if TYPE_CHECKING:` imports never run and are left out.

LAYERS = ("records", "machine", "trace", "load", "rules", "fix", "report", "run", "commands", "cli")
# The first part of a module's name (dtype_doctor.X...) → its layer; the package root itself
# (`dtype_doctor`, which only names its lazy API and version) is at the bottom. "pipeline" is
# the public module of the scan/fix commands (dtype_doctor.pipeline.scan); everywhere else a
# pipeline is a diffusers pipeline.
LAYER_OF = {
    "": "records", "records": "records", "numerics": "records", "ops": "records", "source": "records",
    "data": "records",
    "machine": "machine", "placement": "machine",
    "trace": "trace", "quantization": "trace",
    "load": "load",
    "rules": "rules",
    "fix": "fix", "diagnosis": "fix", "diffusion": "fix",
    "report": "report",
    "run": "run",
    "pipeline": "commands", "compare": "commands",
    "cli": "cli", "__main__": "cli", "integrations": "cli",
}
# The modules at the package's top level: the entry points and the modules whose import path is
# public API (docs/api.md); everything else lives in its layer's package or one named for its
# subject (ops/, source/, integrations/). A new loose module fails.
TOP_LEVEL = {
    "__init__", "__main__",
    "numerics", "quantization", "diagnosis", "diffusion", "pipeline",  # public by name (docs/api.md)
    "placement",  # the old home of machine.placement's public names, a re-export
}
# Upward imports: none. The rules state their fixes as data (Remedy records and hints) and the
# strategies word them (fix.strategies.worded, called where findings become a report:
# diagnosis, which is why it sits in the fix layer); the trace is handed the rules' `refusal`
# by its caller instead of asking the rules. A new one fails.
ALLOWED_UPWARD: set[tuple[str, str]] = set()


def _layer(module: str) -> int:
    first = module.split(".")[1] if "." in module else ""
    return LAYERS.index(LAYER_OF[first])


def _runtime_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import that can run: module level and inside functions, not TYPE_CHECKING blocks."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node):
            yield from _runtime_imports(node.orelse)
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    yield from _runtime_imports([n for n in inner if isinstance(n, ast.stmt | ast.excepthandler)])


def upward_imports() -> set[tuple[str, str]]:
    found = set()
    for module in MODULES:
        for node in _runtime_imports(_tree(module).body):
            for target, _name in _targets(module, node):
                known = _known(target)
                if _layer(known) > _layer(module):
                    found.add((module, known))
    return found


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        _layer(module)  # a KeyError names a new top-level module without a layer


def test_no_module_at_the_top_level_beyond_the_public_ones() -> None:
    loose = {path.stem for path in ROOT.glob("*.py")}
    assert loose - TOP_LEVEL == set(), "a loose module at the top level: move it into its layer's package"
    assert TOP_LEVEL - loose == set(), "a listed top-level module is gone: strike it from TOP_LEVEL"


def test_the_moved_modules_keep_their_layer() -> None:
    """The homes of issue 41's moves are read with the layer of their package, and the public
    paths that stayed still import."""
    import importlib

    assert LAYERS[_layer("dtype_doctor.records.errors")] == "records"
    assert LAYERS[_layer("dtype_doctor.ops.operands")] == "records"
    assert LAYERS[_layer("dtype_doctor.source.analysis")] == "records"
    assert LAYERS[_layer("dtype_doctor.rules.attention")] == "rules"
    assert LAYERS[_layer("dtype_doctor.integrations.diffusers_folder")] == "cli"
    for public in ("dtype_doctor.placement", "dtype_doctor.pipeline", "dtype_doctor.quantization"):
        assert importlib.util.find_spec(public) is not None


def test_no_import_goes_up_a_layer() -> None:
    found = upward_imports()
    assert ALLOWED_UPWARD == set()
    assert found == set(), "an import up a layer"


def test_an_upward_import_is_found(tmp_path: Path) -> None:
    module = "dtype_doctor.machine.placement"
    node = ast.parse("def f():\n    from dtype_doctor.cli.main import run\n").body
    targets = [(_known(t), module) for n in _runtime_imports(node) for t, _ in _targets(module, n)]
    assert targets == [("dtype_doctor.cli.main", module)] and _layer("dtype_doctor.cli.main") > _layer(module)


def test_cuda_0_is_written_only_in_the_machine() -> None:
    """The device a bare "cuda" names, and a simulated target's default, is machine.placement.CUDA0."""
    found = set()
    for module, path in MODULES.items():
        # numerics.device_name (public before machine/ existed) names a bare torch.device("cuda") as users read it
        if module.startswith("dtype_doctor.machine") or module == "dtype_doctor.numerics":
            continue
        for node in ast.walk(_tree(module)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value == "cuda:0":
                found.add(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == set()


def runtime_graph() -> dict[str, set[str]]:
    """Every import that can run, module level and in functions, as edges between modules."""
    graph: dict[str, set[str]] = {}
    for module in MODULES:
        edges = graph.setdefault(module, set())
        for node in _runtime_imports(_tree(module).body):
            for target, _name in _targets(module, node):
                if (known := _known(target)) != module:
                    edges.add(known)
    return graph


# Import cycles counting function-level imports: none. 4 cycles over 14 modules at the start of
# issue 29; the last (the fix package's strategies, patches and outcome; the rule catalogue and
# DD001) went when the strategy table was read from below (Strategy subclasses, outcome's
# JSON_KINDS), Attempt moved to codemods.base and the catalogue to rules/catalogue.py.
def test_no_import_cycle_counting_function_level_imports() -> None:
    assert cycles(runtime_graph()) == []


# ------------------------------------------------------------------ no switch on a strategy's name
#
# A strategy owns its behaviour: no module but the strategy's own compares a string equal to its
# name (==, !=, in, not in, a set of names combined with &, |, -), or looks one up as a key
# (x["name"], x.get("name")). Naming it as data is allowed: Remedy("to-device", ...) in a rule,
# Change("autocast", ...), a dict literal's key, prose.

STRATEGIES_DIR = ROOT / "fix" / "strategies"


def strategy_names() -> dict[str, str]:
    """Each strategy's name → the module that defines it (its `class X(Strategy, name=...)`)."""
    names = {}
    for path in STRATEGIES_DIR.glob("*.py"):
        module = f"dtype_doctor.fix.strategies.{path.stem}"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(isinstance(b, ast.Name) and b.id == "Strategy" for b in node.bases):
                for kw in node.keywords:
                    if kw.arg == "name" and isinstance(kw.value, ast.Constant):
                        names[kw.value.value] = module
    return names


def _strings(node: ast.AST) -> Iterator[ast.Constant]:
    """The string constants `node` is, or holds as a set/tuple/list literal's elements."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node
    elif isinstance(node, (ast.Set, ast.Tuple, ast.List)):
        for element in node.elts:
            yield from _strings(element)


def _source_text(node: ast.AST) -> bool:
    """A piece of a dotted name read from source code (`name.split(".")[-1]`): a word of the
    user's code ("autocast" as torch names it), not a strategy."""
    return (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr in ("split", "rsplit", "partition", "rpartition"))


def _switched(tree: ast.AST) -> Iterator[ast.Constant]:
    """The string constants compared or looked up as keys in `tree`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and all(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops):
            sides = (node.left, *node.comparators)
            if not any(_source_text(side) for side in sides):
                for side in sides:
                    yield from _strings(side)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr, ast.Sub)):
            for side in (node.left, node.right):
                if isinstance(side, ast.Set):
                    yield from _strings(side)
        elif isinstance(node, ast.Subscript):
            yield from _strings(node.slice)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop") and node.args:
            yield from _strings(node.args[0])


def strategy_switches(modules: dict[str, ast.AST], names: dict[str, str]) -> set[str]:
    """`module:line name` for each switch on a strategy's name outside that strategy's module."""
    return {
        f"{module}:{c.lineno} {c.value}"
        for module, tree in modules.items()
        for c in _switched(tree)
        if c.value in names and names[c.value] != module
    }


def test_the_strategy_names_are_read_from_their_modules() -> None:
    names = strategy_names()
    assert names["to-device"] == "dtype_doctor.fix.strategies.to_device" and names["half-model"].endswith(".half_model")


def test_no_switch_on_a_strategy_name_outside_its_module() -> None:
    names = strategy_names()
    assert strategy_switches({m: _tree(m) for m in MODULES}, names) == set()


def test_a_switch_on_a_strategy_name_is_found() -> None:
    names = {"to-device": "dtype_doctor.fix.strategies.to_device", "autocast": "dtype_doctor.fix.strategies.autocast"}
    planted = ast.parse(
        'if r.strategy == "to-device": pass\n'
        'ok = "autocast" in parts or kind not in ("x", "to-device")\n'
        'dtype = parts["autocast"]\n'
        'left = {"to-device"} & set(parts)\n'
        'got = table.get("autocast")\n'
    )
    data = ast.parse('r = Remedy("to-device", "x", "cuda")\nd = {"autocast": 1}\nsay = "run it under autocast"\n'
                     'torchs = name.split(".")[-1] == "autocast"\n')
    found = strategy_switches({"dtype_doctor.run.created": planted, "dtype_doctor.rules.dd201": data}, names)
    assert found == {f"dtype_doctor.run.created:{line} {name}" for line, name in
                     ((1, "to-device"), (2, "autocast"), (2, "to-device"), (3, "autocast"), (4, "to-device"), (5, "autocast"))}
    # the strategy's own module may switch on its own name
    assert strategy_switches({"dtype_doctor.fix.strategies.autocast": ast.parse('x = parts["autocast"]')}, names) == set()


# ------------------------------------------------------------------ sizes
#
# Functions short enough to see whole, files small enough to read in one sitting (STYLE.md), as a
# ratchet: the longest function and the longest module may not grow. A function's length is its
# lines from `def` to its last line (docstring included, decorators not); a module's is its line
# count. At the start of issue 29's split: load/model.py's load_model 149 lines, trace/recorder.py
# 1,009. Lower a figure when the longest shrinks; a new longer one fails.
MAX_FUNCTION_LINES = 68  # machine/simulate.py _CudaMode.__torch_function__
MAX_MODULE_LINES = 678  # trace/recorder.py


def function_sizes() -> dict[str, int]:
    """`module:qualified name` → lines, for every function and method in the package."""
    out: dict[str, int] = {}

    def walk(module: str, body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[f"{module}:{prefix}{node.name}"] = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                walk(module, node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.ClassDef):
                walk(module, node.body, f"{prefix}{node.name}.")
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    inner = getattr(node, field, None)
                    if isinstance(inner, list):
                        walk(module, [n for n in inner if isinstance(n, ast.stmt | ast.excepthandler)], prefix)

    for module in MODULES:
        walk(module, _tree(module).body, "")
    return out


def test_no_function_longer_than_the_ratchet() -> None:
    sizes = function_sizes()
    assert "dtype_doctor.load.model:load_model" in sizes and "dtype_doctor.trace.recorder:Recorder.record" in sizes
    longer = {name: n for name, n in sizes.items() if n > MAX_FUNCTION_LINES}
    assert longer == {}, f"longer than {MAX_FUNCTION_LINES} lines: split them into named parts"


def test_no_module_longer_than_the_ratchet() -> None:
    sizes = {module: len(path.read_text(encoding="utf-8").splitlines()) for module, path in MODULES.items()}
    longer = {module: n for module, n in sizes.items() if n > MAX_MODULE_LINES}
    assert longer == {}, f"longer than {MAX_MODULE_LINES} lines: split by theme"


# ------------------------------------------------------------------ the machine's facts
#
# A GPU's facts (GpuProfile: capability, memory) are worked out once, where the Placement is
# decided (machine/placement.py `decide`), and read off `Placement.profile` by every stage.
# 14 calls of gpu_profile() at the start of issue 41, 10 outside machine/.


def gpu_profile_calls() -> set[str]:
    """`module:line` for each call of gpu_profile() outside machine/."""
    found = set()
    for module in MODULES:
        if module.startswith("dtype_doctor.machine"):
            continue
        for node in ast.walk(_tree(module)):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
                if name == "gpu_profile":
                    found.add(f"{module}:{node.lineno}")
    return found


def test_no_gpu_profile_call_outside_the_machine() -> None:
    assert gpu_profile_calls() == set(), "read Placement.profile: the GPU's facts are decided once"


# ------------------------------------------------------------------ options checked once
#
# An entry builds its option record and checks it once (CheckedOnce.validated); the stages it
# passes through get the record back unchecked again. ScanOptions.validate() ran 3 times per
# `scan` at the start of issue 41.


def _validations(monkeypatch: pytest.MonkeyPatch, cls: type) -> list[object]:
    calls: list[object] = []
    original = cls.validate

    def counted(self: object) -> None:
        calls.append(self)
        original(self)

    monkeypatch.setattr(cls, "validate", counted)
    return calls


def test_a_scan_checks_its_options_once(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from dtype_doctor.cli.main import run as cli
    from dtype_doctor.pipeline import ScanOptions

    fixtures = ROOT.parent / "fixtures/demo"
    calls = _validations(monkeypatch, ScanOptions)
    with pytest.raises(SystemExit) as done:
        cli(["scan", str(fixtures / "model"), str(fixtures / "data"), "--format", "json"])
    assert done.value.code == 1 and '"DD101"' in capsys.readouterr().out  # the demo's one error, found
    assert len(calls) == 1


def test_a_run_checks_its_options_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    from dtype_doctor.cli.main import run as cli
    from dtype_doctor.run.runner import RunOptions

    script = tmp_path / "step.py"
    script.write_text("import torch\nm = torch.nn.Linear(4, 2)\nm(torch.randn(3, 4).half())\n")
    calls = _validations(monkeypatch, RunOptions)
    with pytest.raises(SystemExit) as done:
        cli(["run", "--format", "json", "--", "python", str(script)])
    assert done.value.code == 1 and '"DD101"' in capsys.readouterr().out  # the half input against a float32 Linear
    assert len(calls) == 1


def test_each_dtype_choice_is_defined_once() -> None:
    """MODEL_DTYPES and the other dtype enumerations are assigned in records/choices.py only."""
    names = {"MODEL_DTYPES", "AUTOCAST_DTYPES", "COMPUTE_DTYPES", "DTYPE_ALIASES"}
    found = {
        f"{module}:{node.lineno}"
        for module in MODULES
        for node in ast.walk(_tree(module))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in names for t in node.targets)
    }
    assert {f.partition(":")[0] for f in found} == {"dtype_doctor.records.choices"}, found


# ------------------------------------------------------------------ classes
#
# The limits on functions and modules moved bulk into classes (RunSession grew to 514 lines).
# No class over 300 lines (its lines from `class` to its last line); the ones over it at issue 41
# are listed with their size as a ratchet: each may shrink (lower its figure, strike it at 300),
# none may grow, and no other class may pass 300.
MAX_CLASS_LINES = 300
LONG_CLASSES = {
    "dtype_doctor.trace.recorder:Recorder": 539,
    "dtype_doctor.machine.disk:Overlay": 497,
    "dtype_doctor.run.session:RunSession": 453,  # 514 before its report moved to run/step_report.py
    "dtype_doctor.machine.simulate:CudaSimulation": 360,
}


def class_sizes() -> dict[str, int]:
    """`module:qualified name` → lines, for every class in the package."""
    out: dict[str, int] = {}
    for module in MODULES:
        def walk(body: list[ast.stmt], prefix: str) -> None:
            for node in body:
                if isinstance(node, ast.ClassDef):
                    out[f"{module}:{prefix}{node.name}"] = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                    walk(node.body, f"{prefix}{node.name}.")

        walk(_tree(module).body, "")
    return out


def test_no_class_longer_than_the_ratchet() -> None:
    sizes = class_sizes()
    assert "dtype_doctor.run.session:RunSession" in sizes
    grown = {name: n for name, n in sizes.items() if n > LONG_CLASSES.get(name, MAX_CLASS_LINES)}
    assert grown == {}, f"longer than {MAX_CLASS_LINES} lines (or than its listed figure): split it along its responsibilities"
    shrunk = {name: sizes.get(name) for name, n in LONG_CLASSES.items() if sizes.get(name, 0) < n}
    assert shrunk == {}, "a listed class shrank: lower its figure in LONG_CLASSES (strike it at 300)"


def test_a_fix_checks_its_settings_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The five fix settings are one FixSettings record (no fix engine spells them out as
    keywords), built and checked once per entry: the CLI's, then handed down whole."""
    import inspect

    from dtype_doctor import pipeline
    from dtype_doctor.cli.main import run as cli
    from dtype_doctor.fix.engine import fix_model
    from dtype_doctor.fix.settings import FixSettings
    from dtype_doctor.integrations.diffusers_folder import fix_pipeline
    from dtype_doctor.run.fix import fix_script

    for engine in (fix_model, pipeline.fix, fix_script, fix_pipeline):
        assert not {"strategy", "fail_on", "unsafe_fixes", "force", "max_rounds"} & set(inspect.signature(engine).parameters)
    fixtures = ROOT.parent / "fixtures/demo"
    calls = _validations(monkeypatch, FixSettings)
    with pytest.raises(SystemExit) as done:
        cli(["fix", str(fixtures / "model"), str(fixtures / "data"), "--strategy", "cast-inputs", "--format", "json",
             "--output", str(tmp_path / "fix.json")])
    assert done.value.code in (0, 1)
    assert [c.strategy for c in calls] == ["cast-inputs"]  # type: ignore[attr-defined]
