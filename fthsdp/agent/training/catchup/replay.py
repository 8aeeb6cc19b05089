"""Replaying logged steps: the one place a joiner's state moves forward without training.

Every replay, wherever it happens (the catch-up in ``start()``, the last gap
closed inside the first all-reduce in a new quorum, the steps the members
commit while a joiner waits for them), is ``Replayer.replay``: restore the
step's recorded inputs, set every gradient to the members' average, run the
script's update (fthsdp/agent/training/state/train_state.py has the contract). It runs only on the
training thread, the one thread that changes the model and optimizer.
"""

from __future__ import annotations

import contextlib
import json
import zlib
from collections.abc import Callable

import torch

from fthsdp.agent.training.catchup.client import CatchUpError, SourceClient
from fthsdp.agent.training.catchup.grad_log import GradientLog
from fthsdp.agent.training.session.replica_group import ReplicaGroup
from fthsdp.agent.training.state.checksum import STATE_HASH
from fthsdp.agent.training.state.codec import StateCodecError, local
from fthsdp.agent.training.state.train_state import TrainState, check_gradient, combine, explain_mismatch
from fthsdp.protos.v1 import catchup_pb2 as cpb

LONG_POLL = 0.01
"""Seconds a joiner waiting for the members in a new group waits for the next log entry per poll."""


class ReplayMismatch(CatchUpError):
    """The replayed state differs from the source's (the message names the part)."""


class Replayer:
    """Applies logged steps to this rank's state, through the script's update."""

    def __init__(
        self, state: TrainState, params: list[torch.Tensor], update: Callable[[], object], log: GradientLog
    ) -> None:
        self.state = state
        self.params = params
        self.update = update
        self.log = log
        self._step = 0
        self.in_update = False
        """True while the update runs (live or replayed): optimizer.step() is allowed only then."""
        self.replaying = False
        """True while the update runs for a replayed step."""
        self.contributors = 0
        """While the update runs: the replicas whose gradients the step averaged."""
        self._pending: list[tuple[cpb.LogEntry, torch.Tensor]] = []

    @property
    def step(self) -> int:
        """The step this rank's state is at (the next step to train). It moves
        here alone: by one with every update (``run_update``), or to the step of
        a state loaded whole (``loaded``)."""
        return self._step

    def loaded(self, step: int) -> None:
        """The state was replaced by one at ``step`` (a snapshot, a checkpoint)."""
        self._step = step

    @contextlib.contextmanager
    def updating(self, contributors: int, replay: bool = False):
        self.in_update, self.replaying, self.contributors = True, replay, contributors
        try:
            yield
        finally:
            self.in_update = self.replaying = False

    def apply_sum(self, total: torch.Tensor, contributors: int) -> None:
        """A step's sum, live or replayed: every gradient := its slice of
        ``total`` / ``contributors`` (one pass, in place when it exists), then
        the batch-norm statistics := the first contributor's, which follow
        (fthsdp/agent/training/state/running_buffers.py)."""
        offset = 0
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)  # (a DTensor for an FSDP2 parameter)
            grad = local(p.grad)
            n = grad.numel()
            piece = total[offset : offset + n].view_as(grad)
            torch.div(piece.to(grad.device) if piece.device != grad.device else piece, contributors, out=grad)
            offset += n
        if self.state.running.carries:
            self.state.running.load(total[offset:])

    def run_update(self, contributors: int, sample: torch.Tensor | None, replayed: bool) -> None:
        """The script's update on the step's averaged gradients, which must be
        as the all-reduce left them (``sample``: their first elements then);
        the state then is at the next step."""
        check_gradient(self.params[0], sample)
        with self.updating(contributors, replay=replayed):
            self.update()
        self._step += 1

    def numel(self) -> int:
        """Elements of a logged sum: the gradients, then the batch-norm statistics."""
        return sum(local(p).numel() for p in self.params) + self.state.running.numel()

    def replay(self, entry: cpb.LogEntry, total: torch.Tensor) -> None:
        """Apply one logged step, exactly as the members did."""
        if entry.step != self.step:
            raise CatchUpError(f"log entry of step {entry.step}, but this replica is at step {self.step}")
        if entry.numel != self.numel():
            raise CatchUpError(f"log entry of {entry.numel} gradient elements for a model of a different size")
        try:
            self.state.apply_inputs(entry)
        except StateCodecError as e:
            raise CatchUpError(f"the inputs of step {entry.step}: {e}") from e
        self.apply_sum(total, entry.contributors)
        self.run_update(entry.contributors, None, replayed=True)
        self.log.append(entry, total, entry.contributors, entry.quorum_id)

    def replay_until(self, client: SourceClient, target: int, timeout: float) -> None:
        """Replay from the source's log until this rank is at ``target``."""
        self._pending.clear()
        while self.step < target:
            entries, _, _ = client.log(self.step, wait=timeout)
            for entry, data in entries:
                if entry.step >= target:
                    break
                self.replay(entry, data)

    def replay_available(self, client: SourceClient) -> None:
        """While waiting for the members in a new group: replay at most one
        step the source has committed meanwhile. The source is asked with a
        short long-poll (``LONG_POLL``): a tight loop of requests would cost
        its HTTP server, on a member, CPU its training needs, and a poll
        delays noticing the members' arrival by at most its wait."""
        if not self._pending:
            entries, _, _ = client.log(self.step, max_bytes=1, wait=LONG_POLL)
            self._pending = [(e, d) for e, d in entries if e.step >= self.step]
        if self._pending:
            entry, data = self._pending.pop(0)
            if entry.step == self.step:
                self.replay(entry, data)

    # ----- checksums ------------------------------------------------------------------

    def part_checksums(self, group: ReplicaGroup, kind: str = STATE_HASH) -> dict[str, str]:
        """This replica group's checksum per part (a collective over the
        group), in the hash ``kind`` (fthsdp/agent/training/state/checksum.py)."""
        parts = self.state.part_checksums(kind)
        if group.size == 1:
            return {k: f"{v:08x}" for k, v in parts.items()}
        gathered = group.all_gather_ints(list(parts.values()))
        out = {}
        for i, name in enumerate(parts):
            raw = b"".join(rank[i].to_bytes(4, "big") for rank in gathered)
            out[name] = f"{zlib.crc32(raw):08x}"
        return out

    def verify(self, entry: cpb.LogEntry, group: ReplicaGroup) -> bool:
        """After replaying ``entry``: compare with the source's checksum of
        the same state, if it sent one; raise a mismatch naming the part."""
        if not entry.checksum_after:
            return False
        mine = self.part_checksums(group)
        if combine_hex(mine) == entry.checksum_after:
            return True
        theirs = json.loads(entry.part_checksums_json) if entry.part_checksums_json else {}
        raise ReplayMismatch(explain_mismatch(mine, theirs, entry.step + 1, self.state.unrecorded))


def combine_hex(parts: dict[str, str]) -> str:
    return combine({k: int(v, 16) for k, v in parts.items()})
