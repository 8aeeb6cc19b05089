"""A rank's side of the coordinator's hang verdict (fthsdp/coordinator/decisions/hang.py).

When the coordinator takes this replica out for making no progress, the
rank's training thread is by definition stuck somewhere; another thread can
still say where. The first notice for this incarnation dumps every thread's
stack to stderr (the rank's log, where the agent keeps it) with
``faulthandler``, which works even while the stuck thread holds locks; the
node agent then ends the ranks and restarts them (fthsdp/agent/node/hang_watch.py).

The ranks share their stderr with the agent, whose ``--log-format json``
records are whole lines. ``faulthandler`` writes a stack in many small
pieces, so a record the agent wrote meanwhile (it is told of the same verdict
at the same moment) would land inside a line of the dump and be lost to a
log shipper. The dump goes to a temporary file first and then to stderr in
one write.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import tempfile

from fthsdp.protos.v1 import coordinator_pb2 as pb

STUCK_PROBE_WAIT = 5.0
"""The coordinator's wait for probe answers (fthsdp/coordinator/decisions/stuck.py PROBE_WAIT)."""

log = logging.getLogger("fthsdp.agent.manager")

WAIT_MARGIN_INTERVALS = 3
"""Heartbeat intervals added to the coordinator's hang limit before a
collective gives up: its verdict needs a report from the waiter past the
limit and one from the hung member, then a decision."""


class HangNotices:
    """A Membership listener: dumps the stacks once per incarnation, and
    keeps the coordinator's latest hang horizon for FTAR's waits."""

    def __init__(self, replica_id: str, shard_rank: int, restart_count: int) -> None:
        self.replica_id = replica_id
        self.shard_rank = shard_rank
        self.restart_count = restart_count
        self.dumped = False
        self._horizon = 0.0

    def __call__(self, event: pb.WatchEvent) -> None:
        if event.hang_limit_s:
            margin = WAIT_MARGIN_INTERVALS * (event.heartbeat_interval_s or 1.0) + 1.0
            # A collective stuck with every member inside is regrouped after
            # one limit and probed after another (fthsdp/coordinator/decisions/stuck.py): its
            # members wait out both before any gives up.
            self._horizon = 2 * event.hang_limit_s + STUCK_PROBE_WAIT + margin
        if event.HasField("hang") and event.hang.restart_count == self.restart_count and not self.dumped:
            self.dumped = True
            log.error("replica %s rank %d: %s; its stacks follow", self.replica_id, self.shard_rank, event.hang.reason)
            heading = (f"fthsdp: replica {self.replica_id} rank {self.shard_rank} taken out by the coordinator: "
                       f"{event.hang.reason}. Stacks of every thread:\n")
            try:
                dump = stacks()
            except OSError:  # no room for the temporary file: the stacks in pieces rather than none
                print(heading, end="", file=sys.stderr, flush=True)
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                return
            write_whole(heading.encode() + dump)

    def horizon(self) -> float:
        """Seconds a collective waits at least for the coordinator to blame a hung member."""
        return self._horizon


def stacks() -> bytes:
    """Every thread's stack as ``faulthandler`` prints it."""
    with tempfile.TemporaryFile() as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.seek(0)
        return f.read()


def write_whole(data: bytes) -> None:
    """``data`` on stderr in as few writes as the kernel takes (one, for a file or a pipe's
    first 64 KiB), after whatever Python buffered there."""
    sys.stderr.flush()
    fd = sys.stderr.fileno()
    while data:
        data = data[os.write(fd, data):]
