"""A rank's side of a stuck collective's probe (fthsdp/coordinator/decisions/stuck.py).

When a collective among the members stays stuck after a regroup, the
coordinator asks every member (and, later, a replica it kept out as
unreachable) to probe the others over the data path: each rank opens a TCP
connection to the same rank of every target, at the address its catch-up
server listens on, which is the host its collectives use
(FTHSDP_ADVERTISE_HOST). A connect proves that packets go both ways
between the two hosts; that is what a cable, a switch port or a route
breaks. The answer goes back on ``ReportReach``, once per probe id.

Probes run on a thread of their own, never on the watch thread that
delivers the request, and all targets at once, so that a probe of a cut
peer (which ends only at the connect timeout) costs one timeout, not one
per target.
"""

from __future__ import annotations

import concurrent.futures
import logging
import socket
import threading
from collections.abc import Callable, Sequence

from fthsdp.protos.v1 import coordinator_pb2 as pb

log = logging.getLogger("fthsdp.agent.reach")

CONNECT_TIMEOUT = 2.0
"""Seconds a probe's connect may take: a live peer on a working link answers
in a millisecond; a SYN retransmitted once is already a second."""

MAX_PARALLEL = 64


def split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def reaches(address: str, timeout: float = CONNECT_TIMEOUT) -> bool:
    """Whether a TCP connection to ``address`` (HOST:PORT) opens within ``timeout``."""
    try:
        host, port = split_host_port(address)
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def probe(targets: Sequence[pb.ReachTarget], shard_rank: int, own_id: str,
          timeout: float = CONNECT_TIMEOUT) -> tuple[list[str], list[str]]:
    """Probe the ``shard_rank`` address of every target but ``own_id``;
    returns (reached, unreached) replica ids. A target without an address
    for this rank is not judged."""
    todo = {t.replica_id: t.addresses[shard_rank] for t in targets
            if t.replica_id != own_id and shard_rank < len(t.addresses) and t.addresses[shard_rank]}
    if not todo:
        return [], []
    with concurrent.futures.ThreadPoolExecutor(min(MAX_PARALLEL, len(todo)), "fthsdp-reach") as pool:
        results = dict(zip(todo, pool.map(lambda a: reaches(a, timeout), todo.values()), strict=True))
    return sorted(r for r, ok in results.items() if ok), sorted(r for r, ok in results.items() if not ok)


class ReachProbes:
    """A Membership listener: runs each probe the coordinator asks for, once, and answers it."""

    def __init__(self, replica_id: str, shard_rank: int,
                 report: Callable[[int, list[str], list[str]], None]) -> None:
        self.replica_id = replica_id
        self.shard_rank = shard_rank
        self._report = report
        self._done = 0
        self._lock = threading.Lock()
        self.unreachable = ""
        """The coordinator's latest word on why this replica is kept out ("": it is not)."""

    def __call__(self, event: pb.WatchEvent) -> None:
        if event.unreachable != self.unreachable:
            if event.unreachable:
                log.warning("replica %s: kept out of the quorum, %s; waiting until it reaches them again",
                            self.replica_id, event.unreachable)
            self.unreachable = event.unreachable
        if not event.HasField("probe"):
            return
        with self._lock:
            if event.probe.id <= self._done:
                return
            self._done = event.probe.id
        request = pb.ReachProbe()
        request.CopyFrom(event.probe)
        threading.Thread(target=self._run, args=(request,), name=f"fthsdp-reach-{request.id}", daemon=True).start()

    def _run(self, request: pb.ReachProbe) -> None:
        reached, unreached = probe(request.targets, self.shard_rank, self.replica_id)
        if unreached:
            log.warning("replica %s rank %d: probe %d: cannot reach %s over the data path", self.replica_id,
                        self.shard_rank, request.id, ", ".join(unreached))
        try:
            self._report(request.id, reached, unreached)
        except Exception as e:  # noqa: BLE001 - the coordinator decides without this answer after its wait
            log.warning("replica %s: probe %d's answer was not delivered: %s", self.replica_id, request.id, e)
