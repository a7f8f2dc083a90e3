"""Label shards in the chart (``controller.shards``, ``controller.watchLabelSelector``), rendered by the
real ``helm``: one Deployment per shard beside the main one, each with its own Lease and selector, the
flags the controller itself accepts, and the values refused.  Installing them into a real apiserver
and moving a StageSet between two running shards is ``tests/e2e/test_sharding.py``'s."""

from __future__ import annotations

from typing import Any

import pytest

from stageset.cli.main import main as cli
from tests.helm.chart import Helm, controller_args, find, one

SHARDS = ["--set", "controller.shards={shard1,shard2}"]


def deployments(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in find(docs, "Deployment")}


def args_of(deployment: dict[str, Any]) -> list[str]:
    return list(next(c for c in deployment["spec"]["template"]["spec"]["containers"]
                     if c["name"] == "controller")["args"])


def flag(args: list[str], name: str) -> str | None:
    return next((a.partition("=")[2] for a in args if a.partition("=")[0] == f"--{name}"), None)


def test_shards_render_a_deployment_each_beside_the_main_one(helm: Helm) -> None:
    found = deployments(helm.render(*SHARDS, "--set", "controller.watchLabelSelector=team=platform",
                                    release="gitops"))
    assert sorted(found) == ["gitops-stageset", "gitops-stageset-shard1", "gitops-stageset-shard2"]
    main = args_of(found["gitops-stageset"])
    assert flag(main, "watch-label-selector") == "team=platform,!sharding.fluxcd.io/key"
    assert flag(main, "shard-keys") == "shard1,shard2"
    assert flag(main, "leader-election-id") == "gitops-stageset"
    for key in ("shard1", "shard2"):
        shard = found[f"gitops-stageset-{key}"]
        args = args_of(shard)
        assert flag(args, "watch-label-selector") == f"team=platform,sharding.fluxcd.io/key={key}"
        assert flag(args, "shard-keys") is None
        assert flag(args, "leader-election-id") == f"gitops-stageset-{key}"  # a Lease of its own
        selector = shard["spec"]["selector"]["matchLabels"]
        assert selector == {"app.kubernetes.io/name": "stageset-shard",
                            "app.kubernetes.io/instance": "gitops", "stages.metio.wtf/shard": key}
        assert selector.items() <= shard["spec"]["template"]["metadata"]["labels"].items()
        # The rest of the pod is the main one's (same values): only the flags above differ.
        differing = {a for a in set(args) ^ set(main) if not a.startswith(
            ("--watch-label-selector=", "--shard-keys=", "--leader-election-id="))}
        assert not differing
    # The main Deployment's selector is what it always was (immutable on upgrade).
    plain = deployments(helm.render(release="gitops"))["gitops-stageset"]
    assert found["gitops-stageset"]["spec"]["selector"] == plain["spec"]["selector"]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_selectors_are_disjoint_with_a_metrics_service_and_a_budget_per_deployment(helm: Helm) -> None:
    """Overlapping Deployment selectors are unsupported: each Deployment, metrics Service and
    PodDisruptionBudget selects the pods of exactly one Deployment (and no hook's)."""
    docs = helm.render(*SHARDS, "--set", "replicaCount=2", "--set", "cleanupOnDelete.enabled=true",
                       release="gitops")
    pods = {name: d["spec"]["template"]["metadata"]["labels"] for name, d in deployments(docs).items()}
    pods.update({d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"]
                 for d in find(docs, "Job")})
    assert len(pods) == 5  # three Deployments, the CRD hook and the cleanup hook
    services = {d["metadata"]["name"]: d["spec"]["selector"] for d in find(docs, "Service")}
    budgets = {d["metadata"]["name"]: d["spec"]["selector"]["matchLabels"]
               for d in find(docs, "PodDisruptionBudget")}
    assert sorted(services) == ["gitops-stageset-metrics", "gitops-stageset-shard1-metrics",
                                "gitops-stageset-shard2-metrics"]
    assert sorted(budgets) == ["gitops-stageset", "gitops-stageset-shard1", "gitops-stageset-shard2"]
    for name, deployment in deployments(docs).items():
        own = deployment["spec"]["selector"]["matchLabels"]
        assert [pod for pod, labels in pods.items() if selects(own, labels)] == [name]
        assert [pod for pod, labels in pods.items() if selects(services[f"{name}-metrics"], labels)] == [name]
        assert [pod for pod, labels in pods.items() if selects(budgets[name], labels)] == [name]
    # One ServiceMonitor scrapes every metrics Service of the release.
    monitor = one(helm.render(*SHARDS, "--set", "metrics.serviceMonitor.enabled=true", release="gitops"),
                  "ServiceMonitor")["spec"]["selector"]["matchLabels"]
    assert all(selects(monitor, d["metadata"]["labels"]) for d in find(docs, "Service"))


def test_every_rendered_flag_is_one_the_controller_accepts(helm: Helm) -> None:
    controller = cli.commands["controller"]  # type: ignore[attr-defined]
    for deployment in deployments(helm.render(*SHARDS)).values():
        params = controller.make_context("controller", args_of(deployment)).params
        assert params["watch_label_selector"] is not None
    one = controller_args(helm.render("--set", "controller.watchLabelSelector=sharding.fluxcd.io/key=shard1"))
    params = controller.make_context("controller", one).params
    assert str(params["watch_label_selector"]) == "sharding.fluxcd.io/key=shard1"
    assert params["shard_keys"] is None


def test_without_shards_nothing_changes(helm: Helm) -> None:
    args = controller_args(helm.render())
    assert flag(args, "watch-label-selector") is None
    assert flag(args, "shard-keys") is None
    assert len(deployments(helm.render())) == 1


def test_a_main_release_of_one_release_per_shard_may_name_the_shards_keys(helm: Helm) -> None:
    args = controller_args(helm.render("--set", "controller.watchLabelSelector=!sharding.fluxcd.io/key",
                                       "--set", "controller.extraArgs={--shard-keys=shard1}"))
    assert flag(args, "watch-label-selector") == "!sharding.fluxcd.io/key"
    assert flag(args, "shard-keys") == "shard1"


def test_shards_may_record_their_hand_offs_without_leader_election(helm: Helm) -> None:
    """The hand-off records (Leases, controller/handoff.py) need the release's Lease Role even when no
    leader is elected."""
    off = ["--set", "controller.leaderElection.enabled=false"]
    for values in (SHARDS, ["--set", "controller.watchLabelSelector=sharding.fluxcd.io/key=shard1"]):
        roles = [r for r in find(helm.render(*values, *off), "Role")
                 if r["metadata"]["name"].endswith("-leader-election")]
        assert [rule["resources"] for rule in roles[0]["rules"]] == [["leases"]]
    assert not find(helm.render(*off), "Role")


def test_the_cleanup_hook_deletes_only_the_release_s_own_stagesets(helm: Helm) -> None:
    docs = helm.render("--set", "cleanupOnDelete.enabled=true",
                       "--set", "controller.watchLabelSelector=sharding.fluxcd.io/key=shard1")
    job = one(docs, "Job", "stageset-cleanup")
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--selector=sharding.fluxcd.io/key=shard1" in command
    plain = one(helm.render("--set", "cleanupOnDelete.enabled=true"), "Job", "stageset-cleanup")
    assert not [c for c in plain["spec"]["template"]["spec"]["containers"][0]["command"]
                if c.startswith("--selector")]


@pytest.mark.parametrize(("values", "words"), [
    ([*SHARDS, "--set", "controller.watchLabelSelector=sharding.fluxcd.io/key=x"],
     "leave it out of the selector"),
    (["--set", "controller.shards={Shard1}"], "/controller/shards/0"),
    (["--set", "controller.shards={a,a}"], "/controller/shards"),
    (["--set", "controller.shards={" + "s" * 41 + "}"], "/controller/shards/0"),
    (["--set", "fullnameOverride=" + "f" * 40, "--set", "controller.shards={" + "s" * 30 + "}"],
     "longer than 63 characters"),
    (["--set", "controller.extraArgs={--watch-label-selector=a}"],
     "--watch-label-selector is set by the chart"),
    ([*SHARDS, "--set", "controller.extraArgs={--shard-keys=a}"], "--shard-keys is set by the chart"),
])
def test_bad_shard_values_are_refused(helm: Helm, values: list[str], words: str) -> None:
    result = helm.template(*values, check=False)
    assert result.returncode != 0
    assert words in result.stderr, result.stderr
