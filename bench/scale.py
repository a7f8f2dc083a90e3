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
Kustomizations with ``serviceAccountName``; see :mod:`bench.peers`) into its own markers
(``bench.scale.<part>.multi-tenant``) beside the cluster-admin tables.

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


# Complexity above the limit (15) on purpose: argument dispatch of a benchmark, not product code.
def main(argv: list[str] | None = None) -> int:  # noqa: C901
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
    parser.add_argument("--mode", choices=MODES, default="cluster-admin", dest="tenancy")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args(argv)
    if "flux" in args.peers and args.part != "shards":
        flux.ensure_binaries()
    options = Options(
        sizes=args.sizes, repeat=args.repeat, peers=args.peers, sources=args.sources, tenancy=args.tenancy
    )
    begun = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="stageset-scale-"))
    bench = Bench(workdir, sources=args.sources, tenants=options.tenants, tenancy=args.tenancy)
    measures: list[Measure] = []
    floor: Measure | None = None
    try:
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
    finally:
        bench.close()
    elapsed = time.monotonic() - begun
    head = describe(options, bench.flags, elapsed)
    if args.part == "sizes":
        body = [
            head,
            side_by_side(measures),
            "How cost grows with N (per set)\n\n" + per_set(measures, vary="n"),
            by_verb(measures),
        ]
    elif args.part == "objects":
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
    text = "\n\n".join(body)
    print(text)
    if not args.no_docs:
        command = "python -m bench.scale " + " ".join(argv if argv is not None else sys.argv[1:])
        replace_section(
            DOCS,
            marker=docs_marker(f"bench.scale.{args.part}", args.tenancy),
            skeleton=SKELETON,
            body=f"Measured with `{command.strip()}` on {time.strftime('%Y-%m-%d')}.\n\n{text}",
        )
        log(f"wrote {DOCS.relative_to(ROOT)}")
    if args.keep:
        log(f"kept {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _measure(bench: Bench, peer: str, n: int, m: int, repeat: int) -> Measure:
    if peer == "floor":
        return bench.floor(n, m, repeat)
    if peer == "stageset":
        return bench.stageset(n, m, repeat)
    return bench.flux(n, m, repeat)


if __name__ == "__main__":
    sys.exit(main())
