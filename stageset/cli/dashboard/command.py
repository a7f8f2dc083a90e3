"""``stageset dashboard``: serve the live web view on this machine (read-only by default).

Identity: the user's kubeconfig (as every user command, :mod:`stageset.cli.session`): reads, an
object page's ``stageset diff`` (a dry-run), and — only with ``--allow-actions`` — the requests of
``reconcile``/``suspend``/``resume``/``promote`` (:mod:`~stageset.cli.dashboard.actions`).  The
server listens on loopback unless told otherwise: a non-loopback address needs ``--allow-remote``
and prints a warning, since the dashboard has no login of its own — whoever reaches it sees what
the kubeconfig may read (and, with ``--allow-actions``, acts as it).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
import sys
import webbrowser
from dataclasses import dataclass

import click

from stageset.cli.session import DNS_LABEL, CliError, Session, echo
from stageset.controller.kinds import STAGESETS
from stageset.kube.client import ApiError
from stageset.kube.kubeconfig import list_contexts

DEFAULT_ADDRESS = "127.0.0.1:8090"


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    @property
    def netloc(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def host_header(self) -> str:
        """The host as a ``Host`` header names it (IPv6 in brackets)."""
        return f"[{self.host}]" if ":" in self.host else self.host


def parse_address(text: str) -> Address:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6); refused with a usage error otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise click.BadParameter(f"{text!r} is not HOST:PORT (e.g. {DEFAULT_ADDRESS})",
                                 param_hint="--address")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise click.BadParameter(f"{text!r}: write an IPv6 address in brackets, e.g. [::1]:8090",
                                 param_hint="--address")
    return Address(host=host, port=int(port))


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback address (a name is resolved)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    addresses = {str(info[4][0]).split("%")[0] for info in found}
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def listen(address: Address) -> socket.socket:
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address.host, address.port))
    except OSError as error:
        sock.close()
        raise CliError(f"cannot listen on {address.netloc}: {error.strerror or error}") from None
    sock.listen(128)
    return sock


def check_access(session: Session, namespace: str | None) -> None:
    """Fail at once, in one line, when the user may not list StageSets where asked."""
    where = "any namespace (-A)" if namespace is None else f"namespace {namespace}"
    try:
        session.client().request("GET", STAGESETS.collection_path(namespace), query={"limit": 1})
    except ApiError as error:
        if error.forbidden:
            hint = "; pass -n NAMESPACE for one you may read" if namespace is None else ""
            raise CliError(f"you may not list StageSets in {where}{hint}: {error.message}") from None
        if error.not_found:
            raise CliError("the cluster serves no StageSets: install the CRDs first "
                           "(stageset crds | kubectl apply --server-side -f -)") from None
        raise


def _identity(session: Session) -> str:
    path = session._config()  # the session resolved the kubeconfig already
    if path is None:
        return "this Pod's ServiceAccount"
    _contexts, current = list_contexts(path)
    name = session.context or (current or {}).get("name", "?")
    return f"the kubeconfig's context {name!r}"


@click.command("dashboard")
@click.option("--address", default=DEFAULT_ADDRESS, show_default=True, metavar="HOST:PORT",
              help="Where to listen (port 0: any free port). Loopback only, unless --allow-remote.")
@click.option("--allow-remote", is_flag=True, default=False,
              help="Allow a non-loopback address. The dashboard has no login: anyone who reaches it "
              "sees what your kubeconfig may read.")
@click.option("--allow-actions", is_flag=True, default=False,
              help="Offer reconcile (with source), suspend, resume, promote and update-now on the pages, "
              "each requested as your kubeconfig (RBAC decides), guarded against cross-site requests "
              "and logged.")
@click.option("--open", "open_browser", is_flag=True, default=False, help="Open it in your web browser.")
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).")
@click.option("--context", default=None, help="Kubeconfig context (default: the current one).")
@click.option("-n", "--namespace", default=None, type=DNS_LABEL,
              help="Namespace (default: the context's, else 'default').")
@click.option("-A", "--all-namespaces", is_flag=True, default=False, help="Every namespace you may list.")
def dashboard(address: str, allow_remote: bool, allow_actions: bool, open_browser: bool,
              kubeconfig: str | None, context: str | None, namespace: str | None,
              all_namespaces: bool) -> None:
    """Serve a live web view of StageSets: their stage graph, release history, objects (live YAML
    and diff) and events.

    It reads with your kubeconfig, so it shows exactly what you may read; it writes nothing unless
    --allow-actions is given (then each action is a request made as you).  Pages update within
    about a second of a change, from watches shared by every open page.  Ctrl-C stops it.
    """
    # The web stack is imported here, not with the CLI: other commands do not pay for it.
    import uvicorn

    from stageset.cli.dashboard.actions import ActionLog
    from stageset.cli.dashboard.app import LOOPBACK_HOSTS, create_app
    from stageset.cli.dashboard.hub import Hub

    if namespace is not None and all_namespaces:
        raise click.UsageError("-n/--namespace and -A/--all-namespaces cannot be combined")
    where = parse_address(address)
    local = is_loopback(where.host)
    if not local and not allow_remote:
        raise click.UsageError(f"{where.host} is not a loopback address: the dashboard has no login, so "
                               "anyone who reaches it would see what your kubeconfig may read. Pass "
                               "--allow-remote to serve it there anyway")
    session = Session(kubeconfig=kubeconfig, context=context, namespace_flag=namespace,
                      all_namespaces=all_namespaces)
    try:
        scope = None if all_namespaces else session.namespace
        check_access(session, scope)
        sock = listen(where)
        port = sock.getsockname()[1]
        url = f"http://{Address(where.host, port).netloc}/"
        if not local:
            click.echo(f"WARNING: serving on {where.host}, which is not loopback: anyone who can reach "
                       f"{url} sees everything your kubeconfig may read (no login, plain HTTP).", err=True)
        hub = Hub(client=session.client(), namespace=scope)
        shown = "every namespace" if scope is None else f"namespace {scope}"
        try:
            if not hub.start():
                click.echo("still listing StageSets; the pages fill in when the list arrives", err=True)
            elif not hub.stagesets() and scope is not None:
                click.echo(f"no StageSets in namespace {scope} (yet): -n NAMESPACE shows another namespace, "
                           "-A every namespace you may list", err=True)
            hosts = [*LOOPBACK_HOSTS, where.host_header] if local else None
            who = _identity(session)
            app = create_app(hub, scope=shown, allowed_hosts=hosts, session=session,
                             actions=ActionLog(who=who) if allow_actions else None)
            mode = "actions allowed, made as you" if allow_actions else "read-only"
            echo(f"stageset dashboard: {url}\n"
                 f"  StageSets in {shown}, read as {who}; {mode}. Ctrl-C stops it.\n")
            if open_browser:
                webbrowser.open(url)
            logging.getLogger("stageset").setLevel(logging.WARNING)
            server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                                   timeout_graceful_shutdown=2, server_header=False))
            # uvicorn raises the interrupt again once it has shut down: that is our way out.
            with contextlib.suppress(KeyboardInterrupt):
                server.run(sockets=[sock])
        finally:
            hub.close()
            sock.close()
    finally:
        session.close()
    sys.stdout.flush()
