"""The state a joiner brings to the members' step, as the Joiner sees it.

The Joiner (fthsdp/agent/training/catchup/joiner.py) moves this rank's state forward
by a source's snapshot and log; this object is all it can touch: the state,
its replayer, and what the coordinator hears of the progress. It implements
``joiner.CatchingUp``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fthsdp.agent.training.catchup.replay import Replayer, combine_hex
from fthsdp.agent.training.checkpoint.errors import CheckpointError, PartlyLoaded
from fthsdp.agent.training.session.replica_group import ReplicaGroup
from fthsdp.agent.training.session.report import Reporting
from fthsdp.agent.training.state.checksum import HASHES, STATE_HASH
from fthsdp.agent.training.state.train_state import TrainState
from fthsdp.core.errors import FthsdpError
from fthsdp.protos.v1 import catchup_pb2 as cpb


class CatchUpTarget:
    def __init__(self, state: TrainState, replayer: Replayer, reporting: Reporting, leader: bool, *,
                 job: str, structure: int) -> None:
        """``reporting``: what this rank tells the coordinator (fthsdp/agent/training/session/report.py);
        ``leader``: rank 0 of the replica group, which reports the transfer's progress;
        ``job``, ``structure``: what a checkpoint it restores must be of."""
        self._job, self._structure = job, structure
        self._state = state
        self._replayer = replayer
        self._reporting = reporting
        self._leader = leader

    @property
    def step(self) -> int:
        return self._replayer.step

    def load_snapshot(self, state: dict[str, Any], step: int) -> None:
        self._state.load(state)
        self._replayer.loaded(step)
        self.moved()

    def replay(self, entry: cpb.LogEntry, total: torch.Tensor) -> None:
        self._replayer.replay(entry, total)
        self.moved()

    def verify(self, entry: cpb.LogEntry, group: ReplicaGroup) -> bool:
        return self._replayer.verify(entry, group)

    def report_progress(self, done: int, total: int) -> None:
        if self._leader:
            self._reporting.publish(catch_up_progress=(done, total))

    def restore(self, path: str, digest: str, rank: int) -> str:
        """Load this rank's part of the checkpoint at ``path`` (recorded with
        ``digest``; "" for any); returns the state checksum it recorded ("" if
        none). CheckpointError when it is refused; PartlyLoaded when part of
        it was loaded into the state first (fthsdp/agent/training/checkpoint/restore.py),
        or the state itself did not fit: the state is then to be replaced whole."""
        # Here, not at the top: torch.distributed.checkpoint loads only where a checkpoint is read
        # (fthsdp/agent/training/checkpoint/errors.py).
        from fthsdp.agent.training.checkpoint import restore as checkpoint_restore
        from fthsdp.agent.training.checkpoint.seal import read_checkpoint

        folder = Path(path)
        record = read_checkpoint(folder, job=self._job, structure=self._structure, digest=digest)
        # A checkpoint written before the kind was recorded has a CRC-32 (fthsdp/agent/training/state/checksum.py).
        kind = str(record.get("state_checksum_kind", "crc32"))
        if kind not in HASHES:
            raise CheckpointError(f"{folder}: its state checksum is of a kind this version does not know ({kind!r})")
        params = [p for group in self._state.optimizer.param_groups for p in group["params"]]
        loaded = checkpoint_restore.load(folder, record, rank=rank, current=self._state.capture(), params=params)
        try:
            self._state.load(loaded)
        except FthsdpError as e:
            raise PartlyLoaded(f"{folder}: the state does not fit this replica: {e}") from e
        self._replayer.loaded(record["step"])
        self.moved()
        checksum = str(record.get("state_checksum", ""))
        return f"{kind}:{checksum}" if checksum else ""

    def state_checksum(self, group: ReplicaGroup, kind: str = STATE_HASH) -> str:
        """The state's checksum, as the members report it (a collective over the group), in the hash ``kind``."""
        return combine_hex(self._replayer.part_checksums(group, kind))

    def moved(self) -> None:
        """The state's step moved (a replay, a snapshot): heartbeats report it."""
        self._reporting.publish(step=self._replayer.step)
