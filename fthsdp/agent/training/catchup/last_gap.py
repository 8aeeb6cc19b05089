"""A joiner's last gap, closed inside its first all-reduce in the members' quorum.

FTAR (fthsdp/agent/training/ftar/allreduce.py) asks a joiner what it must do
before it can go on, through the ``Joining`` interface
(fthsdp/agent/training/ftar/results.py); this answers from the catch-up
source's log, on the training thread: replay up to a step (``close_gap``,
``replay_to``), read the members' inputs of the step they wait in
(``enter_step``), and, while the joiner waits for the members in a new
group, replay what they commit meanwhile (``while_waiting``). A
source lost meanwhile (killed, drained, taken out) is replaced by the next
one the coordinator names for this replica; only a joiner that gets none in
time has lost the state (``StateNotHeld``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol, TypeVar

from fthsdp.agent.training.catchup.client import CatchUpError, SourceClient
from fthsdp.agent.training.catchup.replay import Replayer
from fthsdp.agent.training.catchup.source import ServedState
from fthsdp.core.errors import FtarError, StateNotHeld
from fthsdp.protos.v1 import catchup_pb2 as cpb

log = logging.getLogger("fthsdp.agent.manager")

T = TypeVar("T")
MAX_SOURCES = 3
"""Catch-up sources a joiner tries within one request before it has lost the state."""



def require_state_held(replica_id: str, step: int, members_step: int) -> None:
    """A joiner whose first all-reduce had no gradient of anyone's (every
    member was lost as it joined) holds the committed state only if it saw
    the members' step in an agree and replayed up to it; otherwise it must
    not go on: the job's state lives on only where someone holds it."""
    if members_step != step:
        raise StateNotHeld(
            f"replica {replica_id} was admitted at step {step}, but every member was lost before it reached "
            f"their state (last seen at step {members_step}); it leaves so that the coordinator keeps the job "
            "waiting for a replica that holds the state"
        )


class GapSources(Protocol):
    """Where a joiner's last gap is read from (the ``Joiner``: fthsdp/agent/training/catchup/joiner.py)."""

    def gap_client(self) -> SourceClient | None:
        """The connection to this joiner's catch-up source (None without one)."""
        ...

    def switch_source(self) -> SourceClient | None:
        """The source was lost: a connection to the next one the coordinator names (None if none comes in time)."""
        ...


class LastGap:
    """A joiner's answers to FTAR (a ``Joining``)."""

    def __init__(self, replayer: Replayer, source: ServedState, timeout: float, replica_id: str,
                 sources: GapSources, moved: Callable[[], None]) -> None:
        """``source``: what this rank serves (it publishes the inputs it enters a step with);
        ``moved``: called when the state's step moved."""
        self.replayer = replayer
        self.source = source
        self.timeout = timeout
        self.replica_id = replica_id
        self._sources = sources
        self._moved = moved
        self._join_inputs: cpb.LogEntry | None = None
        self.taken: cpb.LogEntry | None = None
        """The members' inputs this joiner entered its step with (None: its own)."""

    def while_waiting(self) -> None:
        """Between FTAR's polls of the collective this joiner waits in for the
        members to arrive in its new group: replay what they committed
        meanwhile, one step at a time, so that little is left when they come."""
        client = self._sources.gap_client()
        if client is None:
            return
        try:
            self.replayer.replay_available(client)
        except CatchUpError as e:
            log.debug("following the log while waiting for the members: %s", e)
        self._moved()

    def _from_source(self, head: int, action: Callable[[SourceClient], T]) -> T:
        """``action(client)`` on the catch-up source; if the source is lost
        (killed, drained, taken out), again on the next one the coordinator
        names, so that a joiner never restarts for a source that died while
        another member holds the state. Only a joiner left with no source
        in time has lost the state."""
        for attempt in range(MAX_SOURCES):
            client = self._source(head)
            try:
                return action(client)
            except CatchUpError as e:
                log.warning("replica %s: the catch-up source was lost at step %d (%s); asking for another",
                            self.replica_id, self.replayer.step, e)
                if attempt + 1 == MAX_SOURCES or self._sources.switch_source() is None:
                    raise self._lost(head, e) from e
        raise AssertionError("unreachable")

    def _source(self, head: int) -> SourceClient:
        client = self._sources.gap_client()
        if client is None:
            raise FtarError(
                f"this replica is at step {self.replayer.step}, the quorum at {head}, and it has no catch-up source"
            )
        return client

    def _lost(self, head: int, e: CatchUpError) -> StateNotHeld:
        return StateNotHeld(
            f"replica {self.replica_id} (at step {self.replayer.step}) lost its catch-up source before it reached "
            f"the members' step {head}: {e}"
        )

    def _take_inputs(self, entry: cpb.LogEntry) -> None:
        """Enter the members' step ``entry.step`` with their recorded inputs."""
        self.replayer.state.apply_inputs(entry)
        self.taken = entry
        self.source.publish_inputs(entry)
        self._moved()

    def close_gap(self, step: int, head: int) -> int:
        """The members are at ``head`` and this joiner, with a gradient for
        ``step``, two or more steps behind (admitted while it still
        replayed): replay up to ``head - 1`` and take that step's inputs;
        FTAR then hands over the members' sum of ``head - 1``."""
        if step != self.replayer.step:
            raise FtarError(f"internal: FTAR closes the gap from step {step}, the state is at {self.replayer.step}")
        target = head - 1

        def replay(client: SourceClient):
            self.replayer.replay_until(client, target, self.timeout)
            return client.log(target, wait=self.timeout)[0]

        entries = self._from_source(head, replay)
        if not entries or entries[0][0].step != target:
            raise FtarError(f"the catch-up source has no log entry of step {target}")
        self._take_inputs(entries[0][0])
        return self.replayer.step

    def enter_step(self, head: int) -> None:
        """About to join the members' data all-reduce of step ``head``: read
        their inputs of ``head`` now, while they wait in it (the steps still
        missing are replayed while it runs: ``replay_to``)."""
        def read(client: SourceClient) -> cpb.LogEntry:
            inputs = client.inputs()
            if inputs.step < head:  # it left the quorum (drained, or taken out) before the members' step
                raise CatchUpError(f"it stopped at step {inputs.step}, before the quorum's {head}")
            return inputs

        inputs = self._from_source(head, read)
        if inputs.step != head:
            raise FtarError(f"the catch-up source is at step {inputs.step}, ahead of the quorum's {head}")
        self._join_inputs = inputs
        return None

    def replay_to(self, head: int) -> int:
        if self.replayer.step > head:
            raise FtarError(f"this replica is at step {self.replayer.step}, ahead of the quorum's {head}")
        self._from_source(head, lambda client: self.replayer.replay_until(client, head, self.timeout))
        assert self._join_inputs is not None  # FTAR calls enter_step before replay_to
        self._take_inputs(self._join_inputs)
        return self.replayer.step
