"""What a replica tells the coordinator with every heartbeat, published whole.

The training thread owns the replica's state; the heartbeat and ping threads
only send what it last published. So the report is one immutable value,
replaced whole under one lock (as the step clock's progress is:
fthsdp/agent/training/step/clock.py): a heartbeat never sends a step from
one moment with a checksum from another. The training thread publishes its
step, checksums, readiness and catch-up progress; the checkpoint saver's
thread publishes the checkpoints it sealed. A change the coordinator must
hear of before the next heartbeat (ready, catching up, a checkpoint) wakes
the heartbeat at once.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from types import MappingProxyType

from fthsdp.protos.v1 import coordinator_pb2 as pb


@dataclasses.dataclass(frozen=True)
class ReplicaReport:
    step: int = 0
    """The step the state is at."""
    ready: bool = False
    """Not a member yet, caught up: it can join at the next step boundary."""
    catching_up: bool = False
    """A catch-up is under way: the coordinator waits for ``ready`` before admitting it, whatever its step."""
    wait_for_replicas: int = 0
    """The replica count the script waits for in ``start()`` (0 before it): while its
    quorum has fewer, members wait at their step, so the coordinator may vouch for an
    outsider at that step (see the proto)."""
    state_checksum: str = ""
    checksum_step: int = 0
    recent_checksums: Mapping[int, str] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    """Checksums at earlier steps, sent with each heartbeat (see the proto); an
    ``fthsdp.agent.training.state.checksum.RecentChecksums`` also carries each one's step inputs."""
    catch_up_progress: tuple[int, int] = (0, 0)
    """Snapshot bytes received and expected while catching up."""
    training_quorum_id: int = 0
    """The quorum this process trains in; sent when it registers again."""
    checkpoint: pb.CheckpointRecord | None = None
    """The newest checkpoint this replica sealed (the coordinator records it:
    fthsdp/coordinator/engine/checkpoints.py)."""
    refused_checkpoint: tuple[str, str] = ("", "")
    """(digest, why) of the last checkpoint this replica could not restore."""

    def recent(self) -> list[pb.StepChecksum]:
        """The recent checksums to report, each with the inputs of the step that produced it when known."""
        inputs = getattr(self.recent_checksums, "inputs", {})
        return [pb.StepChecksum(step=s, checksum=c, inputs=inputs.get(s, "")) for s, c in self.recent_checksums.items()]


URGENT = frozenset({"ready", "catching_up", "wait_for_replicas", "checkpoint", "refused_checkpoint"})
"""Fields whose change the coordinator hears of at once, not at the next heartbeat."""


class Reporting:
    """The published report, and the wake-up of the heartbeat that sends it."""

    def __init__(self, step: int = 0) -> None:
        self._lock = threading.Lock()
        self._report = ReplicaReport(step=step)
        self.beat_now = threading.Event()
        """Set when a heartbeat should go at once (the heartbeat thread waits on it)."""

    @property
    def current(self) -> ReplicaReport:
        """The last report published (never changed: a new one replaces it)."""
        return self._report

    def publish(self, **changes: object) -> None:
        """Replace the report with one whose ``changes`` differ (the thread that owns them)."""
        with self._lock:
            before = self._report
            self._report = dataclasses.replace(before, **changes)  # type: ignore[arg-type]
            urgent = any(k in URGENT and getattr(before, k) != v for k, v in changes.items())
        if urgent:
            self.beat_now.set()

    def set_ready(self, ready: bool) -> None:
        """Whether this replica, not a member, can join at the next step boundary."""
        self.publish(ready=ready)

    def set_catching_up(self, catching_up: bool) -> None:
        """A catch-up is under way: the coordinator then waits for ``ready``
        before admitting this replica, whatever its step (a replay may bring
        it level with the members' last heartbeats)."""
        self.publish(catching_up=catching_up)

    def set_wait_for_replicas(self, count: int) -> None:
        """How many replicas the script waits for before its first step."""
        self.publish(wait_for_replicas=count)

    def refuse_checkpoint(self, digest: str, reason: str) -> None:
        """A checkpoint this replica could not restore."""
        self.publish(refused_checkpoint=(digest, reason))
        self.beat_now.set()  # even if the same one was refused again

    def report_checkpoint(self, record: pb.CheckpointRecord) -> None:
        """A checkpoint this replica sealed (the saver's thread)."""
        self.publish(checkpoint=record)
        self.beat_now.set()


__all__ = ["URGENT", "ReplicaReport", "Reporting"]
