"""Prometheus metrics of the coordinator (``--metrics-port``), in the text
exposition format, served read-only over HTTP at ``/metrics`` (fthsdp/coordinator/web.py).

Counters and histograms are updated by the runtime as things happen; gauges
(quorum id, replicas by state, open Watch streams, the hang limit, step times
and straggler scores) are read from the job tables at scrape time, so they
are never stale.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable

FORMATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TAKEN_OUT_REASONS = ("hung", "straggler")
"""Why the hang detection takes a member out (the runtime starts each series at 0)."""


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Counter:
    def __init__(self, name: str, help_text: str) -> None:
        self.name, self.help = name, help_text
        self.values: dict[tuple, float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        self.values[key] = self.values.get(key, 0.0) + amount

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} counter"
        for key, value in sorted(self.values.items()):
            yield f"{self.name}{_labels(dict(key))} {value:g}"


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...]) -> None:
        self.name, self.help, self.buckets = name, help_text, buckets
        self.series: dict[tuple, tuple[list[int], list[float]]] = {}

    def observe(self, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        counts, total = self.series.setdefault(key, ([0] * (len(self.buckets) + 1), [0.0]))
        counts[bisect.bisect_left(self.buckets, value)] += 1
        total[0] += value

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} histogram"
        for key, (counts, total) in sorted(self.series.items()):
            labels = dict(key)
            running = 0
            for bound, count in zip((*self.buckets, float("inf")), counts):
                running += count
                le = "+Inf" if bound == float("inf") else f"{bound:g}"
                yield f"{self.name}_bucket{_labels({**labels, 'le': le})} {running}"
            yield f"{self.name}_sum{_labels(labels)} {total[0]:g}"
            yield f"{self.name}_count{_labels(labels)} {running}"


class Metrics:
    """The coordinator's metrics; ``gauges`` yields (name, help, labels, value) at scrape time."""

    def __init__(self) -> None:
        self.heartbeats = Counter("fthsdp_heartbeats_total", "Heartbeats received, by job.")
        self.quorum_changes = Counter("fthsdp_quorum_changes_total", "Quorums formed (membership changes stored and pushed), by job.")
        self.formation = Histogram(
            "fthsdp_quorum_formation_seconds",
            "From the first decision that the membership must change to the new quorum stored and pushed "
            "(store latency and retries during a store outage included), by job.",
            FORMATION_BUCKETS,
        )
        self.epochs = Counter("fthsdp_leader_changes_total", "Times this coordinator took a job over (start, restart or failover), by job.")
        self.taken_out = Counter("fthsdp_replicas_taken_out_total",
                                 "Replicas taken out by the hang detection (reason hung: no progress while others "
                                 "waited for it), the straggler policy, or told to end for silence outside the "
                                 "quorum (silent: a stopped joiner), by job and reason.")
        self.gauges: Callable[[], Iterable[tuple[str, str, dict[str, str], float]]] = lambda: ()

    def render(self) -> str:
        lines: list[str] = []
        for metric in (self.heartbeats, self.quorum_changes, self.formation, self.epochs, self.taken_out):
            lines.extend(metric.render())
        # The gauges come job by job, but the exposition format wants every
        # sample of a metric in one group under its HELP and TYPE lines.
        families: dict[str, list[str]] = {}
        for name, help_text, labels, value in self.gauges():
            family = families.get(name)
            if family is None:
                family = families[name] = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
            family.append(f"{name}{_labels(labels)} {value:g}")
        for family in families.values():
            lines.extend(family)
        return "\n".join(lines) + "\n"
