"""The rankers' metrics through a rollout run: scraped on a thread of their own (`Scraper`), and read back
as counter increases over a window (`increase`) whatever restarts happened inside it.

What is read (a family a ranker does not export reads as 0: the handoff off, or not built in):
device seconds by op (`relaygr_model_seconds`), PreInfer outcomes, the handoff's entries and bytes sent
and received by outcome, read-throughs by outcome and their bytes, the last drain's handoff duration and
the bytes each tier holds. A restarted ranker is a new process whose counters start at 0, so every
sample carries the process id, and an increase is summed over the processes (`increase`). A process's
counters before its first sample read as that sample's when it was taken at the load's start (the
rankers started with the fleet), else as 0 (a process started during the run: its counters began then).
A drained ranker's last counters are the last sample before it exited: a draining ranker is scraped
every `DRAINING_INTERVAL_S` (`Scraper.hurry`), so what it did in its last tenth of a second may be
missing; its peers' counters (bytes received) miss nothing.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
import urllib.request
from collections.abc import Iterable, Mapping

from prometheus_client.parser import text_string_to_metric_families

DRAINING_INTERVAL_S = 0.1
SCRAPE_TIMEOUT_S = 2.0
# Prometheus family -> (the key it gets here, the label that splits it, the sample suffix to read); a
# split family's keys are `key/label value`.
FAMILIES = {
    "relaygr_model_seconds": ("device_s", "op", "_sum"),
    "relaygr_pre_infer": ("pre_infer", "outcome", "_total"),
    "relaygr_handoff_sent_entries": ("handoff_sent", "outcome", "_total"),
    "relaygr_handoff_sent_bytes": ("handoff_sent_bytes", None, "_total"),
    "relaygr_handoff_received_entries": ("handoff_received", "outcome", "_total"),
    "relaygr_handoff_received_bytes": ("handoff_received_bytes", None, "_total"),
    "relaygr_read_through": ("read_through", "outcome", "_total"),
    "relaygr_read_through_bytes": ("read_through_bytes", None, "_total"),
    "relaygr_handoff_duration_seconds": ("handoff_duration_s", None, ""),
    "relaygr_kv_cache_bytes": ("kv_bytes", "tier", ""),
}
GAUGES = ("handoff_duration_s", "kv_bytes")  # keys (or key prefixes) read as levels, never as increases


@dataclasses.dataclass(frozen=True)
class Sample:
    """One scrape of one ranker process, `at_s` seconds after the load started."""

    at_s: float
    ranker: str
    pid: int
    values: dict[str, float]
    baseline: bool = False  # taken at the load's start


def parse(text: str) -> dict[str, float]:
    """The values this module reads from one Prometheus exposition, flat: `key` or `key/label`."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        spec = FAMILIES.get(family.name)
        if spec is None:
            continue
        key, label, suffix = spec
        for sample in family.samples:
            if sample.name == family.name + suffix:
                name = key if label is None else f"{key}/{sample.labels[label]}"
                values[name] = values.get(name, 0.0) + sample.value
    return values


def is_gauge(key: str) -> bool:
    return key.split("/")[0] in GAUGES


def _level(samples: list[Sample], at_s: float) -> Mapping[str, float]:
    """One process's counters at `at_s`, from its samples in time order (see the module docstring)."""
    last: Mapping[str, float] = samples[0].values if samples[0].baseline else {}
    for sample in samples:
        if sample.at_s > at_s:
            break
        last = sample.values
    return last


def by_process(samples: Iterable[Sample]) -> dict[tuple[str, int], list[Sample]]:
    processes: dict[tuple[str, int], list[Sample]] = collections.defaultdict(list)
    for sample in sorted(samples, key=lambda s: s.at_s):
        processes[(sample.ranker, sample.pid)].append(sample)
    return processes


def increase(
    samples: Iterable[Sample], start_s: float, end_s: float, rankers: Iterable[str] | None = None
) -> dict[str, float]:
    """Every counter's increase over [start_s, end_s], summed over the processes of `rankers` (None:
    every ranker); gauges are left out."""
    wanted = None if rankers is None else set(rankers)
    total: dict[str, float] = collections.defaultdict(float)
    for (ranker, _), process in by_process(samples).items():
        if wanted is not None and ranker not in wanted:
            continue
        before, after = _level(process, start_s), _level(process, end_s)
        for key, value in after.items():
            if not is_gauge(key):
                total[key] += value - before.get(key, 0.0)
    return {key: round(value, 6) for key, value in sorted(total.items())}


def last_before(samples: Iterable[Sample], ranker: str, at_s: float) -> Sample | None:
    """The last sample of `ranker` taken at or before `at_s`."""
    found = [s for s in samples if s.ranker == ranker and s.at_s <= at_s]
    return max(found, key=lambda s: s.at_s) if found else None


def scrape_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as answer:
        return answer.read().decode()


class Scraper:
    """Scrapes the rankers it watches every `interval_s` (a draining one every `DRAINING_INTERVAL_S`) on
    a thread of its own, from `with` until its end. Thread-safe: the run's thread changes what it watches
    and scrapes at once (`scrape`) while it runs."""

    def __init__(self, interval_s: float, origin: float) -> None:
        self.interval_s = interval_s
        self.origin = origin  # time.monotonic() at the load's start
        self.samples: list[Sample] = []
        self._targets: dict[str, tuple[str, int]] = {}  # ranker -> (metrics URL, pid)
        self._draining: set[str] = set()
        self._due: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rollout-scraper", daemon=True)

    def watch(self, ranker: str, url: str, pid: int) -> None:
        with self._lock:
            self._targets[ranker] = (url, pid)
            self._due[ranker] = 0.0

    def forget(self, ranker: str) -> None:
        with self._lock:
            self._targets.pop(ranker, None)
            self._draining.discard(ranker)

    def hurry(self, ranker: str) -> None:
        """Scrape `ranker` every `DRAINING_INTERVAL_S` until it is forgotten: it is draining."""
        with self._lock:
            self._draining.add(ranker)
            self._due[ranker] = 0.0

    def scrape(self, rankers: Iterable[str], baseline: bool = False) -> dict[str, Sample]:
        """Scrapes `rankers` now; the samples taken (a ranker that did not answer has none)."""
        with self._lock:
            targets = {name: self._targets[name] for name in rankers if name in self._targets}
        taken = {}
        for name, (url, pid) in targets.items():
            try:
                values = parse(scrape_text(url))
            except OSError:  # gone, or not serving metrics yet: no sample
                continue
            taken[name] = Sample(round(time.monotonic() - self.origin, 3), name, pid, values, baseline)
        with self._lock:
            self.samples.extend(taken.values())
        return taken

    def _loop(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            with self._lock:
                due = [name for name in self._targets if self._due.get(name, 0.0) <= now]
                for name in due:
                    wait = DRAINING_INTERVAL_S if name in self._draining else self.interval_s
                    self._due[name] = now + wait
            self.scrape(due)
            self._stop.wait(DRAINING_INTERVAL_S / 2)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
