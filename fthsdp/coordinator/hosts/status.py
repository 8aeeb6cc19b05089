"""What ``fthsdp status`` and the status page show of the job's groups of
several hosts: each group's round, its hosts by node rank, why it waits,
and the spares no group has taken (from fthsdp/coordinator/hosts/table.py)."""

from __future__ import annotations

from fthsdp.coordinator.hosts.rendezvous import Host
from fthsdp.coordinator.hosts.table import HostTable
from fthsdp.protos.v1 import coordinator_pb2 as pb


def _state(host: Host, round_number: int, complete: bool, reconnecting: bool) -> str:
    if host.left_round:
        return "left"
    if host.lost_since is not None:
        return "lost"
    if reconnecting:
        return "reconnecting"  # named by the others' hellos after a coordinator restart, not back itself yet
    if host.joined_round == round_number:
        return "running" if complete else "joined"
    return "gathering"


def group_statuses(table: HostTable, now: float) -> list[pb.GroupStatus]:
    out = []
    for name in sorted(table.groups):
        group = table.groups[name]
        hosts = table.group_hosts(name)
        if not hosts:
            continue  # every host left (finished) or gave up: nothing to show
        ranks = group.current.ranks or group.previous
        number, complete = group.current.number, group.current.complete
        rows = [pb.HostStatus(host_id=h.host_id, node_rank=ranks.index(h.host_id) if h.host_id in ranks else -1,
                              state=_state(h, number, complete, table.reconnecting(h.host_id)),
                              lost_for_s=now - h.lost_since if h.lost_since is not None else 0.0)
                for h in hosts]
        rows.sort(key=lambda r: (r.node_rank < 0, r.node_rank, r.host_id))
        out.append(pb.GroupStatus(replica_id=name, round=group.current.number, complete=group.current.complete,
                                  reason=table.reason(name, now), hosts=rows, nnodes=group.nnodes))
    return out
