"""What the demo saw: the ranks' JSON lines and the coordinator's status over time.

Filled from the stdout reader threads and the status poller, read by the
live view, the summary and the report. Times are on CLOCK_MONOTONIC, which
every process on the machine shares, so the ranks' own ``t`` fields and the
demo's clock compare directly. ``wait_for`` is how the scenario waits: on a
condition over what was recorded, woken by every new record, with a deadline.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable

from fthsdp.coordinator.decisions.status_view import AGENT_STATE_NAMES, STATE_NAMES
from fthsdp.core.errors import FthsdpError


class DemoFailed(FthsdpError):
    """The scenario did not go as it should (a deadline passed, a process died)."""


@dataclasses.dataclass(frozen=True)
class StepLine:
    """One committed step, as a rank printed it."""

    replica: str
    step: int
    loss: float
    quorum: int
    contributors: int
    t: float


@dataclasses.dataclass(frozen=True)
class RankStart:
    """A training process that finished ``Manager.start()`` (admitted, or caught up)."""

    replica: str
    pid: int
    start_step: int
    quorum: int
    t: float
    catch_up: dict | None


@dataclasses.dataclass(frozen=True)
class ReplicaView:
    state: str
    agent_state: str
    step: int
    restart_count: int
    catch_up_source: str
    catch_up_bytes: int
    catch_up_total_bytes: int


@dataclasses.dataclass(frozen=True)
class StatusSample:
    """The coordinator's Status at time ``t``."""

    t: float
    quorum_id: int
    members: tuple[str, ...]
    quorum_created_unix_ms: int
    quorum_reason: str
    replicas: dict[str, ReplicaView]
    quorum_step: int = 0
    """The step the quorum was formed at (the newest any member had reported)."""
    checkpoint_step: int = 0
    """The job's newest complete checkpoint (0: none yet)."""
    checkpoint_path: str = ""
    restored_step: int = 0
    """The checkpoint the coordinator last restored the lost state from (0: never)."""
    restored_path: str = ""
    lost_step: int = 0
    """That restore's lost committed step: the steps after ``restored_step`` up to it were lost."""
    restore_unix_ms: int = 0
    """When the coordinator decided that restore."""
    restore_requested_by: str = ""

    @classmethod
    def from_status(cls, status, t: float) -> StatusSample:
        has_quorum = status.HasField("quorum")
        has_checkpoint = status.HasField("checkpoint")
        restore = status.last_restore if status.HasField("last_restore") else None
        return cls(
            t=t,
            quorum_id=status.quorum.id if has_quorum else 0,
            members=tuple(m.replica_id for m in status.quorum.members) if has_quorum else (),
            quorum_created_unix_ms=status.quorum.created_unix_ms if has_quorum else 0,
            quorum_reason=status.quorum.reason if has_quorum else "",
            replicas={
                r.replica_id: ReplicaView(
                    state=STATE_NAMES.get(r.state, "unknown"),
                    agent_state=AGENT_STATE_NAMES.get(r.agent_state, ""),
                    step=r.step,
                    restart_count=r.restart_count,
                    catch_up_source=r.catch_up_source,
                    catch_up_bytes=r.catch_up_bytes,
                    catch_up_total_bytes=r.catch_up_total_bytes,
                )
                for r in status.replicas
            },
            quorum_step=status.quorum.step if has_quorum else 0,
            checkpoint_step=status.checkpoint.step if has_checkpoint else 0,
            checkpoint_path=status.checkpoint.path if has_checkpoint else "",
            restored_step=restore.checkpoint.step if restore is not None else 0,
            restored_path=restore.checkpoint.path if restore is not None else "",
            lost_step=restore.lost_step if restore is not None else 0,
            restore_unix_ms=restore.unix_ms if restore is not None else 0,
            restore_requested_by=restore.requested_by if restore is not None else "",
        )


def short_reason(reason: str) -> str:
    """A quorum's reason without the counts the coordinator appends ("... [3 alive; ...]")."""
    return reason.split(" [")[0].rstrip(".")


def json_objects(text: str) -> list[dict]:
    """The JSON objects on one line of a rank's output, in order; other output is ignored.

    One line can hold several: Python unbuffered (as the demo runs its
    children) writes a printed line and its newline in two writes, so a rank
    SIGKILLed between them leaves its last object without a newline, and the
    next rank on the same agent's stdout (its restart) goes on on that line.
    Ranks sharing an agent's stdout can interleave so too."""
    decoder, i = json.JSONDecoder(), 0
    out: list[dict] = []
    while True:
        i = text.find("{", i)
        if i < 0:
            return out
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i += 1
            continue
        if isinstance(obj, dict):
            out.append(obj)


class Recorder:
    def __init__(self, replica_ids: list[str]) -> None:
        self.replica_ids = list(replica_ids)
        self.started = time.monotonic()
        self.wall_offset = time.time() - self.started
        """Add to a monotonic time for the Unix time (the coordinator's quorum timestamps)."""
        self._changed = threading.Condition()
        self.steps: dict[str, list[StepLine]] = {r: [] for r in replica_ids}
        self.starts: dict[str, list[RankStart]] = {r: [] for r in replica_ids}
        self.done: dict[str, int] = {}
        self.failing: dict[str, dict] = {}
        """A rank's own line as it fails on purpose ({"failing": HOW, "step": N, ...})."""
        self.coordinator_address = ""
        self.samples: list[StatusSample] = []
        self.events: list[tuple[float, str]] = []
        self.listeners: list[Callable[[str, object], None]] = []
        """Called (under no lock) with ("step", StepLine), ("event", text) or ("start", RankStart)."""

    # ----- writers (reader threads, the poller, the scenario) -----------------------

    def rank_line(self, replica: str, text: str, t_read: float) -> None:
        for obj in json_objects(text):
            self._rank_object(replica, obj, t_read)

    def _rank_object(self, replica: str, obj: dict, t_read: float) -> None:
        if "loss" in obj and "step" in obj:
            self._add("step", StepLine(replica, int(obj["step"]), float(obj["loss"]), int(obj.get("quorum", 0)),
                                       int(obj.get("replicas", 0)), float(obj.get("t", t_read))))
        elif "start_step" in obj:
            self._add("start", RankStart(replica, int(obj["pid"]), int(obj["start_step"]), int(obj.get("quorum", 0)),
                                         float(obj.get("t", t_read)), obj.get("catch_up")))
        elif "done" in obj:
            with self._changed:
                self.done[replica] = int(obj["done"])
                self._changed.notify_all()
        elif "failing" in obj:
            with self._changed:
                self.failing[replica] = obj
                self._changed.notify_all()

    def coordinator_line(self, text: str, t_read: float) -> None:
        """The coordinator's start-up line names the address it serves on."""
        if "listening on " in text:
            with self._changed:
                self.coordinator_address = text.split("listening on ")[1].split()[0]
                self._changed.notify_all()

    def status(self, status, t: float) -> StatusSample:
        """Record a Status the coordinator answered at ``t``; returns its sample."""
        sample = StatusSample.from_status(status, t)
        with self._changed:
            self.samples.append(sample)
            self._changed.notify_all()
        return sample

    def event(self, text: str) -> None:
        self._add("event", text)

    def _add(self, kind: str, item) -> None:
        with self._changed:
            if kind == "step":
                self.steps[item.replica].append(item)
            elif kind == "start":
                self.starts[item.replica].append(item)
            else:
                self.events.append((time.monotonic(), item))
            self._changed.notify_all()
        for listener in list(self.listeners):
            listener(kind, item)

    # ----- readers ------------------------------------------------------------------

    def wait_for(self, predicate: Callable[[], object], timeout: float, what: str,
                 check: Callable[[], None] | None = None):
        """Wait until ``predicate()`` (called under the lock) is truthy and return
        its value; ``check`` may raise to end the wait early (a process died).
        Raises DemoFailed naming ``what`` when ``timeout`` passes first."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                value = predicate()
                if value:
                    return value
                if check is not None:
                    check()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DemoFailed(f"{what} did not happen within {timeout:g}s")
                self._changed.wait(min(left, 0.5))  # woken by every record; the bound re-runs check()

    def latest(self) -> StatusSample | None:
        return self.samples[-1] if self.samples else None

    def last_step(self, replica: str) -> StepLine | None:
        lines = self.steps[replica]
        return lines[-1] if lines else None

    def snapshot(self) -> dict:
        """A consistent copy for the live view."""
        with self._changed:
            return {
                "latest": self.latest(),
                "last_steps": {r: self.last_step(r) for r in self.replica_ids},
                "done": dict(self.done),
                "events": list(self.events[-8:]),
                "elapsed": time.monotonic() - self.started,
            }


@dataclasses.dataclass
class Failure:
    """The failure the demo injected, and when (monotonic and Unix time)."""

    replica: str
    mode: str
    pid: int
    step: int
    """The failing replica's last committed step when it was hit."""
    t: float
    wall: float
    quorum_before: int
    killed_t: float = 0.0
    """When the training process was SIGKILLed: at once for kill, after the
    coordinator dropped it for hang; for deadlock, when its agent had ended it."""
    stacks_in: str = ""
    """deadlock: the log holding the stack dump of the process taken out (empty: none found)."""
    pids: dict[str, int] = dataclasses.field(default_factory=dict)
    """kill-all: every replica's training process SIGKILLed, by replica (``replica`` is "all",
    ``pid`` the last one's, ``step`` the newest step any of them had committed)."""
