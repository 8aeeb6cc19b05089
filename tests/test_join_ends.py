"""Every way a replica's join can end, in-process on fakes (fthsdp/agent/training/catchup/join_session.py).

``join_quorum`` runs the real ``Joiner`` of a one-rank group against a
fake coordinator (pushes handed to the real ``QuorumView``) and fake
catch-up sources (a snapshot and a gradient log). The coordinator's side is
played by the sources themselves: the source admits the joiner from inside
its log answer once the joiner says it is ready, as the coordinator would
on the heartbeat that carries ``ready``. No thread, no clock: each row runs
in milliseconds.

The ends inside the first step (a source lost during the last gap, no
source left, an eviction) are FTAR's and the last gap's: tests/test_last_gap.py,
tests/test_quorum_groups.py and tests/test_ftar_phases.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

from fthsdp.agent.training.catchup.client import CatchUpError
from fthsdp.agent.training.catchup.join_session import Joined, JoinEnd, join_quorum
from fthsdp.agent.training.catchup.joiner import Joiner, StateTorn
from fthsdp.agent.training.catchup.replay import ReplayMismatch
from fthsdp.agent.training.checkpoint.errors import CheckpointError, PartlyLoaded
from fthsdp.agent.training.quorum_view import QuorumView
from fthsdp.agent.training.session.lifecycle import Lifecycle
from fthsdp.agent.training.session.replica_group import ReplicaGroup
from fthsdp.agent.training.session.report import Reporting
from fthsdp.agent.training.state.snapshot import Snapshot
from fthsdp.core.errors import CatchUpFailed, FthsdpError
from fthsdp.protos.v1 import catchup_pb2 as cpb
from fthsdp.protos.v1 import coordinator_pb2 as pb

STRUCTURE = 1234
ME = "r2"


# ----- the coordinator's pushes ----------------------------------------------------------


def admitted(members: int = 3, quorum_id: int = 7, last_drop_id: int = 1) -> pb.WatchEvent:
    return pb.WatchEvent(quorum=pb.Quorum(id=quorum_id, member_count=members, last_drop_id=last_drop_id),
                         place=pb.QuorumPlace(rank=members - 1))


def named(source: Source, quorum_id: int = 6) -> pb.WatchEvent:
    return pb.WatchEvent(quorum=pb.Quorum(id=quorum_id, member_count=2), catch_up=pb.CatchUp(
        source_replica_id=source.name, source_step=source.head, source_catch_up_addresses=[source.address]))


# ----- the replica and its sources ---------------------------------------------------------


class Replica:
    """The ``CatchingUp`` state: a step and the value every replayed step adds to."""

    def __init__(self, step: int = 0) -> None:
        self.step, self.value = step, 0.0
        self.restored: list[str] = []
        self.progress: list[tuple[int, int]] = []
        self.refuse_restore: bool | str = False

    def load_snapshot(self, state: dict, step: int) -> None:
        self.value, self.step = float(state["value"]), step

    def replay(self, entry: cpb.LogEntry, total: torch.Tensor) -> None:
        assert entry.step == self.step, "a joiner replays the source's steps in order, none skipped"
        self.value += float(total)
        self.step += 1

    def verify(self, entry: cpb.LogEntry, group: ReplicaGroup) -> bool:
        if entry.checksum_after != f"{self.value:g}":
            raise ReplayMismatch(f"after step {entry.step}: {self.value:g}, the source had {entry.checksum_after}")
        return True

    def report_progress(self, done: int, total: int) -> None:
        self.progress.append((done, total))

    def restore(self, path: str, digest: str, rank: int) -> str:
        if self.refuse_restore == "in part":
            self.value = -1.0  # some of it landed before the corrupt block
            raise PartlyLoaded(f"{path}: corrupt")
        if self.refuse_restore:
            raise CheckpointError(f"{path}: corrupt")
        self.restored.append(path)
        self.step = int(path.rsplit("-", 1)[1])
        return ""

    def state_checksum(self, group: ReplicaGroup, kind: str = "xxh3") -> str:
        return f"{self.value:g}"


@dataclasses.dataclass
class Source:
    """A member serving its snapshot at ``snapshot_step`` and its log up to ``head``.

    ``on_fetch``/``on_log``: what happens (on the coordinator's side, or to
    this replica) while the joiner copies or reads the log; ``diverges``:
    its checksums disagree with the replay."""

    name: str
    snapshot_step: int = 5
    head: int = 9
    diverges: bool = False
    on_fetch: Callable[[Source], None] | None = None
    on_log: Callable[[Source], None] | None = None
    released: list[int] = dataclasses.field(default_factory=list)
    closed: bool = False
    transport = "http"

    @property
    def address(self) -> str:
        return f"{self.name}.example:29600"

    def value_at(self, step: int) -> float:
        return float(sum(range(step)))  # step s adds s

    def request_snapshot(self, wait: float = 30.0) -> cpb.SnapshotManifest:
        snap = Snapshot(self.snapshot_step, self.name, 0, STRUCTURE, {"value": torch.tensor(self.value_at(
            self.snapshot_step))})
        snap.start()
        assert snap.ready.wait(10) and snap.error is None
        self._snapshot = snap
        return snap.manifest

    def fetch(self, manifest: cpb.SnapshotManifest, progress: Callable[[int], None]) -> torch.Tensor:
        if self.on_fetch is not None:
            self.on_fetch(self)
        progress(manifest.total_bytes)
        return self._snapshot.buffer

    def log(self, from_step: int, max_bytes: int, wait: float):
        if self.on_log is not None:
            self.on_log(self)
        entries = []
        for step in range(from_step, self.head):
            value = self.value_at(step + 1) + (1.0 if self.diverges else 0.0)
            entries.append((cpb.LogEntry(step=step, checksum_after=f"{value:g}" if step == from_step else ""),
                            torch.tensor(float(step))))
        return entries, self.head, True

    def release(self, step: int) -> None:
        self.released.append(step)

    def close(self) -> None:
        self.closed = True


class Joining:
    """A joiner of a one-rank group, its coordinator view and the sources it can reach."""

    def __init__(self, *sources: Source, step: int = 0) -> None:
        self.replica = Replica(step)
        self.view, self.reporting, self.lifecycle = QuorumView(ME), Reporting(step), Lifecycle()
        self.sources = {s.address: s for s in sources}
        self.joiner = Joiner(self.replica, job="default", replica_id=ME, structure=STRUCTURE,
                             group=ReplicaGroup(0, 1, timeout=5.0), view=self.view, reporting=self.reporting,
                             lifecycle=self.lifecycle,
                             connect=lambda address, fingerprint: self.sources[address])  # type: ignore

    def reach(self, source: Source) -> None:
        """A source this replica can connect to (named later, by a push)."""
        self.sources[source.address] = source

    def push(self, event: pb.WatchEvent) -> None:
        self.view.update(event)

    def admit_when_ready(self, source: Source) -> None:
        """The coordinator's side: it admits the joiner on the heartbeat that says ready."""
        if self.reporting.current.ready and not self.view.is_member():
            self.push(admitted())

    def join(self, timeout: float = 5.0, min_members: int = 1) -> Joined:
        return join_quorum(self.joiner, timeout, min_members)


# ----- the ends -----------------------------------------------------------------------------


def test_up_to_date_it_is_admitted_without_catching_up():
    j = Joining()
    j.push(admitted())
    joined = j.join()
    assert joined == Joined(JoinEnd.UP_TO_DATE)
    assert j.joiner.client is None and j.replica.step == 0


def test_caught_up_it_copies_replays_verifies_and_is_admitted_when_ready():
    a = Source("r0")
    j = Joining(a)
    a.on_log = j.admit_when_ready
    j.push(named(a))
    joined = j.join()
    assert joined.end is JoinEnd.CAUGHT_UP and joined.report is not None
    assert (joined.report.source, joined.report.snapshot_step, joined.report.attempts) == ("r0", 5, 1)
    assert j.replica.step == a.head and j.replica.value == a.value_at(a.head), "replayed the log to its head"
    assert j.joiner.verified and j.reporting.current.ready and j.reporting.current.catching_up
    assert j.joiner.client is a and not a.closed, "the source stays held for the last gap of the first step"
    j.joiner.finish()  # (JoinSession.finish, once the first step is committed)
    assert a.closed and a.released == [5] and not j.reporting.current.catching_up


def test_a_source_lost_mid_transfer_is_replaced_by_the_next_one_named():
    b = Source("r1", snapshot_step=6)
    j = Joining(b)

    def lost(a: Source) -> None:
        j.push(named(b, quorum_id=7))  # the coordinator saw r0 die and names r1
        raise CatchUpError("connection reset by r0")

    a = Source("r0", on_fetch=lost)
    j.reach(a)
    b.on_log = j.admit_when_ready
    j.push(named(a))
    joined = j.join()
    assert joined.end is JoinEnd.CAUGHT_UP and joined.report is not None
    assert (joined.report.source, joined.report.snapshot_step, joined.report.attempts) == ("r1", 6, 2)
    assert a.closed and a.released == [5], "the lost source's snapshot is let go"
    assert j.replica.step == b.head


def test_a_source_the_coordinator_moves_it_from_is_left_for_the_new_one():
    b = Source("r1")
    j = Joining(b)
    a = Source("r0", on_log=lambda a: j.push(named(b, quorum_id=7)))
    j.reach(a)
    b.on_log = j.admit_when_ready
    j.push(named(a))
    joined = j.join()
    assert joined.end is JoinEnd.CAUGHT_UP and joined.report is not None and joined.report.source == "r1"
    assert a.closed


def test_a_failed_source_is_tried_again_after_a_pause_when_no_other_is_named():
    j = Joining()
    tries: list[int] = []

    def flaky(a: Source) -> None:
        tries.append(1)
        if len(tries) == 1:
            raise CatchUpError("timed out")

    a = Source("r0", on_fetch=flaky)
    j.reach(a)
    a.on_log = j.admit_when_ready
    j.push(named(a))
    joined = j.join()
    assert joined.end is JoinEnd.CAUGHT_UP and joined.report is not None
    assert (joined.report.attempts, len(tries)) == (2, 2), "the same source, once more"


def test_drained_during_the_transfer():
    j = Joining()
    a = Source("r0", on_fetch=lambda a: j.lifecycle.request_drain("SIGTERM"))
    j.reach(a)
    j.push(named(a))
    joined = j.join()
    assert joined.end is JoinEnd.DRAINED and joined.detail == "drained while catching up"
    assert a.closed and not j.reporting.current.catching_up, "the source is let go"


def test_drained_while_following_the_log():
    j = Joining()
    a = Source("r0", head=50, on_log=lambda a: j.lifecycle.request_drain("fthsdp drain"))
    j.reach(a)
    j.push(named(a))
    joined = j.join()
    assert joined.end is JoinEnd.DRAINED and joined.detail.startswith("drained while catching up, at step ")
    assert a.closed


@pytest.mark.parametrize("how", ["SIGTERM", "the coordinator"])
def test_drained_while_waiting_for_a_source_or_the_admission(how):
    j = Joining()
    if how == "SIGTERM":
        j.lifecycle.request_drain("SIGTERM")
    else:
        j.push(pb.WatchEvent(quorum=pb.Quorum(id=3, member_count=2), drain_requested=True))
    joined = j.join()
    assert joined == Joined(JoinEnd.DRAINED, "drained while waiting for admission")


def test_the_job_finished_before_it_came():
    j = Joining()
    j.push(pb.WatchEvent(quorum=pb.Quorum(id=9, member_count=0), finished=pb.JobFinished(step=500)))
    joined = j.join()
    assert joined == Joined(JoinEnd.JOB_FINISHED, "job default finished at step 500")


def test_a_replay_that_disagrees_with_the_source_fails_the_join():
    j = Joining()
    a = Source("r0", diverges=True)
    j.reach(a)
    j.push(named(a))
    with pytest.raises(CatchUpFailed, match="the replay contract"):
        j.join()


def test_neither_a_source_nor_the_admission_in_time_fails_the_join():
    j = Joining()
    j.push(pb.WatchEvent(quorum=pb.Quorum(id=3, member_count=2), reason="forming"))
    with pytest.raises(FthsdpError, match="neither admitted nor given a catch-up source in time"):
        j.join(timeout=0.2)


def test_a_quorum_smaller_than_the_script_waits_for_does_not_admit_it():
    j = Joining()
    j.push(admitted(members=1))
    with pytest.raises(FthsdpError, match="in time"):
        j.join(timeout=0.2, min_members=2)
    j.push(admitted(members=1, last_drop_id=4))  # once the job lost a member, any number trains
    assert j.join(timeout=0.2, min_members=2).end is JoinEnd.UP_TO_DATE


def restore_push(step: int, *, digest: str = "d1", admit: bool = False) -> pb.WatchEvent:
    event = admitted() if admit else pb.WatchEvent(quorum=pb.Quorum(id=4, member_count=2))
    event.restore.CopyFrom(pb.CheckpointRecord(path=f"/ckpt/step-{step}", digest=digest, step=step))
    return event


def test_the_job_restored_from_a_checkpoint_is_loaded_then_joined():
    j = Joining(step=3)
    j.push(restore_push(40, admit=True))
    joined = j.join()
    assert joined.end is JoinEnd.UP_TO_DATE and j.replica.restored == ["/ckpt/step-40"] and j.replica.step == 40


def test_a_checkpoint_it_cannot_load_is_refused_once_and_not_tried_again():
    j = Joining(step=3)
    j.replica.refuse_restore = True
    j.push(restore_push(40))
    with pytest.raises(FthsdpError, match="in time"):
        j.join(timeout=0.3)
    assert j.reporting.current.refused_checkpoint == ("d1", "/ckpt/step-40: corrupt")
    assert j.joiner.refused == {"d1"}
    j.replica.refuse_restore = False
    j.push(restore_push(30, digest="d0", admit=True))  # the coordinator falls back to the one before
    assert j.join().end is JoinEnd.UP_TO_DATE and j.replica.restored == ["/ckpt/step-30"]


def test_a_checkpoint_refused_after_part_of_it_loaded_never_trains_as_it_is():
    """The state is neither its own nor the checkpoint's: admitted as it is
    (an operator gave the state up), the replica stops instead of training."""
    j = Joining(step=3)
    j.replica.refuse_restore = "in part"
    j.push(restore_push(40))
    with pytest.raises(FthsdpError, match="in time"):
        j.join(timeout=0.3)
    assert j.joiner.torn and j.reporting.current.refused_checkpoint == ("d1", "/ckpt/step-40: corrupt")
    j.push(admitted())
    with pytest.raises(StateTorn, match="partly replaced by a checkpoint it then refused"):
        j.join()


@pytest.mark.parametrize("whole", ["the checkpoint before", "a source's snapshot"])
def test_a_state_replaced_whole_after_a_partial_load_trains(whole):
    j = Joining(step=3)
    j.replica.refuse_restore = "in part"
    j.push(restore_push(40))
    with pytest.raises(FthsdpError, match="in time"):
        j.join(timeout=0.3)
    j.replica.refuse_restore = False
    if whole == "the checkpoint before":
        j.push(restore_push(30, digest="d0", admit=True))
        assert j.join().end is JoinEnd.UP_TO_DATE and j.replica.restored == ["/ckpt/step-30"]
    else:
        a = Source("r0")
        j.reach(a)
        a.on_log = j.admit_when_ready
        j.push(named(a))
        assert j.join().end is JoinEnd.CAUGHT_UP
    assert not j.joiner.torn
