"""Nothing lost under faults: a real proxy between the controller and the apiserver and Git server.

Every fault runs the same story: two StageSets (two stages each) are Ready; the fault starts; a
commit changes one object and removes another; the fault ends.  Then, each time:

- the controller is still up (same process);
- nothing Git still renders was deleted (the apiserver's audit log), only what Git removed;
- nothing is orphaned (every labelled object is in an inventory, and only those Git renders);
- every StageSet converges within the bound stated per fault after it clears (measured times
  are printed at the end of the module and recorded in docs/operations.md);
- where the fault makes requests fail, retries back off (counted from toxiproxy's log).
"""

from __future__ import annotations

import datetime
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.faults.conftest import CONTROLLER_USER, RESYNC, STAGESETS, Lab, Scenario, cm, compact, wait_for

pytestmark = [pytest.mark.apiserver, pytest.mark.e2e]

RECOVERY: dict[str, float] = {}


@pytest.fixture(scope="module", autouse=True)
def _print_recovery() -> Iterator[None]:
    yield
    lines = "\n".join(f"  {name}: {seconds:.1f}s" for name, seconds in RECOVERY.items())
    sys.stderr.write(f"\n--- recovery after each fault cleared ---\n{lines}\n")


def files(sets: int, value: str = "v", *, with_b: bool = True) -> dict[str, str]:
    found: dict[str, str] = {}
    for i in range(sets):
        found[f"set{i}/first/a.json"] = cm(f"s{i}-a", value)
        if with_b:
            found[f"set{i}/first/b.json"] = cm(f"s{i}-b")
        found[f"set{i}/second/c.json"] = cm(f"s{i}-c")
    return found


def expected(sets: int, value: str, *, with_b: bool) -> dict[str, str]:
    found = {f"s{i}-a": value for i in range(sets)} | {f"s{i}-c": "v" for i in range(sets)}
    if with_b:
        found |= {f"s{i}-b": "v" for i in range(sets)}
    return found


def ready_scenario(lab: Lab, prefix: str, sets: int = 2) -> Scenario:
    s = lab.scenario(prefix, files(sets), stagesets=sets)
    s.converge(lab.git.head(s.namespace), expected(sets, "v", with_b=True), timeout=90)
    return s


def change(s: Scenario) -> str:
    """Change every ``a``, remove every ``b``."""
    sets = len(s.names)
    removed: dict[str, str | None] = {f"set{i}/first/b.json": None for i in range(sets)}
    return s.commit({**files(sets, "v2", with_b=False), **removed})


def survive(lab: Lab, name: str, s: Scenario, fault: Callable[[], Any], *, bound: float) -> float:
    """Start ``fault`` (a context manager factory), change Git inside it, clear it, measure."""
    with fault():
        committed = time.monotonic()
        sha = change(s)
    sets = len(s.names)
    taken = s.converge(sha, expected(sets, "v2", with_b=False), timeout=bound)
    s.check(expected(sets, "v2", with_b=False), removed={f"s{i}-b" for i in range(sets)})
    RECOVERY[f"{name}: after it cleared"] = taken
    RECOVERY[f"{name}: after the commit"] = time.monotonic() - committed
    return taken


class Window:
    """A toxic (or several) held for ``seconds``."""

    def __init__(self, lab: Lab, seconds: float, toxics: list[tuple[Any, dict[str, Any]]]):
        self.lab, self.seconds, self.toxics = lab, seconds, toxics

    def __enter__(self) -> None:
        for proxy, toxic in self.toxics:
            self.lab.proxy.add_toxic(proxy, **toxic)
        self.started = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        time.sleep(max(0.0, self.seconds - (time.monotonic() - self.started)))
        for proxy, toxic in self.toxics:
            self.lab.proxy.remove_toxic(proxy, toxic["name"])


def test_one_second_of_latency_per_request(clean: Lab) -> None:
    s = ready_scenario(clean, "latency")
    fault = [(clean.api, {"name": "lat", "type_": "latency", "latency": 1000}),
             (clean.git_proxy, {"name": "lat", "type_": "latency", "latency": 1000})]
    survive(clean, "1 s latency on every apiserver and Git response (15 s)", s,
            lambda: Window(clean, 15, fault), bound=60)


def test_bandwidth_limits(clean: Lab) -> None:
    s = ready_scenario(clean, "bandwidth")
    fault = [(clean.api, {"name": "bw", "type_": "bandwidth", "rate": 16}),
             (clean.git_proxy, {"name": "bw", "type_": "bandwidth", "rate": 4})]
    survive(clean, "bandwidth 16 KB/s to the apiserver, 4 KB/s to Git (15 s)", s,
            lambda: Window(clean, 15, fault), bound=60)


def test_connections_reset_mid_response(clean: Lab) -> None:
    s = ready_scenario(clean, "reset")
    # Half the connections are cut after 8 KB: past the TLS handshake, inside responses and watches.
    fault = [(clean.api, {"name": "cut", "type_": "limit_data", "toxicity": 0.5, "bytes": 8192}),
             (clean.git_proxy, {"name": "cut", "type_": "limit_data", "toxicity": 0.5, "bytes": 2048})]
    survive(clean, "half the connections cut mid-response (15 s)", s, lambda: Window(clean, 15, fault),
            bound=60)


def test_a_stalled_connection(clean: Lab) -> None:
    s = ready_scenario(clean, "stall")
    # Every byte from the apiserver dropped, connections held open (toxiproxy's timeout toxic).
    fault = [(clean.api, {"name": "stall", "type_": "timeout", "timeout": 0})]
    survive(clean, "apiserver connections stalled (10 s)", s, lambda: Window(clean, 10, fault), bound=75)


class Outage:
    """The apiserver unreachable: ``api-inner`` disabled, so ``api`` accepts and closes at once."""

    def __init__(self, lab: Lab, seconds: float):
        self.lab, self.seconds = lab, seconds

    def __enter__(self) -> None:
        self.lab.proxy.set_enabled(self.lab.api_inner, False)
        self.started = time.time()

    def __exit__(self, *exc: object) -> None:
        time.sleep(max(0.0, self.seconds - (time.time() - self.started)))
        self.ended = time.time()
        self.lab.proxy.set_enabled(self.lab.api_inner, True)


def test_the_apiserver_down_for_30_seconds(clean: Lab) -> None:
    s = ready_scenario(clean, "outage")
    outage = Outage(clean, 30)
    survive(clean, "apiserver unreachable (30 s)", s, lambda: outage, bound=60)
    # Retries back off: connection attempts per 10 s fall during the outage.
    attempts = [t for t in clean.proxy.accepted(clean.api) if outage.started <= t <= outage.ended + 1]
    first = sum(1 for t in attempts if t < outage.started + 10)
    last = sum(1 for t in attempts if t >= outage.started + 20)
    sys.stderr.write(f"\nconnection attempts during the 30 s outage: {len(attempts)} "
                     f"(first 10 s: {first}, last 10 s: {last})\n")
    RECOVERY["attempts during the 30 s outage (first 10 s / last 10 s)"] = float(len(attempts))
    assert attempts, "the proxy saw no attempt at all: the outage was not exercised"
    assert last < first, f"no backoff: {first} attempts in the first 10 s, {last} in the last"
    assert len(attempts) < 120, f"{len(attempts)} connection attempts in 30 s"


class Flapping:
    """The Git server's proxy toggled every ``period`` seconds for ``seconds``."""

    def __init__(self, lab: Lab, seconds: float, period: float):
        self.lab, self.seconds, self.period = lab, seconds, period
        self.stop = threading.Event()

    def _run(self) -> None:
        up = True
        while not self.stop.wait(self.period):
            up = not up
            self.lab.proxy.set_enabled(self.lab.git_proxy, up)

    def __enter__(self) -> None:
        self.lab.proxy.set_enabled(self.lab.git_proxy, False)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.started = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        time.sleep(max(0.0, self.seconds - (time.monotonic() - self.started)))
        self.stop.set()
        self.thread.join()
        self.lab.proxy.set_enabled(self.lab.git_proxy, True)


def test_the_git_server_flapping(clean: Lab) -> None:
    s = ready_scenario(clean, "flap")
    before = len(clean.proxy.accepted(clean.git_proxy))
    survive(clean, "Git server flapping every 3 s (24 s)", s, lambda: Flapping(clean, 24, 3), bound=60)
    fetches = len(clean.proxy.accepted(clean.git_proxy)) - before
    assert fetches < 60, f"{fetches} connections to the Git server: retries do not back off"


def _apf(lab: Lab, namespace: str, *, present: bool) -> None:
    base = "/apis/flowcontrol.apiserver.k8s.io/v1"
    if not present:
        for kind in ("flowschemas", "prioritylevelconfigurations"):
            path = f"{base}/{kind}/stageset-tiny"
            lab.admin.request("DELETE", path)
        return
    lab.admin.apply(f"{base}/prioritylevelconfigurations/stageset-tiny", {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
        "metadata": {"name": "stageset-tiny"},
        "spec": {"type": "Limited", "limited": {"nominalConcurrencyShares": 1, "lendablePercent": 0,
                                                "limitResponse": {"type": "Reject"}}}},
        field_manager="faults")
    lab.admin.apply(f"{base}/flowschemas/stageset-tiny", {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
        "metadata": {"name": "stageset-tiny"},
        "spec": {"priorityLevelConfiguration": {"name": "stageset-tiny"}, "matchingPrecedence": 500,
                 "distinguisherMethod": {"type": "ByUser"},
                 "rules": [{"subjects": [
                     {"kind": "ServiceAccount", "serviceAccount": {"namespace": "stageset-system",
                                                                   "name": "stageset-controller"}},
                     {"kind": "Group", "group": {"name": f"system:serviceaccounts:{namespace}"}}],
                     "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                        "namespaces": ["*"], "clusterScope": True}],
                     "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}]}},
        field_manager="faults")


def _stamp(value: str) -> float:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


class Holders:
    """Requests that hold the priority level's seats: POSTs as the tenant whose bodies never finish
    arriving (the handler waits for them inside its seat, up to the apiserver's request timeout).
    While they are open, every other request of that level is answered 429."""

    def __init__(self, lab: Lab, namespace: str, count: int = 4):
        self.lab, self.namespace, self.count = lab, namespace, count
        self.sockets: list[Any] = []

    def __enter__(self) -> Holders:
        import socket

        host, port = "127.0.0.1", int(self.lab.plane.url.rpartition(":")[2])
        context = self.lab.plane.admin_ssl_context()
        for _ in range(self.count):
            raw = socket.create_connection((host, port), timeout=10)
            tls = context.wrap_socket(raw, server_hostname=host)
            tls.sendall((f"POST /api/v1/namespaces/{self.namespace}/configmaps HTTP/1.1\r\n"
                         f"Host: {host}:{port}\r\nContent-Type: application/json\r\n"
                         f"Impersonate-User: system:serviceaccount:{self.namespace}:deployer\r\n"
                         "Content-Length: 100000\r\n\r\n{").encode())
            self.sockets.append(tls)
        return self

    def __exit__(self, *exc: object) -> None:
        for tls in self.sockets:
            tls.close()

    def shed(self) -> float | None:
        """A probe in the same level: the Retry-After of its 429, or ``None`` if it was served."""
        from stageset.kube.client import ApiError, Identity

        tenant = Identity.service_account(namespace=self.namespace, name="deployer")
        client = self.lab.admin_pool.client(tenant)
        try:
            client.request("GET", f"/api/v1/namespaces/{self.namespace}/configmaps", timeout=1.0)
        except ApiError as error:
            return error.retry_after if error.status == 429 else None
        return None


def test_apiserver_overload_429_with_retry_after(clean: Lab) -> None:
    s = ready_scenario(clean, "apf", sets=4)
    mark = time.time()
    _apf(clean, s.namespace, present=True)
    try:
        with Holders(clean, s.namespace) as holders:
            # Once the apiserver's APF configuration controller applied the objects, the level sheds.
            least = wait_for(holders.shed, timeout=60, what="the priority level shedding load")
            sha = change(s)
            time.sleep(12)  # overloaded for a while: every request of the level is shed
        taken = s.converge(sha, expected(4, "v2", with_b=False), timeout=150)
    finally:
        _apf(clean, s.namespace, present=False)
    s.check(expected(4, "v2", with_b=False), removed={f"s{i}-b" for i in range(4)})
    RECOVERY["overloaded priority level (APF, Reject, held 12 s): converged after it cleared in"] = taken

    def acting(event: dict[str, Any]) -> str:
        return str((event.get("impersonatedUser") or event.get("user") or {}).get("username", ""))

    def at(event: dict[str, Any]) -> float:
        return _stamp(event["requestReceivedTimestamp"])

    events = [e for e in clean.plane.audit_events() if e.get("stage") == "ResponseComplete"
              and at(e) >= mark and (e.get("user") or {}).get("username") == CONTROLLER_USER]
    shed = [e for e in events if (e.get("responseStatus") or {}).get("code") == 429]
    sys.stderr.write(f"\n429s answered to the controller: {len(shed)} of {len(events)} requests; "
                     f"Retry-After seen by a probe: {least}s\n")
    RECOVERY["429s answered to the controller during the overload"] = float(len(shed))
    assert shed, "APF shed none of the controller's requests: the overload was not exercised"
    # Shed requests are made again later (a pass that failed on a 429 is retried) ...
    def again(rejected: dict[str, Any]) -> list[float]:
        key = (rejected["verb"], rejected["requestURI"], acting(rejected))
        return [at(e) - at(rejected) for e in events
                if (e["verb"], e["requestURI"], acting(e)) == key and at(e) > at(rejected)]

    assert any(again(e) for e in shed), "no shed request was made again"
    # ... and a shed write comes back no sooner than Retry-After, never at once.  Only writes are
    # paired by time: a read of one URL (the GitRepository, read by every StageSet) may be made by
    # several threads at once, so the next read of it need not be the retry.  Which requests the
    # level sheds depends on timing; when no write was among them, the controller's own account
    # of every wait (below) is the evidence.
    # A create is made to its collection's URL (every Event of the namespace is a POST to
    # .../events), so two creates of one URL are not one request made twice: creates are left out.
    gaps = {f'{e["verb"]} {e["requestURI"]}': min(again(e)) for e in shed
            if e["verb"] in ("patch", "update", "delete") and again(e)}
    assert all(gap >= 0.9 for gap in gaps.values()), \
        f"a shed write was retried too soon: {({k: round(v, 2) for k, v in gaps.items() if v < 0.9})}"
    # And the controller's own account of each wait: never shorter than the Retry-After it got.
    waits = [(float(m.group(1)), float(m.group(2))) for m in re.finditer(
        r": 429 \(Retry-After ([0-9.]+)s\); retrying in ([0-9.]+)s", clean.controller.output())]
    assert waits, "the controller logged no 429"
    assert all(wait >= after for after, wait in waits), [w for w in waits if w[1] < w[0]]
    del least


_BUMPS = iter(range(6, 10_000))


def _bump(s: Scenario, name: str) -> int:
    """A spec change (a new generation) made by the test directly, not through the proxy."""
    obj = s.lab.admin.request("PATCH", f"{STAGESETS.format(ns=s.namespace)}/{name}",
                              content_type="application/merge-patch+json",
                              body={"spec": {"retryInterval": f"{next(_BUMPS)}s"}})
    return int(obj["metadata"]["generation"])


def _observed(s: Scenario, name: str, generation: int) -> bool:
    return int((s.get(name).get("status") or {}).get("observedGeneration") or 0) >= generation


def test_410_gone_after_an_etcd_compaction_is_recovered(clean: Lab) -> None:
    s = ready_scenario(clean, "gone", sets=1)
    before = clean.controller.output().count("expired (410); relisting")
    clean.proxy.set_enabled(clean.api, False)  # every connection cut; watches must reconnect
    try:
        for _ in range(4):
            generation = _bump(s, "set0")
        compact(clean.plane)
    finally:
        clean.proxy.set_enabled(clean.api, True)
    started = time.monotonic()
    wait_for(lambda: _observed(s, "set0", generation), timeout=RESYNC + 40, what="the change seen after 410")
    RECOVERY["410 Gone after an etcd compaction"] = time.monotonic() - started
    assert clean.controller.output().count("expired (410); relisting") > before, "no 410 was seen"
    wait_for(lambda: s.ready_at("set0", None), timeout=30, what="Ready after the 410")
    clean.controller.check_alive()


def test_a_watch_that_silently_stops_delivering_is_recovered_within_the_resync_period(clean: Lab) -> None:
    s = ready_scenario(clean, "silent", sets=1)
    # Connections whose server side goes away are held open towards the controller, silent:
    # close the inner proxy's connections (the apiserver side of every controller connection).
    clean.proxy.add_toxic(clean.api, name="hold", type_="slow_close", delay=600_000)
    clean.proxy.set_enabled(clean.api_inner, False)
    clean.proxy.set_enabled(clean.api_inner, True)
    started = time.monotonic()
    generation = _bump(s, "set0")
    wait_for(lambda: _observed(s, "set0", generation), timeout=RESYNC + 60,
             what="the change seen through a silently dead watch")
    RECOVERY["watch silently dead (the change noticed and reconciled)"] = time.monotonic() - started
    clean.controller.check_alive()
