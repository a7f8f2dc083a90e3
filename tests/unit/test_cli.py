"""Command-line parsing."""

from __future__ import annotations

import click
import pytest

from stageset.cli.main import parse_duration_option, parse_size


@pytest.mark.parametrize(("text", "size"), [
    ("2Gi", 2 * 2**30), ("500M", 500 * 10**6), ("500Mi", 500 * 2**20), ("1048576", 1048576),
    ("1k", 1000), ("1Ki", 1024), ("1.5Ki", 1536),
])
def test_sizes_parse_as_kubernetes_quantities(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "500m", "1.5", "-1", "2gi", ""])
def test_sizes_that_are_not_whole_bytes_are_refused(text: str) -> None:
    # 500m is 0.5 (milli): it must never mean 500 megabytes.
    with pytest.raises(click.BadParameter):
        parse_size(text)


def test_duration_flags() -> None:
    assert parse_duration_option("3s") == 3.0
    assert parse_duration_option("5m") == 300.0
    with pytest.raises(click.BadParameter):
        parse_duration_option("5 minutes")
