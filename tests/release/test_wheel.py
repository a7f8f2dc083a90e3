"""The platform wheel ``make release`` builds, installed as a user would: a fresh virtual environment
(``uv venv``), no Go on ``PATH``, an empty cache, the working directory outside the checkout --
then ``stageset build`` and ``stageset diff`` (against the real apiserver) of a kustomize
repository with a remote-free overlay and a SOPS-encrypted Secret, so both Go helpers the wheel
ships run.  Removing the shipped builder afterwards makes the same build fail: it was the wheel's
copy that ran, not one found elsewhere.

Cost: the wheel is the pure ``uv build`` plus the host's helpers, the cached builds of the test
command (no Go build here); the other CPU's wheel is built only by ``make release``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from stageset.build.decrypt import HELPER_NAME
from stageset.build.kustomize import BUILDER_NAME
from stageset.envtest import wheels
from stageset.envtest.image import find_uv
from stageset.kube.client import KubeClient
from tests.conftest import Tenant
from tests.sopskit import AgeKey, SopsKit, sops_kit

__all__ = ["sops_kit"]

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "wheel-secret-password-7d1e"


@dataclass
class Installed:
    venv: Path
    env: dict[str, str]
    work: Path

    def stageset(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.venv / "bin" / "stageset"), *args], cwd=self.work, env=self.env,
                              capture_output=True, text=True, timeout=120, check=False)


def _path_without_go() -> str:
    """``PATH`` less every directory with ``go`` or a helper in it, and less the checkout's venv."""
    kept = []
    for entry in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep):
        directory = Path(entry or ".")
        if any((directory / name).exists() for name in ("go", BUILDER_NAME, HELPER_NAME)):
            continue
        if directory.resolve().is_relative_to(ROOT):
            continue
        kept.append(entry)
    return os.pathsep.join(kept)


@pytest.fixture(scope="module")
def user_install(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    host = wheels.host_platform()
    out = tmp_path_factory.mktemp("wheels")
    pure = wheels.pure_wheel(out)
    wheel = wheels.platform_wheel(pure, host, out, log=False)
    assert wheel.name.endswith(f"-py3-none-{'.'.join(sorted(host.tag.split('.')))}.whl"), wheel.name
    with zipfile.ZipFile(wheel) as archive:
        modes = {info.filename: info.external_attr >> 16 for info in archive.infolist()}
        (metadata,) = (n for n in archive.namelist() if n.endswith(".dist-info/WHEEL"))
        assert "Root-Is-Purelib: false" in archive.read(metadata).decode()
    for name in (BUILDER_NAME, HELPER_NAME):
        assert modes[f"{wheels.PACKAGED}/{name}"] & 0o111, name
    with zipfile.ZipFile(pure) as archive:
        assert not any(n.startswith(wheels.PACKAGED) for n in archive.namelist())

    base = tmp_path_factory.mktemp("user")
    venv, work, home = base / "venv", base / "work", base / "home"
    work.mkdir()
    home.mkdir()
    uv = find_uv()
    subprocess.run([uv, "venv", "--quiet", "--python", os.path.realpath(sys.executable), str(venv)],
                   check=True, cwd=work, capture_output=True)
    # The locked versions of the dependencies (what uv's cache holds), the wheel itself unpinned.
    constraints = base / "constraints.txt"
    constraints.write_text(subprocess.run(
        [uv, "export", "--frozen", "--no-dev", "--no-hashes", "--no-emit-project", "--quiet"],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout)
    subprocess.run([uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"),
                    "--constraint", str(constraints), str(wheel)], check=True, cwd=work, capture_output=True)
    path = f"{venv / 'bin'}{os.pathsep}{_path_without_go()}"
    assert shutil.which("go", path=path) is None
    env = {"PATH": path, "HOME": str(home), "STAGESET_CACHE_DIR": str(base / "empty-cache"),
           "LANG": "C.UTF-8", "KUBECONFIG": ""}
    return Installed(venv=venv, env=env, work=work)


def repository(root: Path, kit: SopsKit, key: AgeKey) -> None:
    """A kustomize repository: a base and a ``prod`` overlay (prefix, patch, encrypted Secret)."""
    files = {
        "base/kustomization.yaml": {"resources": ["settings.yaml"]},
        "base/settings.yaml": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
                               "data": {"env": "base", "currency": "EUR"}},
        "overlays/prod/kustomization.yaml": {
            "namePrefix": "prod-", "resources": ["../../base", "db.yaml"],
            "patches": [{"patch": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings}\n"
                                  "data: {env: prod}\n"}]},
    }
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(yaml.safe_dump(content))
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"},
              "stringData": {"pw": PASSWORD}}
    (root / "overlays/prod/db.yaml").write_bytes(kit.encrypt(yaml.safe_dump(secret), name="db.yaml",
                                                             age=[key], regex="^stringData$"))


@pytest.mark.apiserver
def test_the_wheel_builds_and_diffs_without_go_or_a_checkout(
    user_install: Installed, installed: KubeClient, sops_kit: SopsKit, tmp_path: Path, kubeconfig: Path,
    make_tenant: Callable[..., Tenant],
) -> None:
    tenant = make_tenant("wheel")
    tenant.bind_cluster_role("edit")
    key = sops_kit.age_key()
    source = tmp_path / "repo"
    repository(source, sops_kit, key)
    key_file = tmp_path / "age.agekey"
    key_file.write_bytes(key.identity)
    stageset = tmp_path / "stageset.yaml"
    stageset.write_text(yaml.safe_dump({
        "apiVersion": "stages.metio.wtf/v1", "kind": "StageSet",
        "metadata": {"name": "app", "namespace": tenant.namespace},
        "spec": {"serviceAccountName": tenant.service_account,
                 "decryption": {"provider": "sops", "secretRef": {"name": "keys"}},
                 "stages": [{"name": "prod", "sourceRef": {"name": "repo"}, "path": "./overlays/prod"}]}}))
    local = ("-f", str(stageset), "--source-dir", str(source), "--sops-age-key-file", str(key_file))

    located = subprocess.run([str(user_install.venv / "bin" / "python"), "-c",
                              "import stageset; print(stageset.__file__)"],
                             cwd=user_install.work, env=user_install.env, capture_output=True, text=True,
                             check=True)
    assert Path(located.stdout.strip()).is_relative_to(user_install.venv)

    built = user_install.stageset("build", *local, "--show-secrets")
    assert built.returncode == 0, built.stderr
    objects = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(built.stdout) if d}
    assert objects[("ConfigMap", "prod-settings")]["data"] == {"env": "prod", "currency": "EUR"}
    assert objects[("Secret", "prod-db")]["stringData"] == {"pw": PASSWORD}  # stageset-sops decrypted it

    diff = user_install.stageset("diff", *local, "-n", tenant.namespace, "--kubeconfig", str(kubeconfig))
    assert diff.returncode == 1, diff.stdout + diff.stderr  # differences: nothing is applied yet
    assert f"+++ after/ConfigMap/{tenant.namespace}/prod-settings" in diff.stdout
    assert f"+++ after/Secret/{tenant.namespace}/prod-db" in diff.stdout
    assert PASSWORD not in diff.stdout + diff.stderr

    # The control: without the builder the wheel shipped, the same build finds none.
    (shipped,) = user_install.venv.glob(f"lib/python*/site-packages/{wheels.PACKAGED}/{BUILDER_NAME}")
    shipped.unlink()
    missing = user_install.stageset("build", *local)
    assert missing.returncode != 0
    assert f"no {BUILDER_NAME} binary" in missing.stderr, missing.stderr
