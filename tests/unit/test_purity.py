"""Pure cores stay pure: importing one loads no I/O module, and none reads the wall clock.

The list of pure modules is the import-linter contract's (``pyproject.toml``), so there is one
list; the contract checks what each module imports by name, these tests check what importing
it really loads (package ``__init__`` files included) and that time only comes in as an argument.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = "pure cores do no I/O: no client, no kubernetes, urllib3, dulwich or subprocess"
# The ``sources`` package's facade (``sources/__init__``) loads the mirror, so importing
# ``sources.revision`` loads dulwich although the module itself imports none of it (the
# import-linter contract checks the module); the stageset pure cores are checked here (but
# ``floors``, which reads revisions and versions through ``sources`` for the same reason).
LOADED_ELSEWHERE = {"sources.revision", "stageset.controller.stageset.floors"}
# Ways to read the clock; pure modules take ``now`` as an argument (an injected clock).
CLOCK_CALLS = {"now", "utcnow", "today", "time", "monotonic", "perf_counter", "time_ns", "monotonic_ns"}


def contract() -> dict[str, list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found = [c for c in config["tool"]["importlinter"]["contracts"] if c["name"] == CONTRACT]
    assert len(found) == 1, f"the contract {CONTRACT!r} is gone from pyproject.toml"
    return found[0]


def pure_modules() -> list[str]:
    modules = [m for m in contract()["source_modules"] if m not in LOADED_ELSEWHERE]
    assert len(modules) >= 10, modules  # the evidence: an emptied list would pass everything
    return modules


def loaded_by(modules: list[str]) -> list[str]:
    """Every module in ``sys.modules`` after importing ``modules`` in a fresh interpreter."""
    script = ("import importlib, json, sys\n"
              f"for name in {modules!r}: importlib.import_module(name)\n"
              "print(json.dumps(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          check=True, timeout=120)
    return list(json.loads(done.stdout))


def io_modules(loaded: list[str]) -> list[str]:
    forbidden = contract()["forbidden_modules"]
    return [m for m in loaded if any(m == f or m.startswith(f + ".") for f in forbidden)]


def test_importing_the_pure_cores_loads_no_io_module() -> None:
    modules = pure_modules()
    loaded = loaded_by(modules)
    assert set(modules) <= set(loaded)  # they were imported: the check below means something
    bad = io_modules(loaded)
    if bad:
        culprits = {m: io_modules(loaded_by([m]))[:5] for m in modules}
        pytest.fail(f"importing pure modules loads I/O modules: {({m: b for m, b in culprits.items() if b})}")


def test_a_module_that_does_io_is_caught() -> None:
    # The check above would pass on a broken probe too: show it catches a real offender.
    assert "stageset.kube.client" in io_modules(loaded_by(["stageset.controller.stageset.reconciler"]))


def clock_reads(source: str) -> list[str]:
    """``time.*``/``datetime.now``-style reads of the clock, and imports of ``time``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name == "time"]
        elif isinstance(node, ast.ImportFrom) and node.module in ("time", "datetime"):
            found += [f"from {node.module} import {a.name}" for a in node.names if a.name in CLOCK_CALLS]
        elif isinstance(node, ast.Attribute) and node.attr in CLOCK_CALLS:
            found.append(f"line {node.lineno}: .{node.attr}")
    return found


@pytest.mark.parametrize("module", pure_modules())
def test_pure_modules_never_read_the_wall_clock(module: str) -> None:
    spec = importlib.util.find_spec(module)
    assert spec is not None, module
    assert spec.origin is not None, module
    assert clock_reads(Path(spec.origin).read_text()) == [], f"{module} reads the clock: take `now` instead"


@pytest.mark.parametrize("source", ["import time\nx = time.monotonic()",
                                    "import datetime\nx = datetime.datetime.now(datetime.UTC)",
                                    "from time import monotonic"])
def test_a_clock_read_is_caught(source: str) -> None:
    assert clock_reads(source)
