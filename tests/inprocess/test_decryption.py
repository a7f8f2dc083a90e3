"""``spec.decryption`` in process: whose identity reads the key Secret, how often, and when not at all.

The real SOPS helper decrypts files the real ``sops`` encrypted (``tests/sopskit.py``); the
cluster is the recording fake, so the test sees every request and its identity.
"""

from __future__ import annotations

import yaml

from tests.inprocess.conftest import NS, TENANT, World, configmap
from tests.sopskit import SECRET_REGEX, SopsKit, secret_data, sops_kit

__all__ = ["sops_kit"]

OTHER = f"system:serviceaccount:{NS}:other"
KEYS = f"/api/v1/namespaces/{NS}/secrets/keys"
DECRYPTION = {"provider": "sops", "secretRef": {"name": "keys"}}


def key_reads(world: World) -> list[str]:
    return [r.user for r in world.cluster.requests if r.path == KEYS]


def test_the_key_secret_is_read_as_the_stagesets_account_once_a_pass_and_only_when_needed(
    world: World, sops_kit: SopsKit
) -> None:
    key = sops_kit.age_key()
    world.cluster.grant_namespace(OTHER, NS)
    world.cluster.put({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "keys", "namespace": NS},
                       "data": secret_data(age=[key])})

    def secret(name: str) -> str:
        manifest = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
                    "stringData": {"password": f"{name}-password"}}
        encrypted = sops_kit.encrypt(yaml.safe_dump(manifest), name="s.yaml", age=[key], regex=SECRET_REGEX)
        return encrypted.decode()

    world.commit({"plain/cm.json": configmap("plain"), "a/secret.yaml": secret("a"),
                  "b/secret.yaml": secret("b")})

    # No SOPS file in the build: the key Secret is never read.
    world.stageset("quiet", [{"name": "plain", "path": "./plain"}], decryption=DECRYPTION)
    world.reconcile("quiet")
    assert world.ready("quiet")["status"] == "True"
    assert key_reads(world) == []

    # Two stages with SOPS files, one applying as another ServiceAccount: one read a pass, as the
    # StageSet's own ServiceAccount (never the stage's override), on a cold pass and a cached one.
    world.stageset("shop", [{"name": "a", "path": "./a"},
                            {"name": "b", "path": "./b", "serviceAccountName": "other"}],
                   decryption=DECRYPTION)
    world.reconcile("shop")
    assert world.ready("shop")["status"] == "True", world.ready("shop")
    assert key_reads(world) == [TENANT]
    applied = world.cluster.get(f"/api/v1/namespaces/{NS}/secrets/b")
    assert applied is not None
    assert [r.user for r in world.cluster.requests if r.write and r.path.endswith("/secrets/b")][-1] == OTHER
    world.cluster.requests.clear()
    world.reconcile("shop")
    assert key_reads(world) == [TENANT]
