"""Metric readings: a service's /metrics endpoint scraped into samples, and this process's own registry."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable

from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

# Every sample of an exposition, by (name, labels).
Samples = dict[tuple[str, frozenset], float]


def samples(rows: Iterable[tuple[str, dict[str, str], float]]) -> Samples:
    """(name, labels, value) rows as Samples."""
    return {(name, frozenset(labels.items())): value for name, labels, value in rows}


def parse(text: str) -> Samples:
    """The samples of a Prometheus text exposition."""
    return samples(
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    )


def scrape(endpoint: int | str) -> Samples:
    """Every sample of a metrics endpoint: a port on 127.0.0.1, or a whole URL."""
    url = f"http://127.0.0.1:{endpoint}/metrics" if isinstance(endpoint, int) else endpoint
    with urllib.request.urlopen(url, timeout=5) as page:
        return parse(page.read().decode())


def value(samples: Samples, name: str, **labels: str) -> float:
    """The one series of `name` with exactly `labels` (0 when there is none)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name` over every series whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, series), v in samples.items() if n == name and wanted <= series)


def increase(before: Samples, after: Samples, name: str, **labels: str) -> float:
    """How much `name` (summed over the series matching `labels`) grew between two scrapes."""
    return total(after, name, **labels) - total(before, name, **labels)


def metric(name: str, **labels: str) -> float:
    """The sample `name` with exactly `labels` in this process's default registry (0 when absent)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0
