"""The per-repository-URL Git series, kept as plain numbers and exposed at scrape time.

``stageset_git_fetches_total{url, result}`` and ``stageset_git_fetch_duration_seconds{url}``
were prometheus_client children: about 3 KiB per URL (a counter child per result and a
histogram child, each value with its own lock), which at thousands of repositories cost more
than their GitRepositories in the watch cache.  :class:`UrlSeries` keeps a short list of
numbers per URL and writes the same series — names, help, types, labels — when ``/metrics``
is scraped, as :mod:`stageset.controller.objectmetrics` does for the per-object series.

Which URLs have series is :class:`stageset.controller.metrics.Metrics`' rule (a URL's series go
when no GitRepository uses it).  URLs are shown without credentials by the caller.  Identity:
none.  Thread-safe.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from stageset.controller.objectmetrics import cumulative_buckets

RESULTS = ("fetched", "unchanged", "failed")


class UrlSeries(Collector):
    def __init__(self, *, buckets: Sequence[float]):
        self._buckets = tuple(buckets)
        self._lock = threading.Lock()
        # Per URL: a count per RESULTS, then a count per bucket (not cumulative) and +Inf, then
        # the sum of the durations.
        self._urls: dict[str, list[float]] = {}

    def fetched(self, url: str, *, result: str, seconds: float) -> None:
        """One fetch of ``url``: its result (one of :data:`RESULTS`) and how long it took."""
        with self._lock:
            numbers = self._urls.get(url)
            if numbers is None:
                numbers = self._urls[url] = [0.0] * (len(RESULTS) + len(self._buckets) + 2)
            numbers[RESULTS.index(result)] += 1
            numbers[len(RESULTS) + bisect.bisect_left(self._buckets, seconds)] += 1
            numbers[-1] += seconds

    def forget(self, url: str) -> None:
        with self._lock:
            self._urls.pop(url, None)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            urls = [(url, list(numbers)) for url, numbers in self._urls.items()]
        fetches = CounterMetricFamily(
            "stageset_git_fetches", "Git fetches per repository URL (shown without credentials) and "
            "result (fetched: objects transferred, unchanged: the mirror had the commit, failed).",
            labels=["url", "result"])
        duration = HistogramMetricFamily("stageset_git_fetch_duration_seconds", "How long Git fetches took.",
                                         labels=["url"])
        for url, numbers in urls:
            for index, result in enumerate(RESULTS):
                fetches.add_metric([url, result], numbers[index])
            counts = numbers[len(RESULTS):-1]
            duration.add_metric([url], cumulative_buckets(self._buckets, counts), numbers[-1])
        yield fetches
        yield duration
