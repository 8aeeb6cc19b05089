"""Hangs and stragglers, decided from progress rather than from heartbeats.

A replica's heartbeats come from a background thread, so a training loop
stuck in a deadlocked data loader, a collective of its own group or a stuck
read goes on heartbeating. What tells it apart is progress: every training
process reports where it is in its step (``Progress``: computing, waiting in
the cross-replica all-reduce, in its update, in a section the script marked
as long) and for how long. The members of a quorum train in lockstep, so a
member waiting in the all-reduce of step S waits for every member that has
not arrived there; once it has waited longer than the hang limit, the ones
it waits for are hung, and the waiting ones are never the ones blamed.

Two things keep a healthy member from being blamed. A wait counts only
within the quorum it is waited in: after a take-out the survivors redo the
step in a new quorum without re-entering the all-reduce (their reports go
on counting from their first arrival), and what they waited before the
change was a wait for the member taken out, not for the ones left. And
only a member that has itself made no progress for the limit is hung: one
whose latest report shows it in its phase for less (it just committed,
entered its update, came back from a section) is moving, whoever waits.

Everything here is a pure function of the reports and the time (tested
table-driven in tests/test_hang.py); ``fthsdp.coordinator.decisions.progress`` keeps the
reports and applies the verdicts.

The hang limit is ``multiple`` times the job's median step time, within
``floor`` and ``ceiling``; before any step time is known (the first step,
with its compilation and warm-up) it is the ceiling. A member inside a
marked section gets the section's own timeout instead. Why a floor of
seconds costs little: at 100,000 GPUs a hang comes every few hours, and a
stall of ten seconds each time is a thousandth of the training time, while a
replica taken out by mistake costs it a restart and a catch-up.

Stragglers (off by default): a member whose compute time (step start to its
arrival at the all-reduce) is ``straggler_multiple`` times the median of the
others' for ``straggler_steps`` steps holds every step back; it is taken out
and cordoned, so that the job trains on without it until an operator
replaces the node and uncordons it.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from collections.abc import Mapping
from typing import NamedTuple

from fthsdp.protos.v1 import coordinator_pb2 as pb


@dataclasses.dataclass(frozen=True)
class HangRules:
    """The parameters of the hang and straggler verdicts (from the coordinator config)."""

    multiple: float = 5.0
    floor: float = 10.0
    ceiling: float = 300.0
    section_timeout: float = 1800.0
    straggler_multiple: float = 0.0
    """0: the straggler policy is off (scores are still shown)."""
    straggler_steps: int = 50


class Report(NamedTuple):
    """One process's latest ``Progress``, as the coordinator received it (a tuple: one is made per rank per
    ping, 100,000 a second at the target size, and a frozen dataclass costs three times as much to build)."""

    phase: pb.Phase
    age: float
    """Seconds in ``phase`` when it was sent."""
    step: int
    received: float
    """Coordinator-monotonic time of receipt."""
    step_time: float = 0.0
    compute_time: float = 0.0
    section: str = ""
    section_timeout: float = 0.0

    @classmethod
    def of(cls, progress: pb.Progress, received: float) -> Report:
        return cls(progress.phase, progress.phase_age_s, progress.step, received, progress.step_time_s,
                   progress.compute_time_s, progress.section, progress.section_timeout_s)


PHASE_NAMES = {
    pb.PHASE_COMPUTE: "computing",
    pb.PHASE_ALLREDUCE: "in the all-reduce",
    pb.PHASE_UPDATE: "in its update",
    pb.PHASE_SECTION: "in section",
    pb.PHASE_STARTING: "starting",
}


def median_step_time(reports: Mapping[str, Report]) -> float:
    """The job's median step time from the members' reports (0: none known)."""
    times = [r.step_time for r in reports.values() if r.step_time > 0]
    return statistics.median(times) if times else 0.0


def job_limit(median_step: float, rules: HangRules) -> float:
    """How long a member may make no progress while others wait for it."""
    if median_step <= 0:
        return rules.ceiling
    return min(rules.ceiling, max(rules.floor, rules.multiple * median_step))


def limit_for(report: Report, limit: float, rules: HangRules) -> float:
    """The limit of one process: a marked section's own timeout, else the job's."""
    if report.phase == pb.PHASE_SECTION:
        return report.section_timeout or rules.section_timeout
    return limit


STUCK_MARGIN = 10.0


def stuck_after(limit: float) -> float:
    """How long a member may wait alone in an all-reduce (every other member
    left it or is past it): well beyond the hang limit plus the margin after
    which a live member gives up waiting (fthsdp/agent/training/session/hang_notice.py)."""
    return 2 * limit + STUCK_MARGIN


def _lowest_other_steps(processes: list[tuple[str, Report]]) -> dict[str, int]:
    """For each process, the lowest step among the others (absent: no other)."""
    steps = sorted((r.step, rid) for rid, r in processes)
    if len(steps) < 2:
        return {}
    (low, low_id), (second, _) = steps[0], steps[1]
    return {rid: second if rid == low_id else low for rid, _ in processes}


def find_hung(
    members: Mapping[str, Mapping[int, Report]], limit: float, rules: HangRules,
    quorum_since: float = float("-inf"), heard_again: Mapping[str, float] | None = None,
) -> dict[str, str]:
    """The members that others have waited for longer than the limit, with why.

    ``members`` maps each member of the quorum to its processes' latest
    reports by rank in the replica group; the all-reduce of rank k runs
    among the rank-k processes of every member. A waiter in the all-reduce
    of step S waits for every rank-k process that has not committed S - 1
    (its step is lower) or has not arrived at the all-reduce of S: lockstep
    makes that a wait, the collective cannot finish without it. A process is
    hung once its latest report shows it so behind a waiter that, by then,
    had waited past the process's limit (the waiter's reported wait plus the
    time between the two reports: it cannot have stopped waiting while the
    other had not arrived), and shows it in its phase for that long itself.

    ``quorum_since`` (coordinator-monotonic) is when the members waited for
    last changed: a wait counts from then at the earliest, since before it
    the waiter waited in an older quorum, for other members (the survivors
    of a take-out redo the step without re-entering the all-reduce, so
    their reports count from their first arrival).

    ``heard_again`` (coordinator-monotonic, by member): when a member whose
    heartbeats had stopped long enough for its member lease to run out was
    heard from again. Cut from the coordinator, it paused before its update
    (fthsdp/agent/training/session/lease.py): what others waited for it then
    was a wait for the coordinator, so a wait counts against it from then at
    the earliest.

    Processes that report no phase (an older replica) are never judged.
    Linear in the processes (10,000 members wait at once in a large job):
    only the longest waiter at each step matters.
    """
    by_rank: dict[int, list[tuple[str, Report]]] = {}
    for rid, ranks in members.items():
        for rank, report in ranks.items():
            by_rank.setdefault(rank, []).append((rid, report))
    out: dict[str, str] = {}
    for rank, processes in sorted(by_rank.items()):
        # The longest waiter at each step: the earliest start of a wait.
        longest: dict[int, tuple[float, str, Report]] = {}
        for rid, w in processes:
            if w.phase == pb.PHASE_ALLREDUCE:
                start = max(w.received - w.age, quorum_since)
                if w.step not in longest or start < longest[w.step][0]:
                    longest[w.step] = (start, rid, w)
        if not longest:
            continue
        lowest_other = _lowest_other_steps(processes)
        inside = Counter(r.step for _, r in processes if r.phase == pb.PHASE_ALLREDUCE)
        for rid, x in processes:
            if rid in out or x.phase == pb.PHASE_UNSPECIFIED:
                continue
            if x.phase == pb.PHASE_ALLREDUCE and inside[x.step] > 1:
                # Waiting with others in a collective that finished for some
                # member already (a link failed in its last moments): they wait
                # for each other, not hang; find_stuck sees it.
                continue
            alone = lowest_other.get(rid, x.step + 1) > x.step  # every other is past its step, or none
            if x.phase == pb.PHASE_ALLREDUCE and alone and x.age >= stuck_after(limit):
                # Alone in an all-reduce nobody else is in, for far longer than
                # any live member waits before it gives up: its own training
                # thread is stuck there (the others left it, or moved on).
                # Its own wait, whatever the quorum: nobody else is blamed by it.
                out[rid] = (f"hung{f' (rank {rank})' if rank else ''}: alone in the all-reduce of step {x.step} "
                            f"for {x.age:.1f}s (limit {stuck_after(limit):.1f}s)")
                continue
            waits = [v for step, v in longest.items()
                     if step > x.step or step == x.step and x.phase != pb.PHASE_ALLREDUCE]
            if not waits:
                continue
            start, wid, w = min(waits, key=lambda v: v[0])
            if heard_again and rid in heard_again:
                start = max(start, heard_again[rid])
            waited, own_limit = x.received - start, limit_for(x, limit, rules)
            if waited < own_limit or x.age < own_limit:
                continue  # not waited for long enough, or it moved on to its phase lately: it makes progress
            where = (f"in section {x.section!r}" if x.phase == pb.PHASE_SECTION
                     else PHASE_NAMES.get(x.phase, "somewhere"))
            rank_text = f" (rank {rank})" if rank else ""
            out[rid] = (
                f"hung{rank_text}: no progress at step {x.step} ({where} for {x.age:.1f}s) while {wid} "
                f"waited {waited:.1f}s in the all-reduce of step {w.step} (limit {own_limit:.1f}s)"
            )
    return out


@dataclasses.dataclass(frozen=True)
class Stuck:
    """A collective that every member is inside, making no progress."""

    step: int
    rank: int
    waited: float
    """The shortest wait among the members (within the current quorum)."""

    def reason(self, members: int, limit: float) -> str:
        rank = f" (rank {self.rank})" if self.rank else ""
        return (f"all {members} members have waited {self.waited:.1f}s in the all-reduce of step {self.step}{rank} "
                f"(limit {limit:.1f}s) with nobody to blame")


def find_stuck(
    members: Mapping[str, Mapping[int, Report]], limit: float, quorum_since: float = float("-inf"),
) -> Stuck | None:
    """A collective nobody can be blamed for: every member's rank-k process
    is in the all-reduce, each having waited there for the limit (counted
    within the current quorum, as in ``find_hung``). No member is hung,
    every one waits: what fails is between them (a link down, a connection
    reset), and fthsdp/coordinator/decisions/stuck.py mends or cuts it. Their steps may
    differ by one: a link that fails in a collective's last moments leaves
    it finished for some members and not for others (``step`` is the lower).
    None with fewer than two members, or while any of them moves."""
    if len(members) < 2:
        return None
    ranks = set.intersection(*(set(r) for r in members.values()))
    for rank in sorted(ranks):
        reports = [m[rank] for m in members.values()]
        steps = [r.step for r in reports]
        if any(r.phase != pb.PHASE_ALLREDUCE for r in reports) or max(steps) - min(steps) > 1:
            continue
        waited = min(r.received - max(r.received - r.age, quorum_since) for r in reports)
        if waited >= limit:
            return Stuck(min(steps), rank, waited)
    return None


def straggler_scores(compute_times: Mapping[str, float]) -> dict[str, float]:
    """Each member's compute time over the median of the others' (0: unknown).

    One sort for all (10,000 members report at once): without member i, the
    sorted times are the sorted list with position i left out, so the
    median of the others is read off next to the middle."""
    known = sorted((t, rid) for rid, t in compute_times.items() if t > 0)
    out = {rid: 0.0 for rid in compute_times}
    n = len(known)
    if n < 2:
        return out
    times = [t for t, _ in known]

    def without(i: int, j: int) -> float:  # the j-th smallest time other than the i-th
        return times[j] if j < i else times[j + 1]

    for i, (t, rid) in enumerate(known):
        k = n - 1  # the others
        others = without(i, k // 2) if k % 2 else (without(i, k // 2 - 1) + without(i, k // 2)) / 2
        out[rid] = t / others if others > 0 else 0.0
    return out


def straggler_verdict(
    score: float, step: int, slow_since: int | None, rules: HangRules
) -> tuple[int | None, str]:
    """Track one member under the straggler policy: the step it has been
    slow since (None: it is not slow) and, once it has been slow for
    ``straggler_steps``, why it is taken out (else "")."""
    if rules.straggler_multiple <= 0 or score < rules.straggler_multiple:
        return None, ""
    since = step if slow_since is None else slow_since
    if step - since >= rules.straggler_steps:
        return since, (
            f"straggler: compute {score:.1f}x the other members' median for {step - since} steps "
            f"(policy: {rules.straggler_multiple:g}x for {rules.straggler_steps}); "
            "cordoned until an operator uncordons it"
        )
    return since, ""
