"""The child process that compiles and evaluates tenant CEL (``python -m stageset.apply.celworker``).

Never imported by the controller: :mod:`stageset.apply.cel` runs it as a subprocess, because
the CEL runtime holds the interpreter lock while it evaluates and has no bound on the memory
an expression may build.  Here, a runaway expression costs this process only — the parent
kills it at its time limit, and ``RLIMIT_DATA`` bounds its memory.

Protocol: one JSON request per line on stdin, one JSON answer per line on stdout; the first
line written is ``{"ready": true}``.  Requests:

- ``{"op": "check", "exprs": [...]}`` → ``{"results": [{"type": "bool"|"dyn"|"<other>"} |
  {"error": "..."}]}``: compiled and type-checked, nothing evaluated;
- ``{"op": "eval", "exprs": [...], "vars": {...}}`` → ``{"results": [{"value": <bool>} |
  {"type": "<name>"} (not a bool) | {"error": "..."}]}``.

The process exits when stdin closes, and with its parent (``PR_SET_PDEATHSIG``).
Identity: none — no cluster, no network, no files: it only sees what the parent sends.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
from collections import OrderedDict
from typing import Any

VARIABLES = ("apiVersion", "kind", "metadata", "spec", "status", "self")
"""What an expression may name: the object's top-level fields (Flux's convention) and ``self``."""
_CONFIG = "extensions:\n  - name: optional\n  - name: strings\n"
_PR_SET_PDEATHSIG = 1
_MAX_COMPILED = 512


def _die_with_parent(parent: int) -> None:
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the closed stdin still ends it
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent is already gone
        os._exit(0)


# Complexity above the limit (15) on purpose: the worker's one request loop; each branch is one message or
# failure kind.
def main() -> int:  # noqa: C901
    if len(sys.argv) > 1:
        _die_with_parent(int(sys.argv[1]))
    from cel_expr_python import cel

    dyn_map = cel.Type.Map(cel.Type.STRING, cel.Type.DYN)
    env = cel.NewEnv(config=cel.NewEnvConfigFromYaml(_CONFIG), variables={
        "apiVersion": cel.Type.DYN, "kind": cel.Type.DYN, "metadata": dyn_map, "spec": cel.Type.DYN,
        "status": cel.Type.DYN, "self": dyn_map})
    compiled: OrderedDict[str, Any] = OrderedDict()

    def compile_(source: str) -> Any:
        found = compiled.get(source)
        if found is None:
            found = env.compile(source)
            compiled[source] = found
            while len(compiled) > _MAX_COMPILED:
                compiled.popitem(last=False)
        else:
            compiled.move_to_end(source)
        return found

    def type_name(kind: Any) -> str:
        if kind == cel.Type.BOOL:
            return "bool"
        if kind == cel.Type.DYN:
            return "dyn"
        return str(kind.name()).lower()

    def check(source: str) -> dict[str, Any]:
        try:
            return {"type": type_name(compile_(source).return_type())}
        except Exception as error:
            return {"error": str(error)}

    def evaluate(source: str, variables: dict[str, Any]) -> dict[str, Any]:
        try:
            value = compile_(source).eval(data=variables)
            if value.type() == cel.Type.ERROR:
                return {"error": str(value.value())}
            if value.type() != cel.Type.BOOL:
                return {"type": type_name(value.type())}
            return {"value": bool(value.value())}
        except Exception as error:
            return {"error": str(error)}

    out = sys.stdout
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        exprs = [str(e) for e in request.get("exprs", [])]
        if request.get("op") == "check":
            results = [check(e) for e in exprs]
        else:
            variables = request.get("vars") or {}
            results = [evaluate(e, variables) for e in exprs]
        out.write(json.dumps({"results": results}) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
