"""Hostile stage contents, each built in a child process with its memory measured.

Why a child process per input: an input that crashes the parser (the C YAML composer
overflowing its stack) must be *seen* to crash — as a signal exit of the child — rather than
take the test runner down with it; and each figure is then the memory of one build alone.

``python -m tests.build.hostile`` prints the table that docs/security.md quotes; the test
suite (tests/build/test_hostile_inputs.py) asserts the same outcomes and bounds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

CM = b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: %s}\n"


def _laughs() -> bytes:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    return b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: lol}\n" + "\n".join(lines).encode() + b"\n"


@dataclass(frozen=True)
class Case:
    name: str
    what: str
    files: Callable[[], dict[str, bytes]]
    refused: str
    """A fragment of the expected BuildError."""
    kustomize: bool = False


CASES = [
    Case("nested-sequence", "100 KB of nested flow sequences `[[[…]]]`",
         lambda: {"bomb.yaml": b"[" * 50_000 + b"]" * 50_000}, "is nested more than"),
    Case("nested-mapping", "150 KB of nested flow mappings `{a: {a: …}}`",
         lambda: {"bomb.yaml": b"{a: " * 30_000 + b"1" + b"}" * 30_000}, "is nested more than"),
    Case("nested-blocks", "2,000 levels of indented block mappings (4 MB)",
         lambda: {"bomb.yaml": b"".join(b" " * i + b"a:\n" for i in range(2_000)) + b" " * 2_000 + b"1\n"},
         "is nested more than"),
    Case("flow-sequence-4mib", "a 4 MiB flow sequence in one object",
         lambda: {"big.yaml": CM % b"big" + b"data: {k: [" + b"0," * (2 * 1024 * 1024) + b"0]}\n"},
         "YAML nodes"),
    Case("documents-1e5", "10^5 tiny documents in one file (5 MB)",
         lambda: {"many.yaml": b"".join(b"---\n" + CM % b"c%d" % i for i in range(100_000))},
         "more than 10000 YAML documents"),
    Case("objects-spread", "25,000 objects spread over 1,000 files",
         lambda: {f"f{f:04}.yaml": b"".join(b"---\n" + CM % b"c%d-%d" % (f, i) for i in range(25))
                  for f in range(1_000)},
         "renders more than 20000 objects"),
    Case("billion-laughs", "aliases expanding to 10^9 nodes",
         lambda: {"lol.yaml": _laughs()}, "through aliases"),
    Case("nested-json", "100 KB of nested JSON arrays",
         lambda: {"bomb.json": b"[" * 50_000 + b"]" * 50_000}, "nested more than"),
    Case("wide-json", "a 4 MiB JSON array",
         lambda: {"big.json": b"[" + b"0," * (2 * 1024 * 1024) + b"0]"}, "JSON values"),
    Case("kustomize-nested", "a kustomize resource of 100 KB nested sequences",
         lambda: {"kustomization.yaml": b"resources: [bomb.yaml]\n",
                  "bomb.yaml": b"[" * 50_000 + b"]" * 50_000},
         "bomb.yaml: document 1 is nested more than", kustomize=True),
    Case("kustomize-laughs", "a kustomize resource with a billion laughs",
         lambda: {"kustomization.yaml": b"resources: [lol.yaml]\n", "lol.yaml": _laughs()},
         "lol.yaml: document 1 expands to more than", kustomize=True),
    Case("kustomize-memory", "a 1 MiB value copied 400 times by a JSON patch",
         lambda: {"kustomization.yaml": b"resources: [cm.yaml]\npatches:\n- path: copies.yaml\n"
                  b"  target: {kind: ConfigMap}\n",
                  "cm.yaml": CM % b"big" + b"data: {v: '" + b"x" * (1024 * 1024) + b"'}\n",
                  "copies.yaml": b"".join(b"- {op: copy, from: /data/v, path: /data/c%d}\n" % i
                                          for i in range(400))},
         "kustomize build ran out of memory", kustomize=True),
    Case("kustomize-output", "10 generators of one 4 MiB file: 40 MiB of output",
         lambda: {"kustomization.yaml": b"configMapGenerator:\n"
                  + b"".join(b"- {name: g%d, files: [big.txt]}\n" % i for i in range(10)),
                  "big.txt": b"x" * (4 * 1024 * 1024)},
         "printed more than", kustomize=True),
]

_CHILD = r"""
import gc, json, resource, sys, time
sys.path[:0] = json.loads(sys.argv[2])
from tests.build.hostile import CASES
from stageset.build import BuildError, build_stage

def memory():
    found = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0]) / 1024
    return found

case = next(c for c in CASES if c.name == sys.argv[1])
files = case.files()
builder = sys.argv[3] or None
gc.collect()
before = memory()["VmRSS"]
start = time.monotonic()
try:
    objects = build_stage(files, path=".", kustomize=builder if builder else None)
    outcome, message = "built", f"{len(objects)} objects"
    del objects
except BuildError as error:
    outcome, message = "refused", str(error)[:300]
seconds = time.monotonic() - start
del files
gc.collect()
after = memory()
child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps({"before": before, "peak": after["VmHWM"], "after": after["VmRSS"], "child_peak": child,
                  "seconds": seconds, "outcome": outcome, "message": message}))
"""


def measure(case: Case, *, builder: str | None = None, timeout: float = 300) -> dict[str, Any]:
    """Build ``case`` in a fresh interpreter; its figures, or how it died."""
    result = subprocess.run([sys.executable, "-c", _CHILD, case.name, json.dumps(sys.path), builder or ""],
                            capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        return {"outcome": "crashed", "returncode": result.returncode, "stderr": result.stderr[-2000:]}
    figures: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return figures


def main() -> int:
    from stageset.build.kustomize import ensure_builder

    builder = str(ensure_builder())
    print("| input | outcome | RSS before | peak | after | builder peak | time |")
    print("|---|---|---|---|---|---|---|")
    for case in CASES:
        figures = measure(case, builder=builder if case.kustomize else None)
        if figures["outcome"] == "crashed":
            print(f"| {case.what} | **crashed** (exit {figures['returncode']}) | | | | | |")
            continue
        child = f"{figures['child_peak']:.0f} MiB" if case.kustomize else "-"
        print(f"| {case.what} | {figures['outcome']}: {figures['message'][:90]} "
              f"| {figures['before']:.0f} MiB | {figures['peak']:.0f} MiB | {figures['after']:.0f} MiB "
              f"| {child} | {figures['seconds']:.2f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
