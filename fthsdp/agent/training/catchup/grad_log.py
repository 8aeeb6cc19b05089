"""The bounded log of the summed gradients of a replica's recent steps.

A joiner that loaded a snapshot of step ``s`` closes the gap to the head by
replaying the optimizer steps it missed: for each step ``t >= s`` it applies
``total_t / contributors_t`` with the hyperparameters the members used at
``t``, which gives a bit-identical state with the same optimizer on the same
device type (the joiner then checks that against a state checksum from the
source). The members already hold each step's sum (FTAR's result); keeping a
reference to it costs no copy, only memory.

How much is kept: the last ``keep_steps`` entries always (enough to close
the last gap when the joiner is admitted), and every entry from the oldest
*pinned* step on while a snapshot is being served, up to ``max_bytes``
(beyond that the oldest go and a joiner that still needed them takes a
fresh snapshot).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import threading
import time
from collections.abc import Callable, Mapping

import torch

from fthsdp.agent.training.state.checksum import digest64
from fthsdp.agent.training.state.codec import dtype_name
from fthsdp.protos.v1 import catchup_pb2 as cpb


@dataclasses.dataclass
class Record:
    entry: cpb.LogEntry
    data: torch.Tensor
    """The flat sum of the step's gradients (this rank's shards)."""
    readers: int = 0
    """Catch-up servers sending it now (``read`` until ``done``)."""
    dropped: bool = False
    """The log let it go while it was being read: handed back at ``done``."""

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def payload(self) -> memoryview:
        """The raw bytes, on the host; their digest is computed on first use."""
        data = self.data if self.data.device.type == "cpu" else self.data.cpu()
        view = data.contiguous().view(torch.uint8).numpy().data.cast("B")
        if not self.entry.xxh3 and self.entry.numel:
            self.entry.xxh3 = digest64(view)
        return view


class GradientLog:
    def __init__(self, keep_steps: int = 4, max_bytes: int = 2 << 30,
                 on_drop: Callable[[torch.Tensor], None] = lambda data: None) -> None:
        """``on_drop(data)``: an entry's sum is let go and nobody reads it
        any more (fthsdp/agent/training/ftar/buffer_pool.py reuses its buffer)."""
        if keep_steps < 1 or max_bytes < 0:
            raise ValueError("keep_steps must be >= 1 and max_bytes >= 0")
        self._on_drop = on_drop
        self.keep_steps = keep_steps
        self.max_bytes = max_bytes
        self._records: collections.OrderedDict[int, Record] = collections.OrderedDict()
        self._bytes = 0
        self._pins: collections.Counter[int] = collections.Counter()
        self._head = 0
        self._cond = threading.Condition()

    def append(
        self,
        inputs: cpb.LogEntry,
        total: torch.Tensor,
        contributors: int,
        quorum_id: int,
        checksum_after: str = "",
        part_checksums: str = "",
    ) -> None:
        """Record the sum that took the state from ``inputs.step`` to the
        next step, with the step's recorded inputs (fthsdp/agent/training/state/train_state.py) and
        the state checksum after it, if one was computed."""
        entry = cpb.LogEntry()
        entry.CopyFrom(inputs)
        entry.contributors, entry.quorum_id = contributors, quorum_id
        entry.dtype, entry.numel = dtype_name(total.dtype), total.numel()
        entry.checksum_after, entry.part_checksums_json = checksum_after, part_checksums
        step = entry.step
        with self._cond:
            if self._records and step != next(reversed(self._records)) + 1:
                for old in self._records.values():  # a gap (this replica was out): older entries cannot be replayed
                    self._drop(old)
                self._records.clear()
                self._bytes = 0
            record = Record(entry, total.detach())
            self._records[step] = record
            self._bytes += record.nbytes
            self._head = step + 1
            self._trim()
            self._cond.notify_all()

    def set_checksum_after(self, step: int, checksum: str, parts: Mapping[str, str] | None = None) -> None:
        """The state checksum after entry ``step`` (and its parts), computed after the entry was logged."""
        with self._cond:
            record = self._records.get(step)
            if record is not None:
                record.entry.checksum_after = checksum
                if parts is not None:
                    record.entry.part_checksums_json = json.dumps(dict(parts), separators=(",", ":"))

    def pin(self, step: int) -> None:
        """Keep every entry from ``step`` on (within ``max_bytes``) until unpinned."""
        with self._cond:
            self._pins[step] += 1

    def unpin(self, step: int) -> None:
        with self._cond:
            self._pins[step] -= 1
            if self._pins[step] <= 0:
                del self._pins[step]
            self._trim()

    def _trim(self) -> None:
        floor = min(self._pins) if self._pins else self._head
        while len(self._records) > self.keep_steps:
            oldest = next(iter(self._records))
            if oldest >= floor and self._bytes <= self.max_bytes:
                break
            record = self._records.pop(oldest)
            self._bytes -= record.nbytes
            self._drop(record)

    def _drop(self, record: Record) -> None:
        if record.readers:
            record.dropped = True
        else:
            self._on_drop(record.data)

    @property
    def head(self) -> int:
        """The step the next entry will have (the replica's committed step)."""
        return self._head

    def read(self, from_step: int, max_bytes: int, wait: float = 0.0) -> tuple[list[Record], int, int]:
        """Entries from ``from_step`` on (at least one if any, then up to
        ``max_bytes``), waiting up to ``wait`` seconds for one to exist.
        Returns (records, head step, oldest step held). The caller says
        ``done(records)`` once it has sent them."""
        deadline = time.monotonic() + wait
        with self._cond:
            while self._head <= from_step and self._cond.wait(max(0.0, deadline - time.monotonic())):
                pass
            oldest = next(iter(self._records)) if self._records else self._head
            out: list[Record] = []
            size = 0
            step = from_step
            while step in self._records:
                record = self._records[step]
                if out and size + record.nbytes > max_bytes:
                    break
                out.append(record)
                size += record.nbytes
                step += 1
            for record in out:
                record.readers += 1
            return out, self._head, oldest

    def done(self, records: list[Record]) -> None:
        """The records of a ``read`` are sent: those let go meanwhile are handed back now."""
        with self._cond:
            for record in records:
                record.readers -= 1
                if record.dropped and not record.readers:
                    record.dropped = False
                    self._on_drop(record.data)
