"""Tenant CEL expressions, compiled and evaluated in a child process with a time and memory bound.

A health-check expression (``readyChecks.exprs``) is tenant input evaluated by the shared
controller.  The CEL runtime (``cel-expr-python``, Google's C++ implementation) bounds
recursion (32) and comprehension iterations (10,000 per evaluation), but it holds the
interpreter lock for as long as an evaluation runs, and an expression such as
``spec.items.map(i, status.big + status.big)`` builds gigabytes within those bounds (measured:
27 s and 4.7 GB with every other thread of the process stopped).  So nothing is evaluated in
the controller's process: a small pool of worker processes (:mod:`stageset.apply.celworker`)
does it, each under ``RLIMIT_DATA`` (:attr:`CelLimits.memory_bytes`), and a request that takes
longer than :attr:`CelLimits.timeout` gets its worker killed (and replaced on next use).
The controller's thread waits on a pipe, so other StageSets keep going meanwhile.

Identity: none — the workers see only the expressions and the object sent to them (already
read by the caller as the stage's identity); no cluster, network or files.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import resource
import select
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_MAX_ANSWER = 1024 * 1024
_STARTUP_TIMEOUT = 30.0


@dataclass(frozen=True)
class CelLimits:
    timeout: float = 1.0
    """Seconds one request (one object, all its expressions) may take."""
    memory_bytes: int = 256 * 1024 * 1024
    """Writable memory a worker may map (``RLIMIT_DATA``), its runtime included."""
    workers: int = 2
    """Worker processes at most (requests beyond wait for one)."""


class CelUnavailableError(RuntimeError):
    """The worker could not be started (a deployment problem, not the expression's)."""


@dataclass(frozen=True)
class Answer:
    """What became of one expression: a bool ``value``, another result ``type``, or an ``error``."""

    value: bool | None = None
    type: str | None = None
    error: str | None = None


class LimitExceededError(Exception):
    """The request took longer than its time limit, or its worker died (memory): killed."""


class _Worker:
    def __init__(self, limits: CelLimits):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "stageset.apply.celworker", str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            # The parent's import path, minus "" (the working directory: "/" for the child).
            env={"PATH": "", "HOME": "/nonexistent", "LANG": "C",
                 "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
            cwd="/", start_new_session=True)
        with contextlib.suppress(OSError, ValueError):
            limit = (limits.memory_bytes, limits.memory_bytes)
            resource.prlimit(self.process.pid, resource.RLIMIT_DATA, limit)
        self._buffer = b""
        first = self._read_line(time.monotonic() + _STARTUP_TIMEOUT)
        if json.loads(first) != {"ready": True}:
            self.kill()
            raise CelUnavailableError("the CEL worker did not start")

    def _read_line(self, deadline: float) -> bytes:
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LimitExceededError("time")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise LimitExceededError("died")
            self._buffer += chunk
            if len(self._buffer) > _MAX_ANSWER:
                raise LimitExceededError("answer too large")
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def ask(self, request: Mapping[str, Any], timeout: float) -> list[dict[str, Any]]:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
        except (BrokenPipeError, ValueError) as error:
            raise LimitExceededError("died") from error
        answer = json.loads(self._read_line(time.monotonic() + timeout))
        results: list[dict[str, Any]] = answer["results"]
        return results

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.process.kill()
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        for pipe in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError, ValueError):
                if pipe is not None:
                    pipe.close()


def _kill_all(workers: list[_Worker]) -> None:
    for worker in list(workers):
        worker.kill()


class CelSandbox:
    """Compile and evaluate CEL in worker processes; shared by all stages of the controller."""

    def __init__(self, limits: CelLimits | None = None):
        self.limits = limits or CelLimits()
        self._idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        self._slots = threading.Semaphore(self.limits.workers)
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self.killed = 0
        """Workers killed at a limit (for tests and metrics)."""
        weakref.finalize(self, _kill_all, self._all)

    def _acquire(self) -> _Worker:
        self._slots.acquire()
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        try:
            worker = _Worker(self.limits)
        except Exception:
            self._slots.release()
            raise
        with self._lock:
            self._all.append(worker)
        return worker

    def _release(self, worker: _Worker, *, healthy: bool) -> None:
        if healthy:
            self._idle.put(worker)
        else:
            worker.kill()
            with self._lock:
                if worker in self._all:
                    self._all.remove(worker)
        self._slots.release()

    def _ask(self, request: Mapping[str, Any]) -> list[Answer]:
        worker = self._acquire()
        try:
            results = worker.ask(request, self.limits.timeout)
        except LimitExceededError:
            self.killed += 1
            self._release(worker, healthy=False)
            raise
        except Exception:
            self._release(worker, healthy=False)
            raise
        self._release(worker, healthy=True)
        return [Answer(value=r.get("value"), type=r.get("type"), error=r.get("error")) for r in results]

    def check(self, expressions: Sequence[str]) -> list[Answer]:
        """Compile and type-check: ``type`` is ``bool``, ``dyn`` (known when evaluated) or another
        type's name; or an ``error``.  Raises :class:`LimitExceededError`."""
        return self._ask({"op": "check", "exprs": list(expressions)})

    def evaluate(self, expressions: Sequence[str], variables: Mapping[str, Any]) -> list[Answer]:
        """Evaluate each expression over ``variables``.  Raises :class:`LimitExceededError`."""
        return self._ask({"op": "eval", "exprs": list(expressions), "vars": dict(variables)})

    def close(self) -> None:
        with self._lock:
            _kill_all(self._all)
            self._all.clear()
