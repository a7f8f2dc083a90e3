"""``build`` and ``diff`` of SOPS-encrypted files: decrypted with a local age key or with the key
Secret read as the StageSet's ServiceAccount (impersonated), and masked unless ``--show-secrets``."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from stageset.kube.client import KubeClient
from tests.cli.conftest import run_cli
from tests.conftest import Tenant
from tests.sopskit import AgeKey, SopsKit, secret_data, sops_kit

__all__ = ["sops_kit"]

VALUE = "cli-decrypted-value-3c9d51"
PASSWORD = "cli-secret-password-0e4f2a"


def checkout(tmp_path: Path, kit: SopsKit, key: AgeKey) -> Path:
    root = tmp_path / "checkout"
    (root / "app").mkdir(parents=True)
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
              "data": {"url": VALUE}}
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"},
              "stringData": {"pw": PASSWORD}}
    (root / "app" / "settings.yaml").write_bytes(kit.encrypt(yaml.safe_dump(config), name="s.yaml",
                                                             age=[key], regex="^data$"))
    (root / "app" / "db.yaml").write_bytes(kit.encrypt(yaml.safe_dump(secret), name="d.yaml",
                                                       age=[key], regex="^stringData$"))
    return root


def stageset_file(tmp_path: Path, namespace: str) -> Path:
    path = tmp_path / "stageset.yaml"
    path.write_text(yaml.safe_dump({
        "apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
        "metadata": {"name": "app", "namespace": namespace},
        "spec": {"serviceAccountName": "deployer",
                 "decryption": {"provider": "sops", "secretRef": {"name": "keys"}},
                 "stages": [{"name": "app", "sourceRef": {"name": "repo"}, "path": "./app"}]}}))
    return path


def test_a_local_build_decrypts_with_a_local_age_key_and_masks(sops_kit: SopsKit, tmp_path: Path) -> None:
    key = sops_kit.age_key()
    root = checkout(tmp_path, sops_kit, key)
    key_file = tmp_path / "age.agekey"
    key_file.write_bytes(key.identity)
    stageset = stageset_file(tmp_path, "team")
    local = ("build", "-f", str(stageset), "--source-dir", str(root))
    masked = run_cli(*local, "--sops-age-key-file", str(key_file))
    assert masked.exit_code == 0, masked.output
    assert VALUE not in masked.output
    assert PASSWORD not in masked.output
    objects = {d["metadata"]["name"]: d for d in yaml.safe_load_all(masked.stdout) if d}
    assert objects["settings"]["data"] == {"url": "***"}
    assert objects["db"]["stringData"] == {"pw": "***"}
    shown = run_cli(*local, "--sops-age-key-file", str(key_file), "--show-secrets")
    assert VALUE in shown.stdout
    assert PASSWORD in shown.stdout
    no_key = run_cli(*local)
    assert no_key.exit_code != 0
    assert "a local build reads no cluster, so give --sops-age-key-file" in no_key.stderr


@pytest.mark.apiserver
def test_build_and_diff_read_the_key_secret_as_the_stagesets_serviceaccount(
    sops_kit: SopsKit, tmp_path: Path, installed: KubeClient, kubeconfig: Path,
    make_tenant: Callable[..., Tenant],
) -> None:
    tenant = make_tenant("cli-sops")
    key = sops_kit.age_key()
    root = checkout(tmp_path, sops_kit, key)
    stageset = stageset_file(tmp_path, tenant.namespace)
    installed.request("POST", f"/api/v1/namespaces/{tenant.namespace}/secrets",
                      body={"metadata": {"name": "keys"}, "data": secret_data(age=[key])})
    installed.request("POST", f"/apis/stages.metio.wtf/v1/namespaces/{tenant.namespace}/stagesets",
                      body=yaml.safe_load(stageset.read_text()))
    # Not yet allowed to read the key Secret: the read is the ServiceAccount's, not the user's, and
    # fails as the controller's read fails (the same message: one render service).
    denied = run_cli("build", "app", "--source-dir", str(root), "-n", tenant.namespace, kubeconfig=kubeconfig)
    assert denied.exit_code != 0
    expected = f"{tenant.username} may not read Secret {tenant.namespace}/keys (spec.decryption.secretRef)"
    assert expected in denied.stderr, denied.stderr
    tenant.bind_cluster_role("edit")
    built = run_cli("build", "app", "--source-dir", str(root), "-n", tenant.namespace, kubeconfig=kubeconfig)
    assert built.exit_code == 0, built.output
    assert VALUE not in built.output
    assert "url: '***'" in built.stdout
    diff = run_cli("diff", "-f", str(stageset), "--source-dir", str(root), "-n", tenant.namespace,
                   kubeconfig=kubeconfig)
    assert diff.exit_code == 1, diff.output  # differences: nothing is applied yet
    assert f"+++ after/ConfigMap/{tenant.namespace}/settings" in diff.stdout
    for text in (VALUE, PASSWORD, base64.b64encode(PASSWORD.encode()).decode()):
        assert text not in diff.output


def test_a_decrypted_value_changed_by_substitution_is_masked_as_it_reads_after_it(
    sops_kit: SopsKit, tmp_path: Path,
) -> None:
    """A SOPS value that holds ``${var}`` reaches the objects changed by postBuild substitution: it is
    masked in that form too (one that is nothing but ``${var}`` makes that variable's value one)."""
    key = sops_kit.age_key()
    root = tmp_path / "checkout"
    (root / "app").mkdir(parents=True)
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
              "data": {"url": f"{VALUE}-${{REGION}}", "region": "${REGION}"}}
    (root / "app" / "settings.yaml").write_bytes(kit_encrypt(sops_kit, key, config))
    key_file = tmp_path / "age.agekey"
    key_file.write_bytes(key.identity)
    stageset = stageset_file(tmp_path, "team")
    spec = yaml.safe_load(stageset.read_text())
    spec["spec"]["stages"][0]["postBuild"] = {"substitute": {"REGION": "eu-north-7"}}
    stageset.write_text(yaml.safe_dump(spec))
    local = ("build", "-f", str(stageset), "--source-dir", str(root), "--sops-age-key-file", str(key_file))
    masked = run_cli(*local)
    assert masked.exit_code == 0, masked.output
    assert VALUE not in masked.output
    assert yaml.safe_load(masked.stdout.split("---", 1)[1])["data"] == {"url": "***", "region": "***"}
    shown = run_cli(*local, "--show-secrets")
    assert yaml.safe_load(shown.stdout.split("---", 1)[1])["data"] == {
        "url": f"{VALUE}-eu-north-7", "region": "eu-north-7"}


def kit_encrypt(kit: SopsKit, key: AgeKey, obj: dict[str, object]) -> bytes:
    return kit.encrypt(yaml.safe_dump(obj), name="s.yaml", age=[key], regex="^data$")
