"""The CI glue, run by the real tools that run it: pre-commit, GitHub's published schemas, the
action's own command lines as a runner executes them, and `dtype-doctor init`.

Offline: pre-commit's `system` hooks install nothing; check-jsonschema's vendored schemas need
no network. Fixtures: fixtures/demo (a DD101 mismatch) and bert-tiny on text-cls (clean).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import junit_errors, sarif_errors, validate_sarif

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DEMO = [str(ROOT / "fixtures/demo/model"), str(ROOT / "fixtures/demo/data")]
CLEAN = [str(ROOT / "fixtures/models/bert-tiny"), str(ROOT / "fixtures/data/text-cls")]
README = (ROOT / "README.md").read_text()


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "GITHUB_", "INPUT_"))}
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(ROOT),
        HF_HUB_OFFLINE="1",
        PRE_COMMIT_HOME=str(tmp / "pre-commit-home"),
        GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t",
        GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1",
    )
    env.update(extra)
    return env


def _tool(name: str) -> str:
    path = shutil.which(name, path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if path is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[test]')")
    return path


def _git(cwd: Path, *args: str, env: dict[str, str]) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


# ------------------------------------------------------------------ schemas GitHub publishes


def _check_jsonschema(schema: str, path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([_tool("check-jsonschema"), "--builtin-schema", schema, str(path)], capture_output=True, text=True)


def test_action_yml_is_a_valid_action() -> None:
    done = _check_jsonschema("vendor.github-actions", ROOT / "action.yml")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_schema_check_bites(tmp_path: Path) -> None:
    """The same check refuses an action without `runs` and a workflow job without `runs-on`."""
    (tmp_path / "action.yml").write_text("name: x\ndescription: y\n")
    assert _check_jsonschema("vendor.github-actions", tmp_path / "action.yml").returncode == 1
    (tmp_path / "wf.yml").write_text("on: push\njobs:\n  a:\n    steps:\n      - run: echo\n")
    assert _check_jsonschema("vendor.github-workflows", tmp_path / "wf.yml").returncode == 1


def _readme_yaml(key: str) -> list[str]:
    return [body for body in re.findall(r"^```yaml\n(.*?)^```", README, re.M | re.S) if re.search(rf"^{key}:", body, re.M)]


def test_the_readme_workflow_is_a_valid_workflow(tmp_path: Path) -> None:
    workflows = _readme_yaml("jobs")
    assert workflows, "the README shows no workflow"
    for i, body in enumerate(workflows):
        (tmp_path / f"wf{i}.yml").write_text(body)
        done = _check_jsonschema("vendor.github-workflows", tmp_path / f"wf{i}.yml")
        assert done.returncode == 0, done.stdout + done.stderr
        flow = yaml.safe_load(body)
        job = next(iter(flow["jobs"].values()))
        assert job["permissions"]["security-events"] == "write"
        steps = [s.get("uses", "") for s in job["steps"]]
        assert any(u.startswith("github/codeql-action/upload-sarif@") for u in steps)
        doctor = next(s for s in job["steps"] if s.get("id") == "doctor")
        assert doctor["with"]["simulate"] == "true" and doctor["with"]["gpu"] == "a100"


def test_the_readme_pre_commit_configs_are_valid(tmp_path: Path) -> None:
    configs = _readme_yaml("repos")
    assert configs, "the README shows no .pre-commit-config.yaml"
    manifest = {h["id"] for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
    for i, body in enumerate(configs):
        (tmp_path / f"c{i}.yaml").write_text(body)
        done = subprocess.run([_tool("pre-commit"), "validate-config", str(tmp_path / f"c{i}.yaml")], capture_output=True, text=True,
                              env=_env(tmp_path))
        assert done.returncode == 0, done.stdout + done.stderr
        for repo in yaml.safe_load(body)["repos"]:
            if repo["repo"] != "local":
                assert {h["id"] for h in repo["hooks"]} <= manifest


# ------------------------------------------------------------------ pre-commit, for real


def test_the_hooks_manifest_is_valid() -> None:
    done = subprocess.run([_tool("pre-commit"), "validate-manifest", str(ROOT / ".pre-commit-hooks.yaml")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    hooks = {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
    assert hooks["dtype-doctor"]["language"] == "python" and hooks["dtype-doctor-system"]["language"] == "system"
    assert all(h["pass_filenames"] is False for h in hooks.values())
    # The hook runs only when a commit touches what the pipeline is made of.
    (HOOK_FILES,) = {h["files"] for h in hooks.values()}
    assert all("types_or" not in h and "types" not in h for h in hooks.values())
    runs_on = ("train.py", "models/bert/config.json", "models/bert/model.safetensors", "data/train.parquet", "pyproject.toml",
               "accelerate_config.yaml", "ds_config.json", "vocab.txt", "rows.csv")
    passes_by = ("README.md", "docs/index.md", "assets/logo.png", "LICENSE", ".gitignore", "notebook.ipynb")
    assert all(re.search(HOOK_FILES, p) for p in runs_on) and not any(re.search(HOOK_FILES, p) for p in passes_by)


def test_pre_commit_runs_the_hook_it_fails_on_a_mismatch_and_passes_a_clean_pipeline(tmp_path: Path) -> None:
    """What `pre-commit try-repo` does, with the hook's `args:` (try-repo cannot pass them): a
    git repository holding this working tree's .pre-commit-hooks.yaml, used at its commit by a
    project's .pre-commit-config.yaml. The `system` hook runs the dtype-doctor on PATH (this
    checkout); the `python` one would pip-install torch, so it is not run here."""
    env = _env(tmp_path)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    shutil.copy2(ROOT / ".pre-commit-hooks.yaml", hooks)
    _git(hooks, "init", "-q", env=env)
    _git(hooks, "add", ".", env=env)
    _git(hooks, "commit", "-qm", "hooks", env=env)
    rev = _git(hooks, "rev-parse", "HEAD", env=env)
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text('[project]\nname = "p"\n\n[tool.dtype-doctor]\nfail-on = "error"\n')
    _git(project, "init", "-q", env=env)

    def run(args: list[str]) -> subprocess.CompletedProcess:
        config = {"repos": [{"repo": str(hooks), "rev": rev, "hooks": [{"id": "dtype-doctor-system", "args": args}]}]}
        (project / ".pre-commit-config.yaml").write_text(yaml.safe_dump(config))
        _git(project, "add", ".", env=env)
        return subprocess.run([_tool("pre-commit"), "run", "--all-files"], cwd=project, env=env, capture_output=True, text=True, timeout=300)

    failed = run(["scan", *DEMO])
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "Failed" in failed.stdout and "DD101" in failed.stdout
    passed = run(["scan", *CLEAN])
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "Passed" in passed.stdout


# ------------------------------------------------------------------ the action, as a runner runs it

ACTION = yaml.safe_load((ROOT / "action.yml").read_text())
EXPR = re.compile(r"\$\{\{\s*(inputs|steps)\.([\w-]+)(?:\.outputs\.([\w-]+))?\s*\}\}")


def _run_action(tmp: Path, inputs: dict[str, str], path: str = "", extra: dict[str, str] | None = None) -> tuple[int, dict[str, dict[str, str]], str, str]:
    """Each of the action's `runs.steps` in order, as GitHub's runner runs a composite step:
    `bash --noprofile --norc -eo pipefail` on the step's script, its `env:` with the `${{ }}`
    expressions substituted, GITHUB_OUTPUT / GITHUB_STEP_SUMMARY files, GITHUB_ACTION_PATH.
    The pip install step is skipped when dtype-doctor is already importable (it is, here:
    installing would download torch); every other step runs as written."""
    values = {name: str(spec.get("default", "")) for name, spec in ACTION["inputs"].items()} | inputs
    outputs: dict[str, dict[str, str]] = {}
    summary = tmp / "summary.md"
    stdout = ""
    for i, step in enumerate(ACTION["runs"]["steps"]):
        if "uses" in step:  # another action (the download cache): GitHub's to run, not this harness's
            assert step["uses"].startswith("actions/cache@") and step["if"] == "inputs.download == 'true'"
            continue
        if "pip install" in step["run"]:
            assert importlib.util.find_spec("dtype_doctor") is not None
            continue
        assert step["shell"] == "bash" and "if" not in step

        def value(m: re.Match) -> str:
            return values[m.group(2)] if m.group(1) == "inputs" else outputs.get(m.group(2), {}).get(m.group(3), "")

        env = _env(tmp, GITHUB_ACTION_PATH=str(ROOT), GITHUB_OUTPUT=str(tmp / f"output{i}"), GITHUB_STEP_SUMMARY=str(summary),
                   RUNNER_TEMP=str(tmp))
        if path:
            env["PATH"] = f"{path}{os.pathsep}{env['PATH']}"
        env |= extra or {}
        env |= {k: EXPR.sub(value, str(v)) for k, v in step.get("env", {}).items()}
        (tmp / f"step{i}.sh").write_text(step["run"])
        (tmp / f"output{i}").write_text("")
        done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(tmp / f"step{i}.sh")], cwd=tmp, env=env,
                              capture_output=True, text=True, timeout=300)
        stdout += done.stdout
        if "id" in step:
            outputs[step["id"]] = dict(line.split("=", 1) for line in (tmp / f"output{i}").read_text().splitlines() if line)
        if done.returncode != 0:
            return done.returncode, outputs, stdout, done.stderr
    return 0, outputs, stdout, ""


def _action_outputs(outputs: dict[str, dict[str, str]]) -> dict[str, str]:
    return {name: EXPR.sub(lambda m: outputs.get(m.group(2), {}).get(m.group(3), ""), spec["value"])
            for name, spec in ACTION["outputs"].items()}


def test_the_action_annotates_writes_sarif_and_fails_on_a_mismatch(tmp_path: Path) -> None:
    code, outputs, stdout, _ = _run_action(tmp_path, {"model": DEMO[0], "dataset": DEMO[1]})
    out = _action_outputs(outputs)
    assert code == 1 and out["exit-code"] == "1"
    assert (out["errors"], out["warnings"], out["infos"]) == ("1", "0", "0")
    assert out["sarif"] == "dtype-doctor.sarif"
    sarif = (tmp_path / out["sarif"]).read_text()
    validate_sarif(sarif)
    assert [r["ruleId"] for r in json.loads(sarif)["runs"][0]["results"]] == ["DD101"]
    assert re.search(r"^::error .*title=DD101 dtype-mismatch-in-op::", stdout, re.M)
    assert "1 error(s)" in (tmp_path / "summary.md").read_text()


def test_the_action_passes_a_clean_simulated_pipeline(tmp_path: Path) -> None:
    code, outputs, stdout, err = _run_action(tmp_path, {"model": CLEAN[0], "dataset": CLEAN[1], "simulate": "true", "gpu": "a100",
                                                         "annotations": "false", "sarif": "out/dd.sarif"})
    out = _action_outputs(outputs)
    assert code == 0 and out["exit-code"] == "0", err
    assert (out["errors"], out["sarif"]) == ("0", "out/dd.sarif")
    log = json.loads((tmp_path / "out/dd.sarif").read_text())
    assert log["runs"][0]["properties"]["target"]["simulated"] is True and log["runs"][0]["results"] == []
    assert "::" not in stdout  # annotations off


def test_the_action_refuses_a_scan_without_a_model(tmp_path: Path) -> None:
    code, outputs, stdout, _ = _run_action(tmp_path, {"dataset": DEMO[1]})
    assert code == 2 and "::error title=dtype-doctor::command scan needs the model and dataset inputs" in stdout
    assert not (tmp_path / "dtype-doctor.sarif").exists()


# ------------------------------------------------------------------ the validators bite


def test_an_invalid_sarif_log_and_junit_file_are_refused() -> None:
    log = {"version": "2.1.0", "runs": [{"tool": {"driver": {"name": "x"}}, "results": [{"level": "fatal", "message": {"text": "m"}}]}]}
    assert sarif_errors(json.dumps(log))
    log["runs"][0]["results"][0]["level"] = "error"
    assert sarif_errors(json.dumps(log)) == []
    assert junit_errors('<testsuite name="s" tests="1" failures="0" errors="0"><testcase classname="c"/></testsuite>')
    assert junit_errors('<testsuite name="s" tests="1" failures="0" errors="0"><testcase name="n"/></testsuite>') == []


def test_the_cli_junit_report_validates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Written by the CLI (in this process; the action's tests write SARIF from a subprocess);
    conftest validates it again at teardown."""
    from dtype_doctor.cli.main import run

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = tmp_path / "report.xml"
    with pytest.raises(SystemExit) as done:
        run(["scan", *DEMO, "--format", "junit", "-o", str(path)])
    assert done.value.code == 1
    assert junit_errors(path.read_text()) == [] and "<failure" in path.read_text()


def test_what_init_writes_runs_under_pre_commit(tmp_path: Path) -> None:
    """`dtype-doctor init` in a project holding the demo, then `pre-commit run` on the config it
    wrote: the hook finds the demo's DD101 and fails the commit."""
    env = _env(tmp_path)
    project = tmp_path / "project"
    shutil.copytree(ROOT / "fixtures/demo", project / "demo")
    _git(project, "init", "-q", env=env)
    done = subprocess.run([str(BIN / "dtype-doctor"), "init"], cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert 'args: ["scan", "demo/model", "demo/data"]' in (project / ".pre-commit-config.yaml").read_text()
    assert _check_jsonschema("vendor.github-workflows", project / ".github/workflows/dtype-doctor.yml").returncode == 0
    _git(project, "add", ".", env=env)
    hook = subprocess.run([_tool("pre-commit"), "run", "--all-files"], cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert hook.returncode == 1 and "DD101" in hook.stdout, hook.stdout + hook.stderr


def test_the_action_runs_a_script(tmp_path: Path) -> None:
    script = ROOT / "tests/scripts/seed_amp_loop.py"  # an int32 target under autocast: DD104
    code, outputs, _, err = _run_action(tmp_path, {"command": "run", "script": f"python {script} 2", "annotations": "false"})
    out = _action_outputs(outputs)
    assert code == 1 and out["exit-code"] == "1", err
    results = json.loads((tmp_path / out["sarif"]).read_text())["runs"][0]["results"]
    assert "DD104" in {r["ruleId"] for r in results} and int(out["errors"]) >= 1


def test_the_action_traces_once_for_the_sarif_and_the_annotations(tmp_path: Path) -> None:
    """One dtype-doctor process writes both: a `dtype-doctor` on PATH that counts its calls."""
    calls = tmp_path / "calls"
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "dtype-doctor").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec "{BIN / "dtype-doctor"}" "$@"\n')
    (shim / "dtype-doctor").chmod(0o755)
    code, outputs, stdout, _ = _run_action(tmp_path, {"model": DEMO[0], "dataset": DEMO[1]}, path=str(shim))
    assert code == 1 and len(calls.read_text().splitlines()) == 1
    assert "--format github --output sarif:dtype-doctor.sarif" in calls.read_text()
    assert re.search(r"^::error .*title=DD101", stdout, re.M) and (tmp_path / "dtype-doctor.sarif").is_file()


def test_the_action_downloads_a_hub_model_without_weights_when_simulating(tmp_path: Path) -> None:
    """`hf download` as the download step calls it (a stand-in `hf` on PATH records the call and
    places the snapshot in the cache, as the real one would; this test has no network)."""
    calls = tmp_path / "hf-calls"
    hub = tmp_path / "hf-home" / "hub"
    snapshot = hub / "models--org--tiny-bert" / "snapshots" / "abc"
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "hf").write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\nmkdir -p {snapshot} {hub}/models--org--tiny-bert/refs\n'
        f'cp {CLEAN[0]}/*.json {CLEAN[0]}/*.txt {snapshot}/ 2>/dev/null\nprintf abc > {hub}/models--org--tiny-bert/refs/main\n')
    (shim / "hf").chmod(0o755)
    code, outputs, _, err = _run_action(tmp_path, {"model": "org/tiny-bert", "dataset": CLEAN[1], "simulate": "true",
                                                   "download": "true", "annotations": "false"},
                                        path=str(shim), extra={"HF_HOME": str(tmp_path / "hf-home")})
    (call,) = calls.read_text().splitlines()  # the model only: the dataset is a local path
    assert call.startswith("download org/tiny-bert --repo-type model") and '--exclude *.safetensors' in call
    assert code == 0 and _action_outputs(outputs)["exit-code"] == "0", err
    log = json.loads((tmp_path / "dtype-doctor.sarif").read_text())
    assert log["runs"][0]["properties"]["target"]["model"] == "org/tiny-bert"
