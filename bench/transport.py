"""What sending and receiving costs the controller, per HTTP client, on its request mix (issue 38, item 3).

Measurement only; nothing here changes what the controller sends.  Run from the checkout's root::

    .venv/bin/python -m bench.transport [--cycles 150] [--threads 4,8] [--tenants 2] [--repeat 1]
                                        [--candidates stageset,stageset-urllib3,urllib3-h2,httpx-h1,...]

One control plane (:func:`stageset.envtest.start`, the StageSet CRDs installed), ``--tenants``
namespaces with a ServiceAccount ``deployer`` each, holding a Role that may write ConfigMaps and
StageSets' status there, and in each namespace 8 ConfigMaps and 8 StageSets (never reconciled:
no controller runs).  Each candidate runs in a subprocess of its own (no candidate's imports,
pools or injected classes leak into another's numbers), with ``--threads`` worker threads, as the
controller's workers; each thread runs ``--cycles`` cycles of the controller's request mix, each
request impersonating the tenant of that cycle (``Impersonate-User``), tenants taken in turn:

1. ``GET`` of a ConfigMap;
2. server-side apply of it (``application/apply-patch+yaml``, ``fieldManager``, ``force``), a value changed;
3. the same apply with ``dryRun=All``;
4. a merge patch to a StageSet's ``/status`` (a Ready condition whose message changes);
5. a ``LIST`` of ConfigMaps with a ``labelSelector``.

The candidates (each builds JSON with orjson, as ours does, and reads the bearer token through the
official client's configuration on every request, as ours must to follow a rotated token):

* ``stageset`` — :class:`stageset.kube.client.KubeClient` as the controller runs it (libcurl,
  HTTP/1.1, one pool of handles per cluster shared by its identities, from
  :meth:`~stageset.kube.client.ClientPool.from_kubeconfig`);
* ``stageset-urllib3`` — the same KubeClient on urllib3 (``libcurl=False``: one urllib3 pool per
  identity, HTTP/1.1), as it ran before libcurl was adopted;
* ``urllib3-h2`` — the KubeClient on urllib3 with urllib3 2.x's own HTTP/2 injected
  (``urllib3.http2.inject_into_urllib3``: one stream per connection at a time, no multiplexing);
* ``httpx-h1`` / ``httpx-h2`` — one ``httpx.Client`` per identity, HTTP/1.1, or HTTP/2 multiplexing
  every thread's requests over one connection per identity;
* ``pycurl`` — libcurl (C: HTTP parsing and OpenSSL without Python in between), one easy handle per
  thread, keep-alive, HTTP/1.1.

After a warm-up cycle per thread (connections open, as in a running controller), the timed phase
counts: the candidate process's own CPU seconds (``getrusage``: every thread, C code included),
wall time, kube-apiserver's and etcd's CPU seconds (``/proc/<pid>/stat``), TLS handshakes made
(connections opened: Python's ``SSLSocket.do_handshake`` and whether the session was resumed;
libcurl's ``NUM_CONNECTS``), and every answer's status code.  Printed: one Markdown table.

Identity: the benchmark's admin (``system:masters``) sets up; every candidate authenticates as the
controller's ServiceAccount ``stageset-system/stageset-controller`` bound to the chart's ClusterRole
(a bearer token, as in a real install) and impersonates ``system:serviceaccount:<tenant>:deployer``.
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson

from bench.common import CpuMeter, machine, markdown_table, revision
from stageset.controller.kinds import STAGESETS
from stageset.envtest import install
from stageset.envtest.server import ControlPlane, start
from stageset.kube.client import ApiError, ClientPool, Identity

ROOT = Path(__file__).resolve().parent.parent
CANDIDATES = ("stageset", "stageset-urllib3", "urllib3-h2", "httpx-h1", "httpx-h2", "pycurl")
REQUESTS_PER_CYCLE = 5
OBJECTS = 8  # ConfigMaps and StageSets per tenant namespace
ACCOUNT = "deployer"
MANAGER = "stageset-bench"
LABEL = "bench.stageset.dev/set"
APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"

# -- what every request of the mix is ---------------------------------------------------------


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    content_type: str | None


def _cycle(namespace: str, k: int, stamp: str) -> list[Call]:
    cm = f"/api/v1/namespaces/{namespace}/configmaps/cm-{k}"
    applied = {"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": f"cm-{k}", "namespace": namespace, "labels": {LABEL: f"set-{k}"}},
               "data": {"stamp": stamp, "payload": "x" * 256}}
    apply_query = {"fieldManager": "stageset", "force": "true"}
    status = {"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "Applied", "observedGeneration": 1,
        "lastTransitionTime": "2026-01-01T00:00:00Z", "message": f"applied 1 object ({stamp})"}]}}
    return [
        Call("GET", cm, {}, None, None),
        Call("PATCH", cm, apply_query, applied, APPLY),
        Call("PATCH", cm, {**apply_query, "dryRun": "All"}, applied, APPLY),
        Call("PATCH", f"{STAGESETS.object_path(namespace=namespace, name=f'set-{k}')}/status", {}, status,
             MERGE),
        Call("GET", f"/api/v1/namespaces/{namespace}/configmaps", {"labelSelector": f"{LABEL}=set-{k}"},
             None, None),
    ]


# -- set-up (the parent) ----------------------------------------------------------------------


def _tenant_rules() -> list[dict[str, Any]]:
    return [
        {"apiGroups": [""], "resources": ["configmaps"],
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
        {"apiGroups": [STAGESETS.group], "resources": ["stagesets", "stagesets/status"],
         "verbs": ["get", "list", "watch", "patch", "update"]},
    ]


def set_up(plane: ControlPlane, *, tenants: int, workdir: Path) -> dict[str, Any]:
    """Namespaces, the tenant accounts, their objects, and the controller's kubeconfig."""
    pool = ClientPool.from_kubeconfig(str(plane.kubeconfig))
    admin = pool.client()
    try:
        install.install(admin)
        kubeconfig = install.controller_kubeconfig(admin, url=plane.url, ca=plane.pki.ca_cert,
                                                   path=workdir / "controller.kubeconfig")
        namespaces = [f"transport-{t}" for t in range(tenants)]
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        for ns in namespaces:
            admin.apply(f"/api/v1/namespaces/{ns}", {"apiVersion": "v1", "kind": "Namespace",
                                                    "metadata": {"name": ns}}, field_manager=MANAGER)
            admin.apply(f"/api/v1/namespaces/{ns}/serviceaccounts/{ACCOUNT}",
                        {"apiVersion": "v1", "kind": "ServiceAccount",
                         "metadata": {"name": ACCOUNT, "namespace": ns}}, field_manager=MANAGER)
            admin.apply(f"{rbac}/namespaces/{ns}/roles/{ACCOUNT}",
                        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                         "metadata": {"name": ACCOUNT, "namespace": ns}, "rules": _tenant_rules()},
                        field_manager=MANAGER)
            admin.apply(f"{rbac}/namespaces/{ns}/rolebindings/{ACCOUNT}",
                        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                         "metadata": {"name": ACCOUNT, "namespace": ns},
                         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                     "name": ACCOUNT},
                         "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": ns}]},
                        field_manager=MANAGER)
            for k in range(OBJECTS):
                admin.apply(STAGESETS.object_path(namespace=ns, name=f"set-{k}"),
                            {"apiVersion": STAGESETS.api_version, "kind": STAGESETS.kind,
                             "metadata": {"name": f"set-{k}", "namespace": ns},
                             "spec": {"interval": "1h", "stages": [
                                 {"name": "main", "path": "./app", "sourceRef": {"name": "src"}}]}},
                            field_manager=MANAGER)
                call = _cycle(ns, k, "setup")[1]
                admin.request(call.method, call.path, query=call.query, body=call.body,
                              content_type=APPLY)
    finally:
        pool.close()
    return {"kubeconfig": str(kubeconfig), "namespaces": namespaces}


# -- the candidates (each in its own subprocess) ----------------------------------------------

Send = Callable[[int, Call], int]
"""Send one call as tenant ``t``; the answer's status code (the body read and parsed)."""

_HANDSHAKES = Counter[str]()
_LOCK = threading.Lock()


def _count_handshakes() -> None:
    """Count every TLS handshake Python makes (urllib3 and httpcore both wrap sockets with ``ssl``)."""
    original = ssl.SSLSocket.do_handshake

    def counted(self: ssl.SSLSocket, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        with _LOCK:
            _HANDSHAKES["handshakes"] += 1
            _HANDSHAKES["resumed"] += int(self.session_reused)

    ssl.SSLSocket.do_handshake = counted  # type: ignore[method-assign]


def _identity(namespace: str) -> Identity:
    return Identity.service_account(namespace=namespace, name=ACCOUNT)


def _stageset(setup: dict[str, Any], *, http2: bool, libcurl: bool) -> tuple[Send, Callable[[], None]]:
    if http2:
        import urllib3.http2

        urllib3.http2.inject_into_urllib3()
    pool = ClientPool.from_kubeconfig(setup["kubeconfig"], libcurl=libcurl)
    clients = [pool.client(_identity(ns)) for ns in setup["namespaces"]]
    seen = [0]  # libcurl's connections already counted

    def send(tenant: int, call: Call) -> int:
        codes: list[int] = []
        try:
            clients[tenant].request(call.method, call.path, query=call.query or None, body=call.body,
                                    content_type=call.content_type or "application/json", status=codes)
        except ApiError as error:
            return error.status
        finally:
            if libcurl:  # libcurl's connections, counted as Python's TLS handshakes are for urllib3
                with _LOCK:
                    total = pool.connections_opened()
                    _HANDSHAKES["handshakes"] += total - seen[0]
                    seen[0] = total
        return codes[0]

    return send, pool.close


class _Auth:
    """The official client's configuration, read as ours reads it: the bearer token on every request."""

    def __init__(self, kubeconfig: str):
        from kubernetes import client as k8s
        from kubernetes import config as k8s_config

        self.configuration = k8s.Configuration()
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=self.configuration)
        self.host = str(self.configuration.host)
        self.ca = str(self.configuration.ssl_ca_cert)

    def token(self) -> str:
        return str(self.configuration.auth_settings()["BearerToken"]["value"])


def _url(host: str, call: Call) -> str:
    return f"{host}{call.path}?{urlencode(call.query)}" if call.query else f"{host}{call.path}"


def _headers(auth: _Auth, namespace: str, call: Call) -> dict[str, str]:
    headers = {"Accept": "application/json", "Authorization": auth.token(),
               "Impersonate-User": _identity(namespace).user or ""}
    if call.content_type:
        headers["Content-Type"] = call.content_type
    return headers


def _httpx(setup: dict[str, Any], *, http2: bool) -> tuple[Send, Callable[[], None]]:
    import httpx

    auth = _Auth(setup["kubeconfig"])
    context = ssl.create_default_context(cafile=auth.ca)
    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    clients = [httpx.Client(verify=context, http2=http2, limits=limits, timeout=30.0)
               for _ in setup["namespaces"]]

    def send(tenant: int, call: Call) -> int:
        response = clients[tenant].request(
            call.method, _url(auth.host, call), headers=_headers(auth, setup["namespaces"][tenant], call),
            content=None if call.body is None else orjson.dumps(call.body))
        if response.content:
            orjson.loads(response.content)
        return response.status_code

    def close() -> None:
        for client in clients:
            client.close()

    return send, close


def _pycurl(setup: dict[str, Any]) -> tuple[Send, Callable[[], None]]:
    import pycurl

    auth = _Auth(setup["kubeconfig"])
    local = threading.local()
    handles: list[Any] = []

    def handle() -> Any:
        curl = getattr(local, "curl", None)
        if curl is None:
            curl = pycurl.Curl()
            curl.setopt(pycurl.CAINFO, auth.ca)
            curl.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1)
            curl.setopt(pycurl.NOSIGNAL, 1)
            curl.setopt(pycurl.TIMEOUT, 30)
            local.curl = curl
            with _LOCK:
                handles.append(curl)
        return curl

    def send(tenant: int, call: Call) -> int:
        curl = handle()
        sink = io.BytesIO()
        curl.setopt(pycurl.URL, _url(auth.host, call))
        curl.setopt(pycurl.HTTPHEADER, [f"{k}: {v}" for k, v in
                                        _headers(auth, setup["namespaces"][tenant], call).items()])
        curl.setopt(pycurl.WRITEDATA, sink)
        if call.body is None:
            curl.setopt(pycurl.HTTPGET, 1)
            curl.setopt(pycurl.CUSTOMREQUEST, call.method)
        else:
            curl.setopt(pycurl.CUSTOMREQUEST, call.method)
            curl.setopt(pycurl.POSTFIELDS, orjson.dumps(call.body))
        curl.perform()
        with _LOCK:
            _HANDSHAKES["handshakes"] += curl.getinfo(pycurl.NUM_CONNECTS)
        data = sink.getvalue()
        if data:
            orjson.loads(data)
        return int(curl.getinfo(pycurl.RESPONSE_CODE))

    def close() -> None:
        for curl in handles:
            curl.close()

    return send, close


def _candidate(name: str, setup: dict[str, Any]) -> tuple[Send, Callable[[], None]]:
    if name in ("stageset", "stageset-urllib3", "urllib3-h2"):
        return _stageset(setup, http2=name == "urllib3-h2", libcurl=name == "stageset")
    if name in ("httpx-h1", "httpx-h2"):
        return _httpx(setup, http2=name == "httpx-h2")
    if name == "pycurl":
        return _pycurl(setup)
    raise ValueError(f"unknown candidate {name!r}; one of {', '.join(CANDIDATES)}")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_candidate(name: str, setup: dict[str, Any], *, threads: int, cycles: int,
                  go: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """One candidate's timed phase, in this process; ``go`` is called between warm-up and timing."""
    _count_handshakes()
    send, close = _candidate(name, setup)
    tenants = len(setup["namespaces"])
    codes: Counter[int] = Counter()
    errors: list[str] = []

    def work(thread: int, rounds: range) -> Counter[int]:
        seen: Counter[int] = Counter()
        for c in rounds:
            tenant = (thread + c) % tenants
            for call in _cycle(setup["namespaces"][tenant], (thread + c) % OBJECTS, f"{name}-{thread}-{c}"):
                try:
                    seen[send(tenant, call)] += 1
                except Exception as error:  # a candidate that fails is a finding, not a crash
                    seen[0] += 1
                    with _LOCK:
                        errors.append(f"{type(error).__name__}: {str(error)[:120]}")
        return seen

    try:
        with ThreadPoolExecutor(threads) as executor:
            # Warm-up: one request per identity from one thread, then one cycle per thread at once.
            for tenant, namespace in enumerate(setup["namespaces"]):
                codes[send(tenant, _cycle(namespace, 0, "warm")[0])] += 1
            for seen in executor.map(lambda t: work(t, range(-1, 0)), range(threads)):
                codes.update(seen)
            opened_in_warm_up = _HANDSHAKES["handshakes"]
            _HANDSHAKES.clear()
            warm = sum(codes.values())
            go()
            cpu, begun = _cpu(), time.monotonic()
            timed: Counter[int] = Counter()
            for seen in executor.map(lambda t: work(t, range(cycles)), range(threads)):
                timed.update(seen)
            wall, used = time.monotonic() - begun, _cpu() - cpu
    finally:
        close()
    return {"candidate": name, "threads": threads, "warm_up": warm,
            "codes": {str(k): v for k, v in timed.items()}, "requests": sum(timed.values()), "cpu": used,
            "wall": wall, "handshakes": _HANDSHAKES["handshakes"], "resumed": _HANDSHAKES["resumed"],
            "connections": opened_in_warm_up + _HANDSHAKES["handshakes"],
            "errors": sorted(set(errors))[:3]}


def _child(argv: list[str]) -> int:
    """``--child NAME SETUP THREADS CYCLES``: warm up, say ``ready``, wait for a line, run, print JSON."""
    name, setup_path, threads, cycles = argv
    setup = json.loads(Path(setup_path).read_text())

    def go() -> None:
        print("ready", flush=True)
        sys.stdin.readline()

    result = run_candidate(name, setup, threads=int(threads), cycles=int(cycles), go=go)
    print(json.dumps(result), flush=True)
    return 0


def _read_line(stream: Any, timeout: float) -> str | None:
    """The next line of ``stream``, or ``None`` if none came within ``timeout`` seconds."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return lines[0] if lines else None


def measure_candidate(plane: ControlPlane, setup_path: Path, name: str, *, threads: int,
                      cycles: int, timeout: float) -> dict[str, Any]:
    """Run one candidate in a subprocess, with the control plane's CPU counted over its timed phase.

    A candidate that hangs (``timeout`` seconds for warm-up, and again for the timed phase) or dies
    is a finding, not the end of the run: its row says ``failed`` and why."""
    etcd, apiserver = (p.pid for p in plane._processes[:2])
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.transport", "--child", name, str(setup_path), str(threads),
         str(cycles)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None
    assert child.stdout is not None
    failed = {"candidate": name, "threads": threads, "requests": 0, "codes": {}}
    try:
        line = _read_line(child.stdout, timeout)
        if line is None or line.strip() != "ready":
            return {**failed, "failed": "hung in warm-up" if line is None else "died in warm-up"}
        meter = CpuMeter({"kube-apiserver": apiserver, "etcd": etcd})
        meter.start()
        child.stdin.write("go\n")
        child.stdin.flush()
        line = _read_line(child.stdout, timeout)
        used = meter.finish()
        if not line:
            return {**failed, "failed": "hung" if line is None else "died"}
        result: dict[str, Any] = json.loads(line)
    finally:
        child.stdin.close()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    return {**result, **used}


def table(results: list[dict[str, Any]]) -> str:
    rows = []
    for r in results:
        n = r["requests"]
        if r.get("failed") or r.get("errors"):
            why = r.get("failed") or f"{r['codes'].get('0', 0)} requests failed: {'; '.join(r['errors'])}"
            rows.append([r["candidate"], str(r["threads"]), str(n), f"failed: {why}", *["-"] * 7])
            continue
        ok = sum(v for k, v in r["codes"].items() if int(k) < 300)
        rows.append([r["candidate"], str(r["threads"]), str(n), f"{ok}",
                     f"{r['cpu'] * 1e6 / n:.0f}", f"{r['kube-apiserver'] * 1e6 / n:.0f}",
                     f"{r['etcd'] * 1e6 / n:.0f}", f"{n / r['wall']:.0f}",
                     f"{r['connections']} ({r['handshakes']})", str(r["resumed"]), f"{r['others']:.1f}"])
    return markdown_table(["client", "threads", "requests", "2xx", "client CPU µs/request",
                           "kube-apiserver µs/request", "etcd µs/request", "requests/s",
                           "connections opened (in the timed phase)", "TLS sessions resumed",
                           "other processes CPU-s"], rows)


def measure(*, candidates: tuple[str, ...], threads: tuple[int, ...], cycles: int, tenants: int,
            repeat: int) -> tuple[str, list[dict[str, Any]]]:
    workdir = Path(tempfile.mkdtemp(prefix="stageset-transport-"))
    plane = start(workdir=workdir / "plane")
    results: list[dict[str, Any]] = []
    try:
        setup = set_up(plane, tenants=tenants, workdir=workdir)
        setup_path = workdir / "setup.json"
        setup_path.write_text(json.dumps(setup))
        for _ in range(repeat):
            for count in threads:
                for name in candidates:
                    result = measure_candidate(plane, setup_path, name, threads=count, cycles=cycles,
                                               timeout=120 + 0.2 * count * cycles * REQUESTS_PER_CYCLE)
                    print(f"[transport] {name} x{count}: {json.dumps(result)}", file=sys.stderr, flush=True)
                    results.append(result)
    finally:
        plane.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    head = (f"{tenants} tenants, {cycles} cycles of {REQUESTS_PER_CYCLE} requests per thread "
            f"(GET, apply, dry-run apply, status merge patch, labelled LIST; each impersonating a tenant), "
            f"{repeat} repeat(s). Machine: {machine()}. Code: {revision(ROOT)}.")
    return f"{head}\n\n{table(results)}", results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return _child(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m bench.transport", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=150, help="cycles of the request mix per thread")
    parser.add_argument("--threads", type=lambda v: tuple(int(x) for x in v.split(",")), default=(4, 8))
    parser.add_argument("--tenants", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--candidates", type=lambda v: tuple(v.split(",")), default=CANDIDATES)
    args = parser.parse_args(argv)
    text, _ = measure(candidates=args.candidates, threads=args.threads, cycles=args.cycles,
                      tenants=args.tenants, repeat=args.repeat)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
