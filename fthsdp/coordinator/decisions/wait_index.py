"""Where the processes' latest reports say they wait, kept as the reports come.

A look for hangs (fthsdp/coordinator/decisions/progress.py) first asks
whether anybody could be hung yet: a verdict needs a process waiting in an
all-reduce for at least a limit. Answering that by reading every report
costs a pass over every rank at every look (100,000 ranks, four times a
second, at the target size) to find, nearly always, that nobody waits
long. Here the waits are indexed as they are reported: a min-heap of wait
starts, an entry made stale by a newer report of its process dropped when
it comes to the top, so that a look reads the oldest live wait in
amortised constant time. The processes inside a marked section (a few at
most) are kept apart, for their own limits.

The index errs early, never late: it holds every process's wait, members
of the quorum or not, so the oldest it reports is at most the members'
oldest, and a look it lets through only costs the full verdict.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

from fthsdp.coordinator.decisions.hang import Report
from fthsdp.protos.v1 import coordinator_pb2 as pb

COMPACT_SLACK = 4096
"""Stale entries tolerated beyond twice the live ones before the heap is rebuilt from the reports."""


class WaitIndex:
    """The wait starts of the processes in an all-reduce, and the processes in a marked section."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str, int, Report]] = []
        self._seq = 0
        self._compact_at = COMPACT_SLACK
        self.sections: dict[tuple[str, int], Report] = {}
        """The processes whose latest report is inside a marked section, by replica and rank."""

    def saw(self, replica_id: str, rank: int, report: Report) -> None:
        """A process's new latest report, whatever its phase."""
        if report.phase == pb.PHASE_ALLREDUCE:
            self.waiting(replica_id, rank, report)
        if report.phase == pb.PHASE_SECTION:
            self.sections[(replica_id, rank)] = report
        elif self.sections:
            self.sections.pop((replica_id, rank), None)

    def waiting(self, replica_id: str, rank: int, report: Report) -> None:
        """A process's new latest report is in an all-reduce (the caller knows it is not in a section)."""
        heapq.heappush(self._heap, (report.received - report.age, self._seq, replica_id, rank, report))
        self._seq += 1

    def left_sections(self, replica_id: str, ranks: Iterable[int]) -> None:
        """These processes of ``replica_id`` reported outside any section."""
        for rank in ranks:
            self.sections.pop((replica_id, rank), None)

    def forget(self, replica_id: str) -> None:
        """A replica's reports are dropped (its heap entries go stale with them)."""
        for key in [key for key in self.sections if key[0] == replica_id]:
            del self.sections[key]

    def oldest(self, reports: Mapping[str, Mapping[int, Report]], before: float = float("inf")) -> float:
        """The earliest start of a wait that is still some process's latest report (``reports``; inf: none),
        exact if it is ``before`` or earlier; otherwise a start after ``before``, at most the earliest. Stale
        entries are read only when they might matter: in the steady state, where every wait is short, a
        look pops nothing."""
        heap = self._heap
        if len(heap) > self._compact_at:
            heap[:] = [entry for entry in heap if reports.get(entry[2], {}).get(entry[3]) is entry[4]]
            heapq.heapify(heap)
            self._compact_at = 2 * len(heap) + COMPACT_SLACK
        while heap:
            start, _, replica_id, rank, report = heap[0]
            if start > before or reports.get(replica_id, {}).get(rank) is report:
                return start
            heapq.heappop(heap)
        return float("inf")
