"""What every user command shares: the kubeconfig, the namespace, output formats and exit codes.

Identity: a :class:`Session` talks to the cluster as **the user** — the kubeconfig's own
credentials, never the controller's — or, with ``--as USER`` (and ``--as-group GROUP``), as
kubectl's flags of those names do: every request impersonates that user (``Impersonate-User``
and ``Impersonate-Group`` headers), which the apiserver allows only when the kubeconfig's user
may ``impersonate`` them.  Only ``build`` and ``diff`` go further and impersonate the StageSet's
ServiceAccount (see :mod:`stageset.cli.render`) for the render; that request impersonates the
ServiceAccount with the kubeconfig's own credentials (one impersonation per request), not on
top of ``--as``.

The kubeconfig is found as kubectl finds it: ``--kubeconfig``, else ``$KUBECONFIG`` (a
``:``-separated list, merged), else ``~/.kube/config``; inside a Pod with none of those, the
Pod's ServiceAccount.  The namespace is ``-n``, else the context's, else ``default``.

Exit codes (documented in docs/cli.md): 0 ok, 1 differences found (``diff``), 2 usage,
3 runtime error.  A runtime error is one line on stderr, never a traceback.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any, TypeVar

import click
import yaml

from stageset.api import parse_time
from stageset.kube.client import ApiError, ClientPool, Identity, KubeClient, UnreachableError
from stageset.kube.kubeconfig import ConfigException, list_contexts
from stageset.kube.types import KubeObject

F = TypeVar("F", bound=Callable[..., Any])


class ExitCode(IntEnum):
    OK = 0
    DIFFERENCES = 1
    USAGE = 2
    ERROR = 3


class CliError(click.ClickException):
    """A runtime error: printed as one line, exit code 3."""

    exit_code = ExitCode.ERROR


def describe_api_error(error: ApiError | UnreachableError) -> str:
    if isinstance(error, UnreachableError):
        return f"cannot reach the cluster at {error.server}: {error.why}"
    if error.status == 401:
        return "the cluster refused your credentials (401 Unauthorized): check the kubeconfig's user"
    return f"{error.message} ({error.status} {error.reason})".replace(" ()", "")


def translated(error: BaseException) -> CliError | None:
    """The one-line error (exit code 3) for an error every command can meet; None for others."""
    if isinstance(error, (ApiError, UnreachableError)):
        return CliError(describe_api_error(error))
    if isinstance(error, ConfigException):
        return CliError(f"kubeconfig: {error}")
    return None


class StagesetGroup(click.Group):
    """Maps the errors every command can meet to exit code 3 and one line, not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (ApiError, UnreachableError, ConfigException) as error:
            raise translated(error) or error from None


# -- deleting: one convention for every command that deletes ----------------------------------------

def yes_option(*, silent: bool = False) -> Callable[[F], F]:
    """``-y/--yes``: delete without asking (``silent``: also Flux's ``-s/--silent`` for the same)."""
    names = ["-y", "--yes", *(["-s", "--silent"] if silent else [])]
    return click.option(*names, "yes", is_flag=True, default=False,
                        help="Do it without asking (without it: asked y/N; with no answer to read, "
                        "a dry run that changes nothing).")


def confirmed(question: str, *, yes: bool) -> bool:
    """Every delete's convention (``delete stageset``/``source git``/``tenant``, ``uninstall``): what
    it would do is printed first; then ``--yes`` goes ahead, else the question is asked: "y" goes
    ahead, any other answer stops (exit 1, as click's Abort), and no answer at all (stdin at its end: a
    script, a pipe) makes it a dry run -- False, nothing is changed."""
    if yes:
        return True
    echo(f"{question} [y/N]: ")
    answer = sys.stdin.readline()
    if not answer:
        echo("\n")
        return False
    if answer.strip().lower() in ("y", "yes"):
        return True
    raise click.Abort()


# -- the kubeconfig -------------------------------------------------------------------------------

def kubeconfig_path(flag: str | None) -> str | None:
    """``--kubeconfig``, else ``$KUBECONFIG`` (existing entries), else ``~/.kube/config``;
    ``None``: in-cluster (only inside a Pod)."""
    if flag:
        return flag
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    existing = [p for p in listed if Path(p).expanduser().is_file()]
    if existing:
        return os.pathsep.join(str(Path(p).expanduser()) for p in existing)
    default = Path.home() / ".kube" / "config"
    if default.is_file():
        return str(default)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    where = f"$KUBECONFIG ({os.environ['KUBECONFIG']}) names no file and " if listed else ""
    raise CliError(f"no kubeconfig: {where}~/.kube/config does not exist; pass --kubeconfig PATH "
                   "or set KUBECONFIG")


def context_namespace(path: str | None, context: str | None) -> str:
    """The namespace the kubeconfig's (current or named) context sets; ``default`` without one."""
    if path is None:
        service_account = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        return service_account.read_text().strip() if service_account.is_file() else "default"
    contexts, current = list_contexts(path)
    chosen = current if context is None else next((c for c in contexts if c.get("name") == context), None)
    if chosen is None:
        raise CliError(f"kubeconfig: no context named {context!r} in {path}")
    return str((chosen.get("context") or {}).get("namespace") or "default")


@dataclass
class Session:
    """One command's view of the cluster, as the user."""

    kubeconfig: str | None = None
    context: str | None = None
    namespace_flag: str | None = None
    all_namespaces: bool = False
    output: str = "table"
    as_user: str | None = None
    """``--as``: every request as this user (the apiserver's impersonation; you need ``impersonate``)."""
    as_groups: tuple[str, ...] = ()
    """``--as-group``: and as these groups."""
    _pool: ClientPool | None = field(default=None, repr=False)
    _path: str | None = field(default=None, repr=False)
    _resolved: bool = field(default=False, repr=False)

    def _config(self) -> str | None:
        if not self._resolved:
            self._path = kubeconfig_path(self.kubeconfig)
            self._resolved = True
        return self._path

    @property
    def pool(self) -> ClientPool:
        if self._pool is None:
            self._pool = ClientPool.from_kubeconfig(self._config(), context=self.context)
        return self._pool

    @property
    def acting_as(self) -> Identity:
        """The user (``Identity()``: the kubeconfig's own), or whom ``--as``/``--as-group`` name."""
        return Identity(user=self.as_user, groups=self.as_groups) if self.as_user else Identity()

    def client(self, identity: Identity | None = None) -> KubeClient:
        """A client as the user (``--as`` when given), or impersonating ``identity`` -- with the
        kubeconfig's own credentials: the apiserver allows one impersonation per request."""
        return self.pool.client(identity or self.acting_as)

    @functools.cached_property
    def namespace(self) -> str:
        return self.namespace_flag or context_namespace(self._config(), self.context)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()


def cluster_options(*, all_namespaces: bool = False, outputs: Sequence[str] = ("table", "yaml", "json")
                    ) -> Callable[[F], F]:
    """The flags every cluster command shares; the command receives a ready :class:`Session`."""

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def run(*args: Any, kubeconfig: str | None, context: str | None, namespace: str | None,
                output: str, as_user: str | None, as_groups: tuple[str, ...], **kwargs: Any) -> Any:
            every = bool(kwargs.pop("all_namespaces", False))
            if as_groups and not as_user:
                raise click.UsageError("--as-group needs --as (the apiserver impersonates groups only "
                                       "together with a user)")
            session = Session(kubeconfig=kubeconfig, context=context, namespace_flag=namespace,
                              all_namespaces=every, output=output, as_user=as_user, as_groups=as_groups)
            try:
                return command(session, *args, **kwargs)
            finally:
                session.close()

        options = [
            click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False), default=None,
                         help="Kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)."),
            click.option("--context", default=None, help="Kubeconfig context (default: the current one)."),
            # Completed from the cluster by stageset.cli.completion.attach (as NAME and --stage are).
            click.option("-n", "--namespace", default=None, type=DNS_LABEL,
                         help="Namespace (default: the context's, else 'default')."),
            click.option("-o", "--output", type=click.Choice(list(outputs)), default=outputs[0],
                         show_default=True, help="Output format."),
            click.option("--as", "as_user", default=None, metavar="USER",
                         help="Act as this user (impersonation: you need the impersonate right), "
                         "e.g. system:serviceaccount:shop:deployer."),
            click.option("--as-group", "as_groups", multiple=True, metavar="GROUP",
                         help="Act as a member of this group too (repeatable; needs --as)."),
        ]
        if all_namespaces:
            options.append(click.option("-A", "--all-namespaces", is_flag=True, default=False,
                                        help="Every namespace you may list."))
        wrapped: Any = run
        for option in reversed(options):
            wrapped = option(wrapped)
        result: F = wrapped
        return result

    return decorate


class DnsLabelType(click.ParamType[str]):
    """A namespace or stage name (RFC 1123 label): refused as a usage error, not by the apiserver."""

    name = "name"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        import re

        from stageset.api.common import DNS_LABEL_PATTERN

        text = str(value)
        if len(text) > 63 or re.fullmatch(DNS_LABEL_PATTERN, text) is None:
            self.fail(f"{text!r} is not a valid name (lower-case letters, digits and '-', at most 63)",
                      param, ctx)
        return text


DNS_LABEL = DnsLabelType()


# -- output ---------------------------------------------------------------------------------------

def age(timestamp: str | None, *, now: datetime.datetime | None = None) -> str:
    """kubectl's short age: ``45s``, ``12m``, ``3h5m``, ``2d4h``."""
    then = parse_time(timestamp)
    if then is None:
        return "<unknown>"
    seconds = int(((now or datetime.datetime.now(datetime.UTC)) - then).total_seconds())
    seconds = max(seconds, 0)
    if seconds < 120:
        return f"{seconds}s"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if minutes < 60:
        return f"{minutes}m"
    if hours < 48:
        return f"{hours}h{minutes % 60}m" if minutes % 60 and hours < 10 else f"{hours}h"
    return f"{days}d{hours % 24}h" if hours % 24 and days < 8 else f"{days}d"


def short_revision(revision: str | None) -> str:
    """``main@sha1:<12 hex>`` for tables (the full revision is in -o yaml/json)."""
    if not revision:
        return "-"
    name, sep, digest = revision.rpartition(":")
    return f"{name}{sep}{digest[:12]}" if sep else revision[:40]


def table(headers: Sequence[str], rows: Iterator[Sequence[str]] | Sequence[Sequence[str]]) -> str:
    """Left-aligned columns, three spaces apart, as kubectl prints them."""
    materialized = [list(headers), *[[str(cell) for cell in row] for row in rows]]
    widths = [max(len(row[i]) for row in materialized) for i in range(len(headers))]
    lines = ["   ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in materialized]
    return "\n".join(lines) + "\n"


def as_printed(obj: KubeObject) -> KubeObject:
    """An object as ``kubectl get -o yaml|json`` prints it: whole, without ``managedFields``."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    return {**obj, "metadata": meta}


def dump_objects(objects: Sequence[KubeObject], output: str, *, one: bool) -> str:
    """``-o yaml|json`` as kubectl prints it: the object, or a ``List`` of them."""
    if one:
        return dump(as_printed(objects[0]), output)
    return dump({"apiVersion": "v1", "kind": "List", "items": [as_printed(o) for o in objects],
                 "metadata": {"resourceVersion": ""}}, output)


def dump(data: Any, output: str) -> str:
    if output == "json":
        return json.dumps(data, indent=2, sort_keys=False) + "\n"
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=1_000_000)


def echo(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
