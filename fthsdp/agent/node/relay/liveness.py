"""Each local rank's liveness, judged on its host: a stopped process is seen in seconds.

The coordinator paces its senders to its heartbeat budget: at 12,500 hosts
a rank pings it every few seconds and is called silent only after ten
intervals, most of a minute. Its host can do better at no cost to anyone:
under the agent every rank also pings the relay every ``LOCAL_EVERY``
seconds (``HeartbeatRequest.local_only``, never forwarded), and the relay
keeps the time of each rank's latest ping of any kind. A rank whose pings
stop for ``limit`` seconds while its stream stays open (the process is
stopped, or every thread of it blocked: its training thread alone hanging
is the coordinator's progress verdict, fthsdp/coordinator/decisions/hang.py) is
``silent``, once; the agent then ends its group's ranks as it does for a
crash (fthsdp/agent/node/supervisor.py).

A rank that closes its stream (it exited, or the agent ended it), or says
it left, is no longer followed. Everything here takes the time as an
argument and does no I/O.
"""

from __future__ import annotations

import dataclasses

from fthsdp.core.relay_address import LOCAL_PING_EVERY as LOCAL_EVERY

Key = tuple[str, str, int]
"""A rank: its replica, its incarnation, its shard rank."""


@dataclasses.dataclass(frozen=True)
class Silence:
    """A rank whose pings stopped."""

    replica_id: str
    incarnation: str
    shard_rank: int
    silent_for: float
    limit: float

    def reason(self) -> str:
        return (f"rank {self.shard_rank} of {self.replica_id} sent its agent no ping for {self.silent_for:.1f}s "
                f"(limit {self.limit:g}s; it pings every {LOCAL_EVERY:g}s): the process is stopped or hung")


class Liveness:
    """The latest ping of every followed rank; ``silent`` says who stopped."""

    def __init__(self, limit: float) -> None:
        if limit <= LOCAL_EVERY:
            raise ValueError(f"the silence limit must be longer than the ping period ({LOCAL_EVERY:g}s), got {limit}")
        self.limit = limit
        self._last: dict[Key, float] = {}
        self._streams: dict[Key, int] = {}
        """Open local streams per rank: a rank is followed while it has one."""

    def opened(self, key: Key, now: float) -> None:
        self._streams[key] = self._streams.get(key, 0) + 1
        self._last[key] = max(self._last.get(key, now), now)

    def heard(self, key: Key, now: float) -> None:
        if key in self._streams:
            self._last[key] = now

    def closed(self, key: Key) -> None:
        """One of the rank's streams ended; with its last, it is no longer followed."""
        left = self._streams.get(key, 0) - 1
        if left > 0:
            self._streams[key] = left
        else:
            self.forget(key)

    def forget(self, key: Key) -> None:
        """The rank said it left (its group leaves cleanly), or ended: nothing more is expected of it."""
        self._streams.pop(key, None)
        self._last.pop(key, None)

    def silent(self, now: float) -> list[Silence]:
        """The ranks silent for ``limit`` by ``now``, each reported once (then no longer followed)."""
        out = [Silence(key[0], key[1], key[2], now - last, self.limit)
               for key, last in self._last.items() if now - last >= self.limit]
        for s in out:
            self.forget((s.replica_id, s.incarnation, s.shard_rank))
        return out

    def followed(self) -> int:
        return len(self._last)
