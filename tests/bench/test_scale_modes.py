"""``bench.scale --mode both`` reports the two modes side by side: per set and peer, each mode's figure
and the multi-tenant / cluster-admin ratio.  A pure unit over hand-made measurements (no cluster)."""

from __future__ import annotations

from collections import Counter

from bench.peers import Measure
from bench.scale import modes_table


def _measure(peer: str, *, n: int, cold: float, requests: int, apiserver: float, load: float) -> Measure:
    return Measure(
        peer=peer,
        n=n,
        m=5,
        repeat=0,
        cold=cold,
        requests=Counter({"patch": requests}),
        cpu={"peer": cold / 2, "kube-apiserver": apiserver, "etcd": 0.0},
        load=(load, load),
    )


def _rows(text: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in text.splitlines()[2:]
    ]


def test_each_peer_and_measure_gets_both_modes_and_their_ratio() -> None:
    runs = {
        "cluster-admin": [
            _measure("floor", n=10, cold=0.1, requests=50, apiserver=0.1, load=1.0),
            _measure("flux", n=10, cold=3.0, requests=380, apiserver=1.0, load=1.5),
        ],
        "multi-tenant": [
            _measure("floor", n=10, cold=0.2, requests=50, apiserver=0.2, load=2.0),
            _measure("flux", n=10, cold=6.0, requests=570, apiserver=3.0, load=2.5),
        ],
    }
    rows = _rows(modes_table(runs, vary="n"))
    by_key = {(row[2], row[3]): row for row in rows}
    assert by_key[("flux", "cold ms")][4:7] == ["300.0", "600.0", "2.00x"]
    assert by_key[("flux", "requests")][4:7] == ["38.00", "57.00", "1.50x"]
    assert by_key[("flux", "apiserver+etcd CPU ms")][4:8] == ["100.0", "300.0", "3.00x", "1.5 / 2.5"]
    assert by_key[("flux", "peer CPU ms")][4:7] == ["150.0", "300.0", "2.00x"]
    assert ("floor", "peer CPU ms") not in by_key, "the floor has no process of its own"
    assert [row[2] for row in rows] == ["floor"] * 3 + ["flux"] * 4


def test_a_peer_measured_in_one_mode_only_shows_a_dash() -> None:
    runs = {
        "cluster-admin": [_measure("stageset", n=20, cold=1.0, requests=400, apiserver=1.0, load=1.0)],
        "multi-tenant": [],
    }
    row = _rows(modes_table(runs, vary="n"))[0]
    assert row[:7] == ["20", "5", "stageset", "cold ms", "50.0", "-", "-"]
    assert row[7] == "1.0 / -"
