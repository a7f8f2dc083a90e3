"""A real client that lets someone else write between its read and its write: the races that
conditional writes (a release patch, a prune delete, a hand-off record's delete) must survive."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stageset.kube.client import ApiError, KubeClient

# Called after the n-th read (1, 2, ...) of the watched path, with what that read answered.
AfterRead = Callable[[int, dict[str, Any]], None]


class Interleaving(KubeClient):
    """``real``'s identity and connections; after each read of ``path`` calls ``after_read`` (which
    writes as someone else), and records how the apiserver answered each ``verb`` request sent:
    200, or the refusal's status."""

    def __init__(self, real: KubeClient, *, path: str, verb: str, after_read: AfterRead):
        self.__dict__.update(real.__dict__)
        self._path = path
        self._verb = verb
        self._after_read = after_read
        self.reads = 0
        self.answers: list[int] = []

    def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        if method == self._verb:
            try:
                answer = super().request(method, path, **kwargs)
            except ApiError as error:
                self.answers.append(error.status)
                raise
            self.answers.append(200)
            return answer
        answer = super().request(method, path, **kwargs)
        if method == "GET" and path == self._path:
            self.reads += 1
            self._after_read(self.reads, answer)
        return answer
