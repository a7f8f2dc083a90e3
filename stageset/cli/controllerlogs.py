"""``stageset logs [NAME]``: the controller's log lines about one StageSet (or every StageSet of a
namespace), as ``flux logs`` reads a Flux controller's.

Identity: the user's own (the kubeconfig's credentials, or ``--as``): a list of pods in the
controller's namespace (``--controller-namespace``, the chart's release namespace) selected by the
chart's labels, then ``GET pods/log`` of each pod's ``controller`` container -- so the user needs
``list pods`` and ``get pods/log`` there, which a tenant usually lacks: the platform decides who
may read the controller's log.  Nothing is written.  With ``--from-file`` (a saved log, or ``-``
for stdin: ``kubectl logs deploy/stageset | stageset logs shop -n shop --from-file -``) no
cluster is contacted at all.

Filtering: a line is about a StageSet when its ``stageset`` field (:mod:`stageset.controller.logs`:
``namespace/name`` of the object reconciled) names it -- in the JSON format the chart sets (the key
``stageset``) and in the text format (`` stageset=namespace/name``).  Lines with no such field
(start-up, leader election, a GitRepository's fetch) are about no StageSet and are left out.
``--tail`` counts the log's lines *before* filtering (it is the apiserver's ``tailLines``, as in
``flux logs``).  The controller redacts Secret values before a line is written
(:class:`~stageset.controller.redact.LogRedactor`); this command adds nothing to hide.
"""

from __future__ import annotations

import datetime
import json
import math
import queue
import re
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, TextIO

import click

from stageset.api import parse_time
from stageset.cli.check import CONTROLLER_SELECTOR
from stageset.cli.params import DURATION
from stageset.cli.session import CliError, Session, cluster_options, echo
from stageset.kube.client import ApiError, KubeClient, QueryValue

CONTAINER = "controller"
"""The controller's container in the chart's pods (helm/stageset/templates/deployment.yaml)."""
DEFAULT_CONTROLLER_NAMESPACE = "stageset-system"
_TEXT_FIELD = re.compile(r"(?:^|\s)stageset=(\S+)")


class Level(IntEnum):
    DEBUG = 10
    INFO = 20
    WARNING = 30
    ERROR = 40

    @classmethod
    def of(cls, text: str) -> Level:
        word = text.strip().upper()
        return cls.WARNING if word == "WARN" else cls.__members__.get(word, cls.INFO)


@dataclass(frozen=True)
class Wanted:
    """Which StageSets' lines to keep: one (``name``), a namespace's, or every one (``namespace=None``)."""

    namespace: str | None
    name: str | None = None
    level: Level = Level.DEBUG
    since: datetime.datetime | None = None

    def keeps(self, subject: str | None, level: Level, when: datetime.datetime | None) -> bool:
        if not subject or level < self.level:
            return False
        if self.since is not None and when is not None and when < self.since:
            return False
        namespace, _, name = subject.partition("/")
        if self.namespace is not None and namespace != self.namespace:
            return False
        return self.name is None or name == self.name


@dataclass(frozen=True)
class LogLine:
    raw: str
    subject: str | None
    level: Level
    when: datetime.datetime | None
    record: dict[str, Any] | None
    """The JSON line's fields (``None``: a text-format line)."""

    def render(self, *, pod: str | None) -> str:
        """``TIME LEVEL StageSet/NS/NAME [stage=S revision=R]: message`` (the raw line for text)."""
        if self.record is None:
            return self.raw
        r = self.record
        extras = " ".join(f"{k}={r[k]}" for k in ("stage", "revision", "identity") if r.get(k))
        head = f"{r.get('time', '-')} {str(r.get('level', 'info')).lower()} StageSet/{self.subject}"
        text = f"{head}{' ' + extras if extras else ''}: {r.get('message', '')}"
        if r.get("exc_info"):
            text += "\n" + str(r["exc_info"])
        return f"[{pod}] {text}" if pod else text


def parse_line(raw: str) -> LogLine:
    """One line of the controller's log, in either format.  Pure."""
    text = raw.rstrip("\r\n")
    if text.startswith("{"):
        try:
            record = json.loads(text)
        except ValueError:
            record = None
        if isinstance(record, dict):
            subject = record.get("stageset")
            return LogLine(raw=text, subject=str(subject) if subject else None,
                           level=Level.of(str(record.get("level", "info"))),
                           when=parse_time(str(record["time"])) if record.get("time") else None,
                           record=record)
    found = _TEXT_FIELD.search(text)
    words = text.split()
    level = Level.of(words[2]) if len(words) > 2 else Level.INFO  # "DATE TIME LEVEL logger: ..."
    return LogLine(raw=text, subject=found.group(1) if found else None, level=level, when=None, record=None)


def kept(lines: Iterable[str], wanted: Wanted) -> Iterator[LogLine]:
    for raw in lines:
        line = parse_line(raw)
        if wanted.keeps(line.subject, line.level, line.when):
            yield line


# -- the controller's pods ------------------------------------------------------------------------

def controller_pods(client: KubeClient, namespace: str) -> list[str]:
    """The chart's controller pods in ``namespace`` (every replica and shard), by name."""
    try:
        pods = client.request("GET", f"/api/v1/namespaces/{namespace}/pods",
                              query={"labelSelector": CONTROLLER_SELECTOR}).get("items", [])
    except ApiError as error:
        if error.forbidden:
            raise CliError(f"you may not list pods in namespace {namespace} (the controller's): "
                           f"{error.message}") from None
        raise
    if not pods:
        raise CliError(f"no controller pod in namespace {namespace} (labels {CONTROLLER_SELECTOR}): "
                       "pass --controller-namespace with the namespace the chart is installed in")
    return sorted(str(p["metadata"]["name"]) for p in pods)


def log_path(namespace: str, pod: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{pod}/log"


def pod_lines(client: KubeClient, namespace: str, pod: str, *, follow: bool, since: float | None,
              tail: int | None) -> Iterator[str]:
    query: dict[str, QueryValue] = {"container": CONTAINER}
    if follow:
        query["follow"] = True
    if since is not None:
        query["sinceSeconds"] = max(1, math.ceil(since))
    if tail is not None:
        query["tailLines"] = tail
    try:
        yield from client.text_lines(log_path(namespace, pod), query=query, timeout=None if follow else 60.0)
    except ApiError as error:
        if error.forbidden:
            raise CliError(f"you may not read the log of pod {namespace}/{pod}: {error.message}") from None
        raise CliError(f"cannot read the log of pod {namespace}/{pod}: {error.message}") from None


def _followed(client: KubeClient, namespace: str, pods: list[str], *, since: float | None,
              tail: int | None) -> Iterator[tuple[str, str]]:
    """Every pod's followed log, merged as lines arrive (one reader thread per pod)."""
    arrived: queue.Queue[tuple[str, str | None, CliError | None]] = queue.Queue()

    def read(pod: str) -> None:
        try:
            for line in pod_lines(client, namespace, pod, follow=True, since=since, tail=tail):
                arrived.put((pod, line, None))
        except CliError as error:
            arrived.put((pod, None, error))
            return
        arrived.put((pod, None, None))

    for pod in pods:
        threading.Thread(target=read, args=(pod,), name=f"logs-{pod}", daemon=True).start()
    open_pods = len(pods)
    while open_pods:
        pod, line, error = arrived.get()
        if error is not None:
            raise error
        if line is None:
            open_pods -= 1
            continue
        yield pod, line


def _file_lines(stream: TextIO, tail: int | None) -> list[str]:
    lines = stream.read().splitlines()
    return lines[-tail:] if tail is not None and tail >= 0 else lines


@click.command("logs")
@click.argument("name", required=False)
@click.option("-f", "--follow", is_flag=True, default=False, help="Keep printing new lines, until Ctrl-C.")
@click.option("--since", type=DURATION, default=None, help="Only lines newer than this (e.g. 10m).")
@click.option("--tail", type=click.IntRange(min=0), default=None,
              help="Only the last N lines of each controller pod's log (counted before filtering).")
@click.option("--level", type=click.Choice(["debug", "info", "warn", "error"]), default="debug",
              show_default=True, help="Only lines of this level and above.")
@click.option("--controller-namespace", default=DEFAULT_CONTROLLER_NAMESPACE, show_default=True,
              envvar="STAGESET_CONTROLLER_NAMESPACE", metavar="NAMESPACE",
              help="Where the controller runs (the chart's release namespace).")
@click.option("--from-file", "from_file", type=click.File("r"), default=None, metavar="FILE",
              help="Read a saved log instead of the controller's pods ('-': stdin); contacts no cluster.")
@cluster_options(all_namespaces=True, outputs=("text", "json"))
def logs(session: Session, name: str | None, follow: bool, since: float | None, tail: int | None,
         level: str, controller_namespace: str, from_file: TextIO | None) -> None:
    """Print the controller's log lines about a StageSet, as flux logs does.

    Without NAME, the lines about every StageSet of the namespace (-A: of every namespace).
    The lines come from the pods of the controller (labels app.kubernetes.io/part-of=stageset,
    app.kubernetes.io/component=controller) in --controller-namespace, read as you: you need
    list pods and get pods/log there.  -o json prints the controller's JSON lines as they are.
    """
    if name is not None and session.all_namespaces:
        raise click.UsageError("NAME and --all-namespaces cannot be combined")
    if follow and from_file is not None:
        raise click.UsageError("--follow reads the controller's pods; a file has no new lines")
    if session.all_namespaces:
        namespace = None
    elif from_file is not None and session.namespace_flag is None:
        raise click.UsageError("with --from-file, name the namespace (-n) or pass -A")
    else:
        namespace = session.namespace
    now = datetime.datetime.now(datetime.UTC)
    cutoff = None if since is None else now - datetime.timedelta(seconds=since)
    wanted = Wanted(namespace=namespace, name=name, level=Level.of(level), since=cutoff)
    raw = session.output == "json"

    def show(lines: Iterable[str], pod: str | None) -> None:
        for line in kept(lines, wanted):
            echo((line.raw if raw else line.render(pod=pod)) + "\n")

    if from_file is not None:
        show(_file_lines(from_file, tail), None)
        return
    client = session.client()
    pods = controller_pods(client, controller_namespace)
    several = len(pods) > 1
    if not follow:
        for pod in pods:
            show(pod_lines(client, controller_namespace, pod, follow=False, since=since, tail=tail),
                 pod if several else None)
        return
    try:
        for pod, line in _followed(client, controller_namespace, pods, since=since, tail=tail):
            show([line], pod if several else None)
    except KeyboardInterrupt:
        sys.stdout.flush()
