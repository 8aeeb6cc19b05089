"""What the coordinator keeps while it resolves a stuck collective
(fthsdp/coordinator/decisions/stuck.py decides): the escalation under way, the probes it
asked for and their answers, and the probes of replicas kept out as
unreachable until they reach the members again.

Part of a ``JobState``, like ``ProgressBook``: no I/O, the time passed in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from fthsdp.coordinator.decisions.hang import Stuck
from fthsdp.coordinator.decisions.stuck import (
    REPROBE_EVERY,
    Act,
    Escalation,
    Remedy,
    Stage,
    escalate,
    merge_reports,
    probe_targets,
    reaches_all,
)
from fthsdp.protos.v1 import coordinator_pb2 as pb

Answers = dict[str, dict[int, tuple[frozenset[str], frozenset[str]]]]


@dataclasses.dataclass
class _Probe:
    """One probe: its id, whom it probes, and the answers so far."""

    id: int
    sent: float
    targets: tuple[str, ...]
    """Sorted: the members, or for a replica kept out the members it must reach."""
    addresses: Mapping[str, Sequence[str]]
    ring: bool
    """The members' probe: each probes its neighbours only (fthsdp/coordinator/decisions/stuck.py ``probe_targets``)."""
    answers: Answers = dataclasses.field(default_factory=dict)
    _requests: dict[str, pb.ReachProbe] = dataclasses.field(default_factory=dict)

    def request_for(self, replica_id: str) -> pb.ReachProbe:
        """What ``replica_id`` is asked to probe: its own targets, with their addresses (built once)."""
        request = self._requests.get(replica_id)
        if request is None:
            targets = probe_targets(self.targets, replica_id) if self.ring else self.targets
            request = pb.ReachProbe(id=self.id, targets=[
                pb.ReachTarget(replica_id=rid, addresses=list(self.addresses.get(rid, ()))) for rid in targets])
            self._requests[replica_id] = request
        return request


@dataclasses.dataclass(frozen=True)
class Readmission:
    """A marked replica's complete answer: whether it reaches every member now, and whom not."""

    replica_id: str
    reaches_all: bool
    unreached: tuple[str, ...]


class ReachBook:
    def __init__(self) -> None:
        self.escalation = Escalation()
        self.regroup = ""
        """Why the next decision must regroup the members ("": it need not)."""
        self._members_probe: _Probe | None = None
        self._marked: dict[str, _Probe] = {}
        """The probe each replica kept out as unreachable answers, by replica."""
        self._next_id = 0

    def _new_probe(self, targets: Sequence[str], addresses: Mapping[str, Sequence[str]], now: float,
                   ring: bool = False) -> _Probe:
        self._next_id += 1
        return _Probe(self._next_id, now, tuple(sorted(targets)), addresses, ring)

    # ----- the members' stuck collective ---------------------------------------------

    def look(
        self, stuck: Stuck | None, members: Sequence[str], quorum_id: int, low_step: Callable[[], int],
        world_sizes: Mapping[str, int], addresses: Mapping[str, Sequence[str]], now: float, limit: float,
    ) -> Remedy:
        """One step of the escalation (fthsdp/coordinator/decisions/stuck.py) with what is known now.
        ``low_step`` (a pass over every rank's report) is read only while an escalation is under way."""
        probe = self._members_probe
        if probe is not None and probe.id == self.escalation.probe_id:
            reach, reported = merge_reports(probe.answers, world_sizes)
        else:
            reach, reported = {}, frozenset()
        low = low_step() if self.escalation.stage is not Stage.WATCHING else -1
        self.escalation, action = escalate(self.escalation, stuck, members, quorum_id, low, reach, reported,
                                           now, limit)
        if action.act is Act.REGROUP:
            self.regroup = action.reason
        elif action.act is Act.PROBE:
            self._members_probe = self._new_probe(members, addresses, now, ring=True)
            self.escalation = dataclasses.replace(self.escalation, probe_id=self._members_probe.id)
        elif action.act in (Act.TAKE_OUT, Act.KEEP):
            self._members_probe = None
        return action

    def quorum_changed(self) -> None:
        """A new quorum is in place: a regroup asked for is done (or moot), a members' probe is over."""
        self.regroup = ""
        if self._members_probe is not None and self.escalation.probe_id != self._members_probe.id:
            self._members_probe = None

    # ----- replicas kept out -----------------------------------------------------------

    def reprobe(self, marked: Sequence[str], members: Sequence[str], addresses: Mapping[str, Sequence[str]],
                now: float) -> bool:
        """Ask each replica kept out as unreachable to probe the members
        again, every REPROBE_EVERY; returns whether any was asked (a push)."""
        self._marked = {rid: p for rid, p in self._marked.items() if rid in marked}
        asked = False
        for rid in marked:
            probe = self._marked.get(rid)
            if members and (probe is None or now - probe.sent >= REPROBE_EVERY):
                self._marked[rid] = self._new_probe([m for m in members if m != rid], addresses, now)
                asked = True
        return asked

    # ----- answers -----------------------------------------------------------------------

    def probe_for(self, replica_id: str, is_member: bool) -> pb.ReachProbe | None:
        """The probe the watcher of ``replica_id`` is asked to run, if any."""
        if is_member:
            probe = self._members_probe
        else:
            probe = self._marked.get(replica_id)
        return probe.request_for(replica_id) if probe is not None else None

    def answer(self, replica_id: str, shard_rank: int, probe_id: int, reached: Sequence[str],
               unreached: Sequence[str], world_size: int) -> Readmission | None:
        """Record one rank's answer; for a replica kept out, once every rank
        answered, whether it reaches every member it probed. Answers to
        probes no longer asked are ignored."""
        row = (frozenset(reached), frozenset(unreached))
        members = self._members_probe
        if members is not None and members.id == probe_id:
            members.answers.setdefault(replica_id, {})[shard_rank] = row
            return None
        probe = self._marked.get(replica_id)
        if probe is None or probe.id != probe_id:
            return None
        probe.answers.setdefault(replica_id, {})[shard_rank] = row
        reach, complete = merge_reports(probe.answers, {replica_id: world_size})
        if replica_id not in complete:
            return None
        targets = probe.targets
        row_of = reach.get(replica_id, {})
        unreached_now = tuple(t for t in targets if row_of.get(t) is not True)
        return Readmission(replica_id, reaches_all(row_of, targets, True), unreached_now)

    def note(self) -> str:
        """What the escalation is doing, for status ("" while nothing is stuck)."""
        esc = self.escalation
        if esc.stage is Stage.WATCHING:
            return ""
        return f"stuck collective at step {esc.step}: {esc.stage.value}"

