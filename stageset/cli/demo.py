"""``stageset run``: the whole product on one laptop, in the foreground — and how to look around.

With no ``--kubeconfig``: starts a local etcd + kube-apiserver (built on first use), serves
``examples/`` as a Git repository on loopback — a *working copy*: an edit saved under it is
committed by the demo's Git server at the next fetch, so the next poll applies it — installs the
CRDs and a tenant (namespace ``shop``, ServiceAccount ``shop-deployer`` bound to ``edit``),
applies the example StageSet and runs the controller, printing each stage as it changes and the
commands to look around.  The admin kubeconfig is kept at a fixed path while it runs.

With ``--kubeconfig``: installs the CRDs when the cluster lacks them (or says clearly that it
may not), then runs the controller with the given flags.

Identity: the local control plane's admin (``system:masters``) installs the CRDs and the tenant
and applies the example; the controller runs as a ServiceAccount with exactly the Helm chart's
ClusterRole, so every tenant write goes through impersonation as in a real multi-tenant install.
Against ``--kubeconfig``, everything runs as that kubeconfig's user.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import signal
import string
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import click
import yaml

from stageset.api.crd import KINDS, VERSION_ANNOTATION, custom_resource_definition
from stageset.api.vocabulary import ConditionStatus, Reason
from stageset.build.kustomize import cache_root
from stageset.cli.check import client_version
from stageset.cli.crds import FIELD_MANAGER
from stageset.cli.process import LifecycleSettings, make_lifecycle
from stageset.cli.session import CliError, short_revision
from stageset.controller.conditions import READY, find_condition
from stageset.controller.kinds import GITREPOSITORIES, STAGESETS
from stageset.controller.manager import Manager
from stageset.controller.metrics import Metrics
from stageset.controller.settings import ControllerSettings
from stageset.controller.stageset.plan import WAITING_FOR_SOURCE
from stageset.envtest import build, gitserve, install, server
from stageset.kube.client import ApiError, ClientPool, KubeClient
from stageset.kube.types import KubeObject
from stageset.kube.watch import Reflector

TENANT, ACCOUNT = "shop", "shop-deployer"
_CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
# Reasons that mean "not yet", not "broken", while a demo starts: its source is being fetched.
_WAITING = {*WAITING_FOR_SOURCE, Reason.DEPENDENCY_NOT_READY}


def _say(message: str) -> None:
    click.echo(f"[{time.strftime('%H:%M:%S')}] {message}")


def run_dir() -> Path:
    """Where ``make run`` keeps its kubeconfig while it runs (``~/.cache/stageset/run``;
    ``$STAGESET_RUN_DIR`` moves it, e.g. for a second demo)."""
    configured = os.environ.get("STAGESET_RUN_DIR")
    return Path(configured) if configured else cache_root() / "run"


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


def _command() -> str:
    """How to call this CLI from the user's shell (the venv's script when there is one): an
    absolute path, so the hint works in another terminal whatever its working directory."""
    script = Path(sys.executable).parent / "stageset"
    return str(script.absolute()) if script.exists() else "stageset"


def look_around(*, kubeconfig: Path, namespace: str, name: str, demo: bool) -> str:
    """The commands a new user runs next, in another terminal."""
    cli = _command()
    lines = [
        "Look around in another terminal:",
        f"  export KUBECONFIG={kubeconfig}",
        f"  {cli} get -n {namespace}                # StageSets: ready state, stages, revisions",
        f"  {cli} tree {name} -n {namespace}           # stages -> objects, with their readiness",
        f"  {cli} diff {name} -n {namespace}           # what applying would change now (exit 1 if anything)",
        f"  {cli} events {name} -n {namespace}         # what the controller did",
        f"  {cli} history {name} -n {namespace}        # the releases each stage applied",
        f"  {cli} dashboard -n {namespace}          # all of it live in a browser: http://127.0.0.1:8090/",
        f"  kubectl get stages,configmaps,services -n {namespace}   # with kubectl, if you have it",
    ]
    if demo:
        lines += [
            "See GitOps happen: edit a file under examples/app/ (or run `make demo-change`); the",
            "demo's Git server commits it when the GitRepository next polls (every 15s), and the",
            f"StageSet applies the new revision. Now instead: {cli} reconcile {name} -n {namespace} "
            "--with-source",
        ]
    lines.append("Ctrl-C stops it all.")
    return "\n".join(lines)


class Progress:
    """Prints each real change of the StageSets' status, fed by a watch (so no change is missed).

    Every line names its StageSet (``shop/shop: stage config Ready at main@sha1:…``), and a line
    is printed only when what it says changed -- a stage's phase, revision or message, or a
    StageSet's Ready -- kept per StageSet and stage, so an update of one StageSet never reprints
    the others, and a new revision is a line even when the phase stays ``Ready``.

    A source that has no artifact yet is shown as waiting: at start the StageSet is reconciled
    before its GitRepository's first fetch, and that is not a failure.
    """

    def __init__(self, *, stop: threading.Event, once: bool, say: Callable[[str], None] = _say):
        self._stop = stop
        self._once = once
        self._say = say
        self._shown: dict[tuple[str, str, str], str] = {}

    def _tell(self, key: tuple[str, str, str], line: str) -> None:
        if self._shown.get(key) != line:
            self._shown[key] = line
            self._say(line)

    def __call__(self, event: str, obj: KubeObject) -> None:
        meta = obj["metadata"]
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        what = f"StageSet {namespace}/{name}"
        if event == "DELETED":
            for key in [k for k in self._shown if k[:2] == (namespace, name)]:
                del self._shown[key]
            self._say(f"{what}: deleted")
            return
        status = obj.get("status") or {}
        for stage in status.get("stages", []):
            message = stage.get("message", "")
            revision = f" at {short_revision(stage['revision'])}" if stage.get("revision") else ""
            line = f"{namespace}/{name}: stage {stage['name']:<10} {stage['phase']:<12}{revision} {message}"
            self._tell((namespace, name, str(stage["name"])), line.rstrip())
        ready = find_condition(status.get("conditions"), READY)
        if ready:
            message = re.sub(r";? ?runbook: \S+$", "", ready.get("message", ""))
            if ready["status"] == ConditionStatus.FALSE and ready.get("reason") in _WAITING:
                line = f"{what}: waiting ({ready['reason']}): {message}"
            else:
                line = f"{what}: Ready={ready['status']} ({ready['reason']}) {message}".rstrip()
            self._tell((namespace, name, ""), line)
            if self._once and ready["status"] == ConditionStatus.TRUE:
                self._stop.set()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def _running_demo(directory: Path) -> int | None:
    """The pid of another ``stageset run`` that owns ``directory`` (its ``owner`` file), if alive."""
    try:
        pid = int((directory / "owner").read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid != os.getpid() and _alive(pid) else None


def _keep_kubeconfig(source: Path) -> Path:
    """A copy of the admin kubeconfig at a fixed path, for the user's other terminals.

    The path is ``run_dir()/kubeconfig`` -- unless another demo still runs there: then this one's
    is ``run_dir()/<pid>/kubeconfig``, so neither overwrites (nor, when it stops, removes) the
    kubeconfig the other's look-around hints name."""
    directory = run_dir()
    if _running_demo(directory) is not None:
        directory = directory / str(os.getpid())
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "owner").write_text(f"{os.getpid()}\n")
    target = directory / "kubeconfig"
    shutil.copyfile(source, target)
    target.chmod(0o600)
    return target


def _release_kubeconfig(kept: Path) -> None:
    """Remove the kept kubeconfig and its owner file -- only while they are still this demo's."""
    if _running_demo(kept.parent) is not None:
        return
    kept.unlink(missing_ok=True)
    (kept.parent / "owner").unlink(missing_ok=True)
    if kept.parent != run_dir():
        with contextlib.suppress(OSError):
            kept.parent.rmdir()


def _on_signals(stop: threading.Event) -> None:
    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)


def run_demo(*, examples: Path, once: bool, stop: threading.Event, settings: ControllerSettings,
             lifecycle: LifecycleSettings | None = None) -> int:
    if not build.assets_dir().exists():
        _say("building etcd and kube-apiserver from the Go module proxy (first run only, a few minutes)")
    assets = build.ensure_assets(controller_manager=False)  # the demo runs none
    _say("starting a local control plane")
    with server.start(assets=assets) as plane, \
            gitserve.serve_directory(examples, live=True) as git_url:
        kubeconfig = _keep_kubeconfig(plane.kubeconfig)
        _say(f"kube-apiserver at {plane.url}; kubeconfig (kept while this runs): {kubeconfig}")
        _say(f"serving {examples} as {git_url} (a working copy: saved edits become new commits)")
        clients = ClientPool.from_kubeconfig(str(kubeconfig))
        admin = clients.client()
        install.install(admin)
        install.create_tenant(admin, namespace=TENANT, service_account=ACCOUNT)
        namespace, name = _apply_examples(admin, examples=examples, git_url=git_url)
        _say(f"applied StageSet {namespace}/{name}; running the controller")
        click.echo(look_around(kubeconfig=kubeconfig, namespace=namespace, name=name, demo=True))
        # The controller runs as a multi-tenant install would: a ServiceAccount with the
        # chart's ClusterRole, so every tenant write in the demo goes through impersonation.
        controller_config = install.controller_kubeconfig(
            admin, url=plane.url, ca=plane.pki.ca_cert, path=plane.workdir / "controller.kubeconfig")
        # What the chart grants with its notification values, so --notification-namespace and
        # --tenant-notifications work here as in a release (issue 50: they ran without, into 403s).
        if settings.notifications.namespace:
            install.grant_notifications(admin, namespace=settings.notifications.namespace)
        if settings.notifications.tenants:
            install.grant_tenant_notifications(admin)
        controller_clients = ClientPool.from_kubeconfig(str(controller_config))
        metrics = Metrics()
        manager = Manager(clients=controller_clients, settings=dataclasses.replace(
            settings, allow_insecure_sources=True, mirror_dir=plane.workdir / "mirrors"), metrics=metrics,
            lifecycle=None if lifecycle is None else make_lifecycle(lifecycle, controller_clients, metrics))
        _on_signals(stop)
        controller = threading.Thread(target=manager.run, name="controller", daemon=True)
        controller.start()
        progress = Reflector(client=admin, resource=STAGESETS, namespace=namespace,
                             handler=Progress(stop=stop, once=once), stop=stop)
        progress.start()
        try:
            while not stop.wait(0.5):
                pass
        finally:
            manager.stop.set()
            controller.join(timeout=30)
            controller_clients.close()
            clients.close()
            _release_kubeconfig(kubeconfig)
            _say("stopped the controller and the control plane (and removed the kubeconfig)")
    return 0


# -- against a cluster ---------------------------------------------------------------------------

def _served(admin: KubeClient) -> set[str]:
    try:
        return {r["name"] for r in admin.get("/apis/stages.metio.wtf/v1").get("resources", [])}
    except ApiError as error:
        if error.not_found:
            return set()
        raise


def ensure_crds(admin: KubeClient, *, timeout: float = 60.0) -> list[str]:
    """Install our CRDs when the cluster does not serve them; the names installed."""
    missing = [kind for kind in KINDS if kind.plural not in _served(admin)]
    for kind in missing:
        crd = custom_resource_definition(kind)
        # The field manager and version of every path we ship (stageset.cli.crds): the chart takes over.
        crd["metadata"]["annotations"] = {VERSION_ANNOTATION: client_version()}
        try:
            admin.apply(f"{_CRDS}/{kind.crd_name}", crd, field_manager=FIELD_MANAGER)
        except ApiError as error:
            if error.forbidden:
                raise CliError(
                    f"the cluster has no {kind.crd_name} CRD and your kubeconfig may not create it "
                    f"({error.message}). Ask a cluster admin to run `stageset crds | kubectl apply "
                    "--server-side -f -` (or install the Helm chart), then try again") from None
            raise
    deadline = time.monotonic() + timeout
    while missing and any(kind.plural not in _served(admin) for kind in missing):
        if time.monotonic() > deadline:
            raise CliError(f"the CRDs were created but are not served after {timeout:.0f}s")
        time.sleep(0.2)
    return [kind.crd_name for kind in missing]


def prepare_cluster(*, kubeconfig: Path, cluster_admin: bool) -> None:
    """Before ``stageset controller`` runs against ``kubeconfig``: the CRDs, and what to run next."""
    clients = ClientPool.from_kubeconfig(str(kubeconfig))
    try:
        installed = ensure_crds(clients.client())
        _say(f"installed the CRDs: {', '.join(installed)}" if installed else "the CRDs are installed")
        mode = "cluster-admin (single-tenant)" if cluster_admin else "multi-tenant"
        _say(f"running the controller in {mode} mode against {clients.client().server}")
    finally:
        clients.close()
    click.echo(look_around(kubeconfig=kubeconfig.resolve(), namespace="<namespace>", name="<name>",
                           demo=False))


# -- make demo-change -----------------------------------------------------------------------------

_CURRENCY = re.compile(r"^(\s*currency:\s*)(\S+)\s*$", re.MULTILINE)


def demo_change(examples: Path) -> str:
    """Toggle the example ConfigMap's ``currency`` (EUR <-> USD); running it twice restores the file."""
    path = examples / "app" / "config" / "settings.yaml"
    text = path.read_text()
    match = _CURRENCY.search(text)
    if match is None:
        raise CliError(f"{path} has no `currency:` line to change")
    new = "USD" if match.group(2) == "EUR" else "EUR"
    path.write_text(text[:match.start(2)] + new + text[match.end(2):])
    return f"{path}: currency {match.group(2)} -> {new}"


def main(argv: list[str]) -> int:
    if argv[:1] == ["change"]:
        examples = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[2] / "examples"
        click.echo(demo_change(examples))
        kubeconfig = run_dir() / "kubeconfig"
        if kubeconfig.exists() and _running_demo(run_dir()) is not None:
            click.echo(f"`make run` is running: the GitRepository's next poll (within 15s) fetches it.\n"
                       f"Watch: KUBECONFIG={kubeconfig} {_command()} get shop -n shop")
        else:
            click.echo("`make run` is not running: start it to see the change applied.")
        return 0
    click.echo("usage: python -m stageset.cli.demo change [EXAMPLES_DIR]", err=True)
    return 2


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
