"""``stageset build``/``diff`` and the controller render a StageSet alike: one render service.

The controller's renderer is the one the reconciler is wired with (after a real pass); the CLI's
is :class:`stageset.cli.render.Renderer` with its own Git mirror (a second fake mirror holding the
same commits, served nothing yet), reading the same fake cluster through the same identities.
Only the CLI's impersonation check (a SelfSubjectAccessReview, which the fake does not answer) is
left out: the CLI is handed the client pool directly.  The SOPS file is encrypted by the real
``sops`` and decrypted by the real helper (``tests/sopskit.py``).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml

from stageset.apply.engine import StageApplier
from stageset.apply.settings import ApplySettings
from stageset.build.kustomize import KustomizeNotFoundError, locate_builder
from stageset.cli.render import Renderer as CliRenderer
from stageset.cli.render import SourceDirs, parse_stageset
from stageset.controller.accounts import AccountCheck
from stageset.controller.consumers import artifact_consumer
from stageset.controller.identity import IdentityPolicy
from stageset.controller.kinds import GITREPOSITORIES
from stageset.controller.redact import Redactor
from stageset.controller.render.decryption import for_pass
from stageset.controller.stageset.rendering import Rendered, Renderer
from stageset.controller.targets.clusters import Target
from stageset.kube.client import LOCAL
from stageset.kube.mapping import RestMapper
from tests.inprocess.conftest import NS, TENANT, URL, World, configmap
from tests.inprocess.fakes import FakeSources
from tests.sopskit import SECRET_REGEX, SopsKit, secret_data, sops_kit

__all__ = ["sops_kit"]

KEYS = f"/api/v1/namespaces/{NS}/secrets/keys"
TOKEN = "token-from-a-secret-7f3a"
PASSWORD = "pw-91c2"
STAGE = {"name": "app", "path": "./app",
         "postBuild": {"substitute": {"env": "prod"},
                       "substituteFrom": [{"kind": "ConfigMap", "name": "vars"},
                                          {"kind": "Secret", "name": "creds"}]}}


def tenant_objects(world: World, kit: SopsKit) -> dict[str, str]:
    """The key Secret, the substituteFrom objects, and a commit with a plain and a SOPS file."""
    key = kit.age_key()
    world.cluster.put({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "keys", "namespace": NS},
                       "data": secret_data(age=[key])})
    world.cluster.put({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "vars", "namespace": NS},
                       "data": {"region": "eu-west"}})
    world.cluster.put({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds", "namespace": NS},
                       "data": {"token": base64.b64encode(TOKEN.encode()).decode()}})
    settings = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
                "data": {"url": "https://${region}.example", "token": "${token}", "env": "${env}"}}
    # Substituted after decryption, as Flux does: the variable sits inside the encrypted value.
    db = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"},
          "stringData": {"password": "${region}-" + PASSWORD}}
    encrypted = kit.encrypt(yaml.safe_dump(db), name="db.yaml", age=[key], regex=SECRET_REGEX)
    return {"app/settings.yaml": yaml.safe_dump(settings), "app/db.yaml": encrypted.decode(),
            "other/unrelated.json": configmap("unrelated")}


def controller_render(world: World, name: str) -> Rendered:
    """The stage as the wired controller renders it in a pass (its renderer, identity, keys)."""
    raw = world.get(name)
    stageset = parse_stageset(raw, where=name)
    renderer: Renderer = world.reconciler._passes._renderer
    identities = IdentityPolicy(cluster_admin=world.settings.cluster_admin)
    redactor = Redactor()
    decryption = for_pass(stageset, policy=identities, clients=world.pool, redactor=redactor,
                          accounts=AccountCheck(clients=world.pool, controller_reads_accounts=False))
    stage = stageset.spec.stages[0]
    target = Target(LOCAL, StageApplier(mapper=RestMapper(world.pool.client()), settings=ApplySettings()))
    return renderer.render(stage=stage, identity=identities.for_stage(stageset, stage), namespace=NS,
                           target=target, redactor=redactor, decryption=decryption,
                           salt=str(raw["metadata"]["uid"]))


def cli_renderer(world: World, tmp_path: Path) -> tuple[CliRenderer, FakeSources, list[str]]:
    mirror = FakeSources(repos=world.sources.repos, heads=world.sources.heads)
    warnings: list[str] = []
    renderer = CliRenderer(clients=world.pool, sources=SourceDirs(), cache_dir=tmp_path, warn=warnings.append,
                           mirror=mirror)
    return renderer, mirror, warnings


def by_name(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects}


def test_the_cli_renders_what_the_controller_renders_sops_and_substitution_included(
    world: World, sops_kit: SopsKit, tmp_path: Path
) -> None:
    sha = world.commit(tenant_objects(world, sops_kit))
    world.stageset("shop", [STAGE], decryption={"provider": "sops", "secretRef": {"name": "keys"}})
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True", world.ready("shop")
    controller = controller_render(world, "shop")

    world.cluster.requests.clear()
    renderer, mirror, warnings = cli_renderer(world, tmp_path)
    [cli] = renderer.render(parse_stageset(world.get("shop"), where="shop"))

    assert cli.error is None, cli.error
    assert cli.objects == controller.objects
    assert (cli.revision, cli.identity, cli.inputs) == (controller.revision, controller.identity,
                                                        controller.action_inputs)
    objects = by_name(cli.objects)
    assert objects["settings"]["data"] == {"url": "https://eu-west.example", "token": TOKEN, "env": "prod"}
    assert objects["db"]["stringData"] == {"password": f"eu-west-{PASSWORD}"}
    assert warnings == []
    # Fetched and read as the controller's consumer: the GitRepository by uid, not by name.
    repo = world.cluster.get(GITREPOSITORIES.object_path(name="app", namespace=NS))
    assert repo is not None
    assert repo["metadata"]["uid"]
    assert mirror.served == {(URL, sha, artifact_consumer(repo["metadata"]))}
    # The key Secret and substituteFrom read as the StageSet's ServiceAccount, as the controller reads them.
    reads = {(r.user, r.path) for r in world.cluster.requests if not r.write}
    assert (TENANT, KEYS) in reads
    assert {user for user, _ in reads} == {TENANT}
    # What came from Secrets, or was decrypted, is masked wherever the CLI shows it.
    assert TOKEN not in renderer.redactor(f"token {TOKEN}")
    # (The decrypted text as decrypted: a value substituted into it afterwards is another string,
    # for the controller's redactor as for this one.)
    assert PASSWORD not in renderer.redactor("${region}-" + PASSWORD)


def test_the_cli_applies_stage_patches_as_the_controller_does(world: World, tmp_path: Path) -> None:
    try:
        locate_builder()
    except KustomizeNotFoundError as error:
        pytest.skip(f"stageset-kustomize unavailable: {error}")
    world.commit({"app/cm.json": configmap("patched", "before")})
    patch = ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: patched}\n"
             "data: {k: after, region: '${region:=eu-central}'}\n")
    world.stageset("shop", [{"name": "app", "path": "./app", "patches": [{"patch": patch}],
                             "postBuild": {"substitute": {}}}])
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True", world.ready("shop")
    controller = controller_render(world, "shop")
    renderer, _, _ = cli_renderer(world, tmp_path)
    [cli] = renderer.render(parse_stageset(world.get("shop"), where="shop"))
    assert cli.error is None, cli.error
    assert cli.objects == controller.objects
    assert by_name(cli.objects)["patched"]["data"] == {"k": "after", "region": "eu-central"}
