"""One inventory object, as the dashboard's object page shows it: its live YAML and its diff.

Identity: **the viewer's** (the kubeconfig the dashboard runs with), never the dashboard's own
and never a stored one:

- the live object is one ``GET`` through a read-only client, so the page shows exactly what the
  viewer may read (``forbidden`` is said, not worked around);
- the diff is ``stageset diff``'s own computation for the object's stage
  (:class:`stageset.cli.preview.Differ` over :class:`stageset.cli.render.Renderer`, the
  controller's render service): the source and ``substituteFrom`` read, and the server-side
  dry-run made, as the stage's ServiceAccount *impersonated by the viewer* — so the viewer needs
  the ``impersonate`` right ``stageset diff`` needs, and RBAC decides.  A dry-run writes nothing.

Secrets: a live Secret's ``data``/``stringData`` values are masked, and so is any
``last-applied-configuration`` annotation on it (it would repeat the data); ``managedFields`` are
left out.  The diff masks Secret values as ``stageset diff`` does (changed values read
``*** (changed)``) and redacts values substituted from Secrets.

Diffs are computed one at a time (a lock): each renders the stage, which may fetch its source.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import yaml

from stageset.apply.errors import StageError
from stageset.apply.inventory import ObjectId
from stageset.cli.dashboard.hub import ReadOnlyClient
from stageset.cli.dashboard.views import Ref
from stageset.cli.preview import Differ, cli_cache_dir
from stageset.cli.render import Renderer, SessionClients, SourceDirs, mask_secret, parse_stageset
from stageset.cli.session import CliError, Session
from stageset.controller.redact import MASK
from stageset.kube.client import ApiError, KubeClient, UnreachableError
from stageset.kube.mapping import RestMapper, UnknownKindError
from stageset.kube.types import KubeObject

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Live:
    """The live object as YAML (masked), or why it is not shown."""

    text: str | None
    problem: str | None = None


@dataclass(frozen=True)
class ObjectDiff:
    """What applying the stage now would do to the object, or why that is not known."""

    action: str | None
    diff: str = ""
    note: str = ""
    revision: str | None = None
    identity: str | None = None
    problem: str | None = None


def shown(obj: KubeObject) -> KubeObject:
    """What the page may show of a live object: no ``managedFields``; a Secret's values masked."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    cleaned: KubeObject = {**obj, "metadata": meta}
    if obj.get("kind") == "Secret":
        cleaned = mask_secret({**cleaned, "apiVersion": "v1"})
        annotations = dict(meta.get("annotations") or {})
        if LAST_APPLIED in annotations:
            annotations[LAST_APPLIED] = MASK
        cleaned["metadata"] = {**meta, "annotations": annotations} if annotations else meta
        for key in ("data", "stringData"):  # any other API version of a Secret too
            if isinstance(obj.get(key), dict):
                cleaned[key] = {name: MASK for name in obj[key]}
    return cleaned


def live(client: KubeClient, ref: Ref) -> Live:
    """``ref`` as the viewer may read it (``client``: theirs, wrapped read-only here)."""
    reader = ReadOnlyClient(client)
    try:
        resource = RestMapper(client).resolve(ref.api_version, ref.kind)
        obj = reader.get(resource.object_path(name=ref.name, namespace=ref.namespace or None)
                         if resource.namespaced else resource.object_path(name=ref.name))
    except UnknownKindError:
        return Live(None, f"the cluster serves no {ref.kind} in {ref.api_version}")
    except ApiError as error:
        if error.forbidden:
            return Live(None, f"you may not read {ref.describe()}: {error.message}")
        if error.not_found:
            return Live(None, f"{ref.describe()} is not on the cluster (deleted, or not created yet)")
        return Live(None, f"reading {ref.describe()} failed: {error.message}")
    except UnreachableError as error:
        return Live(None, f"the cluster cannot be reached: {error}")
    return Live(yaml.safe_dump(shown(obj), sort_keys=False, allow_unicode=True, width=1_000_000))


def _names(oid: ObjectId) -> set[str]:
    """How ``stageset diff`` may name the object (with and without a defaulted namespace)."""
    return {oid.describe().replace(" ", "/"), f"{oid.kind}/{oid.name}"}


def diff(session: Session, stageset: KubeObject, *, stage: str, oid: ObjectId) -> ObjectDiff:
    """The object's diff, as ``stageset diff`` computes it for ``stage``, as the viewer."""
    where = f"StageSet {stageset['metadata']['namespace']}/{stageset['metadata']['name']}"
    try:
        parsed = parse_stageset(stageset, where=where)
    except CliError as error:
        return ObjectDiff(None, problem=str(error))
    spec_stage = next((s for s in parsed.spec.stages if s.name == stage), None)
    if spec_stage is None:
        return ObjectDiff(None, problem=f"stage {stage!r} is no longer in the spec: the next complete pass "
                          "prunes its objects")
    with _LOCK:
        renderer = Renderer(clients=SessionClients(session), sources=SourceDirs.parse(()),
                            cache_dir=cli_cache_dir(), warn=lambda _message: None)
        differ = Differ(session=session, renderer=renderer, stageset=parsed)
        try:
            rendered = renderer.render_stage(parsed, spec_stage)
            stage_diff, _ = differ.stage(rendered, differ.target())
        except (StageError, CliError, ApiError, UnreachableError) as error:
            message = error.message if isinstance(error, StageError | ApiError) else str(error)
            return ObjectDiff(None, problem=message)
    if stage_diff.error is not None:
        return ObjectDiff(None, revision=stage_diff.revision or None, identity=stage_diff.identity,
                          problem=stage_diff.error)
    wanted = _names(oid)
    for item in stage_diff.objects:
        if item.object in wanted:
            return ObjectDiff(item.action, item.diff, item.note, stage_diff.revision, stage_diff.identity)
    return ObjectDiff("Deleted", note=f"stage {stage} no longer renders it: the next complete pass prunes it",
                      revision=stage_diff.revision, identity=stage_diff.identity)
