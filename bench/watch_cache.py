"""What the manager's watch cache costs (:mod:`stageset.controller.cache`): CPU per event and read,
and the memory it keeps per object.

Measurement only, no cluster.  Run from the checkout's root::

    .venv/bin/python -m bench.watch_cache [--n 1000] [--repeat 5]

It replays, through :class:`~stageset.controller.cache.ObjectCache`'s own calls, what the manager
does with N StageSets of one stage of 5 ConfigMaps and their N GitRepositories (the ``pairs``
shape of ``bench.peers``), objects shaped as this controller's are (JSON as the apiserver sends
it, ``managedFields`` dropped as the manager drops them):

* **sync**: every object listed (``update``);
* **cold**: per StageSet, the events and reads of a cold convergence — its first pass reads it;
  the finalizer-and-record patch comes back as an event; the status write is remembered
  (``wrote``) and read again (``get``, as the manager's transition check does); the watch then
  shows it; per GitRepository, a read, its status write and its event;
* **warm**: per StageSet, a ``reconcile.fluxcd.io/requestedAt`` poke: the event, two reads, the
  status write (``lastHandledReconcileAt``) and its event.

Time is simulated (a cache that takes ``monotonic=`` is given the replay's clock): the sync at
0 s, then one StageSet every ``--seconds-per-set`` (0.08 s: the N = 1000 cold rate of the last
quiet run), the warm pokes twice as fast; between the phases the workers go idle for a minute
(``settle()``, where the cache has it, as the manager's idle workers call it).

Printed: the median (and min-max over ``--repeat`` runs) of this process's CPU per phase and per
call, and the bytes the cache keeps per object at the end of the cold phase and after the idle
minute (``tracemalloc``, a run of its own).  Whole-process A/B runs of two checkouts compare
implementations: the replay is the same code.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
import uuid
from typing import Any

from stageset.controller.cache import ObjectCache
from stageset.controller.keys import ObjectKey


def _revision(i: int) -> str:
    return f"main@sha1:{i:040x}"


def stageset(i: int, *, version: int, status: bool, finalizer: bool, poked: str | None = None,
             handled: bool = False) -> dict[str, Any]:
    """StageSet ``set-<i>`` in ``tenant-<i % 10>`` as the apiserver sends it (without managedFields)."""
    namespace, name = f"tenant-{i % 10}", f"set-{i:04d}"
    metadata: dict[str, Any] = {
        "creationTimestamp": "2026-11-28T04:58:01Z", "generation": 1, "labels": {"bench": "stageset"},
        "name": name, "namespace": namespace, "resourceVersion": str(version),
        "uid": str(uuid.UUID(int=i))}
    if finalizer:
        metadata["finalizers"] = ["stages.metio.wtf/teardown"]
        metadata["annotations"] = {"stages.metio.wtf/inventory-record": (
            '{"v":2,"stages":{"app":{"sa":null,"kinds":{"v1//ConfigMap":["' + namespace + '"]}}}}')}
    if poked is not None:
        metadata.setdefault("annotations", {})["reconcile.fluxcd.io/requestedAt"] = poked
    obj: dict[str, Any] = {
        "apiVersion": "stages.metio.wtf/v1", "kind": "StageSet", "metadata": metadata,
        "spec": {"stages": [{"name": "app", "path": f"./sets/{name}",
                             "sourceRef": {"name": f"src-{i:04d}"}}]}}
    if status:
        revision = _revision(i)
        objects = [f"{name}-{k}" for k in range(5)]
        obj["status"] = {
            "conditions": [{"lastTransitionTime": "2026-11-28T04:58:03Z",
                            "message": f"applied 1 stage(s) at {revision}", "observedGeneration": 1,
                            "reason": "Succeeded", "status": "True", "type": "Ready"}],
            "history": [{"stage": "app", "releases": [{"revision": revision, "time": "2026-11-28T04:58:03Z",
                                                        "created": 5, "configured": 0, "deleted": 0,
                                                        "objects": [f"ConfigMap/{namespace}/{o}"
                                                                    for o in objects[:3]]}]}],
            "inventory": [{"name": "app", "entries": [
                {"id": f"{namespace}_{o}__ConfigMap", "v": "v1", "h": f"{(i * 7 + k) % (1 << 64):016x}"}
                for k, o in enumerate(objects)]}],
            "lastAppliedRevision": revision,
            "lastAppliedSnapshot": [{"stage": "app", "revision": revision}],
            "observedGeneration": 1,
            "stages": [{"lastAppliedTime": "2026-11-28T04:58:03Z", "name": "app", "objects": 5,
                        "phase": "Ready", "revision": revision}]}
        if handled:
            obj["status"]["lastHandledReconcileAt"] = poked
    return obj


def gitrepository(i: int, *, version: int, status: bool) -> dict[str, Any]:
    namespace, name = f"tenant-{i % 10}", f"src-{i:04d}"
    obj: dict[str, Any] = {
        "apiVersion": "stages.metio.wtf/v1", "kind": "GitRepository",
        "metadata": {"creationTimestamp": "2026-11-28T04:58:01Z", "generation": 1, "name": name,
                     "namespace": namespace, "resourceVersion": str(version),
                     "uid": str(uuid.UUID(int=10**6 + i))},
        "spec": {"interval": "1m", "ref": {"branch": "main"}, "url": f"http://127.0.0.1:41234/repo-{i:04d}.git"}}
    if status:
        obj["status"] = {
            "artifact": {"revision": _revision(i), "lastUpdateTime": "2026-11-28T04:58:02Z"},
            "conditions": [{"lastTransitionTime": "2026-11-28T04:58:02Z",
                            "message": f"stored artifact for revision '{_revision(i)}'",
                            "observedGeneration": 1, "reason": "Succeeded", "status": "True",
                            "type": "Ready"}],
            "observedGeneration": 1}
    return obj


def _states(obj: dict[str, Any]) -> tuple[Any, ...]:
    """What the manager's watches compare (the generation and the Ready condition, roughly)."""
    ready = next((c for c in obj.get("status", {}).get("conditions", []) if c.get("type") == "Ready"), None)
    return (obj["metadata"].get("generation"), None if ready is None else ready.get("status"))


def _key(obj: dict[str, Any]) -> ObjectKey:
    return ObjectKey(obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])


class Clock:
    """The replay's monotonic clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class NullCache:
    """The replay with no cache behind it (``--null``): what the replay itself costs, to subtract."""

    def update(self, *_: Any, **__: Any) -> tuple[None, None]:
        return None, None

    def get(self, *_: Any) -> None:
        return None

    def wrote(self, *_: Any) -> None:
        return None


def new_cache(clock: Clock) -> ObjectCache:
    """The checkout's cache, on the replay's clock where it takes one."""
    try:
        return ObjectCache(monotonic=clock)  # type: ignore[call-arg,unused-ignore]
    except TypeError:
        return ObjectCache()


def idle(cache: ObjectCache, clock: Clock) -> None:
    """A minute with nothing to do: an idle worker settles what is due (where the cache settles)."""
    clock.now += 60.0
    settle = getattr(cache, "settle", None)
    if settle is not None:
        settle()


def replay(cache: ObjectCache, n: int, clock: Clock, *, seconds_per_set: float = 0.08,
           kept: list[float] | None = None) -> dict[str, tuple[float, int]]:
    """Runs the phases; per phase (CPU seconds, cache calls).  With ``kept``, the traced memory after
    the cold phase and after the idle minute are appended to it."""
    timings: dict[str, tuple[float, int]] = {}
    version = 1000

    def phase(name: str, steps: list[tuple[str, Any]], *, per_set: float = 0.0) -> None:
        begun = time.process_time()
        for call, arg in steps:
            if call == "update":
                cache.update(_key(arg), arg, states=_states)
            elif call == "get":
                cache.get(arg)
            elif call == "tick":
                clock.now += per_set
            else:
                cache.wrote(arg)
        timings[name] = (time.process_time() - begun, sum(1 for call, _ in steps if call != "tick"))

    steps: list[tuple[str, Any]] = []
    for i in range(n):
        version += 1
        steps.append(("update", stageset(i, version=version, status=False, finalizer=False)))
        version += 1
        steps.append(("update", gitrepository(i, version=version, status=False)))
    phase("sync", steps)

    steps = []
    for i in range(n):
        repo_key = ObjectKey("GitRepository", f"tenant-{i % 10}", f"src-{i:04d}")
        set_key = ObjectKey("StageSet", f"tenant-{i % 10}", f"set-{i:04d}")
        version += 1
        steps += [("get", repo_key), ("wrote", gitrepository(i, version=version, status=True)),
                  ("get", repo_key), ("update", gitrepository(i, version=version, status=True))]
        steps.append(("get", set_key))
        version += 1
        steps.append(("update", stageset(i, version=version, status=False, finalizer=True)))
        version += 1
        written = stageset(i, version=version, status=True, finalizer=True)
        steps += [("wrote", written), ("get", set_key), ("update", written), ("tick", None)]
    phase("cold", steps, per_set=seconds_per_set)
    steps = []  # the replayed objects are not the cache's
    if kept is not None:
        kept.append(tracemalloc.get_traced_memory()[0])
    begun = time.process_time()
    idle(cache, clock)
    timings["idle"] = (time.process_time() - begun, 1)
    if kept is not None:
        kept.append(tracemalloc.get_traced_memory()[0])

    steps = []
    for i in range(n):
        set_key = ObjectKey("StageSet", f"tenant-{i % 10}", f"set-{i:04d}")
        poke = f"2026-11-28T05:00:{i % 60:02d}Z"
        version += 1
        steps += [("update", stageset(i, version=version, status=True, finalizer=True, poked=poke)),
                  ("get", set_key)]
        version += 1
        written = stageset(i, version=version, status=True, finalizer=True, poked=poke, handled=True)
        steps += [("wrote", written), ("get", set_key), ("update", written), ("tick", None)]
    phase("warm", steps, per_set=seconds_per_set / 2)
    return timings


def kept_bytes(n: int, seconds_per_set: float) -> tuple[float, float]:
    """Bytes the cache keeps per object (2N objects) at the end of the cold phase and after the idle
    minute."""
    tracemalloc.start()
    clock = Clock()
    cache = new_cache(clock)
    before = tracemalloc.get_traced_memory()[0]
    kept: list[float] = []
    replay(cache, n, clock, seconds_per_set=seconds_per_set, kept=kept)
    tracemalloc.stop()
    del cache
    return (kept[0] - before) / (2 * n), (kept[1] - before) / (2 * n)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.watch_cache", description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="StageSets (and as many GitRepositories)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seconds-per-set", type=float, default=0.08,
                        help="simulated time between two StageSets' cold passes")
    parser.add_argument("--null", action="store_true",
                        help="replay against a cache that does nothing (for instruction counts: subtract it)")
    parser.add_argument("--no-memory", action="store_true", help="skip the traced-memory run")
    args = parser.parse_args(argv)
    runs = []
    for _ in range(args.repeat):
        clock = Clock()
        cache: Any = NullCache() if args.null else new_cache(clock)
        runs.append(replay(cache, args.n, clock, seconds_per_set=args.seconds_per_set))
    print(f"watch cache replay, N = {args.n} StageSets and {args.n} GitRepositories, {args.repeat} runs "
          f"(Python {sys.version.split()[0]})\n")
    print("| phase | calls | CPU ms (median, min-max) | CPU us per call |")
    print("|---|---|---|---|")
    for name in runs[0]:
        seconds = [run[name][0] for run in runs]
        calls = runs[0][name][1]
        median = statistics.median(seconds)
        spread = f"{min(seconds) * 1000:.1f}-{max(seconds) * 1000:.1f}"
        print(f"| {name} | {calls} | {median * 1000:.1f} ({spread}) | {median * 1e6 / calls:.1f} |")
    if args.null or args.no_memory:
        return 0
    cold, settled = kept_bytes(args.n, args.seconds_per_set)
    print(f"\nkept per object: {cold:.0f} bytes at the end of the cold phase, {settled:.0f} after the "
          "idle minute")
    return 0


if __name__ == "__main__":
    sys.exit(main())
