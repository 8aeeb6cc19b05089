"""What the coordinator keeps of each training process's progress, and the
hang and straggler verdicts it draws from it (fthsdp/coordinator/decisions/hang.py decides).

``ProgressBook`` is part of a ``JobState``: it is fed by heartbeats (every
rank of a replica group reports its ``Progress``) and asked, from the
decision loop, which members are hung or straggle. It does no I/O and takes
the time as an argument.
"""

from __future__ import annotations

from collections.abc import Iterable

from fthsdp.coordinator.decisions.hang import (
    HangRules,
    Report,
    Stuck,
    find_hung,
    find_stuck,
    job_limit,
    limit_for,
    median_step_time,
    straggler_scores,
    straggler_verdict,
)
from fthsdp.coordinator.decisions.wait_index import WaitIndex
from fthsdp.protos.v1 import coordinator_pb2 as pb

CHECK_EVERY = 0.25
"""Longest gap between two looks for hangs (shorter with a tight limit):
at 10,000 replicas one look reads every report, so not every tick."""


class ProgressBook:
    """The latest ``Progress`` of every process of every replica, by replica and rank."""

    def __init__(self, rules: HangRules) -> None:
        self.rules = rules
        self.reports: dict[str, dict[int, Report]] = {}
        self.waits = WaitIndex()
        """Where the reports say processes wait, kept as they come: a look reads it, not every report."""
        self.scores: dict[str, float] = {}
        """Straggler scores of the members at the last look (fthsdp/coordinator/decisions/hang.py)."""
        self.median_step = 0.0
        self.limit = rules.ceiling
        """The job's hang limit at the last look."""
        self.horizon = rules.ceiling
        """The longest a member could go without progress at the last look (a section may exceed the limit)."""
        self._waited_among: tuple[int, frozenset[str]] | None = None
        """The quorum and its members at the last look: the ones a waiter waits for (None: no look yet)."""
        self._waits_since = float("-inf")
        """When they last changed: a wait counts from then (fthsdp/coordinator/decisions/hang.py find_hung).
        Before any change was seen (a new coordinator's first look), the waits count whole."""
        self._slow_since: dict[str, int] = {}
        self._heard_again: dict[str, float] = {}
        """Members heard from again after a silence their lease ran out in (``heard_again``)."""
        self._fresh = False
        self._next_look = float("-inf")
        self.stuck: Stuck | None = None
        """At the last look: a collective every member waits in with nobody to blame
        (fthsdp/coordinator/decisions/stuck.py)."""

    def forget(self, replica_id: str) -> None:
        """A new incarnation registered: its predecessor's reports say nothing of it."""
        self._heard_again.pop(replica_id, None)
        self.reports.pop(replica_id, None)
        self.waits.forget(replica_id)
        self._slow_since.pop(replica_id, None)
        self.scores.pop(replica_id, None)

    def report(self, replica_id: str, shard_rank: int, progress: pb.Progress, now: float) -> None:
        report = self.reports.setdefault(replica_id, {})[shard_rank] = Report.of(progress, now)
        self.waits.saw(replica_id, shard_rank, report)
        self._fresh = True

    def report_digest(self, replica_id: str, digest: pb.RankDigest, now: float) -> None:
        """The progress of a digest's ranks (``RankDigest``: checked, its columns of equal length; no rank of
        it is in a section)."""
        reports, waits = self.reports.setdefault(replica_id, {}), self.waits
        for rank, phase, age, step, step_time, compute_time in zip(
                digest.ranks, digest.phases, digest.phase_ages_s, digest.steps, digest.step_times_s,
                digest.compute_times_s, strict=True):
            report = reports[rank] = Report(phase, age, step, now, step_time, compute_time)
            if phase == pb.PHASE_ALLREDUCE:
                waits.waiting(replica_id, rank, report)
        if waits.sections:
            waits.left_sections(replica_id, digest.ranks)
        self._fresh = True

    def heard_again(self, replica_id: str, now: float) -> None:
        """A member's heartbeats had stopped for long enough that its member lease ran out: it
        paused for the coordinator, not hung, until now (fthsdp/coordinator/decisions/hang.py find_hung)."""
        self._heard_again[replica_id] = now

    def rank0(self, replica_id: str) -> Report | None:
        return self.reports.get(replica_id, {}).get(0)

    def due(self, now: float) -> bool:
        """Whether a look could find anything new: reports came since the last one, which was a while ago."""
        return self._fresh and now >= self._next_look

    def look(self, members: Iterable[str], steps: dict[str, int], now: float,
             quorum_id: int = 0) -> tuple[dict[str, str], dict[str, str]]:
        """The members that are hung and those the straggler policy takes out,
        each with why (and ``stuck``). ``members``: the current quorum's live
        members (when they or the quorum change, the waits under way start
        over: a regroup keeps the members but not the group); ``steps``:
        their committed steps (for the straggler count)."""
        if not self.due(now):
            return {}, {}
        self._fresh = False
        self._next_look = now + min(CHECK_EVERY, self.limit / 8)
        members = list(members)
        among = (quorum_id, frozenset(members))
        if among != self._waited_among:
            if self._waited_among is not None:
                # A new quorum, or a member taken out that the next one drops:
                # the waits under way were for others. Seen at the first look
                # after the change, never before it, so a wait is never counted
                # longer than it lasted in the quorum it is waited in.
                self._waits_since = now
            self._waited_among = among
            for rid in [rid for rid in self._heard_again if rid not in among[1]]:
                del self._heard_again[rid]  # no longer a member: nothing waits for it
        members = [rid for rid in members if rid in self.reports]
        first = {rid: self.reports[rid][0] for rid in members if 0 in self.reports[rid]}
        self.median_step = median_step_time(first)
        self.limit = job_limit(self.median_step, self.rules)
        reports = {rid: self.reports[rid] for rid in members}
        oldest_wait, shortest, longest = self._bounds(set(members), now)
        # The longest any member may now go without progress: what a replica
        # waiting in the all-reduce waits at least, for a verdict, before it gives up.
        self.horizon = longest
        if now - oldest_wait < shortest:
            # Nobody has waited in an all-reduce as long as any limit: nobody can be hung or stuck yet.
            # One cheap pass instead of the verdicts' (at 100,000 ranks, most of the coordinator's time).
            hung, self.stuck = {}, None
        else:
            hung = find_hung(reports, self.limit, self.rules, quorum_since=self._waits_since,
                             heard_again=self._heard_again)
            self.stuck = None if hung else find_stuck(reports, self.limit, self._waits_since)
        self.scores = straggler_scores({rid: r.compute_time for rid, r in first.items()})
        stragglers = {}
        for rid, score in self.scores.items():
            since, why = straggler_verdict(score, steps.get(rid, 0), self._slow_since.get(rid), self.rules)
            if since is None:
                self._slow_since.pop(rid, None)
            else:
                self._slow_since[rid] = since
            if why and rid not in hung:
                stragglers[rid] = why
        return hung, stragglers

    def _bounds(self, members: set[str], now: float) -> tuple[float, float, float]:
        """The shortest and the longest limit any member's process is held to (a marked section's own,
        else the job's), and the earliest start of a wait in an all-reduce (any process's, a member's or
        not: it errs early), exact only if it is at least the shortest limit ago. From the wait index, not
        a pass over every report."""
        shortest = longest = self.limit
        for (rid, _), r in self.waits.sections.items():
            if rid in members:
                own = limit_for(r, self.limit, self.rules)
                shortest, longest = min(shortest, own), max(longest, own)
        return self.waits.oldest(self.reports, now - shortest), shortest, longest

    def low_step(self, members: Iterable[str]) -> int:
        """The lowest step among the members' latest reports (any rank): past
        a stuck step, the collective finished."""
        return min((r.step for rid in members for r in self.reports.get(rid, {}).values()), default=-1)
