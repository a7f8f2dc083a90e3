"""The scale shape: the floor, this controller and Flux at N = 10 .. 5000, M = 1 .. 1000, and label shards.

Long runs (hours at the largest sizes on 2 cores): run them in the background on a quiet machine::

    .venv/bin/python -m bench.scale sizes  [--sizes 10,100,1000,5000] [--repeat 3]
    .venv/bin/python -m bench.scale objects [--n 10] [--objects 1,10,100,1000] [--repeat 3]
    .venv/bin/python -m bench.scale shards [--n 5000] [--shards 1,2,4] [--repeat 1]

Every part uses :class:`bench.peers.Bench` (one control plane, one Git server, each peer with
cluster-admin; see its docstring for what is measured) and writes its tables into
``docs/scale.md`` between its own markers (``bench.scale.<part>``), unless ``--no-docs``:

* ``sizes`` — N StageSets of one stage of 5 ConfigMaps, against N Kustomizations, and the floor;
  per set: time, requests, CPU — is the cost per set constant as N grows?
* ``objects`` — N = 10 sets of M = 1, 10, 100, 1000 ConfigMaps: the cost per object.
* ``shards`` — this controller alone, N = 5000 StageSets labelled round-robin with
  ``sharding.fluxcd.io/key=shard<i>`` over K = 1, 2, 4 controllers (each ``--watch-label-selector
  sharding.fluxcd.io/key=shard<i>``, the apiserver selecting) on one control plane; K = 1 is one
  controller with a selector matching every set.  CPU and RSS are summed over the K processes.

``--mode multi-tenant`` runs every part as platforms run it (tenant ServiceAccounts with namespaced
Roles, every write impersonated, this controller with the chart's multi-tenant RBAC, Flux's
controllers on narrow ClusterRoles and its Kustomizations with ``serviceAccountName``; see
:mod:`bench.peers`) into its own markers (``bench.scale.<part>.multi-tenant``) beside the
cluster-admin tables.  ``--mode both`` runs the part in each mode, one after the other, each on a
fresh control plane with every peer (Flux too) measured beside the others in that mode; it writes
both modes' sections and a table of the two modes side by side (``bench.scale.<part>.modes``: per
set or per object, each peer, multi-tenant against cluster-admin).  The N = 1000 runs of issue 38::

    .venv/bin/python -m bench.scale sizes --sizes 10,100,1000 --mode both

``--peers`` limits the peers of ``sizes``/``objects`` (e.g. ``--peers floor,stageset`` where Flux
would not finish in reasonable time), ``--flux-up-to X`` leaves Flux out above N = X (sizes) or
M = X (objects); ``--repeat`` reports medians.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench import flux
from bench.common import markdown_table, replace_section
from bench.peers import (
    DOCS,
    MODES,
    PEERS,
    ROOT,
    SKELETON,
    Bench,
    Measure,
    Options,
    by_verb,
    describe,
    docs_marker,
    log,
    raw,
    side_by_side,
    summarize,
)


def per_set(measures: list[Measure], *, vary: str) -> str:
    """How cost grows: per set (``vary="n"``) or per object (``vary="m"``), each peer."""
    table = summarize(measures)
    rows = []
    for (peer, n, m, shards), values in sorted(
        table.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][3], PEERS.index(kv[0][0]))
    ):
        units = n if vary == "n" else n * m
        rows.append(
            [
                str(n),
                str(m),
                peer + (f" ({shards} shards)" if shards else ""),
                f"{values['cold'] / units * 1000:.1f}",
                f"{values['requests'] / units:.2f}",
                f"{values['cpu'] / units * 1000:.1f}",
                f"{values['apiserver'] / units * 1000:.1f}",
                f"{values['rss']:.0f}",
                f"{values['load']:.1f}",
                f"{values['runs']:.0f}",
            ]
        )
    unit = "set" if vary == "n" else "object"
    return markdown_table(
        [
            "N",
            "M",
            "peer",
            f"cold ms/{unit}",
            f"requests/{unit}",
            f"peer CPU ms/{unit}",
            f"apiserver+etcd CPU ms/{unit}",
            "RSS MiB",
            "load (1 min)",
            "runs",
        ],
        rows,
    )


def modes_table(runs: dict[str, list[Measure]], *, vary: str) -> str:
    """The two modes side by side, per set (``vary="n"``) or per object (``vary="m"``), each peer:
    what impersonation and per-request authorization cost each of them."""
    first, second = MODES
    tables = {mode: summarize(measures) for mode, measures in runs.items()}
    keys = sorted(
        {key for table in tables.values() for key in table if key[3] == 0},
        key=lambda key: (key[1], key[2], PEERS.index(key[0])),
    )
    rows = []
    for key in keys:
        peer, n, m, _ = key
        units = n if vary == "n" else n * m
        got = {mode: tables.get(mode, {}).get(key) for mode in MODES}
        for name, label, scale, fmt in (
            ("cold", "cold ms", 1000.0, "{:.1f}"),
            ("requests", "requests", 1.0, "{:.2f}"),
            ("cpu", "peer CPU ms", 1000.0, "{:.1f}"),
            ("apiserver", "apiserver+etcd CPU ms", 1000.0, "{:.1f}"),
        ):
            if peer == "floor" and name == "cpu":
                continue
            cells = [
                "-" if values is None else fmt.format(values[name] * scale / units)
                for values in (got[first], got[second])
            ]
            a, b = got[first], got[second]
            ratio = f"{b[name] / a[name]:.2f}x" if a and b and a[name] else "-"
            load = " / ".join("-" if v is None else f"{v['load']:.1f}" for v in (a, b))
            rows.append([str(n), str(m), peer, label, *cells, ratio, load])
    unit = "set" if vary == "n" else "object"
    return markdown_table(
        [
            "N",
            "M",
            "peer",
            f"per {unit}",
            first,
            second,
            f"{second} / {first}",
            "load (1 min) at the start",
        ],
        rows,
    )


def shards_table(measures: list[Measure], floor: Measure | None) -> str:
    table = summarize(measures)
    rows = []
    for (_, n, _, shards), values in sorted(table.items(), key=lambda kv: kv[0][3]):
        rows.append(
            [
                str(shards),
                str(n),
                f"{values['cold']:.1f}",
                f"{values['cold'] / floor.cold:.1f}x" if floor else "-",
                f"{values['requests'] / n:.2f}",
                f"{values['cpu']:.1f}",
                f"{values['apiserver']:.1f}",
                f"{values['rss']:.0f}",
                f"{values['rss'] / shards:.0f}",
                f"{values['teardown']:.1f}",
                f"{values['load']:.1f}",
            ]
        )
    return markdown_table(
        [
            "shards",
            "N",
            "cold (s)",
            "vs floor",
            "requests/StageSet",
            "controllers' CPU (s)",
            "apiserver+etcd CPU (s)",
            "RSS summed (MiB)",
            "RSS per shard (MiB)",
            "teardown (s)",
            "load (1 min)",
        ],
        rows,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=("sizes", "objects", "shards"))
    parser.add_argument(
        "--sizes", type=lambda v: tuple(int(x) for x in v.split(",")), default=(10, 100, 1000, 5000)
    )
    parser.add_argument(
        "--objects", type=lambda v: tuple(int(x) for x in v.split(",")), default=(1, 10, 100, 1000)
    )
    parser.add_argument("--n", type=int, help="N for objects (default 10) and shards (default 5000)")
    parser.add_argument("--shards", type=lambda v: tuple(int(x) for x in v.split(",")), default=(1, 2, 4))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--peers", type=lambda v: tuple(v.split(",")), default=PEERS)
    parser.add_argument(
        "--flux-up-to", type=int,
        help="leave Flux out above this N (sizes) or M (objects): it takes the longest",
    )
    parser.add_argument("--sources", choices=("pairs", "shared"), default="pairs")
    parser.add_argument(
        "--mode", choices=(*MODES, "both"), default="cluster-admin", dest="tenancy",
        help="cluster-admin, multi-tenant, or both (one after the other, and a table comparing them)",
    )
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args(argv)
    if "flux" in args.peers and args.part != "shards":
        flux.ensure_binaries()
    modes = MODES if args.tenancy == "both" else (args.tenancy,)
    command = "python -m bench.scale " + " ".join(argv if argv is not None else sys.argv[1:])
    runs: dict[str, list[Measure]] = {}
    for tenancy in modes:
        options = Options(
            sizes=args.sizes, repeat=args.repeat, peers=args.peers, sources=args.sources, tenancy=tenancy
        )
        measures, text = _run_part(args, options)
        runs[tenancy] = measures
        print(f"Mode: {tenancy}\n\n{text}" if len(modes) > 1 else text)
        if not args.no_docs:
            half = f" (its {tenancy} half)" if len(modes) > 1 else ""
            replace_section(
                DOCS,
                marker=docs_marker(f"bench.scale.{args.part}", tenancy),
                skeleton=SKELETON,
                body=f"Measured with `{command.strip()}`{half} on {time.strftime('%Y-%m-%d')}.\n\n{text}",
            )
            log(f"wrote {DOCS.relative_to(ROOT)} ({tenancy})")
    if len(modes) > 1 and args.part != "shards":
        text = modes_table(runs, vary="n" if args.part == "sizes" else "m")
        print(f"Both modes\n\n{text}")
        if not args.no_docs:
            replace_section(
                DOCS,
                marker=f"bench.scale.{args.part}.modes",
                skeleton=SKELETON,
                body=f"Measured with `{command.strip()}` on {time.strftime('%Y-%m-%d')}.\n\n{text}",
            )
            log(f"wrote {DOCS.relative_to(ROOT)} (both modes)")
    return 0


def _run_part(args: argparse.Namespace, options: Options) -> tuple[list[Measure], str]:
    """One part in one mode on a fresh control plane: its measurements and its report."""
    begun = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="stageset-scale-"))
    bench = Bench(workdir, sources=args.sources, tenants=options.tenants, tenancy=options.tenancy)
    try:
        measures, floor = _collect(args, bench)
    finally:
        bench.close()
    head = describe(options, bench.flags, time.monotonic() - begun)
    if args.keep:
        log(f"kept {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return measures, _report(args.part, head, measures, floor)


def _collect(args: argparse.Namespace, bench: Bench) -> tuple[list[Measure], Measure | None]:
    """The part's measurements (and, for shards, the floor they are compared with)."""
    measures: list[Measure] = []
    floor: Measure | None = None
    if args.part == "sizes":
        for n in args.sizes:
            bench.prepare_shared(n, 5)
            for repeat in range(args.repeat):
                order = list(args.peers)
                order = order[repeat % len(order) :] + order[: repeat % len(order)]
                for peer in order:
                    if peer == "flux" and args.flux_up_to is not None and n > args.flux_up_to:
                        continue
                    measures.append(_measure(bench, peer, n, 5, repeat))
    elif args.part == "objects":
        n = args.n or 10
        for m in args.objects:
            bench.prepare_shared(n, m)
            for repeat in range(args.repeat):
                for peer in args.peers:
                    if peer == "flux" and args.flux_up_to is not None and m > args.flux_up_to:
                        continue
                    measures.append(_measure(bench, peer, n, m, repeat))
    else:
        n = args.n or 5000
        bench.prepare_shared(n, 5)
        floor = bench.floor(n, 5, 0)
        for repeat in range(args.repeat):
            for shards in args.shards:
                measures.append(bench.stageset(n, 5, repeat, shards=shards))
    return measures, floor


def _report(part: str, head: str, measures: list[Measure], floor: Measure | None) -> str:
    if part == "sizes":
        body = [
            head,
            side_by_side(measures),
            "How cost grows with N (per set)\n\n" + per_set(measures, vary="n"),
            by_verb(measures),
        ]
    elif part == "objects":
        body = [
            head,
            side_by_side(measures),
            "How cost grows with M (per object)\n\n" + per_set(measures, vary="m"),
            by_verb(measures),
        ]
    else:
        body = [
            head,
            f"Floor for N = {floor.n if floor else '-'}: {floor.cold if floor else 0:.1f} s.",
            shards_table(measures, floor),
            by_verb(measures),
        ]
    body.append("Every measurement\n\n" + raw([*([floor] if floor else []), *measures]))
    return "\n\n".join(body)


def _measure(bench: Bench, peer: str, n: int, m: int, repeat: int) -> Measure:
    if peer == "floor":
        return bench.floor(n, m, repeat)
    if peer == "stageset":
        return bench.stageset(n, m, repeat)
    return bench.flux(n, m, repeat)


if __name__ == "__main__":
    sys.exit(main())
