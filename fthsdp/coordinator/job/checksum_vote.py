"""The checksum vote: which members' training state disagrees with the rest.

Members train in lockstep, so at a step they all hold the same state and
report the same checksum (a heartbeat's ``state_checksum`` and recent
history). ``find_diverged`` is the rule, a pure function tested table-driven
(tests/test_quorum.py): the checksum a strict majority of the members share
is right, or, without a majority, the earliest admitted side. ``flag`` applies
it to a job's replica entries: a newly diverged member gets its verdict
(``Incarnation.divergence``: why, from the step inputs,
fthsdp/coordinator/decisions/divergence.py, and whether its agent should give up), and a
member that agreed for a stretch since its admission has its strikes reset.
The quorum decision then drops the flagged ones (``ReplicaView.diverged``).

Apart from the decision (fthsdp/coordinator/decisions/quorum.py) and the replica table
(fthsdp/coordinator/job/state.py) because it is neither: a check over the members'
reports that runs on its own schedule (only when a checksum arrived) and
hands the decision its verdicts.
"""

from __future__ import annotations

from collections.abc import Mapping

from fthsdp.coordinator.decisions import divergence
from fthsdp.coordinator.decisions.quorum_types import Member, Quorum
from fthsdp.coordinator.job.replica_entry import ReplicaEntry
from fthsdp.protos.v1 import coordinator_pb2 as pb


def find_diverged(reports: Mapping[str, Mapping[int, str]], joined: Mapping[str, int]) -> dict[str, int]:
    """Members whose state checksum disagrees with the others' at a common step.

    ``reports`` maps each member to its recent {step: checksum}; ``joined``
    maps every member of the quorum to the quorum id that admitted it. At a
    step, the replicas holding a checksum that a strict majority of all
    members share are right and the others are flagged. Without such a
    majority (two members, say) and once every member reported the step, the
    members admitted earliest are presumed right if that tells the sides
    apart (a fresh catch-up is the likelier culprit); otherwise nobody is
    flagged. Returns {replica_id: first step at which it disagreed}.
    """
    steps: dict[int, dict[str, str]] = {}
    for rid, history in reports.items():
        for step, checksum in history.items():
            steps.setdefault(step, {})[rid] = checksum
    out: dict[str, int] = {}
    for step in sorted(steps):
        by_checksum: dict[str, list[str]] = {}
        for rid, checksum in steps[step].items():
            by_checksum.setdefault(checksum, []).append(rid)
        if len(by_checksum) < 2:
            continue
        groups = sorted(by_checksum.values(), key=len, reverse=True)
        if len(groups[0]) * 2 > len(joined):
            wrong = [rid for ids in groups[1:] for rid in ids]
        elif len(steps[step]) == len(joined):
            seniority = sorted(groups, key=lambda ids: min(joined.get(i, 0) for i in ids))
            oldest = min(joined.get(i, 0) for i in seniority[0])
            if any(min(joined.get(i, 0) for i in ids) == oldest for ids in seniority[1:]):
                continue  # cannot tell who is right
            wrong = [rid for ids in seniority[1:] for rid in ids]
        else:
            continue
        for rid in wrong:
            out.setdefault(rid, step)
    return out


def flag(
    quorum: Quorum, replicas: Mapping[str, ReplicaEntry], admitted: Mapping[str, Member]
) -> dict[str, pb.Divergence]:
    """Flag the members of ``quorum`` whose state disagrees with the others'
    (``admitted``: its members by replica id); returns the newly flagged ones
    with the verdict their watchers are told."""
    members = {m.replica_id: m.joined_quorum_id for m in quorum.members}
    reports = {
        rid: e.incarnation.checksums
        for rid, e in replicas.items()
        if rid in members and e.incarnation.session_id is not None and not e.incarnation.restarted
    }
    diverged = find_diverged(reports, members)
    flagged = {}
    for rid, step in diverged.items():
        entry = replicas[rid]
        if entry.incarnation.diverged_at is None:
            entry.incarnation.diverged_at = step
            flagged[rid] = entry.incarnation.divergence = _verdict(replicas, entry, step, reports, diverged)
    for rid in reports:
        standing = replicas[rid].standing
        if standing.strikes and rid not in diverged and _agreed_since_admission(admitted, rid, reports):
            standing.strikes, standing.mismatch = 0, ""  # a stretch without a mismatch: the catch-up worked
    return flagged


def _verdict(replicas: Mapping[str, ReplicaEntry], entry: ReplicaEntry, step: int, reports,
             diverged: dict[str, int]) -> pb.Divergence:
    inc, standing = entry.incarnation, entry.standing
    mine = inc.checksums.get(step)
    agreeing = {o: replicas[o].incarnation.inputs.get(step, "") for o, h in reports.items()
                if o not in diverged and h.get(step) not in (None, mine)}
    why = divergence.explain(entry.replica_id, step, inc.inputs.get(step, ""),
                             divergence.members_inputs(agreeing))
    standing.strikes, give_up = divergence.strike(standing.strikes, inc.caught_up)
    standing.mismatch = divergence.gave_up(why, standing.strikes) if give_up else why
    return pb.Divergence(reason=standing.mismatch, step=step, restart_count=inc.restart_count,
                         strikes=standing.strikes, give_up=give_up)


def _agreed_since_admission(admitted: Mapping[str, Member], rid: str, reports) -> bool:
    member = admitted.get(rid)
    if member is None:
        return False
    mine = reports[rid]
    agreed = (s for s, c in mine.items() if any(o != rid and h.get(s) == c for o, h in reports.items()))
    return divergence.resets(member.step, agreed)
