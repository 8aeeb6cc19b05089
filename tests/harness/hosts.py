"""An in-process host table (fthsdp/coordinator/hosts/table.py) on a fake clock,
driven as hosts' agents would drive it, recording what each host is pushed
(tests/test_host_table.py, tests/test_host_table_claims.py)."""

from __future__ import annotations

from fthsdp.coordinator.hosts.rendezvous import RendezvousRules
from fthsdp.coordinator.hosts.table import HostTable
from fthsdp.protos.v1 import coordinator_pb2 as pb

TIMEOUT = 100.0
"""The heartbeat timeout of the ticks: long, but where a test lets heartbeats lapse."""


class Hosts:
    """A table and the pushes each host received, as (kind, payload) pairs."""

    def __init__(self, spare_wait: float = 10.0, rendezvous_timeout: float = 600.0) -> None:
        self.table = HostTable("job", RendezvousRules(spare_wait=spare_wait))
        self.pushed: dict[str, list[tuple[str, object]]] = {}
        self.connection: dict[str, int] = {}
        self.rendezvous_timeout = rendezvous_timeout

    def hello(self, host_id: str, group: str = "r1", now: float = 0.0, nnodes: int = 2, nproc: int = 1,
              **fields) -> None:
        box = self.pushed.setdefault(host_id, [])

        def push(m: pb.HostPush | None) -> None:
            if m is None:
                box.append(("closed", None))
                return
            which = m.WhichOneof("message")
            box.append((which, getattr(m, which)))

        hello = pb.HostHello(job="job", host_id=host_id, replica_id=group, replica_rank=1, num_replicas=2,
                             nnodes=nnodes, nproc=nproc, rendezvous_timeout=self.rendezvous_timeout, **fields)
        self.connection[host_id] = self.table.hello(hello, push, now)

    def join(self, host_id: str, round_number: int, now: float = 0.0) -> None:
        self.table.join(host_id, round_number, f"{host_id}:700{round_number}", now)

    def last(self, host_id: str, kind: str | None = None):
        got = [p for p in self.pushed[host_id] if kind is None or p[0] == kind]
        return got[-1] if got else None

    def take(self) -> None:
        for box in self.pushed.values():
            box.clear()


def running(h: Hosts, now: float = 0.0) -> None:
    h.hello("a", now=now)
    h.hello("b", now=now)
    h.join("a", 1, now)
    h.join("b", 1, now)
