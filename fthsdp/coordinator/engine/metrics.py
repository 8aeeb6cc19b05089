"""Prometheus metrics of the coordinator (``--metrics-port``), served read-only
over HTTP at ``/metrics`` (fthsdp/coordinator/serving/web.py) in the text exposition
format (0.0.4) of ``prometheus_client.generate_latest``.

Counters and histograms are updated by the runtime as things happen; gauges
(quorum id, replicas by state, open Watch streams, the hang limit, step times
and straggler scores) are read from the job tables at scrape time
(fthsdp/coordinator/engine/gauges.py), so they are never stale.

Each ``Metrics`` has its own ``CollectorRegistry``, never the process-wide
default one: a process may hold several coordinators (the tests do), each with
its own counts. The classes here are a thin facade over ``prometheus_client``
that keeps the runtime's calls (``.inc(job=...)``, ``.observe(v, job=...)``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import prometheus_client
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry
from prometheus_client.samples import Sample

FORMATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TAKEN_OUT_REASONS = ("hung", "straggler")
"""Why the hang detection takes a member out (the runtime starts each series at 0)."""

GaugeSample = tuple[str, str, dict[str, str], float]
"""(name, help, labels, value) of one gauge series, as fthsdp/coordinator/engine/gauges.py yields them."""


def _without_created(families: Iterable[Metric]) -> Iterator[Metric]:
    """The families without their ``_created`` samples. prometheus_client adds
    one to every counter and histogram series (exposed as an extra gauge
    family, ``NAME_created``); these metrics never had one, and the library's
    switch for it (``disable_created_metrics``) is process-wide."""
    for family in families:
        created = family.name + "_created"
        family.samples = [s for s in family.samples if s.name != created]
        yield family


class Counter:
    """A labelled counter: ``inc(amount=1, **labels)``; a series exists from its first ``inc`` (0 included)."""

    def __init__(self, name: str, help_text: str, labelnames: tuple[str, ...]) -> None:
        # registry=None: not registered anywhere; Metrics' collector exposes it.
        self._metric = prometheus_client.Counter(name, help_text, labelnames, registry=None)
        self._series: dict[tuple[tuple[str, str], ...], prometheus_client.Counter] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        # Each series' child, looked up once: labels() costs more than inc() itself (heartbeats are the hot path).
        key = tuple(labels.items())
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = self._metric.labels(**labels)
        series.inc(amount)

    def collect(self) -> Iterator[Metric]:
        return _without_created(self._metric.collect())


class Histogram:
    """A labelled histogram: ``observe(value, **labels)``."""

    def __init__(self, name: str, help_text: str, labelnames: tuple[str, ...], buckets: tuple[float, ...]) -> None:
        self._metric = prometheus_client.Histogram(name, help_text, labelnames, registry=None, buckets=buckets)

    def observe(self, value: float, **labels: str) -> None:
        self._metric.labels(**labels).observe(value)

    def collect(self) -> Iterator[Metric]:
        return _without_created(self._metric.collect())


class _Collector:
    """What one scrape of a ``Metrics`` shows: its counters and histogram, then the gauges."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._metrics
        for metric in (m.heartbeats, m.quorum_changes, m.formation, m.epochs, m.taken_out):
            yield from metric.collect()
        # The gauges come job by job; a family gathers each metric's series
        # (the exposition format wants them in one group under one HELP and TYPE).
        # Samples are appended as they are: what add_metric would make of them, without
        # rebuilding each labels dict (20,000 per-replica series with 10,000 replicas).
        families: dict[str, GaugeMetricFamily] = {}
        for name, help_text, labels, value in m.gauges():
            family = families.get(name)
            if family is None:
                family = families[name] = GaugeMetricFamily(name, help_text)
            family.samples.append(Sample(name, labels, value))
        yield from families.values()


class Metrics:
    """The coordinator's metrics; ``gauges`` yields (name, help, labels, value) at scrape time."""

    def __init__(self) -> None:
        self.heartbeats = Counter("fthsdp_heartbeats_total", "Heartbeats received, by job.", ("job",))
        self.quorum_changes = Counter("fthsdp_quorum_changes_total",
                                      "Quorums formed (membership changes stored and pushed), by job.", ("job",))
        self.formation = Histogram(
            "fthsdp_quorum_formation_seconds",
            "From the first decision that the membership must change to the new quorum stored and pushed "
            "(store latency and retries during a store outage included), by job.",
            ("job",),
            FORMATION_BUCKETS,
        )
        self.epochs = Counter("fthsdp_leader_changes_total",
                              "Times this coordinator took a job over (start, restart or failover), by job.", ("job",))
        self.taken_out = Counter("fthsdp_replicas_taken_out_total",
                                 "Replicas taken out by the hang detection (reason hung: no progress while others "
                                 "waited for it), the straggler policy, or told to end for silence outside the "
                                 "quorum (silent: a stopped joiner), by job and reason.", ("job", "reason"))
        self.gauges: Callable[[], Iterable[GaugeSample]] = lambda: ()
        self.registry = CollectorRegistry(auto_describe=False)
        """This coordinator's own registry (what ``render`` exposes)."""
        self.registry.register(_Collector(self))

    def exposition(self) -> bytes:
        """The text exposition format, version 0.0.4 (content type ``text/plain; version=0.0.4; charset=utf-8``)."""
        return prometheus_client.generate_latest(self.registry)

    def render(self) -> str:
        return self.exposition().decode()
