"""What a host's hello may claim, as pure functions (issue 48).

The host table is not stored (fthsdp/coordinator/hosts/table.py): a
coordinator that restarts learns each group from its hosts' hellos. A hello
therefore makes claims, and the job token alone lets anyone send one, so
each claim is checked here before the table records anything:

* **Identity.** A host id belongs to the agent whose stream is open under
  it: the agent draws a random ``incarnation`` at start and says it in every
  hello. A hello with the host id of an open stream and another incarnation
  is refused (``identity_refusal``): a second agent that claims the same host
  id (two hosts with one host name: containers, network namespaces) or a
  caller with the job token alone. The same agent reconnecting (its stream
  dropped) says the same incarnation and is taken.
* **Rounds.** A host may say it is in its group's current round or, if it
  ran in that round, the next one (its failure report was lost on the way):
  never further (``round_refusal``), so a made-up round number cannot end a
  group's round or spend its restarts. Only while the group is being
  learned, right after a restart, are the hellos' rounds believed as they
  come: nothing else knows the group's round then.
* **Node ranks.** Each agent keeps the group's hosts by node rank as last
  pushed to it (a round's completion, or a spare taking a lost host's place)
  with the round they are of, and says them in its hello. Each rank of a
  group's ``Roster`` carries the version of what put its host there: the
  round, and whether the host said it of itself (or the coordinator decided
  it). While a group is learned, ``merge`` takes every newer claim rank by
  rank, so that a host lost while the coordinator was down is known (and
  replaced by a spare after the spare wait), and the hosts a newer claim
  displaced are known too; ``displaced`` tells a host that comes back whose
  node rank a newer claim holds (a spare took its place) that it is not
  needed, whoever else is connected at the time.

The coordinator applies them in fthsdp/coordinator/hosts/table.py; they are
tested table-driven (tests/test_host_claims.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

Version = tuple[int, bool]
"""What put a host at a node rank: (round, said by the host itself or decided by the coordinator)."""
NO_VERSION: Version = (0, False)


@dataclasses.dataclass(frozen=True)
class Claim:
    """A hello's claim that ``host`` holds ``node_rank`` of its group."""

    node_rank: int
    host: str
    version: Version


@dataclasses.dataclass(frozen=True)
class Roster:
    """A group's hosts by node rank ('' where none is known), each with its version."""

    hosts: tuple[str, ...] = ()
    versions: tuple[Version, ...] = ()

    def sized(self, nnodes: int) -> Roster:
        pad = max(0, nnodes - len(self.hosts))
        return Roster((self.hosts + ("",) * pad)[:nnodes], (self.versions + (NO_VERSION,) * pad)[:nnodes])

    @property
    def full(self) -> bool:
        return bool(self.hosts) and all(self.hosts)


def decided(hosts: Sequence[str], round_number: int) -> Roster:
    """The roster of a round this coordinator completed (or of a spare it placed) in ``round_number``."""
    return Roster(tuple(hosts), tuple((round_number, True) if h else NO_VERSION for h in hosts))


def claims(host_id: str, hosts: Sequence[str], hosts_round: int, round_number: int, node_rank: int) -> list[Claim]:
    """What a hello claims: its roster, each rank at ``hosts_round`` (its own
    rank said by itself); with no roster, the node rank it runs in its round."""
    if hosts and hosts_round > 0:
        return [Claim(k, h, (hosts_round, h == host_id)) for k, h in enumerate(hosts) if h]
    if node_rank >= 0 and round_number > 0:
        return [Claim(node_rank, host_id, (round_number, True))]
    return []


def merge(roster: Roster, claimed: Sequence[Claim]) -> tuple[Roster, list[tuple[str, str, int]]]:
    """``roster`` with each newer claim taken, rank by rank; returns it and
    who was displaced: (the host that held the rank, the one that holds it
    now, the rank). A host is at one rank only: a newer claim elsewhere
    clears its older place."""
    hosts, versions = list(roster.hosts), list(roster.versions)
    displaced = []
    for claim in sorted(claimed, key=lambda c: c.version, reverse=True):
        k = claim.node_rank
        if not 0 <= k < len(hosts):
            continue
        if hosts[k] == claim.host:
            versions[k] = max(versions[k], claim.version)
            continue
        if claim.version <= versions[k]:
            continue
        elsewhere = [j for j, h in enumerate(hosts) if h == claim.host and j != k]
        if any(versions[j] >= claim.version for j in elsewhere):
            continue  # a newer claim has it at another rank
        for j in elsewhere:
            hosts[j], versions[j] = "", NO_VERSION
        if hosts[k]:
            displaced.append((hosts[k], claim.host, k))
        hosts[k], versions[k] = claim.host, claim.version
    return Roster(tuple(hosts), tuple(versions)), displaced


def displaced(roster: Roster, claimed: Sequence[Claim], host_id: str) -> tuple[int, str] | None:
    """(node rank, holder) if ``host_id`` claims a node rank that a newer
    claim gave another host (a spare took its place while it was gone);
    None if it holds its rank or claims none."""
    for claim in claimed:
        k = claim.node_rank
        if claim.host == host_id and 0 <= k < len(roster.hosts) and roster.hosts[k] not in ("", host_id) \
                and roster.versions[k] > claim.version:
            return k, roster.hosts[k]
    return None


def identity_refusal(host_id: str, live: str | None, incarnation: str, address: str, connected_for: float) -> str:
    """Why a hello with ``incarnation`` may not take ``host_id`` ('' if it
    may): ``live`` is the incarnation of the agent whose stream is open under
    that host id (None if none is)."""
    if live is None or live == incarnation:
        return ""
    where = f"from {address}" if address else "from another address"
    return (f"host id {host_id!r} is taken: another agent with this host id is connected ({where}, for "
            f"{connected_for:.0f}s); give each agent its own --host-id (hosts that share a host name, such as "
            f"containers or network namespaces, need one each)")


def round_refusal(host_id: str, group: str, claimed: int, current: int, ran_in_current: bool,
                  learning: bool) -> str:
    """Why host ``host_id`` may not say it is in round ``claimed`` of
    ``group``, whose round is ``current`` ('' if it may). ``ran_in_current``:
    the host runs in the current round, which has completed (its failure
    report may have been lost: the next round is its). ``learning``: the
    group is being learned from its hosts' hellos after a restart."""
    if learning or claimed <= current or (claimed == current + 1 and ran_in_current):
        return ""
    allowed = f"round {current}" + (f" or {current + 1}" if ran_in_current else "")
    return (f"host {host_id} says it is in round {claimed} of group {group}, which is in round {current}: "
            f"it may only be in {allowed}")
