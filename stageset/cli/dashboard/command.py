"""``stageset dashboard``: serve the live web view on this machine (read-only by default).

Identity: the user's kubeconfig (as every user command, :mod:`stageset.cli.session`): reads, an
object page's ``stageset diff`` (a dry-run), and — only with ``--allow-actions`` — the requests of
``reconcile``/``suspend``/``resume``/``promote`` (:mod:`~stageset.cli.dashboard.actions`).  The
server listens on loopback unless told otherwise: a non-loopback address needs ``--allow-remote``
and prints a warning, since the dashboard has no login of its own — whoever reaches it sees what
the kubeconfig may read (and, with ``--allow-actions``, acts as it).

``--login`` (the shared dashboard, :mod:`~stageset.cli.dashboard.shared`): no kubeconfig at all;
the apiserver is ``--server`` (or the Pod's), and every request is made with the bearer token of
the person signed in, so a non-loopback address needs no ``--allow-remote``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import sys
import webbrowser
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from stageset.cli.session import DNS_LABEL, CliError, Session, echo
from stageset.controller.kinds import STAGESETS
from stageset.kube.client import ApiError
from stageset.kube.kubeconfig import list_contexts

if TYPE_CHECKING:
    from stageset.cli.dashboard.login import Cluster, LoginStore

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
@click.option("--login", is_flag=True, default=False,
              help="Shared mode (in a cluster): no kubeconfig; each person signs in with a bearer token "
              "(a ServiceAccount or OIDC id token) and every request for them is made with that token. "
              "A non-loopback address needs no --allow-remote then.")
@click.option("--server", default=None, metavar="URL",
              help="With --login: the apiserver (default: this Pod's, from KUBERNETES_SERVICE_HOST/PORT).")
@click.option("--certificate-authority", type=click.Path(exists=True, dir_okay=False), default=None,
              help="With --login: the CA bundle the apiserver's certificate is checked against "
              "(default: the Pod's service-account CA, if mounted).")
@click.option("--tls-cert-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Serve HTTPS with this certificate (and --tls-key-file).")
@click.option("--tls-key-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The key of --tls-cert-file.")
@click.option("--secure-cookies", is_flag=True, default=False,
              help="With --login: mark the login cookie Secure even over plain HTTP (a proxy in front "
              "terminates TLS).")
@click.option("--max-logins", type=click.IntRange(min=1), default=100, show_default=True,
              help="With --login: logins kept at once (past it a new sign-in is refused; nobody else's "
              "login ends).")
@click.option("--max-logins-per-identity", type=click.IntRange(min=1), default=5, show_default=True,
              help="With --login: logins one identity keeps at once (past it that identity's least recently "
              "used ends); every ServiceAccount of one namespace counts as one identity.")
@click.option("--login-idle", type=click.IntRange(min=60), default=1800, show_default=True, metavar="SECONDS",
              help="With --login: a login unused this long ends.")
@click.option("--login-lifetime", type=click.IntRange(min=60), default=28800, show_default=True,
              metavar="SECONDS", help="With --login: a login ends this long after sign-in at the latest "
              "(sooner when its token expires).")
def dashboard(address: str, allow_remote: bool, allow_actions: bool, open_browser: bool,
              kubeconfig: str | None, context: str | None, namespace: str | None,
              all_namespaces: bool, login: bool, server: str | None, certificate_authority: str | None,
              tls_cert_file: str | None, tls_key_file: str | None, secure_cookies: bool, max_logins: int,
              max_logins_per_identity: int, login_idle: int, login_lifetime: int) -> None:
    """Serve a live web view of StageSets: their stage graph, release history, objects (live YAML
    and diff) and events.

    It reads with your kubeconfig, so it shows exactly what you may read; it writes nothing unless
    --allow-actions is given (then each action is a request made as you).  Pages update within
    about a second of a change, from watches shared by every open page.  Ctrl-C stops it.
    """
    # The web stack is imported here, not with the CLI: other commands do not pay for it.
    from stageset.cli.dashboard.actions import ActionLog
    from stageset.cli.dashboard.app import LOOPBACK_HOSTS, create_app
    from stageset.cli.dashboard.hub import Hub

    if namespace is not None and all_namespaces:
        raise click.UsageError("-n/--namespace and -A/--all-namespaces cannot be combined")
    if bool(tls_cert_file) != bool(tls_key_file):
        raise click.UsageError("--tls-cert-file and --tls-key-file go together")
    tls = TLS(cert=tls_cert_file, key=tls_key_file) if tls_cert_file and tls_key_file else None
    if login:
        if kubeconfig or context or namespace or all_namespaces:
            raise click.UsageError("--login uses no kubeconfig and no namespace of its own: each person "
                                   "signs in with a token and names the namespace")
        from stageset.cli.dashboard.login import LoginStore

        serve_shared(where=parse_address(address), cluster=in_cluster(server, certificate_authority), tls=tls,
                     store=LoginStore(limit=max_logins, idle=login_idle, lifetime=login_lifetime,
                                      per_identity=max_logins_per_identity),
                     allow_actions=allow_actions, secure_cookies=secure_cookies, open_browser=open_browser)
        return
    if server or certificate_authority or secure_cookies:
        raise click.UsageError("--server, --certificate-authority and --secure-cookies need --login")
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
        url = f"{'https' if tls else 'http'}://{Address(where.host, port).netloc}/"
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
            run_server(app, sock=sock, tls=tls)
        finally:
            hub.close()
            sock.close()
    finally:
        session.close()
    sys.stdout.flush()


@dataclass(frozen=True)
class TLS:
    cert: str
    key: str


def run_server(app: Any, *, sock: socket.socket, tls: TLS | None) -> None:
    """Serve ``app`` on ``sock`` until Ctrl-C (or SIGTERM)."""
    import uvicorn

    logging.getLogger("stageset").setLevel(logging.WARNING)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                           timeout_graceful_shutdown=2, server_header=False,
                                           ssl_certfile=tls.cert if tls else None,
                                           ssl_keyfile=tls.key if tls else None))
    # uvicorn raises the interrupt again once it has shut down: that is our way out.
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock])


SERVICE_ACCOUNT_CA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"


def in_cluster(server: str | None, certificate_authority: str | None) -> Cluster:
    """Where the shared dashboard finds the apiserver: ``--server``, else the Pod's environment."""
    from stageset.cli.dashboard.login import Cluster

    if server is None:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise click.UsageError("--login outside a Pod needs --server URL (and --certificate-authority)")
        server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    if not server.startswith("https://"):
        raise click.BadParameter("the apiserver must be an https:// URL (tokens are sent to it)",
                                 param_hint="--server")
    if certificate_authority is None and os.path.isfile(SERVICE_ACCOUNT_CA):
        certificate_authority = SERVICE_ACCOUNT_CA
    return Cluster(server=server, certificate_authority=certificate_authority)


def serve_shared(*, where: Address, cluster: Cluster, tls: TLS | None, store: LoginStore, allow_actions: bool,
                 secure_cookies: bool, open_browser: bool) -> None:
    """The shared dashboard: a login page, then each person's pages as their own token."""
    from stageset.cli.dashboard.app import LOOPBACK_HOSTS
    from stageset.cli.dashboard.shared import shared_app

    local = is_loopback(where.host)
    sock = listen(where)
    port = sock.getsockname()[1]
    url = f"{'https' if tls else 'http'}://{Address(where.host, port).netloc}/"
    shared, app = shared_app(cluster=cluster, store=store, allow_actions=allow_actions,
                             secure_cookies=secure_cookies,
                             allowed_hosts=[*LOOPBACK_HOSTS, where.host_header] if local else None)
    try:
        if not local and tls is None and not secure_cookies:
            click.echo(f"WARNING: {url} is plain HTTP off loopback: tokens pasted into it cross the network "
                       "unencrypted. Serve TLS (--tls-cert-file) or put a TLS-terminating proxy in front "
                       "(then --secure-cookies).", err=True)
        mode = "actions allowed, made as each person" if allow_actions else "read-only"
        echo(f"stageset dashboard: {url}\n"
             f"  shared: each person signs in with a bearer token; their pages are read as that token "
             f"({cluster.server}); {mode}. Ctrl-C stops it.\n")
        if open_browser:
            webbrowser.open(url)
        shared.start()
        run_server(app, sock=sock, tls=tls)
    finally:
        shared.close()
        sock.close()
    sys.stdout.flush()
