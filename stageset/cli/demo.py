"""``stageset run`` with no cluster: the whole product on one laptop, in the foreground.

Starts a local etcd + kube-apiserver (built on first use), serves ``examples/`` as
a Git repository on loopback, installs the CRDs and a tenant (namespace ``shop``,
ServiceAccount ``shop-deployer`` bound to ``edit``), applies the example StageSet
and runs the controller, printing each stage as it changes.  Ctrl-C stops it all.
"""

from __future__ import annotations

import signal
import string
import sys
import threading
import time
from pathlib import Path
from types import FrameType

import click
import yaml

from stageset.controller.conditions import READY, find_condition
from stageset.controller.manager import GITREPOSITORIES, STAGESETS, Manager
from stageset.controller.settings import ControllerSettings
from stageset.envtest import build, gitserve, install, server
from stageset.kube.client import ClientPool, KubeClient
from stageset.kube.types import KubeObject
from stageset.kube.watch import Reflector

TENANT, ACCOUNT = "shop", "shop-deployer"


def _say(message: str) -> None:
    click.echo(f"[{time.strftime('%H:%M:%S')}] {message}")


def _apply_examples(admin: KubeClient, *, examples: Path, git_url: str) -> tuple[str, str]:
    text = string.Template((examples / "stageset.yaml").read_text()).safe_substitute(GIT_URL=git_url)
    stageset = ("", "")
    for doc in yaml.safe_load_all(text):
        resource = STAGESETS if doc["kind"] == "StageSet" else GITREPOSITORIES
        meta = doc["metadata"]
        admin.apply(resource.object_path(name=meta["name"], namespace=meta["namespace"]), doc,
                    field_manager="stageset-demo")
        if doc["kind"] == "StageSet":
            stageset = (meta["namespace"], meta["name"])
    return stageset


class _Progress:
    """Prints each change of the StageSet's status, fed by a watch (so no change is missed)."""

    def __init__(self, *, stop: threading.Event, once: bool):
        self._stop = stop
        self._once = once
        self._shown: dict[str, str] = {}

    def __call__(self, _event: str, obj: KubeObject) -> None:
        status = obj.get("status") or {}
        for stage in status.get("stages", []):
            line = f"stage {stage['name']:<10} {stage['phase']:<12} {stage.get('message', '')}"
            if self._shown.get(stage["name"]) != line:
                self._shown[stage["name"]] = line
                _say(line)
        ready = find_condition(status.get("conditions"), READY)
        if ready:
            meta = obj["metadata"]
            line = (f"StageSet {meta['namespace']}/{meta['name']}: Ready={ready['status']} "
                    f"({ready['reason']}) {ready.get('message', '')}")
            if self._shown.get("") != line:
                self._shown[""] = line
                _say(line)
            if self._once and ready["status"] == "True":
                self._stop.set()


def run_demo(*, examples: Path, once: bool, stop: threading.Event) -> int:
    if not build.assets_dir().exists():
        _say("building etcd and kube-apiserver from the Go module proxy (first run only, a few minutes)")
    assets = build.ensure_assets()
    _say("starting a local control plane")
    with server.start(assets=assets) as plane, gitserve.serve_directory(examples) as git_url:
        _say(f"kube-apiserver at {plane.url} (kubeconfig: {plane.kubeconfig})")
        _say(f"serving {examples} as {git_url}")
        clients = ClientPool.from_kubeconfig(str(plane.kubeconfig))
        admin = clients.client()
        install.install(admin)
        install.create_tenant(admin, namespace=TENANT, service_account=ACCOUNT)
        namespace, name = _apply_examples(admin, examples=examples, git_url=git_url)
        _say(f"applied StageSet {namespace}/{name}; running the controller (Ctrl-C stops)")
        # The controller runs as a multi-tenant install would: a ServiceAccount with the
        # chart's ClusterRole, so every tenant write in the demo goes through impersonation.
        controller_config = install.controller_kubeconfig(
            admin, url=plane.url, ca=plane.pki.ca_cert, path=plane.workdir / "controller.kubeconfig")
        controller_clients = ClientPool.from_kubeconfig(str(controller_config))
        manager = Manager(clients=controller_clients, settings=ControllerSettings(
            allow_insecure_sources=True, mirror_dir=plane.workdir / "mirrors"))

        def interrupt(_signum: int, _frame: FrameType | None) -> None:
            stop.set()

        signal.signal(signal.SIGINT, interrupt)
        signal.signal(signal.SIGTERM, interrupt)
        controller = threading.Thread(target=manager.run, name="controller", daemon=True)
        controller.start()
        progress = Reflector(client=admin, resource=STAGESETS, namespace=namespace,
                             handler=_Progress(stop=stop, once=once), stop=stop)
        progress.start()
        try:
            while not stop.wait(0.5):
                pass
        finally:
            manager.stop.set()
            controller.join(timeout=30)
            controller_clients.close()
            clients.close()
            _say("stopped the controller and the control plane")
    return 0


if __name__ == "__main__":
    sys.exit(run_demo(examples=Path("examples"), once=True, stop=threading.Event()))
