"""Shards: ``--watch-namespaces`` (a shard sees only its namespaces, through namespace-scoped watches)
and ``--watch-label-selector`` (Flux's ``sharding.fluxcd.io/key``: two controllers on one control
plane, each with the chart's ClusterRole and RoleBindings under an account of its own — so the audit
log tells them apart — and each with its own Lease; a StageSet moved between them by its label, a
move while the losing shard's pass waits in a slow action (no write of that shard after the relabel,
from the audit log), a key no shard serves reported by the main shard, and our selector parser
against the apiserver's)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from stageset.cli.main import main as cli
from stageset.controller.handoff import record_name
from stageset.controller.sharding import SHARD_LABEL, LabelSelector, SelectorError
from stageset.envtest import install
from stageset.envtest.server import ControlPlane
from stageset.kube.client import ApiError, KubeClient
from tests.actionserver import ActionServer
from tests.e2e.conftest import (
    WRITE_VERBS,
    ControllerProcess,
    apply,
    condition,
    get_or_none,
    start_controller,
    stop_controller,
    wait_for,
)
from tests.e2e.metrics import METRICS_ARGS, metrics_url, scrape
from tests.e2e.remotes import inline_kubeconfig
from tests.e2e.stagesets import cm, poke
from tests.e2e.test_platform_targets import put_secret
from tests.gitserver import GitServer

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

ACCOUNT = "stageset-shard"
WATCHED = ["shard-a", "shard-b"]
OUTSIDE = "shard-c"


@pytest.fixture(scope="module")
def shard(installed: KubeClient, control_plane: ControlPlane,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProcess]:
    for namespace in [*WATCHED, OUTSIDE]:
        install.create_tenant(installed, namespace=namespace, service_account="deployer")
    workdir = tmp_path_factory.mktemp("shard")
    kubeconfig = install.controller_kubeconfig(
        installed, url=control_plane.url, ca=control_plane.pki.ca_cert, path=workdir / "kubeconfig",
        account=ACCOUNT, watch_namespaces=WATCHED)
    handle = start_controller(kubeconfig=kubeconfig, workdir=workdir,
                              extra=["--watch-namespaces", ",".join(WATCHED)])
    try:
        yield handle
    finally:
        stop_controller(handle)


def stageset_in(namespace: str, url: str) -> list[dict[str, Any]]:
    return [
        {"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
         "metadata": {"name": "app", "namespace": namespace},
         "spec": {"url": url, "ref": {"branch": "main"}}},
        {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
         "metadata": {"name": "app", "namespace": namespace},
         "spec": {"serviceAccountName": "deployer",
                  "stages": [{"name": "app", "sourceRef": {"name": "app"}}]}},
    ]


def test_a_shard_reconciles_its_namespaces_only_with_namespace_scoped_watches(
    shard: ControllerProcess, installed: KubeClient, control_plane: ControlPlane, git_server: GitServer,
) -> None:
    url = git_server.create_repo("sharded", {"cm.yaml": cm("sharded")})
    for namespace in [*WATCHED, OUTSIDE]:
        for obj in stageset_in(namespace, url):
            apply(installed, obj)
    for namespace in WATCHED:
        wait_for(lambda ns=namespace: (c := condition(installed.get(
            f"/apis/stages.metio.wtf/v1/namespaces/{ns}/stagesets/app"))) and c["status"] == "True",
            what=f"StageSet in {namespace} Ready")
        assert get_or_none(installed, f"/api/v1/namespaces/{namespace}/configmaps/sharded") is not None
    outside = installed.get(f"/apis/stages.metio.wtf/v1/namespaces/{OUTSIDE}/stagesets/app")
    assert not (outside.get("status") or {}).get("conditions"), "a shard touched another namespace"
    assert get_or_none(installed, f"/api/v1/namespaces/{OUTSIDE}/configmaps/sharded") is None

    shard_user = f"system:serviceaccount:stageset-system:{ACCOUNT}"
    lists = [e for e in control_plane.audit_events()
             if (e.get("user") or {}).get("username") == shard_user and e.get("verb") in ("list", "watch")
             and "stages.metio.wtf" in e.get("requestURI", "")]
    assert lists, "the shard listed nothing"
    for event in lists:
        assert any(f"/namespaces/{ns}/" in event["requestURI"] for ns in WATCHED), event["requestURI"]


# -- label shards ------------------------------------------------------------------------------------

LABELLED = ["label-a", "label-b"]
ACCOUNTS = {"main": "stageset-main", "shard1": "stageset-shard1"}
SELECTORS = {"main": [f"--watch-label-selector=!{SHARD_LABEL}", "--shard-keys=shard1"],
             "shard1": [f"--watch-label-selector={SHARD_LABEL}=shard1"]}
LEASES = "/apis/coordination.k8s.io/v1/namespaces/stageset-system/leases"
SHARD_TARGETS = "shard-targets"
"""The target namespace of both label shards (platform StageTargets)."""


@dataclass
class LabelShards:
    main: ControllerProcess
    shard1: ControllerProcess

    @staticmethod
    def user(shard: str) -> str:
        return f"system:serviceaccount:stageset-system:{ACCOUNTS[shard]}"


@pytest.fixture(scope="module")
def label_shards(installed: KubeClient, control_plane: ControlPlane,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabelShards]:
    """The main shard and shard1, both also scoped to this module's namespaces (so neither picks up
    another test's StageSets on this control plane), each with the Lease the chart would give it,
    both honouring the StageTargets of :data:`SHARD_TARGETS`."""
    for namespace in LABELLED:
        install.create_tenant(installed, namespace=namespace, service_account="deployer")
    handles: dict[str, ControllerProcess] = {}
    try:
        for shard, account in ACCOUNTS.items():
            workdir = tmp_path_factory.mktemp(account)
            kubeconfig = install.controller_kubeconfig(
                installed, url=control_plane.url, ca=control_plane.pki.ca_cert, path=workdir / "kubeconfig",
                account=account, watch_namespaces=LABELLED, leader_election=True,
                target_namespaces=[SHARD_TARGETS])
            handles[shard] = start_controller(kubeconfig=kubeconfig, workdir=workdir, extra=[
                "--watch-namespaces", ",".join(LABELLED), *SELECTORS[shard], "--leader-elect",
                "--target-namespaces", SHARD_TARGETS,
                "--leader-election-namespace=stageset-system", f"--leader-election-id={account}",
                "--allowed-action-hosts=127.0.0.1", *METRICS_ARGS])
        yield LabelShards(main=handles["main"], shard1=handles["shard1"])
    finally:
        for handle in handles.values():
            stop_controller(handle)


def gitrepository(namespace: str, name: str, url: str, shard: str | None) -> dict[str, Any]:
    return {"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {SHARD_LABEL: shard} if shard else {}},
            "spec": {"url": url, "ref": {"branch": "main"}}}


def labelled_stageset(namespace: str, name: str, source: str, shard: str | None) -> dict[str, Any]:
    return {"apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {SHARD_LABEL: shard} if shard else {}},
            "spec": {"serviceAccountName": "deployer",
                     "stages": [{"name": "app", "sourceRef": {"name": source}}]}}


def ready_at(admin: KubeClient, namespace: str, name: str, *, status: str = "True") -> dict[str, Any] | None:
    obj = admin.get(f"/apis/stages.metio.wtf/v1/namespaces/{namespace}/stagesets/{name}")
    found = condition(obj)
    at = (obj.get("status") or {}).get("observedGeneration") == obj["metadata"]["generation"]
    return found if found and found["status"] == status and at else None


def acted_as(event: dict[str, Any]) -> str:
    return str((event.get("user") or {}).get("username", ""))


def real_writes(events: list[dict[str, Any]], *, namespace: str) -> list[dict[str, Any]]:
    """Completed non-dry-run writes in ``namespace`` (our kinds and what the StageSets applied; Events,
    which record rather than own anything, left out)."""
    return [e for e in events if e.get("stage") == "ResponseComplete" and e.get("verb") in WRITE_VERBS
            and "dryRun=All" not in e.get("requestURI", "")
            and (e.get("objectRef") or {}).get("namespace") == namespace
            and (e.get("objectRef") or {}).get("resource") != "events"]


def test_relabelling_moves_a_stageset_between_shards_without_teardown_or_second_owner(
    label_shards: LabelShards, installed: KubeClient, control_plane: ControlPlane, git_server: GitServer,
) -> None:
    namespace = LABELLED[0]
    url = git_server.create_repo("label-move", {"cm.yaml": cm("moved", "one")})
    apply(installed, gitrepository(namespace, "app", url, None))
    apply(installed, gitrepository(namespace, "app-shard1", url, "shard1"))
    apply(installed, labelled_stageset(namespace, "mover", "app", None))
    wait_for(lambda: ready_at(installed, namespace, "mover"), what="Ready on the main shard")
    configmap = f"/api/v1/namespaces/{namespace}/configmaps/moved"
    before = installed.get(configmap)
    mark = len(control_plane.audit_events())
    # One write: the shard label and the shard's own GitRepository of the same URL.
    apply(installed, labelled_stageset(namespace, "mover", "app-shard1", "shard1"))
    wait_for(lambda: ready_at(installed, namespace, "mover"), what="Ready on shard1")
    git_server.commit("label-move", {"cm.yaml": cm("moved", "two")})
    installed.request("PATCH", f"/apis/stages.metio.wtf/v1/namespaces/{namespace}/gitrepositories/app-shard1",
                      content_type="application/merge-patch+json",
                      body={"metadata": {"annotations": {"reconcile.fluxcd.io/requestedAt": "now"}}})
    wait_for(lambda: installed.get(configmap)["data"].get("k") == "two" and
             ready_at(installed, namespace, "mover"), what="shard1 applying the next commit")
    after = installed.get(configmap)

    controllers = {LabelShards.user("main"), LabelShards.user("shard1")}

    def writers(events: list[dict[str, Any]]) -> set[str]:
        return {acted_as(e) for e in real_writes(events, namespace=namespace)
                if (e.get("objectRef") or {}).get("name") in ("mover", "moved")
                and acted_as(e) in controllers}

    audit = control_plane.audit_events()
    events = audit[mark:]
    # Before the move only the main shard wrote them; after it only shard1: the main shard let go at
    # once, and nothing was ever written by both at a time.
    assert writers(audit[:mark]) == {LabelShards.user("main")}
    assert writers(events) == {LabelShards.user("shard1")}
    deletes = [e for e in events if e.get("verb") in ("delete", "deletecollection")
               and acted_as(e) in (LabelShards.user("main"), LabelShards.user("shard1"))]
    # Nothing deleted but the hand-off record, by the shard that gained the StageSet, once it read it.
    assert {((e.get("objectRef") or {}).get("resource"), (e.get("objectRef") or {}).get("name"), acted_as(e))
            for e in deletes} <= {("leases", record_name(namespace, "mover"), LabelShards.user("shard1"))}
    # The same object, one owner: no teardown and recreate, no second field manager.
    assert after["metadata"]["uid"] == before["metadata"]["uid"]

    def appliers(obj: dict[str, Any]) -> set[str]:
        return {f["manager"] for f in obj["metadata"].get("managedFields", [])
                if f.get("operation") == "Apply"}

    managers = appliers(after)
    assert managers == appliers(before)
    assert len(managers) == 1, managers
    # Each shard holds a Lease of its own.
    holders = {name: installed.get(f"{LEASES}/{account}")["spec"].get("holderIdentity")
               for name, account in ACCOUNTS.items()}
    assert all(holders.values()), holders
    assert len(set(holders.values())) == 2, holders


def held_stageset(namespace: str, *, source: str, shard: str | None, action: str) -> dict[str, Any]:
    """One stage behind a ``pre`` HTTP action: each new revision calls ``action`` before applying."""
    obj = labelled_stageset(namespace, "holder", source, shard)
    obj["spec"]["stages"][0]["actions"] = {"pre": [{"name": "gate", "http": {
        "url": action, "method": "GET", "expectedStatus": [200]}}]}
    return obj


def split(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                list[dict[str, Any]]]:
    """Writes of the StageSet ``holder`` and of what it applies (``held``; its GitRepository stays the
    main shard's) before the test's relabelling write, after it, and those after it by the main shard."""
    namespace = LABELLED[0]
    patches = [i for i, e in enumerate(events) if e.get("stage") == "ResponseComplete"
               and e.get("verb") == "patch" and (e.get("objectRef") or {}).get("resource") == "stagesets"
               and (e.get("objectRef") or {}).get("name") == "holder"
               and acted_as(e) not in (LabelShards.user("main"), LabelShards.user("shard1"))]
    if len(patches) < 2:  # created on the main shard, then relabelled
        return [], [], []
    writes = [(i, e) for i, e in enumerate(events) if real_writes([e], namespace=namespace)
              and (e.get("objectRef") or {}).get("name") in ("holder", "held")]
    before = [e for i, e in writes if i < patches[1]]
    after = [e for i, e in writes if i > patches[1]]
    return before, after, [e for e in after if acted_as(e) == LabelShards.user("main")]


def test_a_pass_of_the_shard_that_lost_a_stageset_writes_nothing_after_the_relabel(
    label_shards: LabelShards, installed: KubeClient, control_plane: ControlPlane, git_server: GitServer,
) -> None:
    """The attack of issue 30: the main shard's pass waits in an action (the endpoint holds its answer)
    while the StageSet is relabelled to shard1 and a newer commit lands.  shard1 applies the newest
    revision once the main shard recorded its release; when the action answers, the main shard's stale
    pass sends nothing: no write of the main shard's account in the namespace after the relabel, and
    the older revision never comes back."""
    namespace = LABELLED[0]
    url = git_server.create_repo("label-hold", {"cm.yaml": cm("held", "one")})
    apply(installed, gitrepository(namespace, "hold", url, None))
    apply(installed, gitrepository(namespace, "hold-shard1", url, "shard1"))
    stagesets = f"/apis/stages.metio.wtf/v1/namespaces/{namespace}"
    configmap = f"/api/v1/namespaces/{namespace}/configmaps/held"
    gate = threading.Event()
    # Read before the race (the audit log is long); the relabel is found in it afterwards.
    mark = len(control_plane.audit_events())
    with ActionServer() as server:
        slow_path, fast_path = f"/{namespace}/slow", f"/{namespace}/fast"
        slow, fast = server.answer(slow_path), server.answer(fast_path)
        apply(installed, held_stageset(namespace, source="hold", shard=None, action=slow))
        wait_for(lambda: ready_at(installed, namespace, "holder") and
                 installed.get(configmap)["data"]["k"] == "one", what="Ready on the main shard")
        # The next revision's action is held: the main shard's pass waits in it.
        server.answer(slow_path, hold=gate)
        calls = len(server.received(slow_path))
        git_server.commit("label-hold", {"cm.yaml": cm("held", "two")})
        poke(installed, f"{stagesets}/gitrepositories/hold")
        wait_for(lambda: len(server.received(slow_path)) > calls,
                 what="the main shard's pass held in its action")

        shard1_metrics, main_metrics = metrics_url(label_shards.shard1), metrics_url(label_shards.main)
        handoffs = scrape(shard1_metrics).value("stageset_shard_handoffs_total")
        git_server.commit("label-hold", {"cm.yaml": cm("held", "three")})
        poke(installed, f"{stagesets}/gitrepositories/hold-shard1")
        # One write: the shard label, shard1's source and an endpoint that answers at once.
        apply(installed, held_stageset(namespace, source="hold-shard1", shard="shard1", action=fast))
        wait_for(lambda: installed.get(configmap)["data"]["k"] == "three" and
                 ready_at(installed, namespace, "holder"), what="shard1 applying the newest revision")
        # The action answers: the stale pass goes on, and its next write is refused before it is sent
        # (or, were it not, shows in the audit log).
        gate.set()
        wait_for(lambda: scrape(main_metrics).value("stageset_shard_writes_fenced_total") >= 1 or
                 split(control_plane.audit_events()[mark:])[2], interval=1.0,
                 what="the main shard's stale pass reaching its next write")
        final = installed.get(f"{stagesets}/stagesets/holder")
    before, tenant_writes, stale = split(control_plane.audit_events()[mark:])
    # The main shard wrote the StageSet before the relabel (its passes): the check can see its writes.
    assert [e for e in before if acted_as(e) == LabelShards.user("main")]
    assert stale == [], [f"{e['verb']} {e['requestURI']}" for e in stale]
    assert scrape(main_metrics).value("stageset_shard_writes_fenced_total") >= 1
    # The check can fail: shard1's own writes after the relabel are right there.
    assert [e for e in tenant_writes if acted_as(e) == LabelShards.user("shard1")]
    assert installed.get(configmap)["data"]["k"] == "three"
    assert installed.get(f"{stagesets}/stagesets/holder")["status"]["lastAppliedRevision"] == \
        final["status"]["lastAppliedRevision"]
    # The hand-off: the main shard recorded its release (in the release namespace, not the tenant's),
    # shard1 counted one and then deleted the record (its content: tests/kube/test_handoff_records.py).
    record_writes = [(acted_as(e), e.get("verb")) for e in control_plane.audit_events()[mark:]
                     if e.get("stage") == "ResponseComplete" and e.get("verb") in WRITE_VERBS
                     and (e.get("responseStatus") or {}).get("code", 0) < 300
                     and (e.get("objectRef") or {}).get("resource") == "leases"
                     and (e.get("objectRef") or {}).get("name") == record_name(namespace, "holder")]
    assert record_writes[-1] == (LabelShards.user("shard1"), "delete"), record_writes
    assert (LabelShards.user("main"), "create") in record_writes[:-1] or \
        (LabelShards.user("main"), "update") in record_writes[:-1], record_writes
    assert get_or_none(installed, f"{LEASES}/{record_name(namespace, 'holder')}") is None
    after = scrape(shard1_metrics)
    assert after.value("stageset_shard_handoffs_total") == handoffs + 1
    assert after.value("stageset_shard_handoffs_total", outcome="timeout") == 0


def test_a_key_no_shard_serves_is_reported_by_the_main_shard(
    label_shards: LabelShards, installed: KubeClient, git_server: GitServer, kubeconfig: Path,
) -> None:
    namespace = LABELLED[1]
    url = git_server.create_repo("label-lost", {"cm.yaml": cm("lost", "one")})
    apply(installed, gitrepository(namespace, "app", url, "shard1"))
    apply(installed, labelled_stageset(namespace, "lost", "app", "shard-9"))
    reported = wait_for(lambda: ready_at(installed, namespace, "lost", status="False"), what="NoShard")
    assert reported["reason"] == "NoShard"
    assert f"{SHARD_LABEL}='shard-9' names no shard" in reported["message"]
    assert get_or_none(installed, f"/api/v1/namespaces/{namespace}/configmaps/lost") is None
    main_metrics = metrics_url(label_shards.main)
    assert scrape(main_metrics).value("stageset_unserved_objects", kind="StageSet") == 1
    shown = CliRunner().invoke(cli, ["get", "-n", namespace, "--kubeconfig", str(kubeconfig)])
    assert shown.exit_code == 0, shown.output
    header, row = shown.output.splitlines()[:2]
    assert header.split()[:4] == ["NAME", "SHARD", "READY", "REASON"]
    assert row.split()[:4] == ["lost", "shard-9", "False", "NoShard"]
    # Fixed: shard1 takes it over; the main shard's count drops.
    apply(installed, labelled_stageset(namespace, "lost", "app", "shard1"))
    wait_for(lambda: ready_at(installed, namespace, "lost"), what="Ready on shard1")
    wait_for(lambda: scrape(main_metrics).value("stageset_unserved_objects", kind="StageSet") == 0,
             what="the main shard's count back to 0")


def stage_target(name: str, *, secret: str, allowed: list[str], shard: str | None) -> dict[str, Any]:
    return {"apiVersion": "stages.metio.wtf/v1", "kind": "StageTarget",
            "metadata": {"name": name, "namespace": SHARD_TARGETS,
                         "labels": {SHARD_LABEL: shard} if shard else {}},
            "spec": {"kubeConfig": {"secretRef": {"name": secret}}, "allowedNamespaces": allowed}}


def target_status_writes(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(writer, StageTarget) of every completed write of a StageTarget's status."""
    return [(acted_as(e), str(e["objectRef"].get("name"))) for e in events
            if e.get("stage") == "ResponseComplete" and e.get("verb") in WRITE_VERBS
            and (e.get("objectRef") or {}).get("resource") == "stagetargets"
            and e["objectRef"].get("subresource") == "status"]


def test_one_shard_writes_a_stagetargets_status_the_others_only_read(
    label_shards: LabelShards, installed: KubeClient, control_plane: ControlPlane, git_server: GitServer,
) -> None:
    namespace = LABELLED[1]
    mark = len(control_plane.audit_events())
    put_secret(installed, "here-kubeconfig", inline_kubeconfig(control_plane), namespace=SHARD_TARGETS)
    for name, shard in (("main-owned", None), ("shard1-owned", "shard1")):
        installed.apply(f"/apis/stages.metio.wtf/v1/namespaces/{SHARD_TARGETS}/stagetargets/{name}",
                        stage_target(name, secret="here-kubeconfig", allowed=[namespace], shard=shard),
                        field_manager="platform-team")
    targets = f"/apis/stages.metio.wtf/v1/namespaces/{SHARD_TARGETS}/stagetargets"
    for name in ("main-owned", "shard1-owned"):
        wait_for(lambda name=name: (c := condition(installed.get(f"{targets}/{name}")))
                 and c["status"] == "True", timeout=240, what=f"StageTarget {name} Ready")
    # A StageSet of shard1 on the main shard's target: served by shard1, which only reads the target.
    url = git_server.create_repo("label-target", {"cm.yaml": cm("through-target", "one")})
    apply(installed, gitrepository(namespace, "app-target", url, "shard1"))
    on_target = labelled_stageset(namespace, "on-target", "app-target", "shard1")
    on_target["spec"]["targetRef"] = {"name": "main-owned", "namespace": SHARD_TARGETS}
    apply(installed, on_target)
    wait_for(lambda: ready_at(installed, namespace, "on-target"), timeout=120,
             what="Ready on shard1 through the target")
    assert get_or_none(installed, f"/api/v1/namespaces/{namespace}/configmaps/through-target") is not None
    time.sleep(1)  # let the audit log catch up
    writes = target_status_writes(control_plane.audit_events()[mark:])
    assert writes, "no StageTarget status write in the audit log at all"
    by = {shard: {target for writer, target in writes if writer == LabelShards.user(shard)}
          for shard in ACCOUNTS}
    assert by == {"main": {"main-owned"}, "shard1": {"shard1-owned"}}, writes


# (selector, names of the ConfigMaps it selects among PARITY_OBJECTS)
PARITY_OBJECTS = {"none": {}, "main": {"team": "a"}, "s1": {SHARD_LABEL: "shard1", "team": "a"},
                  "s2": {SHARD_LABEL: "shard2", "n": "5"}, "empty": {SHARD_LABEL: ""}}
PARITY = [f"!{SHARD_LABEL}", f"{SHARD_LABEL}=shard1", f"{SHARD_LABEL}==shard2", f"{SHARD_LABEL}!=shard1",
          f"{SHARD_LABEL} in (shard1,shard2)", f"{SHARD_LABEL} notin (shard1)", f"{SHARD_LABEL}",
          f"{SHARD_LABEL}=", "team=a,!sharding.fluxcd.io/key", "n>4", "n<5", "team in ()",
          f"{SHARD_LABEL},{SHARD_LABEL} notin (shard1)"]
REFUSED = ["a b", "a in b", "a=b,", "-a=b", "a>b", "a=" + "x" * 64, "!a=b"]


def test_selectors_select_as_the_apiserver_selects(installed: KubeClient) -> None:
    namespace = LABELLED[1]
    for name, labels in PARITY_OBJECTS.items():
        installed.apply(f"/api/v1/namespaces/{namespace}/configmaps/parity-{name}",
                        {"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"name": f"parity-{name}", "labels": {"parity": "yes", **labels}}},
                        field_manager="e2e-test")
    for text in PARITY:
        selector = LabelSelector.parse(text)
        listed = installed.request("GET", f"/api/v1/namespaces/{namespace}/configmaps",
                                   query={"labelSelector": f"parity,{selector}"})["items"]
        served = {o["metadata"]["name"].removeprefix("parity-") for o in listed}
        assert served == {n for n, labels in PARITY_OBJECTS.items() if selector.matches(labels)}, text
    for text in REFUSED:
        with pytest.raises(SelectorError):
            LabelSelector.parse(text)
        with pytest.raises(ApiError) as refused:
            installed.request("GET", f"/api/v1/namespaces/{namespace}/configmaps",
                              query={"labelSelector": text})
        assert refused.value.status == 400, text
