"""The worked example of docs/releases.md, run as written against the test control plane.

The repository files, the objects and the commands are read from the page (the blocks marked
``<!-- example-… -->``); only the Git URL (the test's loopback server) and the namespace (each test
gets its own) are the test's.  The soak is 30 minutes as written: the page's break-glass command
ends it, then the page's promotion releases production.  When the test happens to run during the
page's Friday freeze, the page's ``--update-now`` command ships the release, as the page says."""

from __future__ import annotations

import datetime
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from stageset.api import StageSet
from stageset.controller.stageset import windows
from stageset.kube.client import KubeClient
from tests.cli.conftest import run_cli
from tests.conftest import Tenant
from tests.e2e.conftest import ControllerProcess, apply, condition, wait_for
from tests.e2e.stagesets import Scenario

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

PAGE = Path(__file__).resolve().parents[2] / "docs" / "releases.md"
BLOCK = re.compile(r"<!-- (example-[a-z-]+)(?::\s*(\S+))? -->\n```[a-z]*\n(.*?)```", re.DOTALL)


def examples() -> dict[str, list[tuple[str | None, str]]]:
    found: dict[str, list[tuple[str | None, str]]] = {}
    for kind, argument, body in BLOCK.findall(PAGE.read_text(encoding="utf-8")):
        found.setdefault(kind, []).append((argument or None, body))
    return found


def commands(body: str, namespace: str) -> list[list[str]]:
    """The ``$ stageset …`` lines of a console block, in the test's namespace."""
    lines = [line.removeprefix("$ ") for line in body.splitlines() if line.startswith("$ stageset ")]
    return [[namespace if (i and words[i - 1] == "-n") else word for i, word in enumerate(words)][1:]
            for words in map(shlex.split, lines)]


def test_the_worked_example_of_the_releases_page_runs_as_written(
    controller: ControllerProcess, installed: KubeClient, git_server: Any, make_tenant: Callable[..., Tenant],
    kubeconfig: Path,
) -> None:
    blocks = examples()
    files = {path: body for path, body in blocks["example-file"] if path}
    assert set(files) == {"deploy/staging/app.yaml", "deploy/canary/app.yaml", "deploy/production/app.yaml"}
    [(_, manifests)] = blocks["example-apply"]
    objects = [o for o in yaml.safe_load_all(manifests) if o]
    [stageset] = [o for o in objects if o["kind"] == "StageSet"]
    # The page's freeze means what the page says: Friday 16:00 Berlin until Monday 08:00.
    spec = StageSet.model_validate(stageset).spec
    friday = windows.decide(spec.update_windows, datetime.datetime(2026, 11, 27, 15, 0, tzinfo=datetime.UTC))
    assert not friday.allowed
    monday = datetime.datetime(2026, 11, 30, 7, 0, tzinfo=datetime.UTC)
    assert friday.next_open == monday
    assert windows.decide(spec.update_windows, monday).allowed

    tenant = make_tenant("shop", service_account=stageset["spec"]["serviceAccountName"])
    tenant.bind_cluster_role("edit")
    url = git_server.create_repo(f"{tenant.namespace}-deploy", files)
    s = Scenario(admin=installed, git=git_server, tenant=tenant, repo=f"{tenant.namespace}-deploy")
    for obj in objects:
        obj["metadata"]["namespace"] = tenant.namespace
        if obj["kind"] == "GitRepository":
            obj["spec"]["url"] = url
        apply(installed, obj)

    def cli(kind: str) -> None:
        [(_, body)] = blocks[kind]
        for args in commands(body, tenant.namespace):
            result = run_cli(*args, kubeconfig=kubeconfig)
            assert result.exit_code == 0, (args, result.output)

    def reason() -> str:
        return str((condition(s.get("shop")) or {}).get("reason", ""))

    wait_for(lambda: reason() in ("Soaking", "UpdateDeferred"), what="the release started (or frozen)")
    if reason() == "UpdateDeferred":  # the test runs during the page's Friday freeze
        assert s.get("shop")["status"]["pendingUpdate"]["nextWindowOpens"]
        cli("example-update-now")
        wait_for(lambda: reason() == "Soaking", what="the release shipped through the freeze")
    soaking = s.get("shop")["status"]["stages"][0]["promotionState"]
    assert soaking["phase"] == "Soaking"
    assert s.configmap("shop-staging") is not None
    assert s.configmap("shop-canary") is None

    cli("example-break-glass")  # ends the 30-minute soak now
    wait_for(lambda: reason() == "AwaitingPromotion", what="canary waiting for its promotion")
    assert s.configmap("shop-canary") is not None
    assert s.configmap("shop-production") is None

    cli("example-run")  # stageset promote … --stage canary --wait
    ready = s.wait_ready("shop")
    assert s.configmap("shop-production") is not None
    gates = {st["name"]: (st.get("promotionState") or {}).get("phase") for st in ready["status"]["stages"]}
    assert gates == {"staging": "Promoted", "canary": "Promoted", "production": None}
    shown = run_cli("get", "shop", "-n", tenant.namespace, kubeconfig=kubeconfig)
    assert shown.exit_code == 0, shown.output
    assert "GATE" in shown.stdout
    assert "Promoted" in shown.stdout
