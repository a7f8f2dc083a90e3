"""SOPS-encrypted manifests end to end: the real ``sops`` encrypts, the controller (a subprocess with
the chart's multi-tenant rights, sharded to this test's namespaces) decrypts with the key Secret
read as the tenant, and the real apiserver holds the plaintext only where it was applied.

One controller and one repository serve every case, in order:

* an encrypted Secret (age) and an encrypted ``secretGenerator`` env file (OpenPGP and age)
  applied decrypted, as the tenant (the audit log shows who read the key Secret and who wrote);
* a wrong key, a tampered MAC, too many values, no ``spec.decryption``: each a clear
  ``StageFailed`` and nothing of that stage applied; a decrypted value the apiserver quotes in
  its refusal is masked in the message;
* a tenant naming another namespace's key Secret: refused at admission; naming its own (absent)
  one: "not found", never the other namespace's;
* a rotated key: the key Secret is read again on the next pass (the old file then fails, and the
  applied Secret stays as it was: nothing pruned), and a file re-encrypted for the new key applies;
* then every status, event, log line and metric of the run is scanned for every plaintext value
  and key line, after checking that each of them was really captured.
"""

from __future__ import annotations

import base64
import json
import urllib.request
import uuid
from collections.abc import Callable, Iterator

import pytest
import yaml

from stageset.controller.redact import forms
from stageset.envtest import install
from stageset.envtest.controller import ControllerProcess
from stageset.envtest.server import ControlPlane
from stageset.kube.client import ApiError, KubeClient
from tests.conftest import Tenant
from tests.e2e.conftest import get_or_none, start_controller, stop_controller, wait_for
from tests.e2e.metrics import METRICS_ARGS, metrics_url
from tests.e2e.stagesets import Scenario, cm, poke, scenario
from tests.gitserver import GitServer
from tests.sopskit import SECRET_REGEX, SopsKit, secret_data, sops_kit

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]
__all__ = ["sops_kit"]

PASSWORD = "e2e-db-password-4b7c1f"
ROTATED = "e2e-rotated-password-9d02ae"
TOKEN = "e2e-api-token-61e8c3"
ECHOED = "echoed by the apiserver 5e0b"
"""Decrypted into a label value the apiserver refuses, and quotes in its error."""
MANY = {f"k{i}": f"many-value-{i:05d}-{uuid.uuid4().hex[:6]}" for i in range(1200)}


def secret_yaml(name: str, password: str) -> str:
    return f"apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\nstringData:\n  password: {password}\n"


def tamper(encrypted: bytes) -> bytes:
    document = yaml.safe_load(encrypted)
    document["metadata"]["labels"] = {"changed": "after-encryption"}
    return yaml.safe_dump(document).encode()


@pytest.fixture
def two_tenants(make_tenant: Callable[..., Tenant]) -> tuple[Tenant, Tenant]:
    return make_tenant("sops"), make_tenant("sops-other")


@pytest.fixture
def controller(installed: KubeClient, control_plane: ControlPlane, two_tenants: tuple[Tenant, Tenant],
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProcess]:
    namespaces = [tenant.namespace for tenant in two_tenants]
    account = f"sops-{uuid.uuid4().hex[:8]}"
    workdir = tmp_path_factory.mktemp(account)
    kubeconfig = install.controller_kubeconfig(
        installed, url=control_plane.url, ca=control_plane.pki.ca_cert, path=workdir / "kubeconfig",
        account=account, watch_namespaces=namespaces)
    handle = start_controller(kubeconfig=kubeconfig, workdir=workdir,
                              extra=["--watch-namespaces", ",".join(namespaces), *METRICS_ARGS])
    try:
        yield handle
    finally:
        stop_controller(handle)


def put_secret(admin: KubeClient, namespace: str, name: str, data: dict[str, str]) -> None:
    admin.apply(f"/api/v1/namespaces/{namespace}/secrets/{name}",
                {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace},
                 "data": data}, field_manager="e2e-test")


def secret_value(admin: KubeClient, namespace: str, name: str, key: str) -> str | None:
    found = get_or_none(admin, f"/api/v1/namespaces/{namespace}/secrets/{name}")
    if found is None:
        return None
    return base64.b64decode((found.get("data") or {}).get(key, "")).decode()


def failed_with(s: Scenario, name: str, text: str) -> str:
    def check() -> str | None:
        ready = next((c for c in (s.get(name).get("status") or {}).get("conditions", [])
                      if c["type"] == "Ready"), None)
        if ready and ready["reason"] == "StageFailed" and text in ready["message"]:
            return str(ready["message"])
        return None
    found: str = wait_for(check, timeout=60, what=f"StageSet {name} to fail with {text!r}")
    return found


def test_sops_secrets_decrypted_as_the_tenant_failures_safe_nothing_leaks(
    installed: KubeClient, control_plane: ControlPlane, git_server: GitServer, sops_kit: SopsKit,
    two_tenants: tuple[Tenant, Tenant], controller: ControllerProcess,
) -> None:
    tenant, other = two_tenants
    age, wrong_age, new_age = sops_kit.age_key(), sops_kit.age_key(), sops_kit.age_key()
    pgp = sops_kit.pgp_key()
    many = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "many"}, "stringData": MANY}
    files = {
        "secret/secret.enc.yaml": sops_kit.encrypt(secret_yaml("db", PASSWORD), name="s.yaml", age=[age],
                                                   regex=SECRET_REGEX).decode(),
        "gen/kustomization.yaml": "secretGenerator:\n- name: app-env\n  envs: [app.enc.env]\n"
                                  "generatorOptions: {disableNameSuffixHash: true}\n",
        "gen/app.enc.env": sops_kit.encrypt(f"TOKEN={TOKEN}\n", name="app.env", pgp=pgp).decode(),
        "wrong/secret.enc.yaml": sops_kit.encrypt(secret_yaml("wrong", PASSWORD), name="s.yaml", age=[age],
                                                  regex=SECRET_REGEX).decode(),
        "tampered/secret.enc.yaml": tamper(sops_kit.encrypt(secret_yaml("tampered", PASSWORD), name="s.yaml",
                                                            age=[age], regex=SECRET_REGEX)).decode(),
        "many/secret.enc.yaml": sops_kit.encrypt(yaml.safe_dump(many), name="m.yaml", age=[age],
                                                 regex=SECRET_REGEX).decode(),
        "echo/cm.yaml": sops_kit.encrypt(yaml.safe_dump({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "echo", "labels": {"tier": ECHOED}}}), name="cm.yaml", age=[age],
            regex="^labels$").decode(),
        "canary/cm.yaml": cm("canary"),
    }
    s = scenario(installed, git_server, tenant, files)
    ns = s.ns
    put_secret(installed, ns, "sops-keys", secret_data(age=[age], pgp=[pgp]))
    put_secret(installed, ns, "wrong-keys", secret_data(age=[wrong_age]))
    decryption = {"provider": "sops", "secretRef": {"name": "sops-keys"}}

    # 1. Applied decrypted, as the tenant.
    s.stageset("good", [{"name": "secret", "path": "./secret"}, {"name": "gen", "path": "./gen"}],
               decryption=decryption)
    s.wait_ready("good")
    assert secret_value(installed, ns, "db", "password") == PASSWORD
    assert secret_value(installed, ns, "app-env", "TOKEN") == TOKEN
    events = control_plane.audit_events()
    key_reads = [e for e in events if e.get("verb") == "get" and e.get("stage") == "ResponseComplete"
                 and e.get("objectRef", {}).get("name") == "sops-keys"
                 and e.get("objectRef", {}).get("namespace") == ns]
    assert key_reads, "the key Secret was never read (or the audit log is empty)"
    assert {(e.get("impersonatedUser") or {}).get("username") for e in key_reads} == {tenant.username}
    writes = [e for e in events if e.get("verb") in ("create", "patch", "update")
              and e.get("objectRef", {}).get("resource") == "secrets"
              and e.get("objectRef", {}).get("name") in ("db", "app-env")
              and e.get("objectRef", {}).get("namespace") == ns
              and "dryRun" not in e.get("requestURI", "") and e.get("stage") == "ResponseComplete"]
    assert writes, "no write of the decrypted Secrets in the audit log"
    assert {(e.get("impersonatedUser") or {}).get("username") for e in writes} == {tenant.username}

    # 2. Failures: a clear message, nothing of the stage applied.
    s.stageset("wrong", [{"name": "app", "path": "./wrong"}],
               decryption={"provider": "sops", "secretRef": {"name": "wrong-keys"}})
    s.stageset("tampered", [{"name": "app", "path": "./tampered"}], decryption=decryption)
    s.stageset("many", [{"name": "app", "path": "./many"}], decryption=decryption)
    s.stageset("nokeys", [{"name": "app", "path": "./wrong"}])
    s.stageset("echo", [{"name": "app", "path": "./echo"}], decryption=decryption)
    failed_with(s, "wrong", "wrong/secret.enc.yaml: no key matches the file's recipients")
    failed_with(s, "tampered", "tampered/secret.enc.yaml: MAC mismatch")
    failed_with(s, "many", "more than 1000 encrypted values")
    failed_with(s, "nokeys", "SOPS-encrypted, and this StageSet has no spec.decryption")
    for name in ("wrong", "tampered", "many"):
        assert get_or_none(installed, f"/api/v1/namespaces/{ns}/secrets/{name}") is None, name
    # A decrypted value the apiserver echoes back in its refusal is redacted from the message.
    echoed = failed_with(s, "echo", "Invalid value")
    assert "***" in echoed, echoed

    # 3. Another namespace's key Secret: refused at admission; its own name finds nothing there.
    o = Scenario(admin=installed, git=git_server, tenant=other, repo=s.repo)
    other.bind_cluster_role("edit")
    with pytest.raises(ApiError) as refused:
        o.stageset("borrow", [{"name": "app", "path": "./secret", "sourceRef": {"name": "app",
                                                                                "namespace": ns}}],
                   decryption={"provider": "sops", "secretRef": {"name": "sops-keys", "namespace": ns}})
    assert "the key Secret is always read from the StageSet's own namespace" in str(refused.value)
    installed.apply(f"/apis/stages.metio.wtf/v1/namespaces/{other.namespace}/gitrepositories/app",
                    {"apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
                     "metadata": {"name": "app", "namespace": other.namespace},
                     "spec": {"url": git_server.url(s.repo), "ref": {"branch": "main"}, "interval": "1m"}},
                    field_manager="e2e-test")
    o.stageset("borrow", [{"name": "app", "path": "./secret"}], decryption=decryption)
    failed_with(o, "borrow", f"spec.decryption: Secret {other.namespace}/sops-keys not found")
    assert get_or_none(installed, f"/api/v1/namespaces/{other.namespace}/secrets/db") is None

    # 4. A rotated key: read on the next pass.  The old file no longer opens, and the Secret the
    #    last good pass applied stays as it was; the file re-encrypted for the new key applies.
    put_secret(installed, ns, "sops-keys", secret_data(age=[new_age], pgp=[pgp]))
    poke(installed, s.path("good"))
    failed_with(s, "good", "secret/secret.enc.yaml: no key matches the file's recipients")
    assert secret_value(installed, ns, "db", "password") == PASSWORD
    sha = s.commit({"secret/secret.enc.yaml": sops_kit.encrypt(secret_yaml("db", ROTATED), name="s.yaml",
                                                               age=[new_age], regex=SECRET_REGEX).decode()})
    s.wait_ready("good", revision=sha)
    assert secret_value(installed, ns, "db", "password") == ROTATED

    # 5. Nothing of it anywhere it can be read: first check each place was really captured.
    controller.check_alive()
    names = ["good", "wrong", "tampered", "many", "nokeys", "echo"]
    statuses = [s.get(name).get("status") or {} for name in names] + [o.get("borrow").get("status") or {}]
    assert all(status.get("conditions") for status in statuses), "a status was not captured"
    event_list = [e for namespace in (ns, other.namespace)
                  for e in installed.get(f"/api/v1/namespaces/{namespace}/events")["items"]]
    assert any(e.get("involvedObject", {}).get("kind") == "StageSet" for e in event_list), "no event captured"
    log = controller.output()
    assert f"applied: Secret/{ns}/db" in log, "the controller log was not captured"
    assert f"reconciled StageSet {ns}/wrong" in log, "the controller log was not captured"
    with urllib.request.urlopen(metrics_url(controller), timeout=10) as response:  # noqa: S310 - loopback
        metrics = response.read().decode()
    assert "stageset_" in metrics, "no metrics captured"
    everywhere = {"status": json.dumps(statuses), "events": json.dumps(event_list), "controller log": log,
                  "metrics": metrics}
    plaintexts = [PASSWORD, ROTATED, TOKEN, ECHOED, *list(MANY.values())[:50]]
    for key in (age, wrong_age, new_age):
        plaintexts += [line for line in key.identity.decode().splitlines()
                       if line.startswith("AGE-SECRET-KEY")]
    plaintexts += [line for line in pgp.armored.decode().splitlines() if len(line) > 40]
    for place, text in everywhere.items():
        for value in plaintexts:
            for form in forms(value):
                if len(form) >= 8:
                    assert form not in text, f"{value[:6]}... ({form[:6]}...) leaked through the {place}"
