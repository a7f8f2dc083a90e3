"""``stageset promote``: release a stage held by its promotion gate, as the user.

Identity: every request is the user's own (the kubeconfig's credentials): reading the StageSet,
and a merge patch of its ``stages.metio.wtf/promote`` annotation (``<stage>@<token>``, the
reference's format).  So the StageSet's RBAC decides who may promote: anyone who may ``patch``
the StageSet (the aggregated ``edit`` role), and nobody who may only read it.  The controller
acts on each token once, and only for the revision the stage waits at (:mod:`stageset.controller.
stageset.gates`); ``--wait`` watches its status for the token.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import click

from stageset.api.release import ANNOTATION_PROMOTE
from stageset.cli.inspect import read_stageset
from stageset.cli.params import DURATION
from stageset.cli.session import DNS_LABEL, CliError, Session, cluster_options, echo
from stageset.cli.steer import POLL, patch
from stageset.controller.kinds import STAGESETS
from stageset.kube.client import KubeClient
from stageset.kube.types import KubeObject

HELD = ("Soaking", "AwaitingManual")


def _stage_status(obj: KubeObject, stage: str) -> dict[str, Any]:
    found: dict[str, Any] = next((s for s in (obj.get("status") or {}).get("stages") or []
                                  if s.get("name") == stage), {})
    return found


def token() -> str:
    """A fresh token: the time (readable) and randomness (two promotions in one second differ)."""
    return f"{int(time.time())}-{secrets.token_hex(4)}"


def request_promotion(client: KubeClient, obj: KubeObject, stage: str, *, force: bool = False
                      ) -> tuple[str, dict[str, Any]]:
    """Stamp ``stage@token`` on ``obj`` with ``client`` (the user's), after the checks the command
    makes; returns the value and the gate it promotes.  Raises :class:`CliError` (with what to say)
    when there is nothing to promote, or the user may not patch the StageSet."""
    namespace, name = str(obj["metadata"]["namespace"]), str(obj["metadata"]["name"])
    stages = (obj.get("spec") or {}).get("stages") or []
    spec_stage = next((s for s in stages if s.get("name") == stage), None)
    if spec_stage is None:
        raise CliError(f"StageSet {namespace}/{name} has no stage {stage!r}")
    if not spec_stage.get("promotion"):
        raise CliError(f"stage {stage!r} of StageSet {namespace}/{name} has no promotion gate "
                       "(spec.stages[].promotion): there is nothing to promote")
    if (obj.get("spec") or {}).get("suspend") and not force:
        raise CliError(f"StageSet {namespace}/{name} is suspended and will not act on a promotion "
                       "(--force asks anyway)")
    gate: dict[str, Any] = _stage_status(obj, stage).get("promotionState") or {}
    if gate.get("phase") not in HELD and not force:
        raise CliError(f"stage {stage!r} is not waiting for a promotion (promotionState: "
                       f"{gate.get('phase') or 'none'}); --force asks anyway")
    value = f"{stage}@{token()}"
    patch(client, STAGESETS, namespace, name, {"metadata": {"annotations": {ANNOTATION_PROMOTE: value}}})
    return value, gate


@click.command("promote")
@click.argument("name")
@click.option("--stage", "stage", required=True, type=DNS_LABEL, help="The stage to promote.")
@click.option("--wait", is_flag=True, default=False,
              help="Wait until the controller has acted on the promotion.")
@click.option("--timeout", type=DURATION, default="5m", show_default=True, help="How long --wait waits.")
@click.option("--force", is_flag=True, default=False,
              help="Ask even when the stage is not waiting for a promotion now (the controller ignores a "
                   "promotion of a stage that does not wait for one when it acts on it).")
@cluster_options(outputs=("table",))
def promote(session: Session, name: str, stage: str, wait: bool, timeout: float, force: bool) -> None:
    """Promote STAGE of StageSet NAME past its promotion gate (a soak, requireManualPromotion).

    Stamps the stages.metio.wtf/promote annotation as you: who may patch the StageSet may
    promote.  The controller acts on it once, for the revision the stage waits at; the stages
    after it then start.  Exit code 3 when the controller did not promote anything (--wait).
    """
    obj = read_stageset(session, name)
    namespace = session.namespace
    value, gate = request_promotion(session.client(), obj, stage, force=force)
    echo(f"asked to promote stage {stage!r} of StageSet {namespace}/{name} at "
         f"{gate.get('revision') or 'its current revision'} ({ANNOTATION_PROMOTE}={value})\n")
    if not wait:
        return
    handled = value.partition("@")[2]
    deadline = time.monotonic() + timeout
    path = STAGESETS.object_path(name=name, namespace=namespace)
    while True:
        now = _stage_status(session.client().get(path), stage)
        if now.get("lastHandledPromotion") == handled:
            state = now.get("promotionState") or {}
            if state.get("phase") != "Promoted":
                raise CliError(f"the controller did not promote stage {stage!r}: it was not waiting for a "
                               "promotion when the request arrived (see `stageset events`)")
            echo(f"stage {stage!r} promoted at {state.get('revision')}\n")
            return
        if time.monotonic() >= deadline:
            raise CliError(f"timed out after {timeout:g}s waiting for the controller to act on the "
                           "promotion; is the controller running?")
        time.sleep(POLL)
