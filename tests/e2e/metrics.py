"""Scraping the controller's ``/metrics`` in end-to-end tests: where it listens, what it says."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from stageset.envtest.controller import ControllerProcess
from tests.e2e.conftest import wait_for

METRICS_ARGS = ["--metrics-address", "127.0.0.1:0", "--log-format", "json"]
_SERVING = re.compile(r"serving /metrics on ([0-9.]+):(\d+)")

# What each type of family exposes as sample names (the text format's rules).
_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gauge": ("",),
    "summary": ("", "_sum", "_count"),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}


def metrics_url(controller: ControllerProcess) -> str:
    """The URL the controller logged it serves ``/metrics`` on (it binds port 0)."""

    def find() -> str | None:
        for line in controller.output().splitlines():
            try:
                message = json.loads(line).get("message", "")
            except ValueError:
                continue
            if match := _SERVING.search(message):
                return f"http://{match[1]}:{match[2]}/metrics"
        return None

    found: str = wait_for(find, timeout=30, what="the controller to serve /metrics")
    return found


@dataclass(frozen=True)
class Scrape:
    text: str
    families: dict[str, Metric]

    def samples(self, series: str, /, **labels: str) -> Iterator[tuple[dict[str, str], float]]:
        """Every sample called ``series`` whose labels include ``labels``."""
        for family in self.families.values():
            for sample in family.samples:
                if sample.name == series and all(sample.labels.get(k) == v for k, v in labels.items()):
                    yield sample.labels, sample.value

    def value(self, series: str, /, **labels: str) -> float:
        """The sum over matching samples (0 when there is none)."""
        return sum(value for _, value in self.samples(series, **labels))

    def has(self, series: str, /, **labels: str) -> bool:
        return any(True for _ in self.samples(series, **labels))

    def exposed_names(self) -> dict[str, set[str]]:
        """Every series name the endpoint declares (whether or not it has samples yet), with the
        label names its samples carry."""
        names: dict[str, set[str]] = {}
        for family in self.families.values():
            for suffix in _SUFFIXES.get(family.type, ("",)):
                names.setdefault(family.name + suffix, set())
            for sample in family.samples:
                names.setdefault(sample.name, set()).update(sample.labels)
        return names

    def label_values(self) -> set[str]:
        return {
            value
            for family in self.families.values()
            for sample in family.samples
            for value in sample.labels.values()
        }


def scrape(url: str) -> Scrape:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - loopback, our own endpoint
        text = response.read().decode()
    return Scrape(text=text, families={f.name: f for f in text_string_to_metric_families(text)})


def labels_of(labels: Mapping[str, str], *names: str) -> tuple[str, ...]:
    return tuple(labels.get(n, "") for n in names)
