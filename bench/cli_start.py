"""What a bare start of the CLI costs: ``stageset --version``, ``--help`` and a TAB press, beside
kubectl's ``version --client`` and a floor (``python -c pass``, the interpreter alone), in one run.

Each command runs ``--rounds`` times, interleaved (floor, each stageset form, kubectl, then again),
so a machine whose speed drifts slows every column alike; the figure is the process's own CPU time
(user + system, from ``wait4``: what a shell waiting for a TAB completion pays), its median and the
ratio to kubectl's and to the floor.  ``--stageset 'COMMAND ...'`` times another build of the CLI
(e.g. an older checkout's ``stageset`` and ``sources`` in ``/tmp/old``:
``--stageset "env PYTHONPATH=/tmp/old .venv/bin/python -c 'from stageset.cli.main import main;
main(prog_name=\"stageset\")'"``: the completion answers only to the name ``stageset``),
which is how the before/after of issue 50 were taken; the result is also written to
``docs/benchmarks.md`` with ``--write``.

    python -m bench.cli_start [--rounds 15] [--stageset CMD] [--write]

Identity: none; the completion runs without a kubeconfig, so it talks to no cluster.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.common import machine, markdown_table, replace_section, revision

ROOT = Path(__file__).resolve().parents[1]
MARKER = "cli-start"


@dataclass(frozen=True)
class Case:
    name: str
    argv: list[str]
    env: dict[str, str]


def cpu_of(argv: list[str], env: dict[str, str]) -> float:
    """CPU seconds (user + system) of one run of ``argv`` and every process it waited for."""
    # From a neutral directory: `python -m` puts the working directory first on sys.path, which
    # would shadow the build under test (--stageset with PYTHONPATH) with this checkout.
    process = subprocess.Popen(argv, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, cwd=tempfile.gettempdir())
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with {process.returncode}")
    return usage.ru_utime + usage.ru_stime


def cases(stageset: list[str], kubectl: str) -> list[Case]:
    empty = {"KUBECONFIG": "/nonexistent"}  # the completion must not reach a cluster
    complete = {**empty, "_STAGESET_COMPLETE": "bash_complete", "COMP_WORDS": "stageset g", "COMP_CWORD": "1"}
    return [
        Case("python -c pass (floor)", [sys.executable, "-c", "pass"], {}),
        Case("stageset --version", [*stageset, "--version"], empty),
        Case("stageset --help", [*stageset, "--help"], empty),
        Case("stageset <TAB> (completion)", list(stageset), complete),
        Case("kubectl version --client", [kubectl, "version", "--client"], empty),
    ]


def measure(runs: list[Case], rounds: int) -> dict[str, list[float]]:
    seconds: dict[str, list[float]] = {case.name: [] for case in runs}
    for case in runs:  # a warm-up of each (page cache, .pyc files)
        cpu_of(case.argv, case.env)
    for _ in range(rounds):
        for case in runs:
            seconds[case.name].append(cpu_of(case.argv, case.env))
    return seconds


def report(seconds: dict[str, list[float]], *, rounds: int, label: str) -> str:
    kubectl = statistics.median(seconds["kubectl version --client"])
    floor = statistics.median(seconds["python -c pass (floor)"])
    rows = []
    for name, values in seconds.items():
        median = statistics.median(values)
        rows.append([name, f"{median * 1000:.0f}", f"{min(values) * 1000:.0f}-{max(values) * 1000:.0f}",
                     f"{median / kubectl:.1f}x", f"{median / floor:.1f}x"])
    table = markdown_table(["command", "CPU ms (median)", "min-max", "vs kubectl", "vs floor"], rows)
    return (f"{label}: {rounds} interleaved rounds on {machine()} at {revision(ROOT)}; CPU = user + system "
            f"of the process.\n\n{table}\n")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cli_start",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--stageset", default=str(Path(sys.executable).with_name("stageset")),
                        help="the CLI to time (a command line; default: this checkout's `stageset`)")
    parser.add_argument("--label", default="this checkout")
    parser.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    args = parser.parse_args(argv)
    from stageset.envtest.kubectl import ensure_kubectl

    seconds = measure(cases(shlex.split(args.stageset), str(ensure_kubectl())), args.rounds)
    text = report(seconds, rounds=args.rounds, label=args.label)
    print(text)
    if args.write:
        replace_section(ROOT / "docs" / "benchmarks.md", marker=MARKER, body=text,
                        skeleton="\n## The CLI's bare start: `bench/cli_start.py`\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
