"""The CLI without a cluster: usage errors are exit 2 and name the flag, runtime errors exit 3 in one
line, never a traceback; ``build -f --source-dir`` needs no cluster; ``crds`` prints the CRDs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stageset.api.crd import DEFAULT_OUTPUT_DIR, KINDS
from tests.cli.conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]


def stageset(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real process, as a user's shell runs it: exit code and stderr exactly as they see them."""
    import os

    return subprocess.run(
        [sys.executable, "-m", "stageset.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
    )


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["controller", "--workers", "0"], "--workers"),
        (["controller", "--mirror-max-size", "500m"], "--mirror-max-size"),
        (["controller", "--mirror-max-size", "lots"], "--mirror-max-size"),
        (["controller", "--max-teardown-wait", "5 minutes"], "--max-teardown-wait"),
        (["controller", "--watch-namespaces", "shop,Not_A_Namespace"], "--watch-namespaces"),
        (["controller", "--log-level", "loud"], "--log-level"),
        (["controller", "--runbook-base-url", "ftp://docs"], "--runbook-base-url"),
        (["get", "-n", "Bad_Namespace"], "--namespace"),
        (["graph", "shop", "-o", "png"], "--output"),
        (["reconcile", "shop", "--timeout", "soon"], "--timeout"),
        (["run", "--workers", "0"], "--workers"),
    ],
)
def test_bad_values_are_usage_errors_naming_the_flag(args: list[str], flag: str) -> None:
    result = run_cli(*args)  # any exception but click's own would fail this test
    assert result.exit_code == 2, result.output
    assert flag in result.stderr, result.stderr


def test_a_bad_value_in_the_real_process_is_no_traceback() -> None:
    result = stageset("controller", "--mirror-max-size", "500m")
    assert result.returncode == 2
    assert "not a whole number of bytes" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_arguments_are_usage_errors() -> None:
    for args in (["tree"], ["graph"], ["diff"], ["reconcile"], ["nonsense"]):
        result = run_cli(*args)
        assert result.exit_code == 2, (args, result.output)


def test_version() -> None:
    result = stageset("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("stageset, version ")


def test_no_kubeconfig_is_a_runtime_error_in_one_line(no_cluster: dict[str, str]) -> None:
    result = stageset("get", env=no_cluster)
    assert result.returncode == 3, result.stderr
    assert "no kubeconfig" in result.stderr
    assert "--kubeconfig" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unreachable_cluster_is_a_runtime_error(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {"server": "https://127.0.0.1:9", "insecure-skip-tls-verify": True},
                    }
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "shop"}}],
            }
        )
    )
    result = stageset("get", "--kubeconfig", str(config))
    assert result.returncode == 3, result.stderr
    assert "cannot reach the cluster at https://127.0.0.1:9" in result.stderr
    assert "Traceback" not in result.stderr
    unknown = stageset("get", "--kubeconfig", str(config), "--context", "nope")
    assert unknown.returncode == 3
    assert "nope" in unknown.stderr
    assert "Traceback" not in unknown.stderr


def test_crds_prints_what_crds_holds() -> None:
    result = run_cli("crds")
    assert result.exit_code == 0
    printed = [d for d in yaml.safe_load_all(result.stdout) if d]
    on_disk = [yaml.safe_load((DEFAULT_OUTPUT_DIR / kind.filename).read_text()) for kind in KINDS]
    assert printed == on_disk
    listed = json.loads(run_cli("crds", "-o", "json").stdout)
    assert listed["kind"] == "List"
    assert listed["items"] == on_disk


SECRET_SOURCE = {
    "app/secret.yaml": """\
apiVersion: v1
kind: Secret
metadata: {name: db}
stringData:
  password: ${DB_PASSWORD:=hunter2-default}
""",
    "app/config.yaml": """\
apiVersion: v1
kind: ConfigMap
metadata: {name: app}
data:
  mode: ${MODE}
""",
}
LOCAL_STAGESET = """\
apiVersion: stages.metio.wtf/v1
kind: GitRepository
metadata: {name: app, namespace: shop}
spec: {url: "https://git.example.invalid/app.git"}
---
apiVersion: stages.metio.wtf/v1
kind: StageSet
metadata: {name: shop, namespace: shop}
spec:
  serviceAccountName: deployer
  stages:
    - name: app
      sourceRef: {name: app}
      path: ./app
      postBuild:
        substitute: {MODE: fast}
        substituteFrom: [{kind: Secret, name: vars}]
"""


def test_a_local_build_needs_no_cluster_and_masks_secrets(tmp_path: Path, no_cluster: dict[str, str]) -> None:
    for name, text in SECRET_SOURCE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "stageset.yaml").write_text(LOCAL_STAGESET)
    args = ["build", "-f", str(tmp_path / "stageset.yaml"), "--source-dir", str(tmp_path)]
    result = stageset(*args, env=no_cluster)
    assert result.returncode == 0, result.stderr
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert {o["kind"] for o in objects} == {"Secret", "ConfigMap"}
    config = next(o for o in objects if o["kind"] == "ConfigMap")
    assert config["data"] == {"mode": "fast"}  # postBuild.substitute applied
    secret = next(o for o in objects if o["kind"] == "Secret")
    assert secret["stringData"] == {"password": "***"}
    assert "hunter2" not in result.stdout
    assert "substituteFrom (Secret/vars) not read" in result.stderr
    shown = stageset(*args, "--show-secrets", env=no_cluster)
    assert "hunter2-default" in shown.stdout
    as_json = json.loads(stageset(*args, "-o", "json", env=no_cluster).stdout)
    assert [s["stage"] for s in as_json] == ["app"]


def test_a_local_build_of_the_example(no_cluster: dict[str, str]) -> None:
    examples = ROOT / "examples"
    result = stageset(
        "build", "-f", str(examples / "stageset.yaml"), "--source-dir", str(examples), env=no_cluster
    )
    assert result.returncode == 0, result.stderr
    names = [d["metadata"]["name"] for d in yaml.safe_load_all(result.stdout) if d]
    assert names == ["shop-settings", "shop-backend", "shop-backend-schema", "shop-frontend"]
    assert "# stage frontend: path ./app/frontend" in result.stdout


def test_a_build_that_fails_exits_3(tmp_path: Path, no_cluster: dict[str, str]) -> None:
    (tmp_path / "stageset.yaml").write_text(LOCAL_STAGESET)
    result = stageset(
        "build", "-f", str(tmp_path / "stageset.yaml"), "--source-dir", str(tmp_path), env=no_cluster
    )
    assert result.returncode == 3
    assert "stage app" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_link_elsewhere_in_a_local_checkout_fails_only_a_build_that_loads_it(
    tmp_path: Path, no_cluster: dict[str, str]
) -> None:
    for name, text in SECRET_SOURCE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "stageset.yaml").write_text(LOCAL_STAGESET)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "passwd.yaml").symlink_to("/etc/passwd")
    args = ["build", "-f", str(tmp_path / "stageset.yaml"), "--source-dir", str(tmp_path)]
    assert run_cli(*args, env=no_cluster).exit_code == 0
    (tmp_path / "app" / "leak.yaml").symlink_to("/etc/passwd")
    result = run_cli(*args, env=no_cluster)
    assert result.exit_code == 3
    assert "root:" not in result.output


def test_run_is_hidden_from_the_command_list_but_still_runs() -> None:
    listed = run_cli("--help").stdout
    assert "  get " in listed
    assert "  check " in listed
    assert "  run " not in listed
    assert run_cli("run", "--help").exit_code == 0


def test_bash_completion_offers_commands_but_not_hidden_ones() -> None:
    """The script from `stageset completion bash`, sourced by a real bash, completing with the real
    `stageset` executable (.venv/bin) as a user's shell would."""
    import os
    import shutil

    bash = shutil.which("bash")
    assert bash is not None
    venv = Path(sys.executable).parent
    script = run_cli("completion", "bash").stdout
    assert "_STAGESET_COMPLETE=bash_complete" in script

    def complete(*words: str) -> list[str]:
        line = " ".join(words)
        result = subprocess.run(
            [bash, "-c", f'source /dev/stdin; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; '
                         '_stageset_completion stageset; printf "%s\\n" "${COMPREPLY[@]}"'],
            input=script, capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, "PATH": f"{venv}{os.pathsep}{os.environ['PATH']}"})
        assert result.returncode == 0, result.stderr
        return sorted(line for line in result.stdout.splitlines() if line)

    assert complete("stageset", "r") == ["reconcile", "resume"]  # not the hidden `run`
    assert complete("stageset", "check", "--p") == ["--pre"]


@pytest.mark.parametrize(("shell", "marker"), [("zsh", "compdef _stageset_completion stageset"),
                                               ("fish", "complete --no-files --command stageset")])
def test_zsh_and_fish_scripts(shell: str, marker: str) -> None:
    result = run_cli("completion", shell)
    assert result.exit_code == 0
    assert marker in result.stdout
    assert run_cli("completion", "tcsh").exit_code == 2


def test_powershell_script_and_its_completion_protocol() -> None:
    from click.testing import CliRunner

    from stageset.cli.main import main

    script = run_cli("completion", "powershell")
    assert script.exit_code == 0
    assert "Register-ArgumentCompleter -Native -CommandName stageset" in script.stdout
    assert '$env:_STAGESET_COMPLETE = "powershell_complete"' in script.stdout
    # What the script's call gets back: type, value and help, tab-separated, one per line.
    env = {"_STAGESET_COMPLETE": "powershell_complete", "COMP_WORDS": "stageset r", "COMP_CWORD": "r"}
    answer = CliRunner().invoke(main, [], env=env, prog_name="stageset", complete_var="_STAGESET_COMPLETE")
    assert answer.exit_code == 0
    values = sorted(line.split("\t")[1] for line in answer.stdout.splitlines() if line)
    assert values == ["reconcile", "resume"]
    env = {"_STAGESET_COMPLETE": "powershell_complete", "COMP_WORDS": "stageset get -o ", "COMP_CWORD": ""}
    answer = CliRunner().invoke(main, [], env=env, prog_name="stageset", complete_var="_STAGESET_COMPLETE")
    assert sorted(line.split("\t")[1] for line in answer.stdout.splitlines() if line) == [
        "json", "name", "table", "wide", "yaml"]


def test_usage_errors_of_the_conventions(no_cluster: dict[str, str]) -> None:
    # Refused before any request: exit code 2, naming the flags.
    assert "--as-group needs --as" in run_cli("get", "--as-group", "g", env=no_cluster).stderr
    assert run_cli("get", "shop", "-l", "a=b", env=no_cluster).exit_code == 2
    assert run_cli("get", "-l", "a=b=c", env=no_cluster).exit_code == 2
    for command in ("reconcile", "suspend", "resume"):
        neither = run_cli(command, env=no_cluster)
        assert neither.exit_code == 2, command
        assert "--all" in neither.stderr
    assert run_cli("events", "shop", "-A", env=no_cluster).exit_code == 2


def test_the_run_progress_log_names_the_stageset_and_prints_only_changes() -> None:
    import threading

    from stageset.cli.demo import Progress

    said: list[str] = []
    progress = Progress(stop=threading.Event(), once=False, say=said.append)

    def stageset(namespace: str, phases: dict[str, tuple[str, str]]) -> dict[str, object]:
        stages = [{"name": n, "phase": p, "revision": r} for n, (p, r) in phases.items()]
        return {"metadata": {"namespace": namespace, "name": "shop"}, "status": {"stages": stages}}

    a, b = "main@sha1:" + "a" * 40, "main@sha1:" + "b" * 40
    progress("ADDED", stageset("one", {"config": ("Ready", a)}))
    progress("ADDED", stageset("two", {"config": ("Failed", a)}))
    assert said == [f"one/shop: stage config     Ready        at main@sha1:{'a' * 12}",
                    f"two/shop: stage config     Failed       at main@sha1:{'a' * 12}"]
    progress("MODIFIED", stageset("one", {"config": ("Ready", a)}))  # nothing changed: nothing said
    progress("MODIFIED", stageset("two", {"config": ("Failed", a)}))
    assert len(said) == 2
    progress("MODIFIED", stageset("one", {"config": ("Ready", b)}))  # a new revision, still Ready
    assert said[2:] == [f"one/shop: stage config     Ready        at main@sha1:{'b' * 12}"]


def test_a_second_run_keeps_its_kubeconfig_apart_and_leaves_the_firsts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first demo's hints name run_dir()/kubeconfig: a second demo (while the first runs)
    neither overwrites it nor, when it stops, removes it."""

    from stageset.cli import demo

    monkeypatch.setenv("STAGESET_RUN_DIR", str(tmp_path / "run"))
    source = tmp_path / "admin.kubeconfig"
    source.write_text("first")
    first = demo._keep_kubeconfig(source)
    assert first == tmp_path / "run" / "kubeconfig"
    # The first demo is another live process now (this one plays the second).
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (first.parent / "owner").write_text(f"{other.pid}\n")
        source.write_text("second")
        second = demo._keep_kubeconfig(source)
        assert second != first
        assert first.read_text() == "first"
        demo._release_kubeconfig(second)
        assert not second.exists()
        demo._release_kubeconfig(first)  # not ours while the first runs: kept
        assert first.read_text() == "first"
    finally:
        other.kill()
        other.wait()
    # The first demo gone (crashed, its owner file left), a new demo takes the fixed path again.
    assert demo._keep_kubeconfig(source) == first
    assert first.read_text() == "second"
