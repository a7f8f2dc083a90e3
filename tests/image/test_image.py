"""The controller image, built daemonlessly (OCI archive), unpacked and run under ``chroot``.

No container engine runs here, so the image is checked the way a runtime would use it: the
archive is unpacked by ``umoci`` into a root filesystem and a runtime config, and the
commands run under ``chroot`` as the image's numeric user with the image's environment.
The archive is built (or found in the cache, keyed by content) by
``python -m stageset.envtest.image``, which ``hack/test.sh`` runs before pytest.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stageset.build.decrypt import SOPS_VERSION
from stageset.build.kustomize import KUSTOMIZE_VERSION
from stageset.envtest.image import TAG, ContainerfileSettings, containerfile_settings, ensure_image
from stageset.envtest.release import current_version


@dataclass
class Unpacked:
    archive: Path
    rootfs: Path
    runtime: dict[str, Any]  # the OCI runtime config umoci derives from the image config
    settings: ContainerfileSettings
    summary: dict[str, Any]

    def run(self, *command: str, user: str | None = None) -> subprocess.CompletedProcess[str]:
        """``command`` as the image's user (or ``user``, ``uid:gid``) with the image's environment."""
        process = self.runtime["process"]
        own = process["user"]
        spec = user or f"{own['uid']}:{own['gid']}"
        env = dict(item.split("=", 1) for item in process["env"])
        return subprocess.run(
            ["chroot", f"--userspec={spec}", str(self.rootfs), "/usr/bin/env", "-i",
             *(f"{k}={v}" for k, v in env.items()), *command],
            capture_output=True, text=True, timeout=120, check=False, cwd="/")


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Unpacked]:
    missing = [tool for tool in ("umoci", "chroot", "mmdebstrap") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        reason = f"the image build and chroot need root and {', '.join(missing) or 'nothing else'}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} under CI", pytrace=False)
        pytest.skip(reason)
    archive = ensure_image(log=False)
    work = tmp_path_factory.mktemp("image")
    layout = work / "oci"
    layout.mkdir()
    subprocess.run(["tar", "--extract", "--file", str(archive), "--directory", str(layout)], check=True)
    subprocess.run(["umoci", "unpack", "--image", f"{layout}:{TAG}", str(work / "bundle")], check=True,
                   capture_output=True)
    runtime = json.loads((work / "bundle" / "config.json").read_text())
    summary = json.loads(archive.with_suffix(".json").read_text())
    unpacked = sum(f.lstat().st_size for f in (work / "bundle" / "rootfs").rglob("*") if f.is_file())
    sys.stderr.write(f"\nimage: {archive.name}: {summary['layers']} layers, "
                     f"{summary['compressed_bytes'] / 2**20:.1f} MiB compressed (as pulled), "
                     f"{unpacked / 2**20:.0f} MiB unpacked\n")
    try:
        yield Unpacked(archive=archive, rootfs=work / "bundle" / "rootfs", runtime=runtime,
                       settings=containerfile_settings(), summary=summary)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_the_image_config_is_the_containerfile_s(image: Unpacked) -> None:
    config = image.summary["config"]
    assert config["User"] == image.settings.user == "65532:65532"
    assert config["Entrypoint"] == list(image.settings.entrypoint)
    assert image.settings.entrypoint == ("/opt/stageset/bin/stageset", "controller")
    assert config["Env"] == [f"{k}={v}" for k, v in image.settings.env.items()]
    assert config["WorkingDir"] == image.settings.workdir
    assert config["Labels"] == image.settings.labels
    user = image.runtime["process"]["user"]
    assert (user["uid"], user["gid"]) == (65532, 65532)
    assert image.runtime["process"]["args"] == list(image.settings.entrypoint)


def test_stageset_version_as_the_image_user(image: Unpacked) -> None:
    result = image.run("stageset", "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"stageset, version {current_version()}"


def test_the_entrypoint_loads_the_whole_controller(image: Unpacked) -> None:
    # The entrypoint itself, with --help: every import of the controller command resolves.
    result = image.run(*image.settings.entrypoint, "--help")
    assert result.returncode == 0, result.stderr
    for flag in ("--watch-namespaces", "--leader-elect", "--probe-address", "--metrics-address"):
        assert flag in result.stdout
    result = image.run("stageset", "controller", "--help")
    assert result.returncode == 0, result.stderr
    modules = image.run("python3", "-c", "import stageset.controller.manager, stageset.cli.main, "
                        "sources, kubernetes.client, dulwich.client, pydantic, networkx, cryptography, re2; "
                        "import sys; print(sys.prefix)")
    assert modules.returncode == 0, modules.stderr
    assert modules.stdout.strip() == "/opt/stageset"


def test_the_dashboard_s_web_stack_and_templates_load_in_the_image(image: Unpacked) -> None:
    result = image.run("stageset", "dashboard", "--help")
    assert result.returncode == 0, result.stderr
    script = ("import uvicorn, sse_starlette; from stageset.cli.dashboard.app import environment; "
              "env = environment(); print(env.from_string('{{ x }}').render(x='<b>')); "
              "print(len(env.list_templates()))")
    rendered = image.run("python3", "-c", script)
    assert rendered.returncode == 0, rendered.stderr
    escaped, templates = rendered.stdout.split()
    assert escaped == "&lt;b&gt;"
    assert int(templates) >= 10


def test_the_kustomize_builder_and_ssh_as_the_image_user(image: Unpacked) -> None:
    builder = image.run("stageset-kustomize", "--version")
    assert builder.returncode == 0, builder.stderr
    assert builder.stdout.strip() == KUSTOMIZE_VERSION
    ssh = image.run("ssh", "-V")
    assert ssh.returncode == 0
    assert ssh.stderr.startswith("OpenSSH_")  # ssh -V prints to stderr
    # The controller finds the builder through STAGESET_KUSTOMIZE_BUILDER.
    assert image.settings.env["STAGESET_KUSTOMIZE_BUILDER"] == "/usr/local/bin/stageset-kustomize"
    # ... and the SOPS decryption helper through STAGESET_SOPS_HELPER.
    helper = image.run("stageset-sops", "--version")
    assert helper.returncode == 0, helper.stderr
    assert helper.stdout.strip() == SOPS_VERSION.removeprefix("v")
    assert image.settings.env["STAGESET_SOPS_HELPER"] == "/usr/local/bin/stageset-sops"


def test_a_stage_with_a_shared_base_builds_as_the_image_user(image: Unpacked) -> None:
    # The controller's own build path, in the image, under its limits: an overlay loading a
    # base from outside the stage path (../base) is built by the in-memory kustomize builder.
    script = (
        "from stageset.build import BuildLimits, prepare, render\n"
        "files = {'base/kustomization.yaml': b'resources: [cm.yaml]\\n',\n"
        "         'base/cm.yaml': b'apiVersion: v1\\nkind: ConfigMap\\nmetadata: {name: app}\\n',\n"
        "         'prod/kustomization.yaml': b'resources: [../base]\\nnamePrefix: prod-\\n'}\n"
        "objects = render(prepare(files, path='./prod', limits=BuildLimits()), variables=None)\n"
        "print(','.join(o['metadata']['name'] for o in objects))\n"
    )
    result = image.run("python3", "-c", script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "prod-app"
    # As OpenShift runs it: a UID from the namespace's range, group 0, no entry in /etc/passwd.
    assigned = image.run("python3", "-c", script, user="1000650000:0")
    assert assigned.returncode == 0, assigned.stderr
    assert assigned.stdout.strip() == "prod-app"


def test_the_cel_worker_runs_as_the_image_user(image: Unpacked) -> None:
    # readyChecks.exprs are evaluated in a child process (cel-expr-python's native runtime).
    script = ("from stageset.apply.cel import CelSandbox\n"
              "box = CelSandbox()\n"
              "expr = 'status.phase == \"Running\"'\n"
              "answer = box.evaluate([expr], {'status': {'phase': 'Running'}})[0]\n"
              "print(box.check([expr])[0].type, answer.value)\n")
    result = image.run("python3", "-c", script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "bool True"


def test_update_windows_read_iana_zones_in_the_image(image: Unpacked) -> None:
    # The image has no system zone files: update windows read the tzdata wheel's.
    script = ("import datetime\n"
              "from stageset.api.release import UpdateWindow\n"
              "from stageset.controller.stageset.windows import decide\n"
              "freeze = UpdateWindow(type='Deny', schedule='0 16 * * FRI', duration='64h', "
              "time_zone='Europe/Berlin')\n"
              "friday = datetime.datetime(2026, 11, 27, 15, 0, tzinfo=datetime.UTC)\n"
              "print(decide([freeze], friday).next_open)\n")
    result = image.run("python3", "-c", script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2026-11-30 07:00:00+00:00"


def test_nothing_is_writable_by_the_user_but_its_home(image: Unpacked) -> None:
    # readOnlyRootFilesystem: the image must not need to write anywhere (the chart mounts /tmp and
    # the mirror volume); byte code is precompiled, so no __pycache__ is written on start.
    owned = [p for p in image.rootfs.rglob("*") if not p.is_symlink() and p.lstat().st_uid == 65532]
    assert [p.relative_to(image.rootfs).as_posix() for p in owned] == ["home/stageset"]
    compiled = list((image.rootfs / "opt" / "stageset").rglob("stageset/cli/__pycache__/main*.pyc"))
    assert compiled


def test_the_image_stays_small(image: Unpacked) -> None:
    # A guard, not a benchmark: a base image plus an accidental dependency would blow past it.
    # About 100 MiB today: Debian's Python and OpenSSH, our wheels, the kustomize builder and the
    # SOPS helper (SOPS' own Go packages carry every cloud SDK: ~15 MiB of it compressed).
    assert image.summary["layers"] == 2
    assert image.summary["compressed_bytes"] < 120 * 2**20
