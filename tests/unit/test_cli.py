"""Command-line parsing."""

from __future__ import annotations

import click
import pytest

from stageset.cli.main import parse_size


def test_sizes_parse_like_kubernetes_quantities() -> None:
    assert parse_size("2Gi") == 2 * 2**30
    assert parse_size("500M") == 500 * 10**6
    assert parse_size("1048576") == 1048576
    with pytest.raises(click.BadParameter):
        parse_size("lots")
